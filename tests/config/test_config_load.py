"""load_config: precedence, TOML/env/CLI syntax, URL-option layering, validation."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from config import Broker, Config, ConfigError, Secret, load_config

ONE = "stomp://mq:61613"
MQ = (Broker("mq", 61613),)


def write(tmp_path: Path, text: str, name: str = "mq-sidecar.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def problems_of(
    *,
    path: Path | None = None,
    env: dict[str, str] | None = None,
    overrides: dict[str, object | None] | None = None,
) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(path=path, env={} if env is None else env, overrides=overrides)
    assert str(info.value) == "\n".join(info.value.problems)
    return info.value.problems


# --------------------------------------------------------------------------------------
# sources and precedence


def test_defaults_plus_brokers() -> None:
    assert load_config(env={"MQ_SIDECAR_BROKERS": ONE}) == Config(brokers=MQ)


def test_env_none_means_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MQ_SIDECAR_BROKERS", ONE)
    monkeypatch.setenv("MQ_SIDECAR_RETRY_INTERVAL", "42")
    assert load_config().retry_interval == 42


def test_precedence_key_by_key(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        f"""
        brokers = "{ONE}"
        retry_interval = 1000
        max_retry_interval = 8000
        jitter = 0.5
        randomize = true
        log_level = "debug"
        """,
    )
    env = {
        "MQ_SIDECAR_MAX_RETRY_INTERVAL": "9000",
        "MQ_SIDECAR_JITTER": "0.25",
        "MQ_SIDECAR_LOG_FORMAT": "json",
    }
    overrides: dict[str, object | None] = {"jitter": "0.1", "randomize": None, "log_level": None}
    cfg = load_config(path=path, env=env, overrides=overrides)
    assert cfg.retry_interval == 1000  # file
    assert cfg.max_retry_interval == 9000  # env beats file
    assert cfg.jitter == 0.1  # override beats env and file
    assert cfg.randomize is True  # None override = not given: file stays
    assert cfg.log_level == "debug"
    assert cfg.log_format == "json"  # env over default
    assert cfg.heartbeat_grace == 2.0  # default


def test_config_file_from_env(tmp_path: Path) -> None:
    path = write(tmp_path, f'brokers = "{ONE}"\nretry_interval = 7\n')
    other = write(tmp_path, f'brokers = "{ONE}"\nretry_interval = 8\n', "other.toml")
    assert load_config(env={"MQ_SIDECAR_CONFIG": str(path)}).retry_interval == 7
    # an explicit path wins over MQ_SIDECAR_CONFIG
    assert load_config(path=other, env={"MQ_SIDECAR_CONFIG": str(path)}).retry_interval == 8
    # empty MQ_SIDECAR_CONFIG = no file; it is never "unknown"
    assert load_config(env={"MQ_SIDECAR_CONFIG": "", "MQ_SIDECAR_BROKERS": ONE}).brokers == MQ


# --------------------------------------------------------------------------------------
# URL options layer where the URL was given


def test_explicit_key_beats_url_option_in_same_file(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        retry_interval = 500
        brokers = "failover:(stomp://mq:61613)?retryInterval=100&randomize=true"
        """,
    )
    cfg = load_config(path=path, env={})
    assert cfg.retry_interval == 500
    assert cfg.randomize is True


def test_url_option_in_env_beats_file_key(tmp_path: Path) -> None:
    path = write(tmp_path, f'brokers = "{ONE}"\nretry_interval = 500\n')
    env = {"MQ_SIDECAR_BROKERS": "failover:(stomp://b:1)?initialReconnectDelay=50"}
    cfg = load_config(path=path, env=env)
    assert cfg.retry_interval == 50
    assert cfg.brokers == (Broker("b", 1),)


def test_explicit_env_key_beats_url_option_in_env() -> None:
    env = {
        "MQ_SIDECAR_BROKERS": "failover:(stomp://b:1)?retryInterval=50",
        "MQ_SIDECAR_RETRY_INTERVAL": "70",
    }
    assert load_config(env=env).retry_interval == 70


