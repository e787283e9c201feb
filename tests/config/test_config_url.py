"""Broker URLs (ActiveMQ/Artemis failover syntax) and host:port addresses.

Pure tests, no I/O. The ActiveMQ alias semantics come from the ActiveMQ Classic
"Failover Transport Reference"; the Artemis names from "Client Reconnection and Session
Reattachment".
"""

from __future__ import annotations

import re
from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from config import (
    FAILOVER_OPTIONS,
    Broker,
    Config,
    ConfigError,
    Secret,
    parse_address,
    parse_broker_url,
)


def problems_of(url: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_broker_url(url)
    return info.value.problems


# --------------------------------------------------------------------------------------
# URL forms


@pytest.mark.parametrize(
    ("url", "brokers", "options"),
    [
        pytest.param(
            "failover:(stomp://a:61613,stomp+ssl://b:61614)?retryInterval=100&randomize=false",
            (Broker("a", 61613), Broker("b", 61614, tls=True)),
            {"retry_interval": 100, "randomize": False},
            id="failover-parens-options",
        ),
        pytest.param(
            "failover://(stomp://a:1,stomp://b:2)?maxReconnectAttempts=5",
            (Broker("a", 1), Broker("b", 2)),
            {"reconnect_attempts": 5},
            id="failover-slashes",
        ),
        pytest.param(
            "failover:(stomp://a:1,stomp://b:2)",
            (Broker("a", 1), Broker("b", 2)),
            {},
            id="failover-parens-no-options",
        ),
        pytest.param(
            "failover:stomp://a:1,stomp://b:2",
            (Broker("a", 1), Broker("b", 2)),
            {},
            id="failover-no-parens",
        ),
        pytest.param(
            "failover:stomp://a:1",
            (Broker("a", 1),),
            {},
            id="failover-one-broker",
        ),
        pytest.param("stomp://a:61613", (Broker("a", 61613),), {}, id="bare-uri"),
        pytest.param(
            "stomp://a:1,stomp+ssl://b",
            (Broker("a", 1), Broker("b", 61614, tls=True)),
            {},
            id="comma-list",
        ),
        pytest.param(
            "  FAILOVER:( STOMP://a:1 , Stomp+SSL://b:2 )?RetryInterval=7  ",
            (Broker("a", 1), Broker("b", 2, tls=True)),
            {"retry_interval": 7},
            id="case-and-spaces",
        ),
        pytest.param(
            "failover:(stomp://a:1)?",
            (Broker("a", 1),),
            {},
            id="empty-query",
        ),
        pytest.param(
            "stomp://a:1/",
            (Broker("a", 1),),
            {},
            id="trailing-slash",
        ),
    ],
)
def test_url_forms(url: str, brokers: tuple[Broker, ...], options: dict[str, object]) -> None:
    assert parse_broker_url(url) == (brokers, options)


@pytest.mark.parametrize(
    ("scheme", "tls"),
    [
        ("stomp", False),
        ("tcp", False),
        ("stomp+nio", False),
        ("nio", False),
        ("stomp+ssl", True),
        ("stomp+tls", True),
        ("ssl", True),
        ("tls", True),
    ],
)
def test_schemes_and_default_ports(scheme: str, tls: bool) -> None:
    (broker,), _ = parse_broker_url(f"{scheme}://mq.example")
    assert broker == Broker("mq.example", 61614 if tls else 61613, tls=tls)
    (broker,), _ = parse_broker_url(f"{scheme}://mq.example:1234")
    assert (broker.port, broker.tls) == (1234, tls)


def test_userinfo_is_percent_decoded() -> None:
    (broker,), _ = parse_broker_url("stomp://us%3Aer:p%40ss%2Fw%25rd@mq:61613")
    assert broker.login == "us:er"
    assert broker.passcode == Secret("p@ss/w%rd")


def test_raw_comma_in_passcode_stays_in_the_passcode() -> None:
    # RFC 3986 allows ',' in userinfo; entries split only before the next scheme://.
    brokers, _ = parse_broker_url("failover:(stomp://u:p,w@a:1,stomp://b:2)")
    assert [b.label for b in brokers] == ["a:1", "b:2"]
    assert brokers[0].passcode == Secret("p,w")


def test_login_without_passcode_and_empty_passcode() -> None:
    (broker,), _ = parse_broker_url("stomp://user@mq")
    assert (broker.login, broker.passcode) == ("user", None)
    (broker,), _ = parse_broker_url("stomp://user:@mq")
    assert (broker.login, broker.passcode) == ("user", Secret(""))


@pytest.mark.parametrize(
    ("url", "vhost"),
    [
        ("stomp://127.0.0.1:61613?host=/", "/"),
        ("stomp://127.0.0.1:61613?vhost=%2F", "/"),
        ("stomp://127.0.0.1:61613?host=prod%20vh", "prod vh"),
        ("stomp://127.0.0.1:61613", None),
    ],
)
def test_virtual_host(url: str, vhost: str | None) -> None:
    (broker,), _ = parse_broker_url(url)
    assert broker.virtual_host == vhost


def test_nested_host_applies_to_brokers_without_their_own() -> None:
    brokers, options = parse_broker_url(
        "failover:(stomp://a:1,stomp://b:2?host=own)?nested.host=/&randomize=true"
    )
    assert [b.virtual_host for b in brokers] == ["/", "own"]
    assert options == {"randomize": True}


@pytest.mark.parametrize(
    ("url", "host", "port", "label"),
    [
        ("stomp://[::1]:61613", "::1", 61613, "[::1]:61613"),
        ("stomp+ssl://[2001:db8::7]", "2001:db8::7", 61614, "[2001:db8::7]:61614"),
        ("stomp://[fe80::1%25eth0]:5", "fe80::1%eth0", 5, "[fe80::1%eth0]:5"),
        ("stomp://10.0.0.1:7", "10.0.0.1", 7, "10.0.0.1:7"),
    ],
)
def test_ip_literals(url: str, host: str, port: int, label: str) -> None:
    (broker,), _ = parse_broker_url(url)
    assert (broker.host, broker.port, broker.label) == (host, port, label)


# --------------------------------------------------------------------------------------
# failover options and aliases


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        # Artemis names
        ("retryInterval=250", {"retry_interval": 250}),
        ("retryIntervalMultiplier=1.5", {"retry_interval_multiplier": 1.5}),
        ("maxRetryInterval=9000", {"max_retry_interval": 9000}),
        ("reconnectAttempts=-1", {"reconnect_attempts": -1}),
        ("initialConnectAttempts=4", {"initial_connect_attempts": 4}),
        ("reconnectPeriod=0", {"reconnect_period": 0}),
        ("jitter=0.5", {"jitter": 0.5}),
        ("randomize=true", {"randomize": True}),
        ("priorityBackup=yes", {"priority_backup": True}),
        ("callTimeout=1000", {"call_timeout": 1000}),
        ("confirmationWindowSize=65536", {"confirmation_window_size": 65536}),
        ("connectTimeout=750", {"connect_timeout": 750}),
        # the Config field names work too, and names are matched ignoring case
        ("retry_interval=11", {"retry_interval": 11}),
        ("priority_backup=on", {"priority_backup": True}),
        ("RANDOMIZE=0", {"randomize": False}),
        # ActiveMQ Classic aliases
        ("initialReconnectDelay=10", {"retry_interval": 10}),
        ("maxReconnectDelay=30000", {"max_retry_interval": 30000}),
        ("backOffMultiplier=3", {"retry_interval_multiplier": 3.0}),
        ("reconnectDelayExponent=2.5", {"retry_interval_multiplier": 2.5}),
        ("timeout=2500", {"call_timeout": 2500}),
        # maxReconnectAttempts: ActiveMQ 5.6+ (-1 forever, 0 no reconnect) = Artemis meaning
        ("maxReconnectAttempts=-1", {"reconnect_attempts": -1}),
        ("maxReconnectAttempts=0", {"reconnect_attempts": 0}),
        ("maxReconnectAttempts=7", {"reconnect_attempts": 7}),
        # startupMaxReconnectAttempts counts RE-tries: N -> N + 1 attempts, -1 stays -1
        ("startupMaxReconnectAttempts=0", {"initial_connect_attempts": 1}),
        ("startupMaxReconnectAttempts=4", {"initial_connect_attempts": 5}),
        ("startupMaxReconnectAttempts=-1", {"initial_connect_attempts": -1}),
        # useExponentialBackOff=false means a constant delay; true changes nothing
        ("useExponentialBackOff=false", {"retry_interval_multiplier": 1.0}),
        ("useExponentialBackOff=true", {}),
        (
            "useExponentialBackOff=false&backOffMultiplier=3",
            {"retry_interval_multiplier": 1.0},
        ),
        (
            "backOffMultiplier=3&useExponentialBackOff=true",
            {"retry_interval_multiplier": 3.0},
        ),
    ],
)
def test_failover_options(query: str, expected: dict[str, object]) -> None:
    brokers, options = parse_broker_url(f"failover:(stomp://a:1)?{query}")
    assert brokers == (Broker("a", 1),)
    assert options == expected
    defaults = Config()
    assert all(type(v) is type(getattr(defaults, k)) for k, v in options.items())


