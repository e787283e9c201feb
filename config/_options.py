"""The option table: one row per :class:`~config.Config` field.

The same names are used in the TOML file (top-level keys), the environment
(``MQ_SIDECAR_<NAME>``) and the CLI (``--<name-with-dashes>``). The table says how a
value is read from each; ranges are checked by the loader after merging.
"""

from __future__ import annotations

import dataclasses
import math
import types
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from ._model import Broker, Config, Secret, format_address
from ._url import FAILOVER_OPTIONS, parse_address
from ._values import InvalidValue, describe, parse_bool, parse_float, parse_heartbeat, parse_int

__all__ = ["ENV_PREFIX", "OPTIONS", "Kind", "Option", "convert"]

#: Prefix of every environment variable read by :func:`config.load_config`.
ENV_PREFIX = "MQ_SIDECAR_"

Kind = Literal[
    "int", "float", "bool", "str", "secret", "address", "heartbeat", "brokers", "enum", "strings"
]

_CREDENTIALS = frozenset({"login", "passcode", "client_login", "client_passcode"})
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Config)}


@dataclass(frozen=True)
class Option:
    """How one ``Config`` field is configured.

    Attributes:
        name: The ``Config`` field name, also the TOML key.
        kind: Value syntax: ``int``, ``float``, ``bool``, ``str``, ``secret`` (a
            string wrapped in :class:`~config.Secret`), ``address`` (``"host:port"``),
            ``heartbeat`` (``[x, y]`` or ``"x,y"``), ``brokers`` (a failover URL, a list
            of URLs or ``[[brokers]]`` tables), ``enum`` (one of ``choices``) or ``strings``
            (a TOML list of strings, or one comma-separated string: ``"a,b"``).
        help: One line for ``--help``: meaning, unit, range and source of the rule.
        unit: ``"ms"``, ``"bytes"`` or ``""``.
        choices: Allowed values of an ``enum`` (compared case-insensitively).
    """

    name: str
    kind: Kind
    help: str
    unit: str = ""
    choices: tuple[str, ...] = ()

    @property
    def env_var(self) -> str:
        """``MQ_SIDECAR_<NAME>``, e.g. ``MQ_SIDECAR_RETRY_INTERVAL``."""
        return ENV_PREFIX + self.name.upper()

    @property
    def cli_flag(self) -> str:
        """``--<name>`` with dashes, e.g. ``--retry-interval``."""
        return "--" + self.name.replace("_", "-")

    @property
    def credential(self) -> bool:
        """True for logins and passcodes: their values are never shown."""
        return self.name in _CREDENTIALS

    @property
    def default(self) -> object:
        """The ``Config`` default."""
        return _DEFAULTS[self.name]

    @property
    def url_options(self) -> tuple[str, ...]:
        """Failover URL query options that also set this field (see ``FAILOVER_OPTIONS``)."""
        return tuple(o.name for o in FAILOVER_OPTIONS if o.field == self.name)