def test_env_key_beats_url_option_in_file(tmp_path: Path) -> None:
    path = write(tmp_path, 'brokers = "failover:(stomp://b:1)?retryInterval=50"\n')
    assert load_config(path=path, env={"MQ_SIDECAR_RETRY_INTERVAL": "70"}).retry_interval == 70


def test_cli_url_option_beats_env_key() -> None:
    cfg = load_config(
        env={"MQ_SIDECAR_BROKERS": ONE, "MQ_SIDECAR_CALL_TIMEOUT": "1000"},
        overrides={"brokers": "failover:(stomp://c:3)?timeout=2000"},
    )
    assert cfg.call_timeout == 2000
    assert cfg.brokers == (Broker("c", 3),)


def test_url_options_of_a_lower_layer_survive_a_new_broker_list(tmp_path: Path) -> None:
    # key by key: a later layer's plain URL replaces the brokers, not the other keys.
    path = write(tmp_path, 'brokers = "failover:(stomp://a:1)?randomize=true"\n')
    cfg = load_config(path=path, env={"MQ_SIDECAR_BROKERS": "stomp://b:2"})
    assert cfg.brokers == (Broker("b", 2),)
    assert cfg.randomize is True


def test_url_option_validation_names_the_option_and_source() -> None:
    assert problems_of(env={"MQ_SIDECAR_BROKERS": "failover:(stomp://a:1)?timeout=-1"}) == [
        "call_timeout: must be > 0, got -1 (from failover option 'timeout' of MQ_SIDECAR_BROKERS)"
    ]


# --------------------------------------------------------------------------------------
# TOML syntax


def test_toml_types(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        f"""
        brokers = "{ONE}"
        listen = "[::1]:0"
        admin_listen = "127.0.0.1:19464"
        upstream_heartbeat = [1000, 0]
        client_heartbeat = "2000, 3000"
        jitter = 1
        heartbeat_grace = 1.5
        priority_backup = true
        events_destination = "/queue/events"
        failover_mode = "STRICT"
        login = "svc"
        passcode = "pw"
        """,
    )
    cfg = load_config(path=path, env={})
    assert cfg.listen == ("::1", 0)
    assert cfg.admin_listen == ("127.0.0.1", 19464)
    assert cfg.upstream_heartbeat == (1000, 0)
    assert cfg.client_heartbeat == (2000, 3000)
    assert cfg.jitter == 1.0
    assert isinstance(cfg.jitter, float)
    assert cfg.heartbeat_grace == 1.5
    assert cfg.priority_backup is True
    assert cfg.events_destination == "/queue/events"
    assert cfg.failover_mode == "strict"
    assert (cfg.login, cfg.passcode) == ("svc", Secret("pw"))


def test_toml_broker_list_of_urls(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        'brokers = ["stomp://a:1?host=/", "failover:(stomp+ssl://b)?randomize=true"]\n',
    )
    cfg = load_config(path=path, env={})
    assert cfg.brokers == (Broker("a", 1, virtual_host="/"), Broker("b", 61614, tls=True))
    assert cfg.randomize is True


@pytest.mark.parametrize("key", ["brokers", "broker"])
def test_toml_broker_tables(tmp_path: Path, key: str) -> None:
    path = write(
        tmp_path,
        f"""
        [[{key}]]
        url = "stomp://127.0.0.1:61613"
        host = "/"
        login = "guest"
        passcode = "guest"

        [[{key}]]
        url = "stomp+ssl://u:p@[::1]"
        vhost = "prod"
        """,
    )
    cfg = load_config(path=path, env={})
    assert cfg.brokers == (
        Broker("127.0.0.1", 61613, False, "guest", Secret("guest"), "/"),
        Broker("::1", 61614, True, "u", Secret("p"), "prod"),
    )