def test_every_failover_option_is_accepted() -> None:
    values = {"int": "5", "float": "1.5", "bool": "true"}
    for option in FAILOVER_OPTIONS:
        _, options = parse_broker_url(f"failover:(stomp://a)?{option.name}={values[option.kind]}")
        assert set(options) <= {option.field}, option.name


def test_unknown_failover_option_suggests() -> None:
    assert problems_of("failover:(stomp://a)?retryIntervall=5") == [
        "unknown failover option 'retryIntervall' (did you mean 'retryInterval'?)"
    ]
    assert problems_of("failover:(stomp://a)?maxReconectAttempts=5") == [
        "unknown failover option 'maxReconectAttempts' (did you mean 'maxReconnectAttempts'?)"
    ]
    assert problems_of("failover:(stomp://a)?zzz=1") == ["unknown failover option 'zzz'"]


def test_known_but_unsupported_and_misplaced_options() -> None:
    (problem,) = problems_of("failover:(stomp://a)?trackMessages=true")
    assert problem.startswith("unsupported failover option 'trackMessages': ")
    (problem,) = problems_of("failover:(stomp://a)?heartbeat_grace=3")
    assert problem.startswith("'heartbeat_grace' is not a failover option")


def test_conflicting_and_repeated_options() -> None:
    assert problems_of("failover:(stomp://a)?retryInterval=1&initialReconnectDelay=2") == [
        "failover options 'retryInterval' and 'initialReconnectDelay' both set retry_interval"
    ]
    assert problems_of("failover:(stomp://a)?randomize=true&randomize=false") == [
        "failover option 'randomize' given twice"
    ]


