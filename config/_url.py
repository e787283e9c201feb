"""Broker URLs in the ActiveMQ / Artemis failover syntax, and ``host:port`` addresses.

Pure functions, no I/O, no name resolution (names resolve on every connect attempt:
docs/behaviour.md, "Broker list and reconnect policy").

Accepted forms (ActiveMQ Classic "Failover Transport Reference", Artemis "Client
Failover")::

    failover:(stomp://a:61613,stomp+ssl://b:61614)?retryInterval=100&randomize=false
    failover://(stomp://a:61613,stomp://b:61613)?maxReconnectAttempts=5
    failover:stomp://a:61613,stomp://b:61613          (no failover options possible)
    stomp://a:61613                                   (one broker)
    stomp://a:61613,stomp://b:61613                   (a list without ``failover:``)

Rules worth knowing:

* In ``failover:uri1,uri2?x=y`` (no parentheses) the query belongs to the *last* URI,
  as in ActiveMQ's ``URISupport.parseComposite``, so only broker options (``host``)
  may appear there. Failover options need the parenthesized form.
* Entries are separated by a comma followed by the next ``scheme://``. A raw comma may
  therefore appear in a passcode (RFC 3986 allows it in user info; ActiveMQ would
  split there), but every broker must carry its scheme.
* User info is everything up to the *last* ``@`` of an entry, percent-decoded; write
  an ``@`` inside a ``host=`` value as ``%40``.
* ``nested.host=/`` in the failover query applies ``host=/`` to every broker that does
  not set its own (after ActiveMQ's ``nested.*`` options).
* Option names match ignoring case and ``_``: ``retryInterval``, ``retry_interval``
  and ``RETRYINTERVAL`` are the same option.

Messages never quote user info: an entry is shown as ``stomp://***@host:port``.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from dataclasses import dataclass
from typing import Literal, NamedTuple
from urllib.parse import unquote

from ._dns import dns_kind
from ._model import Broker, Config, ConfigError, Secret
from ._values import InvalidValue, normalize_name, parse_bool, parse_float, parse_int, suggest

__all__ = [
    "DEFAULT_PORT",
    "DEFAULT_TLS_PORT",
    "FAILOVER_OPTIONS",
    "PLAIN_SCHEMES",
    "TLS_SCHEMES",
    "FailoverOption",
    "ParsedUrl",
    "UrlSetting",
    "is_host_name",
    "parse_address",
    "parse_broker_url",
    "parse_url",
    "redact_uri",
]

#: Default STOMP port of ActiveMQ Classic, Artemis and RabbitMQ.
DEFAULT_PORT = 61613
#: Default STOMP+TLS port of ActiveMQ Classic and Artemis (RabbitMQ uses 61614 too).
DEFAULT_TLS_PORT = 61614

#: Schemes of plain TCP brokers. ``tcp``/``nio`` are ActiveMQ transport names.
PLAIN_SCHEMES = ("stomp", "tcp", "stomp+nio", "nio")
#: Schemes of TLS brokers (``Broker.tls``).
TLS_SCHEMES = ("stomp+ssl", "stomp+tls", "ssl", "tls")

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*)://")
_ENTRY_SPLIT = re.compile(r"\s*,\s*(?=[A-Za-z][A-Za-z0-9+.\-]*://)")
_FAILOVER_PREFIX = re.compile(r"failover:", re.IGNORECASE)
_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_HOSTNAME = re.compile(rf"(?=.{{1,254}}$){_LABEL}(?:\.{_LABEL})*\.?")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


# --------------------------------------------------------------------------------------
# host:port


def is_host_name(text: str) -> bool:
    """Whether ``text`` is a DNS host name (RFC 1123 labels), as ``tls_server_name`` and
    ``sniHost`` must be: SNI carries names, never IP literals (RFC 6066 §3)."""
    return bool(_HOSTNAME.fullmatch(text))


def parse_address(text: str, *, default_port: int | None = None) -> tuple[str, int]:
    """Parse ``host:port`` into ``(host, port)``.

    Accepts a host name, an IPv4 literal, or an IPv6 literal in brackets
    (``[::1]:61613``, RFC 3986 §3.2.2); the IPv6 host is returned without brackets.
    ``port`` is 0..65535 (0 = ephemeral, for listeners; broker ports are checked to be
    1..65535 by the caller). Without a port, ``default_port`` is used if given (a bare
    IPv6 literal such as ``::1`` is then accepted too).

    Raises:
        ValueError: empty host (``":61613"`` is refused rather than guessed as
            ``0.0.0.0``), bad host syntax, missing/non-numeric/out-of-range port.
    """
    s = text.strip()
    if not s:
        raise ValueError("empty address (expected host:port)")
    port_text: str | None
    if s.startswith("["):
        end = s.find("]")
        if end < 0:
            raise ValueError(f"missing ']' in {s!r}")
        host, rest = s[1:end], s[end + 1 :]
        if not host:
            raise ValueError(f"empty host in {s!r}")
        try:
            ipaddress.IPv6Address(host.replace("%25", "%"))
        except ValueError:
            raise ValueError(f"invalid IPv6 address {host!r} in {s!r}") from None
        host = host.replace("%25", "%")
        if rest and not rest.startswith(":"):
            raise ValueError(f"unexpected {rest!r} after ']' in {s!r}")
        port_text = rest[1:] if rest else None
    elif s.count(":") > 1:
        try:
            ipaddress.IPv6Address(s)
        except ValueError:
            raise ValueError(
                f"invalid address {s!r} (IPv6 goes in brackets: '[::1]:61613')"
            ) from None
        if default_port is None:
            raise ValueError(f"IPv6 address needs brackets and a port: '[{s}]:<port>'")
        host, port_text = s, None
    else:
        host, sep, rest = s.partition(":")
        port_text = rest if sep else None
        if not host:
            raise ValueError(f"empty host in {s!r}")
        if not _HOSTNAME.fullmatch(host):
            raise ValueError(f"invalid host name {host!r}")
    if port_text is None:
        if default_port is None:
            raise ValueError(f"missing port in {s!r} (expected host:port)")
        return host, default_port
    if not (port_text.isascii() and port_text.isdigit()):
        raise ValueError(f"invalid port {port_text!r} in {s!r}")
    port = int(port_text)
    if port > 65535:
        raise ValueError(f"port {port} out of range 0..65535 in {s!r}")
    return host, port


# --------------------------------------------------------------------------------------
# failover options


@dataclass(frozen=True)
class FailoverOption:
    """One failover query option and the :class:`~config.Config` field it sets.

    Attributes:
        name: The name as documented (camelCase); the snake_case form and any case
            are accepted too (``retry_interval``, ``RETRYINTERVAL``).
        field: The ``Config`` field it sets.
        kind: How the text value is parsed.
        origin: Where the name comes from (``"Artemis"`` or ``"ActiveMQ"``) and any
            translation applied.
    """

    name: str
    field: str
    kind: Literal["int", "float", "bool"]
    origin: str


#: Every failover option accepted in a broker URL query, Artemis names first.
FAILOVER_OPTIONS: tuple[FailoverOption, ...] = (
    FailoverOption("retryInterval", "retry_interval", "int", "Artemis"),
    FailoverOption("retryIntervalMultiplier", "retry_interval_multiplier", "float", "Artemis"),
    FailoverOption("maxRetryInterval", "max_retry_interval", "int", "Artemis"),
    FailoverOption("reconnectAttempts", "reconnect_attempts", "int", "Artemis"),
    FailoverOption("initialConnectAttempts", "initial_connect_attempts", "int", "Artemis"),
    FailoverOption("reconnectPeriod", "reconnect_period", "int", "mq-sidecar"),
    FailoverOption("initialConnectPeriod", "initial_connect_period", "int", "mq-sidecar"),
    FailoverOption("jitter", "jitter", "float", "mq-sidecar"),
    FailoverOption("randomize", "randomize", "bool", "ActiveMQ"),
    FailoverOption("priorityBackup", "priority_backup", "bool", "ActiveMQ"),
    FailoverOption("callTimeout", "call_timeout", "int", "Artemis"),
    FailoverOption("confirmationWindowSize", "confirmation_window_size", "int", "Artemis"),
    FailoverOption("connectTimeout", "connect_timeout", "int", "mq-sidecar"),
    FailoverOption("initialReconnectDelay", "retry_interval", "int", "ActiveMQ"),
    FailoverOption("maxReconnectDelay", "max_retry_interval", "int", "ActiveMQ"),
    FailoverOption("backOffMultiplier", "retry_interval_multiplier", "float", "ActiveMQ"),
    FailoverOption(
        "reconnectDelayExponent",
        "retry_interval_multiplier",
        "float",
        "ActiveMQ (older name of backOffMultiplier)",
    ),
    FailoverOption(
        "useExponentialBackOff",
        "retry_interval_multiplier",
        "bool",
        "ActiveMQ: false sets the multiplier to 1.0 (wins over a multiplier in the same "
        "URL); true changes nothing",
    ),
    FailoverOption(
        "maxReconnectAttempts",
        "reconnect_attempts",
        "int",
        "ActiveMQ 5.6+ semantics: -1 forever, 0 no reconnect, N attempts "
        "(before 5.6, 0 meant forever; that meaning is not supported)",
    ),
    FailoverOption(
        "startupMaxReconnectAttempts",
        "initial_connect_attempts",
        "int",
        "ActiveMQ counts RE-tries after the first attempt: N >= 0 becomes N + 1 "
        "attempts, -1 (forever) stays -1",
    ),
    FailoverOption(
        "timeout",
        "call_timeout",
        "int",
        "ActiveMQ send timeout in ms; its -1 (block forever) is refused: call_timeout must be > 0",
    ),
)

_BY_NORMAL = {normalize_name(o.name): o for o in FAILOVER_OPTIONS}
_FAILOVER_NAMES = [o.name for o in FAILOVER_OPTIONS]
_CONFIG_FIELDS = {normalize_name(f.name): f.name for f in dataclasses.fields(Config)}

# ActiveMQ / Artemis options that are known but have no meaning here, with the reason.
_UNSUPPORTED = {
    "trackmessages": "the sidecar always keeps a confirmation window (confirmation_window_size)",
    "maxcachesize": "the confirmation window is sized by confirmation_window_size",
    "backup": "the sidecar opens one upstream connection per app session",
    "clientfailurecheckperiod": "dead brokers are found by STOMP heart-beats "
    "(upstream_heartbeat, heartbeat_grace)",
    "connectionttl": "dead brokers are found by STOMP heart-beats "
    "(upstream_heartbeat, heartbeat_grace)",
}

# Per-broker query options (normalized name -> canonical name). ``sslEnabled``, ``verifyHost``
# and ``sniHost`` are Artemis' connector parameters ("Configuring the Transport", Netty
# TLS/SSL); ``verifyHostName`` is ActiveMQ Classic's (``socket.verifyHostName``). In the
# failover query they apply to every broker that does not set its own, as Artemis applies a
# connection factory URL's parameters to each connector.
_BROKER_OPTIONS = {"host": "host", "vhost": "vhost"}
_TLS_OPTIONS = {
    "sslenabled": "sslEnabled",
    "verifyhost": "verifyHost",
    "verifyhostname": "verifyHost",
    "socket.verifyhostname": "verifyHost",
    "transport.verifyhostname": "verifyHost",
    "snihost": "sniHost",
}

_PEM_CA = "tls_ca_file (a PEM bundle of the CAs to trust)"
_PEM_CLIENT = "tls_cert_file + tls_key_file (+ tls_key_password_file), PEM files"
# Java keystore and JSSE options: the sidecar reads PEM (what a Kubernetes TLS Secret and
# cert-manager hold), so each is refused with the option that replaces it.
_JAVA_TLS = {
    "truststorepath": _PEM_CA,
    "truststorepassword": _PEM_CA,
    "truststoretype": _PEM_CA,
    "truststoreprovider": _PEM_CA,
    "truststorealias": _PEM_CA,
    "keystorepath": _PEM_CLIENT,
    "keystorepassword": _PEM_CLIENT,
    "keystoretype": _PEM_CLIENT,
    "keystoreprovider": _PEM_CLIENT,
    "keystorealias": _PEM_CLIENT,
    "trustall": "tls_ca_file with the broker's CA (trusting every certificate is not offered)",
    "enabledprotocols": "tls_min_version",
    "enabledciphersuites": "tls_ciphers (an OpenSSL cipher list)",
    "sslprovider": "nothing: the sidecar always uses OpenSSL through Python's ssl module",
    "crlpath": "nothing: certificate revocation lists are not supported",
}


def _tls_option(
    shown: str, key: str, value: str, settings: dict[str, object], problems: list[str]
) -> bool:
    """Record a TLS URL option in ``settings``; False (with a problem) if it is not good."""
    normal = normalize_name(key)
    canonical = _TLS_OPTIONS[normal]
    if canonical in settings:
        problems.append(f"{shown}: {canonical!r} given twice")
        return False
    if canonical == "sniHost":
        if not is_host_name(value):
            problems.append(f"{shown}: {key!r} must be a host name, got {value!r}")
            return False
        settings[canonical] = value
        return True
    try:
        settings[canonical] = parse_bool(value)
    except InvalidValue as exc:
        problems.append(f"{shown}: {key!r}: {exc}, got {value!r}")
        return False
    return True


def _java_tls_problem(shown: str, key: str) -> str | None:
    replacement = _JAVA_TLS.get(normalize_name(key))
    if replacement is None:
        return None
    return f"{shown}: {key!r} (a Java keystore/JSSE option) is not supported; use {replacement}"


class UrlSetting(NamedTuple):
    """A typed value set by a failover option, with the option name as written."""

    value: object
    option: str


@dataclass
class ParsedUrl:
    """What :func:`parse_url` found; ``problems`` is empty when the URL is good."""

    brokers: list[Broker]
    options: dict[str, UrlSetting]
    problems: list[str]


def redact_uri(text: str) -> str:
    """``text`` with any user info replaced by ``***`` (``stomp://***@host:61613``)."""
    if "@" not in text:
        return text
    after = text.rsplit("@", 1)[1]
    m = _SCHEME.match(text)
    return f"{m.group(0)}***@{after}" if m else f"***@{after}"


def _query_pairs(query: str) -> list[tuple[str, str]]:
    pairs = []
    for piece in query.split("&"):
        if not piece:
            continue
        key, _, value = piece.partition("=")
        pairs.append((unquote(key).strip(), unquote(value)))
    return pairs


def _parse_failover_query(
    query: str, problems: list[str]
) -> tuple[dict[str, UrlSetting], dict[str, object]]:
    options: dict[str, UrlSetting] = {}
    nested: dict[str, object] = {}
    seen: dict[str, str] = {}  # canonical option or field -> name as written
    backoff_off: str | None = None
    for key, value in _query_pairs(query):
        if key.lower().startswith("nested."):
            sub = key[len("nested.") :]
            if normalize_name(sub) not in _BROKER_OPTIONS:
                problems.append(
                    f"unknown broker option {sub!r} in failover option {key!r}"
                    f"{suggest(sub, _BROKER_OPTIONS)}"
                )
            elif "host" in nested:
                problems.append(f"failover option {key!r}: virtual host given twice")
            else:
                nested["host"] = value
            continue
        normal = normalize_name(key)
        if normal in _TLS_OPTIONS:
            _tls_option("failover option", key, value, nested, problems)
            continue
        java = _java_tls_problem("failover URL", key)
        if java is not None:
            problems.append(java)
            continue
        spec = _BY_NORMAL.get(normal)
        if spec is None:
            if normal in _UNSUPPORTED:
                problems.append(f"unsupported failover option {key!r}: {_UNSUPPORTED[normal]}")
            elif normal in _CONFIG_FIELDS:
                problems.append(
                    f"{key!r} is not a failover option; set the option "
                    f"{_CONFIG_FIELDS[normal]!r} instead (config file, environment or CLI)"
                )
            else:
                problems.append(f"unknown failover option {key!r}{suggest(key, _FAILOVER_NAMES)}")
            continue
        try:
            typed: object
            if spec.kind == "int":
                typed = parse_int(value)
            elif spec.kind == "float":
                typed = parse_float(value)
            else:
                typed = parse_bool(value)
        except InvalidValue as exc:
            problems.append(f"failover option {key!r}: {exc}, got {value!r}")
            continue
        slot = spec.name if spec.name == "useExponentialBackOff" else spec.field
        if slot in seen:
            earlier = seen[slot]
            if normalize_name(earlier) == normal:
                problems.append(f"failover option {key!r} given twice")
            else:
                problems.append(f"failover options {earlier!r} and {key!r} both set {spec.field}")
            continue
        seen[slot] = key
        if spec.name == "useExponentialBackOff":
            if typed is False:
                backoff_off = key
            continue
        if spec.name == "startupMaxReconnectAttempts":
            assert isinstance(typed, int)
            typed = typed + 1 if typed >= 0 else typed
        options[spec.field] = UrlSetting(typed, key)
    if backoff_off is not None:
        options["retry_interval_multiplier"] = UrlSetting(1.0, backoff_off)
    return options, nested


def _parse_entry(entry: str, nested: dict[str, object], problems: list[str]) -> Broker | None:
    shown = redact_uri(entry)
    m = _SCHEME.match(entry)
    if m is None:
        problems.append(f"{shown!r}: missing scheme (expected e.g. 'stomp://{shown}')")
        return None
    scheme = m.group(1).lower()
    tls = scheme in TLS_SCHEMES
    ok = tls or scheme in PLAIN_SCHEMES
    if not ok:
        known = ", ".join(PLAIN_SCHEMES + TLS_SCHEMES)
        problems.append(f"{shown!r}: unsupported scheme {scheme!r} (expected one of {known})")
    rest = entry[m.end() :]
    login: str | None = None
    passcode: Secret | None = None
    if "@" in rest:
        userinfo, rest = rest.rsplit("@", 1)
        user, has_pass, password = userinfo.partition(":")
        login = unquote(user)
        passcode = Secret(unquote(password)) if has_pass else None
        if not login:
            problems.append(f"{shown!r}: empty login in user info")
            ok = False
    if "#" in rest:
        problems.append(f"{shown!r}: a fragment ('#...') is not allowed")
        rest = rest.split("#", 1)[0]
        ok = False
    hostport, _, query = rest.partition("?")
    hostport, _, path = hostport.partition("/")
    if path:
        problems.append(f"{shown!r}: unexpected path '/{path}'")
        ok = False
    if "," in hostport:
        hostport, *extras = hostport.split(",")
        for extra in extras:
            if extra.strip():
                problems.append(
                    f"{extra.strip()!r}: missing scheme (expected e.g. 'stomp://{extra.strip()}')"
                )
            else:
                problems.append(f"{shown!r}: empty entry in the broker list")
        ok = False
    virtual_host: str | None = None
    own_tls: dict[str, object] = {}
    dns: str | None = None
    for key, value in _query_pairs(query):
        normal = normalize_name(key)
        java = _java_tls_problem(repr(shown), key)
        if normal == "dns":
            dns = value.strip().lower()
        elif normal in _TLS_OPTIONS:
            ok = _tls_option(repr(shown), key, value, own_tls, problems) and ok
        elif java is not None:
            problems.append(java)
            ok = False
        elif normal in _BROKER_OPTIONS:
            if virtual_host is not None:
                problems.append(f"{shown!r}: virtual host given twice")
                ok = False
            virtual_host = value
        elif normal in _BY_NORMAL:
            problems.append(
                f"{shown!r}: {key!r} is a failover option, not a broker option; "
                f"write failover:(...)?{key}=..."
            )
            ok = False
        else:
            problems.append(
                f"{shown!r}: unknown broker option {key!r}{suggest(key, _BROKER_OPTIONS)}"
            )
            ok = False
    if virtual_host is None and isinstance(nested.get("host"), str):
        virtual_host = str(nested["host"])
    tls_settings = {**nested, **own_tls}
    ssl_enabled = tls_settings.get("sslEnabled")
    if ssl_enabled is False and tls and "sslEnabled" in own_tls:
        problems.append(f"{shown!r}: sslEnabled=false contradicts the TLS scheme {scheme!r}")
        ok = False
    tls = tls or ssl_enabled is True
    try:
        host, port = parse_address(hostport, default_port=DEFAULT_TLS_PORT if tls else DEFAULT_PORT)
    except ValueError as exc:
        problems.append(f"{shown!r}: {exc}")
        return None
    if port == 0:
        problems.append(f"{shown!r}: broker port must be 1..65535, got 0")
        ok = False
    dns = dns_kind(dns, host, ":" in hostport.lstrip("[").rpartition("]")[2], problems, shown)
    ok = ok and dns != ""
    verify = tls_settings.get("verifyHost")
    sni = tls_settings.get("sniHost")
    if virtual_host is not None and (not virtual_host or _CONTROL.search(virtual_host)):
        problems.append(
            f"{shown!r}: the virtual host must be non-empty text without control characters"
        )
        ok = False
    if not ok:
        return None
    return Broker(
        host,
        port,
        tls,
        login,
        passcode,
        virtual_host,
        verify_hostname=verify if isinstance(verify, bool) else None,
        server_name=sni if isinstance(sni, str) else None,
        dns=dns,
    )


def parse_url(text: str) -> ParsedUrl:
    """Parse a broker URL, collecting problems instead of raising (see module doc).

    ``options`` maps ``Config`` field names to :class:`UrlSetting` (typed value plus the
    option name as written, for messages). Ranges are not checked here; the loader
    does that, naming where the value came from.
    """
    problems: list[str] = []
    options: dict[str, UrlSetting] = {}
    nested: dict[str, object] = {}
    s = text.strip()
    if not s:
        return ParsedUrl([], {}, ["empty broker URL"])
    body = s
    m = _FAILOVER_PREFIX.match(s)
    if m is not None:
        rest = s[m.end() :].strip()
        rest = rest.removeprefix("//")
        if rest.startswith("("):
            close = rest.rfind(")")
            if close < 0:
                return ParsedUrl([], {}, ["missing ')' in failover URL"])
            body = rest[1:close]
            tail = rest[close + 1 :].strip()
            if tail.startswith("?"):
                options, nested = _parse_failover_query(tail[1:], problems)
            elif tail:
                problems.append(
                    "unexpected text after ')' in failover URL (expected '?option=value')"
                )
        else:
            body = rest
        if not body.strip():
            problems.append("no brokers in failover URL")
    brokers = []
    body = body.strip()
    for entry in _ENTRY_SPLIT.split(body) if body else []:
        broker = _parse_entry(entry.strip(), nested, problems)
        if broker is not None:
            brokers.append(broker)
    return ParsedUrl(brokers, options, problems)


def parse_broker_url(text: str) -> tuple[tuple[Broker, ...], dict[str, object]]:
    """Parse a failover URL into brokers and failover options.

    Forms: ``failover:(uri,...)?options``, ``failover://(uri,...)?options``,
    ``failover:uri,uri``, a bare ``stomp://host:port`` and a comma list of URIs.
    Schemes ``stomp``, ``tcp``, ``stomp+nio``, ``nio`` (plain) and ``stomp+ssl``,
    ``stomp+tls``, ``ssl``, ``tls`` (TLS); default port 61613, 61614 for TLS. User info
    (percent-decoded) sets ``Broker.login``/``passcode``; broker option ``host`` (alias
    ``vhost``) sets ``Broker.virtual_host``.

    Failover options (Artemis names, their snake_case ``Config`` names, and the
    ActiveMQ Classic aliases listed in :data:`FAILOVER_OPTIONS`) are returned mapped
    to ``Config`` field names with typed values, e.g.
    ``{"retry_interval": 100, "randomize": False}``. Translations:
    ``useExponentialBackOff=false`` -> ``retry_interval_multiplier=1.0``;
    ``startupMaxReconnectAttempts=N`` -> ``initial_connect_attempts=N+1`` (ActiveMQ
    counts retries after the first attempt; -1 stays -1).

    Raises:
        ConfigError: listing every problem (unknown options with a did-you-mean
            suggestion, bad schemes, hosts, ports, values). Never quotes credentials.
    """
    parsed = parse_url(text)
    if parsed.problems:
        raise ConfigError(parsed.problems)
    return tuple(parsed.brokers), {name: s.value for name, s in parsed.options.items()}
