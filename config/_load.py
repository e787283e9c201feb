"""Loading: defaults < TOML file < environment < overrides (the CLI), key by key.

Theory of operation:

* Each source is read into a *layer*: ``{field: _Setting(value, source)}``. A broker
  URL in a layer may carry failover options (``?retryInterval=100``); they join the
  layer *under* its explicit keys, so ``retry_interval = 500`` next to a URL with
  ``retryInterval=100`` in the same file gives 500, and a URL option in the
  environment beats an explicit key in the file.
* Reading a layer never stops at the first problem. Every problem is one line that
  names the option and where the value came from; all of them are raised together
  in one :class:`~config.ConfigError`.
* Ranges are checked once, on the merged result, so a message can name the source
  of the value that is actually in effect. Options whose last value failed to parse
  are not range-checked (their problem is already reported).
* Unknown ``MQ_SIDECAR_*`` environment variables are ignored with one warning:
  Kubernetes injects service-link variables such as ``MQ_SIDECAR_PORT`` and
  ``MQ_SIDECAR_SERVICE_HOST`` into every pod in the namespace of a Service named
  ``mq-sidecar``, so refusing them would break deployments for no reason.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import ssl
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._dns import parse_dns_server
from ._model import Broker, Config, ConfigError, Secret
from ._options import ENV_PREFIX, OPTIONS, Option, convert
from ._url import is_host_name, parse_url
from ._values import InvalidValue, closest, describe, suggest

__all__ = ["CONFIG_ENV", "load_config"]

logger = logging.getLogger("mq_sidecar.config")

#: Environment variable naming the config file (used when ``path`` is not given).
CONFIG_ENV = ENV_PREFIX + "CONFIG"
#: Not an option either: which build of the core runs (protocol/_native.py).
_PURE_ENV = ENV_PREFIX + "PURE"

_NO_BROKERS = (
    "no brokers configured: set `brokers` in the config file, MQ_SIDECAR_BROKERS or --brokers"
)
_TABLE_KEYS = ("url", "host", "vhost", "login", "passcode")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class _Setting:
    value: object
    source: str | None  # None: the default

    def where(self) -> str:
        return "(default)" if self.source is None else f"(from {self.source})"


class _Layer:
    """The settings of one source, and the problems found reading it."""

    def __init__(
        self, key_source: Callable[[Option], str], url_source: Callable[[str], str]
    ) -> None:
        self.key_source = key_source  # option -> "MQ_SIDECAR_X" / "/etc/x.toml" / "--x"
        self.url_source = url_source  # failover option as written -> description
        self.explicit: dict[str, _Setting] = {}
        self.from_url: dict[str, _Setting] = {}
        self.failed: set[str] = set()
        self.problems: list[str] = []

    def settings(self) -> dict[str, _Setting]:
        return {**self.from_url, **self.explicit}

    def problem(self, option: Option, text: str) -> None:
        self.problems.append(f"{option.name}: {text} (from {self.key_source(option)})")
        self.failed.add(option.name)

    def set_value(self, option: Option, raw: object, *, text: bool) -> None:
        try:
            value = convert(option, raw, text=text)
        except InvalidValue as exc:
            self.problem(option, str(exc))
            return
        self.explicit[option.name] = _Setting(value, self.key_source(option))

    # -- brokers --------------------------------------------------------------------

    def set_brokers(self, raw: object, *, text: bool, table_key: str = "brokers") -> None:
        option = OPTIONS["brokers"]
        if isinstance(raw, str):
            self._set_urls([raw])
        elif isinstance(raw, list | tuple) and raw and all(isinstance(u, str) for u in raw):
            self._set_urls(list(raw))
        elif not text and isinstance(raw, list) and raw and all(isinstance(t, dict) for t in raw):
            self._set_tables(raw, table_key)
        elif isinstance(raw, list | tuple) and not raw:
            self.problem(option, "empty list")
        else:
            try:
                value = convert(option, raw, text=text)
            except InvalidValue as exc:
                self.problem(option, str(exc))
                return
            self.explicit["brokers"] = _Setting(value, self.key_source(option))

    def _set_urls(self, urls: list[str]) -> None:
        option = OPTIONS["brokers"]
        brokers: list[Broker] = []
        ok = True
        for url in urls:
            parsed = parse_url(url)
            for text in parsed.problems:
                self.problem(option, text)
            ok = ok and not parsed.problems
            brokers.extend(parsed.brokers)
            for field, (value, name) in parsed.options.items():
                if field in self.from_url:
                    self.problem(option, f"failover option {name!r}: {field} is set by two URLs")
                    continue
                self.from_url[field] = _Setting(value, self.url_source(name))
        if ok:
            self.explicit["brokers"] = _Setting(tuple(brokers), self.key_source(option))

    def _set_tables(self, tables: list[Any], key: str) -> None:
        option = OPTIONS["brokers"]
        brokers: list[Broker] = []
        ok = True
        for number, table in enumerate(tables, 1):
            broker = self._table_broker(table, f"[[{key}]] #{number}")
            ok = ok and broker is not None
            if broker is not None:
                brokers.append(broker)
        if ok:
            self.explicit["brokers"] = _Setting(tuple(brokers), self.key_source(option))

    def _table_broker(self, table: dict[str, object], where: str) -> Broker | None:
        option = OPTIONS["brokers"]
        problems_before = len(self.problems)
        broker: Broker | None = None
        for k in table:
            if k not in _TABLE_KEYS:
                self.problem(option, f"unknown key {k!r} in {where}{suggest(k, _TABLE_KEYS)}")
        url = table.get("url")
        if not isinstance(url, str):
            self.problem(
                option, f"{where} needs a 'url' string (one broker, e.g. stomp://host:61613)"
            )
            return None
        parsed = parse_url(url)
        for text in parsed.problems:
            self.problem(option, f"{where}: {text}")
        if parsed.options:
            self.problem(
                option,
                f"{where}: failover options ({', '.join(o for _, o in parsed.options.values())}) "
                "are not allowed in a broker table; set them as top-level options",
            )
        if not parsed.problems:
            if len(parsed.brokers) == 1:
                broker = parsed.brokers[0]
            else:
                self.problem(option, f"{where}: 'url' must name exactly one broker")
        strings: dict[str, str] = {}
        for k in ("host", "vhost", "login", "passcode"):
            if k in table:
                v = table[k]
                if isinstance(v, str):
                    strings[k] = v
                else:
                    shown = "" if k in ("login", "passcode") else f" {v!r}"
                    self.problem(
                        option, f"{where}: {k!r} must be a string, got {describe(v)}{shown}"
                    )
        if "host" in strings and "vhost" in strings:
            self.problem(option, f"{where}: give 'host' or 'vhost', not both")
        if broker is None:
            return None
        vhost = strings.get("host", strings.get("vhost"))
        if vhost is not None:
            if broker.virtual_host is not None:
                self.problem(option, f"{where}: virtual host given both in 'url' and as a key")
            broker = dataclasses.replace(broker, virtual_host=vhost)
        for k in ("login", "passcode"):
            if k in strings and getattr(broker, k) is not None:
                self.problem(option, f"{where}: {k} given both in 'url' and as a key")
        if "login" in strings:
            broker = dataclasses.replace(broker, login=strings["login"])
        if "passcode" in strings:
            broker = dataclasses.replace(broker, passcode=Secret(strings["passcode"]))
        if len(self.problems) > problems_before:
            return None
        return broker


# --------------------------------------------------------------------------------------
# sources


def _file_layer(path: Path) -> _Layer:
    layer = _Layer(
        key_source=lambda _option: str(path),
        url_source=lambda name: f"failover option {name!r} of brokers in {path}",
    )
    try:
        data = tomllib.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        layer.problems.append(f"config file {path}: not found")
        layer.failed.update(OPTIONS)
        return layer
    except OSError as exc:
        layer.problems.append(f"config file {path}: cannot read it ({exc.strerror or exc})")
        layer.failed.update(OPTIONS)
        return layer
    except UnicodeDecodeError as exc:
        layer.problems.append(f"config file {path}: not UTF-8 (byte offset {exc.start})")
        layer.failed.update(OPTIONS)
        return layer
    except tomllib.TOMLDecodeError as exc:
        layer.problems.append(f"config file {path}: invalid TOML: {exc}")
        layer.failed.update(OPTIONS)
        return layer
    if "brokers" in data and "broker" in data:
        layer.problem(OPTIONS["brokers"], "give either 'brokers' or [[broker]] tables, not both")
    for key, raw in data.items():
        if key in ("brokers", "broker"):
            if "brokers" in data and "broker" in data:
                continue
            if key == "broker" and not isinstance(raw, list):
                layer.problem(
                    OPTIONS["brokers"], "'broker' must be [[broker]] tables (or use 'brokers')"
                )
                continue
            layer.set_brokers(raw, text=False, table_key=key)
        elif key in OPTIONS:
            layer.set_value(OPTIONS[key], raw, text=False)
        else:
            layer.problems.append(f"unknown option {key!r} in {path}{suggest(key, OPTIONS)}")
    return layer


def _env_layer(env: Mapping[str, str]) -> _Layer:
    layer = _Layer(
        key_source=lambda option: option.env_var,
        url_source=lambda name: f"failover option {name!r} of {OPTIONS['brokers'].env_var}",
    )
    by_var = {o.env_var: o for o in OPTIONS.values()}
    unknown: list[str] = []
    for var in sorted(env):
        if not var.startswith(ENV_PREFIX) or var in (CONFIG_ENV, _PURE_ENV):
            continue
        option = by_var.get(var)
        if option is None:
            best = closest(var[len(ENV_PREFIX) :].lower(), OPTIONS)
            unknown.append(
                var if best is None else f"{var} (did you mean {OPTIONS[best].env_var}?)"
            )
        elif option.kind == "brokers":
            layer.set_brokers(env[var], text=True)
        else:
            layer.set_value(option, env[var], text=True)
    if unknown:
        logger.warning(
            "ignoring unknown environment variables %s: not mq-sidecar options. "
            "Kubernetes sets such variables for a Service named mq-sidecar "
            "(pod setting enableServiceLinks: false turns them off)",
            ", ".join(unknown),
        )
    return layer


def _override_layer(overrides: Mapping[str, object | None]) -> _Layer:
    layer = _Layer(
        key_source=lambda option: option.cli_flag,
        url_source=lambda name: f"failover option {name!r} of {OPTIONS['brokers'].cli_flag}",
    )
    for name, raw in overrides.items():
        if raw is None:
            continue
        option = OPTIONS.get(name)
        if option is None:
            layer.problems.append(f"unknown option {name!r} in overrides{suggest(name, OPTIONS)}")
        elif option.kind == "brokers":
            layer.set_brokers(raw, text=True)
        else:
            layer.set_value(option, raw, text=True)
    return layer


# --------------------------------------------------------------------------------------
# validation


def _show(value: object) -> str:
    if isinstance(value, tuple) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return f"{value[0]},{value[1]}"
    return repr(value)


def _validate(cfg: Config, settings: Mapping[str, _Setting], skip: set[str]) -> list[str]:
    problems: list[str] = []

    def where(name: str) -> str:
        return settings[name].where()

    def check(name: str, ok: bool, rule: str) -> None:
        if name not in skip and not ok:
            value = getattr(cfg, name)
            problems.append(f"{name}: {rule}, got {_show(value)} {where(name)}")

    # brokers (docs/configuration.md, "Brokers"): at least one, real ports, no duplicates,
    # paired credentials
    if "brokers" not in skip:
        if not cfg.brokers and not cfg.brokers_file:
            problems.append(_NO_BROKERS)
        seen: set[tuple[str, int]] = set()
        for n, b in enumerate(cfg.brokers, 1):
            name = f"brokers: broker #{n} ({b.label})"
            if not b.host:
                problems.append(f"brokers: broker #{n}: empty host {where('brokers')}")
            if not 1 <= b.port <= 65535:
                problems.append(f"{name}: port must be 1..65535 {where('brokers')}")
            key = (b.host.lower(), b.port)
            if key in seen:
                problems.append(f"{name}: listed twice {where('brokers')}")
            seen.add(key)
            if b.login is not None and b.passcode is None:
                problems.append(f"{name}: login given without passcode {where('brokers')}")
            if b.login == "":
                problems.append(f"{name}: login must not be empty {where('brokers')}")
            if b.virtual_host is not None and (
                not b.virtual_host or _CONTROL.search(b.virtual_host)
            ):
                problems.append(
                    f"{name}: virtual host must be non-empty text without control characters "
                    f"{where('brokers')}"
                )

    # reconnect policy (Artemis client reconnection attributes; docs/configuration.md,
    # "Reconnect policy")
    check("retry_interval", cfg.retry_interval > 0, "must be > 0")
    check("retry_interval_multiplier", cfg.retry_interval_multiplier >= 1.0, "must be >= 1.0")
    if (
        not {"retry_interval", "max_retry_interval"} & skip
        and cfg.max_retry_interval < cfg.retry_interval
    ):
        problems.append(
            f"max_retry_interval: must be >= retry_interval "
            f"({cfg.retry_interval} {where('retry_interval')}), "
            f"got {cfg.max_retry_interval} {where('max_retry_interval')}"
        )
    check("reconnect_attempts", cfg.reconnect_attempts >= -1, "must be -1 (unlimited) or >= 0")
    check(
        "initial_connect_attempts",
        cfg.initial_connect_attempts == -1 or cfg.initial_connect_attempts >= 1,
        "must be -1 (unlimited) or >= 1",
    )
    check("reconnect_period", cfg.reconnect_period >= 0, "must be >= 0 (0 = no time bound)")
    check(
        "initial_connect_period",
        cfg.initial_connect_period >= 0,
        "must be >= 0 (0 = initial_connect_attempts alone bound a first connection)",
    )
    check("jitter", 0.0 <= cfg.jitter <= 1.0, "must be between 0 and 1")
    check(
        "subscription_down_timeout",
        cfg.subscription_down_timeout >= 0,
        "must be >= 0 (0 = subscriptions are no readiness reason)",
    )
    problems.extend(_broker_list_problems(cfg, where, skip))
    for name in (
        "call_timeout",
        "connect_timeout",
        "handshake_timeout",
        "drain_timeout",
        "broker_probe_interval",
    ):
        check(name, getattr(cfg, name) > 0, "must be > 0")
    for name in (
        "confirmation_window_size",
        "max_frame_bytes",
        "max_headers",
        "max_header_line_bytes",
        "max_subscriptions",
        "max_unacked",
        "id_cache_size",
        "max_transaction_size",
        "max_sessions",
        "max_connecting",
        "max_memory_bytes",
        "outbox_max_bytes",
    ):
        check(name, getattr(cfg, name) > 0, "must be > 0")
    if "max_frame_bytes" not in skip:
        check(
            "max_memory_bytes",
            cfg.max_memory_bytes >= 2 * cfg.max_frame_bytes + 65536,
            f"must be at least twice max_frame_bytes ({cfg.max_frame_bytes}) plus 65536: one "
            "frame of that size costs twice its size and one read while it is read",
        )
    # the outbox (docs/outbox.md): a directory when it is on, patterns that say something
    if not {"outbox", "outbox_dir"} & skip and cfg.outbox and not cfg.outbox_dir:
        problems.append(f"outbox_dir: required when outbox is true {where('outbox')}")
    check("outbox_dir", cfg.outbox_dir != "", "must not be empty")
    check("outbox_max_age", cfg.outbox_max_age >= 0, "must be >= 0 (0 = no age limit)")
    check(
        "outbox_destinations",
        cfg.outbox_destinations is None or all(cfg.outbox_destinations),
        "must be non-empty patterns",
    )
    problems.extend(_tls_problems(cfg, where, skip))

    # heart-beats (STOMP 1.2 "Heart-beating": 0 means "cannot/does not want to")
    for name in ("upstream_heartbeat", "client_heartbeat"):
        check(name, min(getattr(cfg, name)) >= 0, "both values must be >= 0")
    check("heartbeat_grace", cfg.heartbeat_grace > 1.0, "must be > 1.0")

    check(
        "events_destination",
        bool(cfg.events_destination) and not _CONTROL.search(cfg.events_destination),
        "must be non-empty text without control characters",
    )
    for name in (
        "failover_mode",
        "transaction_failover",
        "tls_min_version",
        "log_level",
        "log_format",
    ):
        choices = OPTIONS[name].choices
        check(
            name, getattr(cfg, name) in choices, "must be one of " + ", ".join(map(repr, choices))
        )

    # credentials come in pairs; values are never shown
    for login, passcode in (("login", "passcode"), ("client_login", "client_passcode")):
        if {login, passcode} & skip:
            continue
        if getattr(cfg, login) == "":
            problems.append(f"{login}: must not be empty {where(login)}")
        if getattr(cfg, login) is not None and getattr(cfg, passcode) is None:
            problems.append(f"{login}: given without {passcode} {where(login)}")
        if getattr(cfg, passcode) is not None and getattr(cfg, login) is None:
            problems.append(f"{passcode}: given without {login} {where(passcode)}")
    return problems


def _broker_list_problems(cfg: Config, where: Callable[[str], str], skip: set[str]) -> list[str]:
    """The live broker list's options (docs/configuration.md, "A live broker list"): a
    refresh interval, DNS servers that are IP addresses, a brokers file path. The file is not
    opened here (it may exist only in the sidecar's container): the daemon reads it at start
    and whenever it changes, and keeps the list in force when it does not parse."""
    problems: list[str] = []
    if "dns_refresh_interval" not in skip and cfg.dns_refresh_interval <= 0:
        problems.append(
            f"dns_refresh_interval: must be > 0, got {cfg.dns_refresh_interval} "
            f"{where('dns_refresh_interval')}"
        )
    for server in cfg.dns_servers or () if "dns_servers" not in skip else ():
        try:
            parse_dns_server(server)
        except ValueError as exc:
            problems.append(f"dns_servers: {exc} {where('dns_servers')}")
    if "dns_servers" not in skip and cfg.dns_servers == ():
        problems.append(
            f"dns_servers: empty list (unset it for the system resolver) {where('dns_servers')}"
        )
    if "brokers_file" not in skip and cfg.brokers_file == "":
        problems.append(f"brokers_file: must not be empty {where('brokers_file')}")
    return problems


def _tls_problems(cfg: Config, where: Callable[[str], str], skip: set[str]) -> list[str]:
    """TLS and admin-token options: paths non-empty, certificate and key together, a cipher
    list OpenSSL accepts, a server name that is a host name. Files are not opened here: they
    are read at every connect (a rotated Secret), and a missing one is that attempt's
    ``tls_error`` (docs/configuration.md, "TLS to the brokers")."""
    problems: list[str] = []
    paths = ("tls_ca_file", "tls_cert_file", "tls_key_file", "tls_key_password_file")
    for name in (*paths, "admin_token_file", "tls_ciphers", "tls_server_name"):
        if name not in skip and getattr(cfg, name) == "":
            problems.append(f"{name}: must not be empty {where(name)}")
    pairs = (
        ("tls_cert_file", "tls_key_file", "a client certificate needs its key"),
        ("tls_key_file", "tls_cert_file", "a key needs its client certificate"),
        ("tls_key_password_file", "tls_key_file", "a key password needs the key"),
    )
    for name, needed, why in pairs:
        if {name, needed} & skip:
            continue
        if getattr(cfg, name) is not None and getattr(cfg, needed) is None:
            problems.append(f"{name}: given without {needed} ({why}) {where(name)}")
    if "tls_ciphers" not in skip and cfg.tls_ciphers:
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).set_ciphers(cfg.tls_ciphers)
        except ssl.SSLError:
            problems.append(
                f"tls_ciphers: OpenSSL selects no cipher from {cfg.tls_ciphers!r} "
                f"{where('tls_ciphers')}"
            )
    if (
        "tls_server_name" not in skip
        and cfg.tls_server_name
        and not is_host_name(cfg.tls_server_name)
    ):
        problems.append(
            f"tls_server_name: not a host name: {cfg.tls_server_name!r} {where('tls_server_name')}"
        )
    return problems


# --------------------------------------------------------------------------------------


def load_config(
    *,
    path: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, object | None] | None = None,
) -> Config:
    """Build the :class:`~config.Config` from defaults, a TOML file, the environment and
    overrides, in that order of precedence, key by key.

    Args:
        path: The TOML file. If ``None``, the file named by ``MQ_SIDECAR_CONFIG`` (when
            set and non-empty) is used; otherwise there is no file.
        env: The environment; ``None`` means ``os.environ``. ``MQ_SIDECAR_<FIELD>``
            sets a field (``MQ_SIDECAR_RETRY_INTERVAL=250``); values are text
            (booleans ``true/false/1/0/yes/no/on/off``, ``host:port``, ``"x,y"``).
            Unknown ``MQ_SIDECAR_*`` variables are ignored with a warning on the
            ``mq_sidecar.config`` logger (Kubernetes service links).
        overrides: Field name -> value from the CLI; ``None`` means "not given".
            Strings are parsed like environment values; typed values (``int``,
            ``tuple[Broker, ...]``, ``Secret``, ``("host", port)``) are taken as is.

    File format: top-level keys named like the fields, TOML-typed (``retry_interval =
    100``, ``randomize = false``, ``listen = "127.0.0.1:61613"``,
    ``upstream_heartbeat = [5000, 5000]``). ``brokers`` is a failover URL, a list of
    URLs, or ``[[brokers]]`` (alias ``[[broker]]``) tables with keys ``url``
    (required, one broker), ``host`` (virtual host, alias ``vhost``), ``login`` and
    ``passcode``. Failover options in a URL apply at the layer where the URL was
    given, under that layer's explicit keys.

    Raises:
        ConfigError: with every problem found (unreadable file, TOML syntax with its
            line, unknown keys, wrong types, bad URLs, out-of-range values, missing
            brokers, half-given credentials), each naming the option and the source
            of its value. No message contains a credential.
    """
    environ: Mapping[str, str] = os.environ if env is None else env
    layers: list[_Layer] = []
    if path is None and environ.get(CONFIG_ENV):
        path = environ[CONFIG_ENV]
    if path is not None:
        layers.append(_file_layer(Path(path)))
    layers.append(_env_layer(environ))
    if overrides:
        layers.append(_override_layer(overrides))

    settings = {o.name: _Setting(o.default, None) for o in OPTIONS.values()}
    problems: list[str] = []
    failed: set[str] = set()
    for layer in layers:
        problems.extend(layer.problems)
        here = layer.settings()
        settings.update(here)
        failed = (failed - here.keys()) | layer.failed

    values: dict[str, Any] = {name: s.value for name, s in settings.items()}
    cfg = Config(**values)
    problems.extend(_validate(cfg, settings, failed))
    if problems:
        raise ConfigError(problems)
    return cfg