def test_bad_option_values() -> None:
    assert problems_of("failover:(stomp://a)?retryInterval=1.5&randomize=maybe&jitter=x") == [
        "failover option 'retryInterval': expected an integer, got '1.5'",
        "failover option 'randomize': expected a boolean (true/false, 1/0, yes/no, on/off), "
        "got 'maybe'",
        "failover option 'jitter': expected a number, got 'x'",
    ]


def test_failover_option_on_a_broker_uri_explains_the_parentheses() -> None:
    # ActiveMQ: without parentheses the query belongs to the last URI.
    for url in ("stomp://a:1?retryInterval=5", "failover:stomp://a:1,stomp://b:2?randomize=1"):
        (problem,) = problems_of(url)
        assert "is a failover option, not a broker option" in problem
        assert "failover:(...)?" in problem


def test_unknown_broker_option() -> None:
    assert problems_of("stomp://a:1?vhots=/") == [
        "'stomp://a:1?vhots=/': unknown broker option 'vhots' (did you mean 'vhost'?)"
    ]


# --------------------------------------------------------------------------------------
# malformed URLs


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("", ["empty broker URL"]),
        ("   ", ["empty broker URL"]),
        ("failover:", ["no brokers in failover URL"]),
        ("failover:()", ["no brokers in failover URL"]),
        ("failover:(stomp://a:1", ["missing ')' in failover URL"]),
        (
            "failover:(stomp://a:1)randomize=true",
            ["unexpected text after ')' in failover URL (expected '?option=value')"],
        ),
        ("a:61613", ["'a:61613': missing scheme (expected e.g. 'stomp://a:61613')"]),
        (
            "amqp://a:5672",
            [
                "'amqp://a:5672': unsupported scheme 'amqp' (expected one of stomp, tcp, "
                "stomp+nio, nio, stomp+ssl, stomp+tls, ssl, tls)"
            ],
        ),
        ("stomp://a:x", ["'stomp://a:x': invalid port 'x' in 'a:x'"]),
        ("stomp://a:0", ["'stomp://a:0': broker port must be 1..65535, got 0"]),
        ("stomp://a:70000", ["'stomp://a:70000': port 70000 out of range 0..65535 in 'a:70000'"]),
        ("stomp://:61613", ["'stomp://:61613': empty host in ':61613'"]),
        ("stomp://", ["'stomp://': empty address (expected host:port)"]),
        ("stomp://a b:1", ["'stomp://a b:1': invalid host name 'a b'"]),
        ("stomp://[::1", ["'stomp://[::1': missing ']' in '[::1'"]),
        ("stomp://[zz]:1", ["'stomp://[zz]:1': invalid IPv6 address 'zz' in '[zz]:1'"]),
        ("stomp://a:1/queue", ["'stomp://a:1/queue': unexpected path '/queue'"]),
        ("stomp://a:1#x", ["'stomp://a:1#x': a fragment ('#...') is not allowed"]),
        ("stomp://:pw@a:1", ["'stomp://***@a:1': empty login in user info"]),
        ("stomp://a:1,b:2", ["'b:2': missing scheme (expected e.g. 'stomp://b:2')"]),
        ("stomp://a:1,", ["'stomp://a:1,': empty entry in the broker list"]),
        (
            "stomp://a:1?host=",
            [
                "'stomp://a:1?host=': the virtual host must be non-empty text without control "
                "characters"
            ],
        ),
        ("stomp://a:1?host=a&vhost=b", ["'stomp://a:1?host=a&vhost=b': virtual host given twice"]),
    ],
)
def test_malformed(url: str, expected: list[str]) -> None:
    assert problems_of(url) == expected