def test_toml_broker_table_problems(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        [[brokers]]
        url = "stomp://u:pw@a:1?host=x"
        host = "y"
        login = "v"
        colour = "red"

        [[brokers]]
        host = "/"

        [[brokers]]
        url = "failover:(stomp://b:1,stomp://c:2)?randomize=true"

        [[brokers]]
        url = "stomp://d:1"
        passcode = 42
        """,
    )
    src = f"(from {path})"
    assert problems_of(path=path) == [
        f"brokers: unknown key 'colour' in [[brokers]] #1 {src}",
        f"brokers: [[brokers]] #1: virtual host given both in 'url' and as a key {src}",
        f"brokers: [[brokers]] #1: login given both in 'url' and as a key {src}",
        f"brokers: [[brokers]] #2 needs a 'url' string (one broker, e.g. stomp://host:61613) {src}",
        f"brokers: [[brokers]] #3: failover options (randomize) are not allowed in a broker "
        f"table; set them as top-level options {src}",
        f"brokers: [[brokers]] #3: 'url' must name exactly one broker {src}",
        f"brokers: [[brokers]] #4: 'passcode' must be a string, got integer {src}",
    ]


def test_toml_both_broker_keys(tmp_path: Path) -> None:
    path = write(tmp_path, f'brokers = "{ONE}"\n[[broker]]\nurl = "{ONE}"\n')
    assert problems_of(path=path) == [
        f"brokers: give either 'brokers' or [[broker]] tables, not both (from {path})"
    ]


def test_toml_wrong_types_name_key_type_and_file(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        f"""
        brokers = "{ONE}"
        retry_interval = "100"
        max_retry_interval = 5000.0
        randomize = "true"
        reconnect_attempts = true
        jitter = "full"
        listen = ["127.0.0.1", 61613]
        upstream_heartbeat = [1, 2, 3]
        log_level = 3
        passcode = 12345
        login = "x"
        """,
    )
    src = f"(from {path})"
    assert problems_of(path=path) == [
        f"retry_interval: expected an integer (milliseconds), got string '100' {src}",
        f"max_retry_interval: expected an integer (milliseconds), got float 5000.0 {src}",
        f"randomize: expected a boolean, got string 'true' {src}",
        f"reconnect_attempts: expected an integer, got boolean True {src}",
        f"jitter: expected a number, got string 'full' {src}",
        f"listen: expected a 'host:port' string, got array ['127.0.0.1', 61613] {src}",
        "upstream_heartbeat: expected two integers [x, y] or 'x,y' (milliseconds), "
        f"got array [1, 2, 3] {src}",
        f"log_level: expected one of 'debug', 'info', 'warning', 'error', got integer 3 {src}",
        f"passcode: expected a string, got integer {src}",
    ]


def test_toml_unknown_keys(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        f"""
        brokers = "{ONE}"
        retry_intervall = 5
        retryInterval = 5
        colour = "blue"
        [reconnect]
        attempts = 3
        """,
    )
    assert problems_of(path=path) == [
        f"unknown option 'retry_intervall' in {path} (did you mean 'retry_interval'?)",
        f"unknown option 'retryInterval' in {path} (did you mean 'retry_interval'?)",
        f"unknown option 'colour' in {path}",
        f"unknown option 'reconnect' in {path} (did you mean 'reconnect_period'?)",
    ]


def test_file_errors_name_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    assert problems_of(path=missing, env={"MQ_SIDECAR_BROKERS": ONE}) == [
        f"config file {missing}: not found"
    ]
    (problem,) = problems_of(path=tmp_path, env={"MQ_SIDECAR_BROKERS": ONE})
    assert problem.startswith(f"config file {tmp_path}: cannot read it (")
    bad = write(tmp_path, f'brokers = "{ONE}"\nretry_interval = = 3\n')
    (problem,) = problems_of(path=bad)
    assert problem.startswith(f"config file {bad}: invalid TOML: ")
    assert "line 2" in problem
    binary = tmp_path / "latin1.toml"
    binary.write_bytes(b'login = "\xe9"\n')
    assert problems_of(path=binary, env={"MQ_SIDECAR_BROKERS": ONE}) == [
        f"config file {binary}: not UTF-8 (byte offset 9)"
    ]


# --------------------------------------------------------------------------------------
# environment


def test_env_value_syntax() -> None:
    env = {
        "MQ_SIDECAR_BROKERS": "failover:(stomp://a:1,stomp+ssl://b:2)",
        "MQ_SIDECAR_LISTEN": "[::1]:0",
        "MQ_SIDECAR_ADMIN_LISTEN": "localhost:9000",
        "MQ_SIDECAR_RETRY_INTERVAL": " 250 ",
        "MQ_SIDECAR_CONFIRMATION_WINDOW_SIZE": "1_048_576",
        "MQ_SIDECAR_RETRY_INTERVAL_MULTIPLIER": "1.5",
        "MQ_SIDECAR_HEARTBEAT_GRACE": "3",
        "MQ_SIDECAR_RANDOMIZE": "YES",
        "MQ_SIDECAR_PRIORITY_BACKUP": "on",
        "MQ_SIDECAR_UPSTREAM_HEARTBEAT": "1000, 2000",
        "MQ_SIDECAR_CLIENT_HEARTBEAT": "0,0",
        "MQ_SIDECAR_LOGIN": "svc",
        "MQ_SIDECAR_PASSCODE": "pw",
        "MQ_SIDECAR_LOG_LEVEL": "Warning",
    }
    cfg = load_config(env=env)
    assert cfg.brokers == (Broker("a", 1), Broker("b", 2, tls=True))
    assert cfg.listen == ("::1", 0)
    assert cfg.admin_listen == ("localhost", 9000)
    assert cfg.retry_interval == 250
    assert cfg.confirmation_window_size == 1_048_576
    assert cfg.retry_interval_multiplier == 1.5
    assert cfg.heartbeat_grace == 3.0
    assert cfg.randomize is True
    assert cfg.priority_backup is True
    assert cfg.upstream_heartbeat == (1000, 2000)
    assert cfg.client_heartbeat == (0, 0)
    assert (cfg.login, cfg.passcode) == ("svc", Secret("pw"))
    assert cfg.log_level == "warning"


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("true", True),
        ("1", True),
        ("yes", True),
        ("ON", True),
        ("false", False),
        ("0", False),
        ("No", False),
        ("off", False),
    ],
)
def test_env_booleans(text: str, value: bool) -> None:
    cfg = load_config(env={"MQ_SIDECAR_BROKERS": ONE, "MQ_SIDECAR_RANDOMIZE": text})
    assert cfg.randomize is value


def test_env_bad_values() -> None:
    env = {
        "MQ_SIDECAR_BROKERS": ONE,
        "MQ_SIDECAR_RETRY_INTERVAL": "fast",
        "MQ_SIDECAR_JITTER": "nan",
        "MQ_SIDECAR_RANDOMIZE": "maybe",
        "MQ_SIDECAR_LISTEN": ":61613",
        "MQ_SIDECAR_UPSTREAM_HEARTBEAT": "5000",
        "MQ_SIDECAR_MAX_HEADERS": "",
    }
    assert problems_of(env=env) == [
        "jitter: expected a finite number, got 'nan' (from MQ_SIDECAR_JITTER)",
        "listen: empty host in ':61613', got ':61613' (from MQ_SIDECAR_LISTEN)",
        "max_headers: expected an integer, got '' (from MQ_SIDECAR_MAX_HEADERS)",
        "randomize: expected a boolean (true/false, 1/0, yes/no, on/off), got 'maybe' "
        "(from MQ_SIDECAR_RANDOMIZE)",
        "retry_interval: expected an integer, got 'fast' (from MQ_SIDECAR_RETRY_INTERVAL)",
        "upstream_heartbeat: expected two integers 'x,y' (milliseconds), got '5000' "
        "(from MQ_SIDECAR_UPSTREAM_HEARTBEAT)",
    ]


def test_unknown_env_vars_are_ignored_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    env = {
        "MQ_SIDECAR_BROKERS": ONE,
        # what Kubernetes injects for a Service named mq-sidecar
        "MQ_SIDECAR_PORT": "tcp://10.0.0.7:61613",
        "MQ_SIDECAR_PORT_61613_TCP": "tcp://10.0.0.7:61613",
        "MQ_SIDECAR_PORT_61613_TCP_ADDR": "10.0.0.7",
        "MQ_SIDECAR_SERVICE_HOST": "10.0.0.7",
        "MQ_SIDECAR_SERVICE_PORT": "61613",
        "MQ_SIDECAR_RETRY_INTERVALL": "5",
        "MQ_SIDECAR_CONFIG": "",
        "OTHER_RETRY_INTERVAL": "x",
        "mq_sidecar_retry_interval": "x",
    }
    with caplog.at_level(logging.WARNING, logger="mq_sidecar.config"):
        cfg = load_config(env=env)
    assert cfg == Config(brokers=MQ)
    (record,) = caplog.records
    assert record.name == "mq_sidecar.config"
    assert record.levelno == logging.WARNING
    message = record.getMessage()
    for name in (
        "MQ_SIDECAR_PORT",
        "MQ_SIDECAR_PORT_61613_TCP_ADDR",
        "MQ_SIDECAR_SERVICE_HOST",
        "MQ_SIDECAR_SERVICE_PORT",
    ):
        assert name in message
    assert "MQ_SIDECAR_RETRY_INTERVALL (did you mean MQ_SIDECAR_RETRY_INTERVAL?)" in message
    assert "MQ_SIDECAR_CONFIG" not in message
    assert "OTHER" not in message
    assert "10.0.0.7" not in message  # values are never logged
    assert "enableServiceLinks" in message


def test_no_warning_without_unknown_vars(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="mq_sidecar.config"):
        load_config(env={"MQ_SIDECAR_BROKERS": ONE, "PATH": "/bin"})
    assert caplog.records == []


# --------------------------------------------------------------------------------------
# overrides (the CLI)


def test_overrides_strings_and_typed_values() -> None:
    brokers = (Broker("x", 1), Broker("y", 2, virtual_host="/"))
    cfg = load_config(
        env={},
        overrides={
            "brokers": brokers,
            "listen": ("::1", 0),
            "admin_listen": "0.0.0.0:0",
            "retry_interval": 300,
            "max_retry_interval": "6000",
            "jitter": 0,
            "randomize": "true",
            "priority_backup": True,
            "upstream_heartbeat": [0, 1000],
            "client_heartbeat": "0,0",
            "login": "svc",
            "passcode": Secret("pw"),
            "client_login": "app",
            "client_passcode": "apw",
            "log_format": "JSON",
            "drain_timeout": None,
        },
    )
    assert cfg.brokers == brokers
    assert cfg.listen == ("::1", 0)
    assert cfg.admin_listen == ("0.0.0.0", 0)
    assert (cfg.retry_interval, cfg.max_retry_interval) == (300, 6000)
    assert cfg.jitter == 0.0
    assert (cfg.randomize, cfg.priority_backup) == (True, True)
    assert (cfg.upstream_heartbeat, cfg.client_heartbeat) == ((0, 1000), (0, 0))
    assert cfg.passcode == Secret("pw")
    assert cfg.client_passcode == Secret("apw")
    assert cfg.log_format == "json"
    assert cfg.drain_timeout == 10_000


def test_overrides_problems_name_the_flag() -> None:
    assert problems_of(
        overrides={
            "brokers": ONE,
            "retry_interval": "soon",
            "randomize": 1,
            "listen": ("h", 70000),
            "heartbeat_grace": "1.0",
            "colour": "red",
            "retry_intervall": 5,
        }
    ) == [
        "retry_interval: expected an integer, got 'soon' (from --retry-interval)",
        "randomize: expected a boolean, got integer 1 (from --randomize)",
        "listen: port 70000 out of range 0..65535 in 'h:70000' (from --listen)",
        "unknown option 'colour' in overrides",
        "unknown option 'retry_intervall' in overrides (did you mean 'retry_interval'?)",
        "heartbeat_grace: must be > 1.0, got 1.0 (from --heartbeat-grace)",
    ]


def test_brokers_wrong_shapes() -> None:
    assert problems_of(overrides={"brokers": []}) == ["brokers: empty list (from --brokers)"]
    assert problems_of(overrides={"brokers": 5}) == [
        "brokers: expected a broker URL, a list of broker URLs or [[brokers]] tables, "
        "got integer 5 (from --brokers)"
    ]


# --------------------------------------------------------------------------------------
# validation


def test_no_brokers() -> None:
    assert problems_of() == [
        "no brokers configured: set `brokers` in the config file, MQ_SIDECAR_BROKERS or --brokers"
    ]


@pytest.mark.parametrize(
    ("var", "value", "problem"),
    [
        ("RETRY_INTERVAL", "0", "retry_interval: must be > 0, got 0"),
        ("RETRY_INTERVAL", "-5", "retry_interval: must be > 0, got -5"),
        (
            "RETRY_INTERVAL_MULTIPLIER",
            "0.5",
            "retry_interval_multiplier: must be >= 1.0, got 0.5",
        ),
        (
            "RECONNECT_ATTEMPTS",
            "-2",
            "reconnect_attempts: must be -1 (unlimited) or >= 0, got -2",
        ),
        (
            "INITIAL_CONNECT_ATTEMPTS",
            "0",
            "initial_connect_attempts: must be -1 (unlimited) or >= 1, got 0",
        ),
        (
            "INITIAL_CONNECT_ATTEMPTS",
            "-3",
            "initial_connect_attempts: must be -1 (unlimited) or >= 1, got -3",
        ),
        ("RECONNECT_PERIOD", "-1", "reconnect_period: must be >= 0 (0 = no time bound), got -1"),
        (
            "INITIAL_CONNECT_PERIOD",
            "-5",
            "initial_connect_period: must be >= 0 (0 = initial_connect_attempts alone bound a "
            "first connection), got -5",
        ),
        ("JITTER", "1.5", "jitter: must be between 0 and 1, got 1.5"),
        ("JITTER", "-0.1", "jitter: must be between 0 and 1, got -0.1"),
        ("CALL_TIMEOUT", "0", "call_timeout: must be > 0, got 0"),
        ("CONNECT_TIMEOUT", "-1", "connect_timeout: must be > 0, got -1"),
        ("HANDSHAKE_TIMEOUT", "0", "handshake_timeout: must be > 0, got 0"),
        ("DRAIN_TIMEOUT", "0", "drain_timeout: must be > 0, got 0"),
        ("BROKER_PROBE_INTERVAL", "0", "broker_probe_interval: must be > 0, got 0"),
        ("CONFIRMATION_WINDOW_SIZE", "0", "confirmation_window_size: must be > 0, got 0"),
        ("MAX_FRAME_BYTES", "0", "max_frame_bytes: must be > 0, got 0"),
        ("MAX_HEADERS", "-1", "max_headers: must be > 0, got -1"),
        ("MAX_HEADER_LINE_BYTES", "0", "max_header_line_bytes: must be > 0, got 0"),
        ("MAX_SUBSCRIPTIONS", "0", "max_subscriptions: must be > 0, got 0"),
        ("MAX_UNACKED", "0", "max_unacked: must be > 0, got 0"),
        (
            "UPSTREAM_HEARTBEAT",
            "-1,5",
            "upstream_heartbeat: both values must be >= 0, got -1,5",
        ),
        ("CLIENT_HEARTBEAT", "5,-1", "client_heartbeat: both values must be >= 0, got 5,-1"),
        ("HEARTBEAT_GRACE", "1", "heartbeat_grace: must be > 1.0, got 1.0"),
        (
            "EVENTS_DESTINATION",
            "",
            "events_destination: must be non-empty text without control characters, got ''",
        ),
        (
            "FAILOVER_MODE",
            "magic",
            "failover_mode: must be one of 'transparent', 'strict', got 'magic'",
        ),
        (
            "TRANSACTION_FAILOVER",
            "commit",
            "transaction_failover: must be one of 'replay', 'rollback', got 'commit'",
        ),
        (
            "LOG_LEVEL",
            "trace",
            "log_level: must be one of 'debug', 'info', 'warning', 'error', got 'trace'",
        ),
        ("LOG_FORMAT", "xml", "log_format: must be one of 'text', 'json', got 'xml'"),
    ],
)
def test_range_rules(var: str, value: str, problem: str) -> None:
    env = {"MQ_SIDECAR_BROKERS": ONE, f"MQ_SIDECAR_{var}": value}
    if var == "RETRY_INTERVAL":
        env["MQ_SIDECAR_MAX_RETRY_INTERVAL"] = "1"  # keep the cross-field rule quiet
        problem_list = problems_of(env=env)
        assert problem_list[0] == f"{problem} (from MQ_SIDECAR_{var})"
        return
    assert problems_of(env=env) == [f"{problem} (from MQ_SIDECAR_{var})"]


def test_boundaries_are_accepted() -> None:
    cfg = load_config(
        env={},
        overrides={
            "brokers": "stomp://a:1,stomp://b:65535",
            "retry_interval": 1,
            "max_retry_interval": 1,
            "retry_interval_multiplier": 1.0,
            "reconnect_attempts": -1,
            "initial_connect_attempts": -1,
            "reconnect_period": 0,
            "jitter": 0.0,
            "upstream_heartbeat": (0, 0),
            "heartbeat_grace": 1.001,
            "max_headers": 1,
            "listen": "127.0.0.1:0",
            "admin_listen": "[::]:0",
        },
    )
    assert cfg.max_retry_interval == cfg.retry_interval == 1
    assert load_config(env={}, overrides={"brokers": ONE, "reconnect_attempts": 0})


def test_max_retry_interval_names_both_sources(tmp_path: Path) -> None:
    path = write(tmp_path, f'brokers = "{ONE}"\nretry_interval = 10000\n')
    assert problems_of(path=path) == [
        f"max_retry_interval: must be >= retry_interval (10000 (from {path})), got 5000 (default)"
    ]


def test_a_value_that_failed_to_parse_is_not_range_checked() -> None:
    env = {"MQ_SIDECAR_BROKERS": ONE, "MQ_SIDECAR_RETRY_INTERVAL": "abc"}
    assert problems_of(env=env) == [
        "retry_interval: expected an integer, got 'abc' (from MQ_SIDECAR_RETRY_INTERVAL)"
    ]
    # a later layer's value is the one in effect, and it is range-checked
    assert problems_of(env=env, overrides={"retry_interval": "-1"}) == [
        "retry_interval: expected an integer, got 'abc' (from MQ_SIDECAR_RETRY_INTERVAL)",
        "retry_interval: must be > 0, got -1 (from --retry-interval)",
    ]


def test_brokers_that_failed_to_parse_do_not_also_report_no_brokers() -> None:
    assert problems_of(env={"MQ_SIDECAR_BROKERS": "stomp://a:x"}) == [
        "brokers: 'stomp://a:x': invalid port 'x' in 'a:x' (from MQ_SIDECAR_BROKERS)"
    ]


def test_broker_rules() -> None:
    assert problems_of(
        env={"MQ_SIDECAR_BROKERS": "stomp://u@a:1,stomp://A:1,stomp://b:2"},
        overrides={"login": "svc"},
    ) == [
        "brokers: broker #1 (a:1): login given without passcode (from MQ_SIDECAR_BROKERS)",
        "brokers: broker #2 (A:1): listed twice (from MQ_SIDECAR_BROKERS)",
        "login: given without passcode (from --login)",
    ]
    odd = (Broker("a", 0), Broker("", 1, login="", passcode=Secret("x")))
    assert problems_of(overrides={"brokers": odd}) == [
        "brokers: broker #1 (a:0): port must be 1..65535 (from --brokers)",
        "brokers: broker #2: empty host (from --brokers)",
        "brokers: broker #2 (:1): login must not be empty (from --brokers)",
    ]


def test_credentials_come_in_pairs() -> None:
    base = {"MQ_SIDECAR_BROKERS": ONE}
    assert problems_of(env={**base, "MQ_SIDECAR_PASSCODE": "pw"}) == [
        "passcode: given without login (from MQ_SIDECAR_PASSCODE)"
    ]
    assert problems_of(env={**base, "MQ_SIDECAR_CLIENT_LOGIN": "app"}) == [
        "client_login: given without client_passcode (from MQ_SIDECAR_CLIENT_LOGIN)"
    ]
    assert problems_of(env={**base, "MQ_SIDECAR_CLIENT_PASSCODE": "pw"}) == [
        "client_passcode: given without client_login (from MQ_SIDECAR_CLIENT_PASSCODE)"
    ]
    assert problems_of(env={**base, "MQ_SIDECAR_LOGIN": "", "MQ_SIDECAR_PASSCODE": "pw"}) == [
        "login: must not be empty (from MQ_SIDECAR_LOGIN)"
    ]
    cfg = load_config(
        env={**base, "MQ_SIDECAR_CLIENT_LOGIN": "a", "MQ_SIDECAR_CLIENT_PASSCODE": ""}
    )
    assert cfg.client_passcode == Secret("")


def test_all_problems_at_once(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        brokers = "failover:(stomp://a:1)?retryIntervall=3"
        jitter = 7
        colour = 1
        """,
    )
    env = {
        "MQ_SIDECAR_RETRY_INTERVAL": "-5",
        "MQ_SIDECAR_RANDOMIZE": "sometimes",
        "MQ_SIDECAR_PASSCODE": "pw",
    }
    overrides: dict[str, object | None] = {"log_level": "loud", "handshake_timeout": "0"}
    assert problems_of(path=path, env=env, overrides=overrides) == [
        "brokers: unknown failover option 'retryIntervall' (did you mean 'retryInterval'?) "
        f"(from {path})",
        f"unknown option 'colour' in {path}",
        "randomize: expected a boolean (true/false, 1/0, yes/no, on/off), got 'sometimes' "
        "(from MQ_SIDECAR_RANDOMIZE)",
        # no "no brokers configured": the broken URL is the problem to report
        "retry_interval: must be > 0, got -5 (from MQ_SIDECAR_RETRY_INTERVAL)",
        f"jitter: must be between 0 and 1, got 7.0 (from {path})",
        "handshake_timeout: must be > 0, got 0 (from --handshake-timeout)",
        "log_level: must be one of 'debug', 'info', 'warning', 'error', got 'loud' "
        "(from --log-level)",
        "passcode: given without login (from MQ_SIDECAR_PASSCODE)",
    ]


