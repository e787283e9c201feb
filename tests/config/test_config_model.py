"""The model (Secret, Broker, Config, ConfigError), the option table and the example file."""

from __future__ import annotations

import dataclasses
import json
import tomllib
from pathlib import Path

import pytest

import config
from config import (
    ENV_PREFIX,
    OPTIONS,
    Broker,
    Config,
    ConfigError,
    Secret,
    load_config,
    parse_broker_url,
)

EXAMPLE = Path(config.__file__).parent / "examples" / "mq-sidecar.toml"


def test_public_api() -> None:
    for name in (
        "Config",
        "Broker",
        "Secret",
        "ConfigError",
        "load_config",
        "parse_broker_url",
        "parse_address",
        "OPTIONS",
        "ENV_PREFIX",
    ):
        assert name in config.__all__
        assert hasattr(config, name)
    assert ENV_PREFIX == "MQ_SIDECAR_"


# --------------------------------------------------------------------------------------
# Secret


def test_secret_hides_itself() -> None:
    secret = Secret("hunter2")
    assert repr(secret) == "Secret('***')"
    assert str(secret) == "***"
    assert f"{secret}" == "***"
    assert f"{secret!r}" == "Secret('***')"
    assert "%s" % secret == "***"  # noqa: UP031 - the old style must hide it too
    assert secret.reveal() == "hunter2"
    assert secret.matches("hunter2")
    assert not secret.matches("hunter3")
    assert not secret.matches("")
    assert Secret("pässword").matches("pässword")
    assert secret == Secret("hunter2")
    assert secret != Secret("other")
    assert hash(secret) == hash(Secret("hunter2"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        secret.value = "x"  # type: ignore[misc]


# --------------------------------------------------------------------------------------
# Broker


@pytest.mark.parametrize(
    ("broker", "label"),
    [
        (Broker("mq.example", 61613), "mq.example:61613"),
        (Broker("10.0.0.1", 1), "10.0.0.1:1"),
        (Broker("::1", 61613), "[::1]:61613"),
        (Broker("fe80::1%eth0", 5, tls=True), "[fe80::1%eth0]:5"),
    ],
)
def test_broker_label(broker: Broker, label: str) -> None:
    assert broker.label == label
    assert str(broker) == label
    assert f"{broker}" == label


def test_broker_repr_hides_credentials() -> None:
    broker = Broker("mq", 1, True, "alice", Secret("pw"), "/")
    assert repr(broker) == (
        "Broker(host='mq', port=1, tls=True, login='***', passcode=Secret('***'), "
        "virtual_host='/', verify_hostname=None, server_name=None, dns=None)"
    )
    assert repr(Broker("mq", 1)) == (
        "Broker(host='mq', port=1, tls=False, login=None, passcode=None, virtual_host=None, "
        "verify_hostname=None, server_name=None, dns=None)"
    )
    assert str(broker) == "mq:1"


def test_broker_defaults_and_frozen() -> None:
    broker = Broker("mq", 61613)
    assert (broker.tls, broker.login, broker.passcode, broker.virtual_host) == (
        False,
        None,
        None,
        None,
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        broker.port = 1  # type: ignore[misc]


# --------------------------------------------------------------------------------------
# Config


def test_config_defaults() -> None:
    cfg = Config()
    assert cfg.listen == ("127.0.0.1", 61613)
    assert cfg.admin_listen == ("0.0.0.0", 9464)
    assert cfg.broker_probe_interval == 5_000
    assert cfg.brokers == ()
    assert (cfg.retry_interval, cfg.retry_interval_multiplier, cfg.max_retry_interval) == (
        100,
        2.0,
        5000,
    )
    assert (cfg.reconnect_attempts, cfg.initial_connect_attempts) == (-1, 3)
    assert (cfg.reconnect_period, cfg.jitter) == (300_000, 1.0)
    assert (cfg.call_timeout, cfg.confirmation_window_size) == (30_000, 1_048_576)
    assert (cfg.upstream_heartbeat, cfg.client_heartbeat) == ((5000, 5000), (10_000, 10_000))
    assert (cfg.failover_mode, cfg.transaction_failover) == ("transparent", "replay")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.jitter = 0.5  # type: ignore[misc]


def test_redacted_view() -> None:
    cfg = Config(
        listen=("::1", 0),
        brokers=(Broker("a", 1, login="u", passcode=Secret("p")), Broker("::1", 2)),
        login="svc",
        passcode=Secret("pw"),
        client_passcode=None,
    )
    view = cfg.redacted()
    assert json.loads(json.dumps(view)) == view
    assert list(view) == [f.name for f in dataclasses.fields(Config)]
    assert view["listen"] == "[::1]:0"
    assert view["admin_listen"] == "0.0.0.0:9464"
    assert view["brokers"] == ["a:1", "[::1]:2"]
    assert (view["login"], view["passcode"]) == ("***", "***")
    assert (view["client_login"], view["client_passcode"]) == (None, None)
    assert view["upstream_heartbeat"] == [5000, 5000]
    assert view["retry_interval"] == 100
    assert "svc" not in json.dumps(view)
    assert "pw" not in json.dumps(view)


def test_config_repr_hides_credentials() -> None:
    cfg = Config(
        brokers=(Broker("a", 1, login="brokeruser", passcode=Secret("brokerpw")),),
        login="svcuser",
        passcode=Secret("svcpw"),
        client_login="appuser",
        client_passcode=Secret("apppw"),
    )
    text = repr(cfg) + str(cfg)
    for word in ("brokeruser", "brokerpw", "svcuser", "svcpw", "appuser", "apppw"):
        assert word not in text
    assert "login='***'" in text
    assert "passcode=Secret('***')" in text
    assert "retry_interval=100" in text


def test_config_error() -> None:
    err = ConfigError(["a: bad", "b: worse"])
    assert err.problems == ["a: bad", "b: worse"]
    assert str(err) == "a: bad\nb: worse"
    assert isinstance(err, Exception)


# --------------------------------------------------------------------------------------
# option table


def test_option_table_covers_every_field_in_order() -> None:
    fields = [f.name for f in dataclasses.fields(Config)]
    assert list(OPTIONS) == fields
    defaults = Config()
    for name, option in OPTIONS.items():
        assert option.name == name
        assert option.help
        assert option.env_var == "MQ_SIDECAR_" + name.upper()
        assert option.cli_flag == "--" + name.replace("_", "-")
        assert option.default == getattr(defaults, name)
        if option.kind == "enum":
            assert option.default in option.choices
    with pytest.raises(TypeError):
        OPTIONS["x"] = OPTIONS["jitter"]  # type: ignore[index]


def test_option_kinds_match_default_types() -> None:
    kinds = {
        "int": int,
        "float": float,
        "bool": bool,
        "address": tuple,
        "heartbeat": tuple,
        "brokers": tuple,
    }
    for option in OPTIONS.values():
        if option.kind == "enum":  # a str, or a StrEnum (failover_mode, transaction_failover)
            assert isinstance(option.default, str), option.name
            assert option.default in option.choices, option.name
        elif option.kind in kinds:
            assert type(option.default) is kinds[option.kind], option.name
        else:
            assert option.default is None or isinstance(option.default, str), option.name


def test_option_url_names_and_credentials() -> None:
    assert OPTIONS["retry_interval"].url_options == ("retryInterval", "initialReconnectDelay")
    assert OPTIONS["retry_interval_multiplier"].url_options == (
        "retryIntervalMultiplier",
        "backOffMultiplier",
        "reconnectDelayExponent",
        "useExponentialBackOff",
    )
    assert OPTIONS["heartbeat_grace"].url_options == ()
    assert {n for n, o in OPTIONS.items() if o.credential} == {
        "login",
        "passcode",
        "client_login",
        "client_passcode",
    }
    assert OPTIONS["passcode"].kind == OPTIONS["client_passcode"].kind == "secret"


def test_ms_and_byte_options_say_their_unit() -> None:
    for option in OPTIONS.values():
        if option.unit == "ms":
            assert "ms" in option.help, option.name
        if option.unit == "bytes":
            assert "bytes" in option.help, option.name


# --------------------------------------------------------------------------------------
# the example file


def test_example_file_loads_and_equals_the_defaults() -> None:
    cfg = load_config(path=EXAMPLE, env={})
    brokers, options = parse_broker_url(tomllib.loads(EXAMPLE.read_text())["brokers"])
    assert options == {}
    assert cfg == Config(brokers=brokers)
    assert [b.label for b in cfg.brokers] == [
        "broker-a.messaging.svc:61613",
        "broker-b.messaging.svc:61614",
    ]


def test_example_file_shows_every_option_with_a_reason() -> None:
    lines = EXAMPLE.read_text().splitlines()
    data = tomllib.loads(EXAMPLE.read_text())
    for name in OPTIONS:
        if OPTIONS[name].default is None:
            # no TOML null: unset options are shown commented out
            assert any(line.startswith(f"# {name} = ") for line in lines), name
            continue
        assert name in data, name
        (index,) = [i for i, line in enumerate(lines) if line.startswith(f"{name} = ")]
        assert lines[index - 1].startswith("# "), f"{name} has no reason above it"