def test_all_problems_at_once() -> None:
    problems = problems_of(
        "failover:(stomp://a:x,amqp://b,stomp://c:1?foo=1)?retryIntervall=1&jitter=x"
    )
    assert len(problems) == 5, problems
    assert problems[0].startswith("unknown failover option 'retryIntervall'")
    assert problems[1] == "failover option 'jitter': expected a number, got 'x'"
    assert problems[2] == "'stomp://a:x': invalid port 'x' in 'a:x'"
    assert problems[3].startswith("'amqp://b': unsupported scheme 'amqp'")
    assert problems[4].startswith("'stomp://c:1?foo=1': unknown broker option 'foo'")


SECRET = "S3cr3t-PW"


@pytest.mark.parametrize(
    "url",
    [
        f"stomp://u:{SECRET}@a:bad",
        f"stomp://u:{SECRET}@:1",
        f"amqp://u:{SECRET}@a:1",
        f"stomp://u:{SECRET}@a:1/path",
        f"stomp://u:{SECRET}@a:1#frag",
        f"stomp://u:{SECRET}@a:1?foo=1",
        f"stomp://u:{SECRET}@a:1?retryInterval=1",
        f"stomp://u:{SECRET}@a:1,b:2",
        f"failover:(stomp://u:{SECRET}@a:0)?x=1",
        f"failover:(stomp://u:{SECRET},x@a:0)",
        f"stomp://u:{SECRET}@@a:99999",
        f"u:{SECRET}@a:1",
        f"stomp://u:{SECRET}@a:1?host=",
    ],
)
def test_problems_never_show_user_info(url: str) -> None:
    text = "\n".join(problems_of(url))
    assert "S3cr" not in text
    assert "PW" not in text
    assert "u:" not in text.replace("stomp://", "").replace("amqp://", "")


# --------------------------------------------------------------------------------------
# round trip (hypothesis)

_LABEL = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,8}[a-z0-9])?", fullmatch=True)
_hostnames = st.lists(_LABEL, min_size=1, max_size=4).map(".".join)
_hosts = st.one_of(
    _hostnames,
    st.ip_addresses(v=4).map(str),
    st.ip_addresses(v=6).map(str),
)
_text = st.text(st.characters(codec="utf-8"), max_size=12)
_vhost_text = st.text(st.characters(codec="utf-8", exclude_categories=["Cc"]), min_size=1)