# --------------------------------------------------------------------------------------
# credentials never leak

PW = "Zq7-secret-Xv"


def test_credentials_never_in_messages_reprs_or_views(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(
        tmp_path,
        f"""
        brokers = "failover:(stomp://user1:{PW}1@a:1,stomp://user2:{PW}2@a:x)?foo=1"
        passcode = 12345
        client_passcode = ["{PW}3"]
        [[nothing]]
        x = "{PW}4"
        """,
    )
    env = {
        "MQ_SIDECAR_LOGIN": f"{PW}5",
        "MQ_SIDECAR_PASSCODE": f"{PW}6",
        "MQ_SIDECAR_CLIENT_PASSCODE": f"{PW}7",
        "MQ_SIDECAR_PORT_X": f"{PW}8",
        "MQ_SIDECAR_RETRY_INTERVAL": "0",
    }
    with caplog.at_level(logging.DEBUG), pytest.raises(ConfigError) as info:
        load_config(path=path, env=env, overrides={"client_login": ""})
    for text in (str(info.value), repr(info.value), "\n".join(info.value.problems), caplog.text):
        assert PW not in text
        assert "user1" not in text
        assert "12345" not in text

    cfg = load_config(
        env={
            "MQ_SIDECAR_BROKERS": f"stomp://user1:{PW}1@a:1?host=/",
            "MQ_SIDECAR_LOGIN": "user5",
            "MQ_SIDECAR_PASSCODE": f"{PW}6",
            "MQ_SIDECAR_CLIENT_LOGIN": "user7",
            "MQ_SIDECAR_CLIENT_PASSCODE": f"{PW}7",
        }
    )
    view = json.dumps(cfg.redacted())
    for text in (repr(cfg), str(cfg), view, repr(cfg.brokers), str(cfg.brokers[0])):
        assert PW not in text
        for user in ("user1", "user5", "user7"):
            assert user not in text
    assert cfg.passcode is not None
    assert cfg.passcode.reveal() == f"{PW}6"
    assert cfg.brokers[0].passcode == Secret(f"{PW}1")
