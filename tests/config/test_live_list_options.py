"""The live broker list's options: the ``dns`` broker option (every address, SRV), the brokers
file's format (one URL per line, problems by line), ``dns_servers`` and
``dns_refresh_interval`` (docs/configuration.md, "A live broker list")."""

from __future__ import annotations

from pathlib import Path

import pytest

from config import ConfigError, load_config, parse_broker_url, parse_dns_server, read_brokers_file


def test_the_dns_option_and_srv_names() -> None:
    (srv,), _ = parse_broker_url("stomp://_stomp._tcp.rabbitmq.ns.svc")
    assert (srv.host, srv.dns) == ("_stomp._tcp.rabbitmq.ns.svc", "srv")
    (every,), _ = parse_broker_url("stomp+ssl://mq-headless.ns.svc:61614?dns=all&host=/")
    assert (every.dns, every.tls, every.virtual_host) == ("all", True, "/")
    (plain,), _ = parse_broker_url("stomp://mq.ns.svc:61613")
    assert plain.dns is None


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("stomp://_stomp._tcp.x:61613", "an SRV name takes no port (its records give the ports)"),
        ("stomp://127.0.0.1:61613?dns=all", "option 'dns=all' needs a DNS name, got '127.0.0.1'"),
        ("stomp://a:61613?dns=every", "option 'dns' must be 'all' or 'srv', got 'every'"),
    ],
)
def test_bad_dns_options_are_refused_with_the_reason(url: str, problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_broker_url(url)
    assert caught.value.problems == [f"{url!r}: {problem}"]


def test_the_brokers_file_names_its_bad_lines(tmp_path: Path) -> None:
    path = tmp_path / "brokers.txt"
    path.write_text(
        "# brokers\n\nstomp://a:61613\nstomp://b:0\n"
        "failover:(stomp://c:61613)?retryInterval=5\nstomp://A:61613\n"
        "stomp://user:secret@d:61613?bogus=1\n"
    )
    brokers, problems = read_brokers_file(str(path))
    assert brokers == ()
    assert problems == [
        "line 4: 'stomp://b:0': broker port must be 1..65535, got 0",
        "line 5: failover options (retryInterval) belong in the configuration, not in the "
        "brokers file",
        "line 6: A:61613 listed twice (first on line 3)",
        "line 7: 'stomp://***@d:61613?bogus=1': unknown broker option 'bogus'",
    ]
    path.write_text("stomp://a:61613\n  stomp://_stomp._tcp.b  \n")
    brokers, problems = read_brokers_file(str(path))
    assert ([b.label for b in brokers], problems) == (["a:61613", "_stomp._tcp.b:61613"], [])
    assert read_brokers_file(str(tmp_path / "none"))[1] == [
        f"cannot read {tmp_path / 'none'}: No such file or directory"
    ]


def test_dns_servers_and_the_refresh_interval_are_checked() -> None:
    assert parse_dns_server("10.96.0.10") == ("10.96.0.10", 53)
    assert parse_dns_server("[::1]:5353") == ("::1", 5353)
    with pytest.raises(ConfigError) as caught:
        load_config(
            env={},
            overrides={
                "brokers": "stomp://a:61613",
                "dns_servers": "10.0.0.1:53,dns.example",
                "dns_refresh_interval": "0",
            },
        )
    assert caught.value.problems == [
        "dns_refresh_interval: must be > 0, got 0 (from --dns-refresh-interval)",
        "dns_servers: 'dns.example' is not an IP address (with an optional :port) "
        "(from --dns-servers)",
    ]


def test_a_brokers_file_alone_is_a_broker_list_and_is_not_opened_by_the_loader() -> None:
    config = load_config(env={}, overrides={"brokers_file": "/nonexistent/brokers.txt"})
    assert (config.brokers, config.brokers_file) == ((), "/nonexistent/brokers.txt")
    assert config.dns_refresh_interval == 5000
    assert config.durations.dns_refresh_interval == 5.0
    with pytest.raises(ConfigError, match="no brokers configured"):
        load_config(env={}, overrides={})