@st.composite
def _brokers(draw: st.DrawFn) -> tuple[Broker, str, bool]:
    host = draw(_hosts)
    tls = draw(st.booleans())
    scheme = draw(
        st.sampled_from(["stomp+ssl", "stomp+tls", "ssl", "tls"] if tls else ["stomp", "tcp"])
    )
    explicit_port = draw(st.booleans())
    port = draw(st.integers(1, 65535)) if explicit_port else (61614 if tls else 61613)
    login = draw(st.none() | _text.filter(bool))
    passcode = draw(st.none() | _text) if login is not None else None
    vhost = draw(st.none() | _vhost_text)
    netloc = f"[{host}]" if ":" in host else host
    if explicit_port:
        netloc += f":{port}"
    if login is not None:
        userinfo = quote(login, safe="")
        if passcode is not None:
            userinfo += ":" + quote(passcode, safe="")
        netloc = f"{userinfo}@{netloc}"
    uri = f"{scheme}://{netloc}"
    if vhost is not None:
        uri += "?host=" + quote(vhost, safe="")
    broker = Broker(
        host,
        port,
        tls,
        login,
        None if passcode is None else Secret(passcode),
        vhost,
    )
    return broker, uri, draw(st.booleans())


_option_values = st.fixed_dictionaries(
    {},
    optional={
        "retryInterval": st.integers(-10, 10**6),
        "retryIntervalMultiplier": st.floats(0, 100, allow_nan=False),
        "reconnectAttempts": st.integers(-1, 1000),
        "randomize": st.booleans(),
        "priorityBackup": st.booleans(),
        "callTimeout": st.integers(1, 10**6),
    },
)
_FIELDS = {o.name: o.field for o in FAILOVER_OPTIONS}


@given(st.lists(_brokers(), min_size=1, max_size=4), _option_values, st.booleans())
def test_round_trip(
    entries: list[tuple[Broker, str, bool]], options: dict[str, object], slashes: bool
) -> None:
    query = "&".join(
        f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in options.items()
    )
    body = ",".join(uri for _, uri, _ in entries)
    url = f"failover:{'//' if slashes else ''}({body})" + (f"?{query}" if query else "")
    brokers, parsed = parse_broker_url(url)
    assert brokers == tuple(b for b, _, _ in entries)
    assert parsed == {_FIELDS[k]: v for k, v in options.items()}
    if not options:
        # the same list without failover: (comma list / bare URI) means the same brokers
        assert parse_broker_url(body) == (brokers, {})


# --------------------------------------------------------------------------------------
# parse_address


@pytest.mark.parametrize(
    ("text", "default", "expected"),
    [
        ("127.0.0.1:61613", None, ("127.0.0.1", 61613)),
        ("localhost:0", None, ("localhost", 0)),
        ("0.0.0.0:9464", None, ("0.0.0.0", 9464)),
        ("[::1]:61613", None, ("::1", 61613)),
        ("[::]:0", None, ("::", 0)),
        (" mq-1.example.com:65535 ", None, ("mq-1.example.com", 65535)),
        ("mq", 61613, ("mq", 61613)),
        ("[::1]", 7, ("::1", 7)),
        ("::1", 7, ("::1", 7)),
        ("my_host.svc.cluster.local.:1", None, ("my_host.svc.cluster.local.", 1)),
    ],
)
def test_parse_address(text: str, default: int | None, expected: tuple[str, int]) -> None:
    assert parse_address(text, default_port=default) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty address"),
        (":61613", "empty host"),
        ("[]:1", "empty host"),
        ("host", "missing port"),
        ("host:", "invalid port ''"),
        ("host:abc", "invalid port 'abc'"),
        ("host:-1", "invalid port '-1'"),
        ("host:65536", "out of range"),
        ("host:\uff11\uff12", "invalid port"),  # full-width digits
        ("::1", "needs brackets"),
        ("::1:61613:x", "IPv6 goes in brackets"),
        ("[::1]x", "unexpected 'x'"),
        ("a/b:1", "invalid host name"),
        ("-a:1", "invalid host name"),
        ("a..b:1", "invalid host name"),
    ],
)
def test_parse_address_rejects(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_address(text)


@given(_hosts, st.integers(0, 65535))
def test_parse_address_round_trip(host: str, port: int) -> None:
    text = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    assert parse_address(text) == (host, port)
    if port:
        assert parse_broker_url(f"stomp://{text}") == ((Broker(host, port),), {})
        assert Broker(host, port).label == text