_ROWS = (
    Option("listen", "address", "STOMP listener for apps, host:port (port 0 = ephemeral)"),
    Option("admin_listen", "address", "HTTP admin plane (metrics, health, status), host:port"),
    Option(
        "admin_token_file",
        "str",
        "file with the bearer token /status and /events require (RFC 6750); unset = none",
    ),
    Option("admin_token_metrics", "bool", "/metrics requires the admin token too"),
    Option(
        "broker_probe_interval",
        "int",
        "ms between readiness probes (STOMP CONNECT) of each broker for /readyz, > 0",
        "ms",
    ),
    Option(
        "brokers",
        "brokers",
        "broker list: failover:(stomp://a:61613,stomp+ssl://b:61614)?retryInterval=100 "
        "(ActiveMQ/Artemis failover URL syntax)",
    ),
    Option(
        "brokers_file",
        "str",
        "file of more brokers, one URL per line, re-read when it changes and on SIGHUP",
    ),
    Option(
        "dns_refresh_interval",
        "int",
        "ms between lookups of the broker list's DNS names (dns=all, SRV), > 0, jittered",
        "ms",
    ),
    Option(
        "dns_servers",
        "strings",
        "DNS servers to ask, ip[:port] (port 53 by default); unset = the system resolver",
    ),
    Option("login", "str", "upstream login for every broker without its own (needs passcode)"),
    Option("passcode", "secret", "upstream passcode for `login`"),
    Option("client_login", "str", "login apps must present in CONNECT (needs client_passcode)"),
    Option("client_passcode", "secret", "passcode apps must present in CONNECT"),
    Option("tls_ca_file", "str", "PEM bundle of CAs trusted for TLS brokers; unset = system store"),
    Option("tls_cert_file", "str", "PEM client certificate for mutual TLS (needs tls_key_file)"),
    Option("tls_key_file", "str", "PEM private key of tls_cert_file"),
    Option("tls_key_password_file", "str", "file holding the password of tls_key_file"),
    Option(
        "tls_verify_hostname",
        "bool",
        "check the broker certificate names the host (RFC 6125; Artemis verifyHost)",
    ),
    Option(
        "tls_server_name",
        "str",
        "name sent in SNI and verified instead of the URL host (Artemis sniHost)",
    ),
    Option(
        "tls_min_version",
        "enum",
        "lowest TLS version offered to brokers, 1.2 or 1.3",
        choices=("1.2", "1.3"),
    ),
    Option("tls_ciphers", "str", "OpenSSL cipher list for TLS 1.2 (unset = OpenSSL default)"),
    Option(
        "retry_interval",
        "int",
        "delay before the first reconnect attempt, ms, > 0 (Artemis retryInterval)",
        "ms",
    ),
    Option(
        "retry_interval_multiplier",
        "float",
        "delay factor per failed attempt, >= 1.0 (Artemis retryIntervalMultiplier)",
    ),
    Option(
        "max_retry_interval",
        "int",
        "largest delay between attempts, ms, >= retry_interval (Artemis maxRetryInterval)",
        "ms",
    ),
    Option(
        "reconnect_attempts",
        "int",
        "attempts after a connection loss, -1 = unlimited, 0 = none (Artemis reconnectAttempts)",
    ),
    Option(
        "initial_connect_attempts",
        "int",
        "attempts for a session's first connection, -1 = unlimited or >= 1 "
        "(Artemis initialConnectAttempts)",
    ),
    Option(
        "reconnect_period",
        "int",
        "give up a reconnect after this long, ms, 0 = no time bound",
        "ms",
    ),
    Option(
        "initial_connect_period",
        "int",
        "a session's first connection keeps trying rounds for at least this long, ms, "
        ">= 0, 0 = initial_connect_attempts alone",
        "ms",
    ),
    Option(
        "jitter",
        "float",
        "randomized fraction of each delay, 0..1, 1.0 = full jitter",
    ),
    Option("randomize", "bool", "walk the broker list in random order (ActiveMQ randomize)"),
    Option(
        "priority_backup",
        "bool",
        "return to the first broker when it is back (ActiveMQ priorityBackup)",
    ),
    Option(
        "call_timeout",
        "int",
        "how long a receipt may stay unconfirmed during failover, ms, > 0 (Artemis callTimeout)",
        "ms",
    ),
    Option(
        "subscription_down_timeout",
        "int",
        "/readyz is not ready while a subscription is down longer than this, ms, 0 = never",
        "ms",
    ),
    Option(
        "confirmation_window_size",
        "int",
        "bytes of unconfirmed upstream frames kept for replay, > 0 "
        "(Artemis confirmationWindowSize)",
        "bytes",
    ),
    Option(
        "connect_timeout",
        "int",
        "TCP connect + STOMP CONNECT/CONNECTED to one broker, ms, > 0",
        "ms",
    ),
    Option(
        "max_connecting",
        "int",
        "connection attempts in flight at once to one broker, > 0; the next waits its turn",
    ),
    Option(
        "upstream_heartbeat",
        "heartbeat",
        "heart-beat offered to brokers 'cx,cy', ms, >= 0 (STOMP 1.2 heart-beat header)",
        "ms",
    ),
    Option(
        "client_heartbeat",
        "heartbeat",
        "heart-beat offered to apps in CONNECTED 'sx,sy', ms, >= 0 (STOMP 1.2), when the "
        "broker's answer to the app's ask is not known (ActiveMQ's and RabbitMQ's are)",
        "ms",
    ),
    Option(
        "heartbeat_grace",
        "float",
        "a peer silent for interval * grace is dead, > 1.0 (STOMP 1.2 tolerance)",
    ),
    Option("handshake_timeout", "int", "an app must finish CONNECT within this, ms, > 0", "ms"),
    Option("drain_timeout", "int", "graceful shutdown deadline, ms, > 0", "ms"),
    Option("max_frame_bytes", "int", "largest frame accepted from an app, bytes, > 0", "bytes"),
    Option("max_headers", "int", "most headers in one frame, > 0"),
    Option("max_header_line_bytes", "int", "longest header line, bytes, > 0", "bytes"),
    Option("max_subscriptions", "int", "most subscriptions per app session, > 0"),
    Option("max_unacked", "int", "most delivered-but-unacked messages per app session, > 0"),
    Option("id_cache_size", "int", "duplicate-detection ids remembered per subscription, > 0"),
    Option(
        "max_transaction_size",
        "int",
        "bytes a session's open transactions may hold for replay, > 0",
        "bytes",
    ),
    Option("max_sessions", "int", "most app sessions at once, > 0 (two sockets each)"),
    Option(
        "max_memory_bytes",
        "int",
        "bytes all sessions hold together (windows, frames read, transactions), "
        ">= 2 x max_frame_bytes",
        "bytes",
    ),
    Option(
        "events_destination",
        "str",
        "reserved destination of the in-band event channel (control channel)",
    ),
    Option(
        "failover_mode",
        "enum",
        "transparent, or strict (JMS semantics): what an app sees of redeliveries after failover",
        choices=("transparent", "strict"),
    ),
    Option(
        "transaction_failover",
        "enum",
        "replay or rollback open transactions on failover",
        choices=("replay", "rollback"),
    ),
    Option(
        "log_level",
        "enum",
        "debug, info, warning or error",
        choices=("debug", "info", "warning", "error"),
    ),
    Option("log_format", "enum", "text or json", choices=("text", "json")),
    Option(
        "tracing",
        "bool",
        "OpenTelemetry traces of SENDs, MESSAGEs and ACKs, exported as the OTEL_* variables say",
    ),
    Option(
        "outbox",
        "bool",
        "store-and-forward: SENDs confirmed once durable in outbox_dir, forwarded later",
    ),
    Option("outbox_dir", "str", "directory of the outbox (one sidecar each); required with outbox"),
    Option(
        "outbox_destinations",
        "strings",
        "destination patterns spooled to the outbox (fnmatch: * ? [..]); unset = every one",
    ),
    Option(
        "outbox_max_bytes",
        "int",
        "frame bytes the outbox may hold, > 0; full = the app waits, then ERROR at call_timeout",
        "bytes",
    ),
    Option(
        "outbox_max_age",
        "int",
        "frames not forwarded within this long are dropped (outcome expired), ms, >= 0, "
        "0 = no age limit",
        "ms",
    ),
)

