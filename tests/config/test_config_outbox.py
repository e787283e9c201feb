"""The outbox options (issue 17): ``outbox``, ``outbox_dir``, ``outbox_destinations``,
``outbox_max_bytes``, ``outbox_max_age`` from TOML, the environment and overrides, and their
checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from config import Config, ConfigError, load_config

BROKER = {"MQ_SIDECAR_BROKERS": "stomp://127.0.0.1:61613"}


def test_defaults_are_off_and_every_destination() -> None:
    cfg = Config()
    assert cfg.outbox is False
    assert cfg.outbox_dir is None
    assert cfg.outbox_destinations is None
    assert cfg.outbox_max_bytes == 1 << 30
    assert cfg.outbox_max_age == 0
    assert cfg.durations.outbox_max_age is None


def test_outbox_from_the_environment() -> None:
    cfg = load_config(
        env={
            **BROKER,
            "MQ_SIDECAR_OUTBOX": "true",
            "MQ_SIDECAR_OUTBOX_DIR": "/tmp/ob",
            "MQ_SIDECAR_OUTBOX_DESTINATIONS": "/queue/orders.*, /topic/x",
            "MQ_SIDECAR_OUTBOX_MAX_BYTES": "4096",
            "MQ_SIDECAR_OUTBOX_MAX_AGE": "60000",
        }
    )
    assert cfg.durations.outbox_max_age == 60.0
    assert cfg.outbox is True
    assert cfg.outbox_dir == "/tmp/ob"
    assert cfg.outbox_destinations == ("/queue/orders.*", "/topic/x")
    assert cfg.outbox_max_bytes == 4096


def test_outbox_from_toml(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(
        'brokers = "stomp://127.0.0.1:61613"\noutbox = true\noutbox_dir = "/tmp/ob"\n'
        'outbox_destinations = ["/queue/a", "/queue/b.*"]\n'
    )
    cfg = load_config(path=path, env={})
    assert cfg.outbox_destinations == ("/queue/a", "/queue/b.*")
    assert cfg.outbox_dir == "/tmp/ob"


def test_outbox_without_a_directory_is_one_line() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(env={**BROKER, "MQ_SIDECAR_OUTBOX": "1"})
    assert caught.value.problems == [
        "outbox_dir: required when outbox is true (from MQ_SIDECAR_OUTBOX)"
    ]


@pytest.mark.parametrize(
    ("var", "value", "words"),
    [
        ("MQ_SIDECAR_OUTBOX_MAX_BYTES", "0", "outbox_max_bytes: must be > 0"),
        ("MQ_SIDECAR_OUTBOX_DIR", "", "outbox_dir: must not be empty"),
        ("MQ_SIDECAR_OUTBOX_MAX_AGE", "-1", "outbox_max_age: must be >= 0 (0 = no age limit)"),
    ],
)
def test_outbox_values_are_checked(var: str, value: str, words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(env={**BROKER, var: value})
    assert any(p.startswith(words) for p in caught.value.problems), caught.value.problems


def test_destinations_of_a_wrong_type(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('brokers = "stomp://127.0.0.1:61613"\noutbox_destinations = [1]\n')
    with pytest.raises(ConfigError) as caught:
        load_config(path=path, env={})
    assert "outbox_destinations" in str(caught.value)