#: The option table, read-only: ``Config`` field name -> :class:`Option`, in field order.
OPTIONS: Mapping[str, Option] = types.MappingProxyType({o.name: o for o in _ROWS})


def _expected(option: Option) -> str:
    unit = {"ms": " (milliseconds)", "bytes": " (bytes)"}.get(option.unit, "")
    return {
        "int": f"an integer{unit}",
        "float": "a number",
        "bool": "a boolean",
        "str": "a string",
        "secret": "a string",
        "address": "a 'host:port' string",
        "heartbeat": f"two integers [x, y] or 'x,y'{unit}",
        "brokers": "a broker URL, a list of broker URLs or [[brokers]] tables",
        "enum": "one of " + ", ".join(repr(c) for c in option.choices),
        "strings": "a list of strings or a comma-separated string",
    }[option.kind]


def _wrong_type(option: Option, raw: object) -> InvalidValue:
    shown = "" if option.credential else f" {raw!r}"
    return InvalidValue(f"expected {_expected(option)}, got {describe(raw)}{shown}")


def _from_text(option: Option, text: str) -> object:
    try:
        match option.kind:
            case "int":
                return parse_int(text)
            case "float":
                return parse_float(text)
            case "bool":
                return parse_bool(text)
            case "heartbeat":
                return parse_heartbeat(text)
            case "address":
                return parse_address(text)
            case "secret":
                return Secret(text)
            case "enum":
                return text.strip().lower()
            case "strings":
                return _strings(text)
            case _:
                return text
    except ValueError as exc:
        shown = "" if option.credential else f", got {text!r}"
        raise InvalidValue(f"{exc}{shown}") from None


def _strings(text: str) -> tuple[str, ...]:
    """``"a, b"`` -> ``("a", "b")``: a comma-separated list, blanks around items dropped."""
    return tuple(item.strip() for item in text.split(",") if item.strip())


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def convert(option: Option, raw: object, *, text: bool) -> object:
    """Convert ``raw`` to the field's type; not for ``brokers`` (see ``_load.py``).

    ``text=True``: ``raw`` came from the environment or the CLI and a string is parsed
    (``"100"``, ``"yes"``, ``"a:1"``, ``"5000,5000"``). ``text=False``: ``raw`` is a
    TOML (or already typed) value and must have the field's type; strings are only
    accepted for string-like kinds (``"host:port"``, ``"x,y"``).

    Raises:
        InvalidValue: with a message such as ``expected an integer (milliseconds), got
            string '100'``; values of credentials are never included.
    """
    if text and isinstance(raw, str):
        return _from_text(option, raw)
    match option.kind:
        case "int":
            if _is_int(raw):
                return raw
        case "float":
            if isinstance(raw, float | int) and not isinstance(raw, bool):
                if not math.isfinite(raw):
                    raise InvalidValue(f"expected a finite number, got {raw!r}")
                return float(raw)
        case "bool":
            if isinstance(raw, bool):
                return raw
        case "str":
            if isinstance(raw, str):
                return raw
        case "secret":
            if isinstance(raw, Secret):
                return raw
            if isinstance(raw, str):
                return Secret(raw)
        case "enum":
            if isinstance(raw, str):
                return raw.strip().lower()
            if isinstance(raw, float) and str(raw) in option.choices:
                return str(raw)  # tls_min_version = 1.2, written as a TOML number
        case "address":
            if isinstance(raw, str):
                return _from_text(option, raw)
            if (
                isinstance(raw, tuple)
                and len(raw) == 2
                and isinstance(raw[0], str)
                and _is_int(raw[1])
            ):
                try:
                    return parse_address(format_address(raw[0], raw[1]))
                except ValueError as exc:
                    raise InvalidValue(str(exc)) from None
        case "heartbeat":
            if isinstance(raw, str):
                return _from_text(option, raw)
            if isinstance(raw, tuple | list) and len(raw) == 2 and all(_is_int(v) for v in raw):
                return (raw[0], raw[1])
        case "brokers":
            if isinstance(raw, tuple | list) and raw and all(isinstance(b, Broker) for b in raw):
                return tuple(raw)
        case "strings":
            if isinstance(raw, str):
                return _strings(raw)
            if isinstance(raw, tuple | list) and all(isinstance(v, str) for v in raw):
                return tuple(raw)
    raise _wrong_type(option, raw)
