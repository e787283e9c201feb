"""The configuration model: frozen value objects, no I/O, no validation.

Everything here is a plain frozen dataclass. Validation lives in ``_load.py`` because a
problem is only useful to an operator when it says where the bad value came from, and
only the loader knows that. A ``Config`` built by hand (tests, embedding) is trusted.

Credentials (``login`` and ``passcode`` fields) never appear in a ``repr``, ``str`` or
:meth:`Config.redacted` view: passcodes are wrapped in :class:`Secret`, and logins are
shown as ``'***'``: credentials never appear in logs, events or metrics
(docs/configuration.md, "Credentials").
"""

from __future__ import annotations

import dataclasses
import enum
import hmac
from dataclasses import dataclass

__all__ = [
    "REDACTED",
    "Broker",
    "Config",
    "ConfigError",
    "Durations",
    "FailoverMode",
    "Secret",
    "TransactionFailover",
    "format_address",
]


class FailoverMode(enum.StrEnum):
    """``failover_mode``: what the app sees of a message redelivered by a failover."""

    #: Redeliveries of messages the app already has are hidden; its ack ids stay valid.
    TRANSPARENT = "transparent"
    #: JMS semantics: stale ack ids fail with an ERROR, redeliveries are shown.
    STRICT = "strict"


class TransactionFailover(enum.StrEnum):
    """``transaction_failover``: what becomes of a transaction open at failover."""

    #: Its frames (held by the sidecar) are re-run on the new broker; COMMIT succeeds once.
    REPLAY = "replay"
    #: JMS semantics: rolled back; its COMMIT answers an ERROR, its messages are redelivered.
    ROLLBACK = "rollback"


#: What every credential is replaced by in reprs, messages and :meth:`Config.redacted`.
REDACTED = "***"

# Fields whose value is a credential, in Broker and Config alike.
_CREDENTIAL_FIELDS = frozenset({"login", "passcode", "client_login", "client_passcode"})


def format_address(host: str, port: int) -> str:
    """``host:port``, with an IPv6 literal in brackets (``[::1]:61613``), as in RFC 3986."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True)
class Secret:
    """A credential that does not print itself.

    ``repr()`` is ``Secret('***')`` and ``str()`` / f-strings give ``***``, so a secret
    that ends up in a log line, an exception or a ``repr`` of a larger object shows
    nothing. Call :meth:`reveal` at the one place the real value is needed (the STOMP
    ``CONNECT`` frame).
    """

    value: str

    def reveal(self) -> str:
        """The real value. Only for building the ``CONNECT`` frame; never log it."""
        return self.value

    def matches(self, candidate: str) -> bool:
        """Whether ``candidate`` equals the secret, compared in constant time
        (:func:`hmac.compare_digest`), for checking an app's ``CONNECT`` passcode."""
        return hmac.compare_digest(self.value.encode(), candidate.encode())

    def __repr__(self) -> str:
        return f"Secret({REDACTED!r})"

    def __str__(self) -> str:
        return REDACTED


def _safe_repr(obj: Broker | Config) -> str:
    """A dataclass repr with every credential field shown as ``'***'`` (or ``None``)."""
    parts = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if f.name in _CREDENTIAL_FIELDS and value is not None:
            shown = repr(value) if isinstance(value, Secret) else repr(REDACTED)
        else:
            shown = repr(value)
        parts.append(f"{f.name}={shown}")
    return f"{type(obj).__name__}({', '.join(parts)})"


@dataclass(frozen=True, repr=False)
class Broker:
    """One upstream STOMP broker.

    Built from one URI of the failover URL (see :func:`config.parse_broker_url`), e.g.
    ``stomp+ssl://user:pass@mq-1.example:61614?host=/``.

    Attributes:
        host: Host name or IP literal (IPv6 without brackets). Resolved on every connect
            attempt, never at load time, because a Kubernetes Service may move
            (docs/behaviour.md, "Broker list and reconnect policy").
        port: TCP port, 1..65535. URL default 61613 (STOMP), 61614 for TLS, the ports
            ActiveMQ and Artemis ship with.
        tls: Connect with TLS (schemes ``stomp+ssl``, ``stomp+tls``, ``ssl``, ``tls``).
        login: This broker's own login (URL userinfo); ``None`` = use ``Config.login``.
        passcode: This broker's own passcode; ``None`` = use ``Config.passcode``.
        virtual_host: Value of the STOMP ``CONNECT`` ``host`` header (URL option ``host``
            or ``vhost``). RabbitMQ reads it as the vhost, e.g. ``/``. ``None`` = the
            broker's host name, as STOMP 1.2 recommends ("clients set this to the host
            name that the socket was established against").
        verify_hostname: This broker's own ``tls_verify_hostname`` (URL option
            ``verifyHost``, Artemis' name); ``None`` = the top-level option.
        server_name: This broker's own ``tls_server_name`` (URL option ``sniHost``,
            Artemis' name); ``None`` = the top-level option, else ``host``.
        dns: ``None``: one broker, ``host`` resolved at each connect. ``"all"`` (URL option
            ``dns=all``): ``host`` names a set of brokers, one per address it resolves to (a
            Kubernetes headless Service), on ``port``. ``"srv"`` (``dns=srv``, or a host
            starting with ``_`` such as ``_stomp._tcp.rabbitmq.ns.svc``): one broker per SRV
            record, host and port from the record (RFC 2782). Either is re-resolved every
            ``dns_refresh_interval`` (docs/configuration.md, "A live broker list").
    """

    host: str
    port: int
    tls: bool = False
    login: str | None = None
    passcode: Secret | None = None
    virtual_host: str | None = None
    verify_hostname: bool | None = None
    server_name: str | None = None
    dns: str | None = None

    @property
    def label(self) -> str:
        """``host:port`` (``[::1]:61613`` for IPv6). Safe to log: never has credentials."""
        return format_address(self.host, self.port)

    def __str__(self) -> str:
        return self.label

    def __repr__(self) -> str:
        return _safe_repr(self)


@dataclass(frozen=True, repr=False)
class Config:
    """The whole sidecar configuration, immutable.

    Units: every duration is an ``int`` in **milliseconds** (the Artemis convention,
    e.g. ``retryInterval``), every size is in **bytes**. Names follow Artemis "Client
    Reconnection and Session Reattachment" / "Client Failover" (``retry_interval`` =
    ``retryInterval``, ...); ActiveMQ Classic "Failover Transport Reference" names are
    accepted as aliases in the broker URL only (see :func:`config.parse_broker_url`).
    The loader (:func:`config.load_config`) enforces the ranges given below; the
    per-option help text is in :data:`config.OPTIONS`.

    Attributes:
        listen: ``(host, port)`` of the STOMP listener for apps. Loopback by default
            (docs/configuration.md, "Listeners"); port 0 = ephemeral (tests).
        admin_listen: ``(host, port)`` of the HTTP admin plane (metrics, health,
            status); on all interfaces so Prometheus can scrape it
            (docs/configuration.md, "Listeners").
        admin_token_file: Path of a file holding the bearer token that ``/status`` and
            ``/events`` require (``Authorization: Bearer <token>``, RFC 6750); ``None`` =
            no token. Re-read on every request, so a rotated Secret takes effect at once.
            ``/healthz`` and ``/readyz`` never require it (the kubelet has no token).
        admin_token_metrics: ``/metrics`` requires the token too (Prometheus then needs
            ``authorization.credentials_file``).
        broker_probe_interval: ms between readiness checks of each broker, > 0: the
            admin plane's ``/readyz`` needs "a STOMP CONNECT answered recently", so every
            interval it opens one (unless a live session leg already proves the broker
            answers). 5000 ms: readiness follows a broker within seconds, and a probe
            connection every 5 s is negligible load.
        brokers: The upstream brokers in failover order. At least one is required, unless
            ``brokers_file`` is given. A broker with ``dns`` set stands for the brokers its
            name resolves to (:attr:`Broker.dns`).
        brokers_file: Path of a file of more brokers, one broker URL per line (``#`` starts a
            comment), after ``brokers`` in the list; re-read when it changes (looked at
            every ``dns_refresh_interval``) and on SIGHUP. A file that does not parse leaves
            the list in force (docs/configuration.md, "A live broker list").
        dns_refresh_interval: ms between lookups of the DNS names of the broker list (and
            looks at ``brokers_file``), > 0, each drawn from 0.8..1.2 times it (jitter, so a
            fleet of sidecars does not query in step). 5000 ms: Envoy's STRICT_DNS default.
        dns_servers: ``host[:port]`` of the DNS servers asked (IP literals, port 53 by
            default); ``None`` = the system's resolver (``/etc/resolv.conf``).
        login: The sidecar's own upstream login, used for every broker without its
            own. When set, the app's ``login``/``passcode`` are not forwarded.
        passcode: Passcode for ``login``; required with it, forbidden without it.
        client_login: When set, apps must present this login in ``CONNECT``.
        client_passcode: Passcode apps must present; required with ``client_login``.
        tls_ca_file: PEM bundle of the CAs a TLS broker's certificate must chain to;
            ``None`` = the system's trust store. Files are re-read at every connect, so a
            rotated Kubernetes Secret takes effect at the next (re)connect.
        tls_cert_file: PEM client certificate (chain) for mutual TLS; needs
            ``tls_key_file``.
        tls_key_file: PEM private key of ``tls_cert_file``.
        tls_key_password_file: File holding the password of an encrypted ``tls_key_file``
            (first line, without its newline).
        tls_verify_hostname: Check that a broker's certificate names the host connected
            to (or ``tls_server_name``), RFC 6125. The chain is always verified.
        tls_server_name: The name sent in SNI and verified in the certificate instead of
            the URL's host (for an IP literal or a Service alias); ``None`` = the host.
        tls_min_version: Lowest TLS version offered, ``"1.2"`` or ``"1.3"``.
        tls_ciphers: OpenSSL cipher list for TLS 1.2 (``None`` = OpenSSL's default);
            TLS 1.3 suites are not affected (Python's ``ssl`` has no setter for them).
        retry_interval: ms before the first reconnect attempt, > 0. Artemis
            ``retryInterval`` (Artemis default 2000 ms); ActiveMQ
            ``initialReconnectDelay`` (default 10 ms).
        retry_interval_multiplier: Factor applied to the delay after each failed
            attempt, >= 1.0 (1.0 = constant). Artemis ``retryIntervalMultiplier``
            (default 1.0); ActiveMQ ``backOffMultiplier`` (default 2.0).
        max_retry_interval: Upper bound of the delay in ms, >= ``retry_interval``.
            Artemis ``maxRetryInterval`` (default 2000 ms); ActiveMQ
            ``maxReconnectDelay`` (default 30000 ms).
        reconnect_attempts: Attempts after a connection was lost before giving up,
            -1 = unlimited (still bounded by ``reconnect_period``), 0 = none. Artemis
            ``reconnectAttempts``; ActiveMQ 5.6+ ``maxReconnectAttempts``.
        initial_connect_attempts: Attempts for the first connection of a session,
            -1 = unlimited, otherwise >= 1. Artemis ``initialConnectAttempts``.
        reconnect_period: ms after which a reconnect gives up whatever the attempt
            count, >= 0; 0 = no time bound (docs/behaviour.md, "Broker list and
            reconnect policy").
        initial_connect_period: ms for which a session's first connection keeps trying
            rounds even when ``initial_connect_attempts`` are spent, >= 0; 0 = the attempts
            alone bound it. It gives up once *both* are spent (the attempts and this
            period), or at ``reconnect_period``; a round in which every broker refused the
            login ends it at once, as it ends a reconnect (docs/behaviour.md, "Broker list
            and reconnect policy"). 30000 ms covers an ActiveMQ shared-store takeover even at
            ActiveMQ's default 10 s lock poll (docs/brokers.md, "Takeover and hung
            brokers") or a broker pod's restart, and stays within the 30 s an app's
            blocking call is commonly allowed (Artemis ``callTimeout``). No Artemis or
            ActiveMQ name: the URL name is mq-sidecar's ``initialConnectPeriod``.
        jitter: Fraction of each delay that is drawn at random, 0..1; 1.0 = "full
            jitter" (AWS Architecture Blog, "Exponential Backoff And Jitter"), so a
            fleet of sidecars does not reconnect in lockstep (docs/behaviour.md,
            "Broker list and reconnect policy").
        randomize: Walk the broker list in random order. ActiveMQ ``randomize``
            (ActiveMQ default true; ours false, so list order = priority).
        priority_backup: Return to the first broker when it is back, within
            ``max_retry_interval`` plus a brief hold of the app while the window drains.
            ActiveMQ ``priorityBackup`` (docs/behaviour.md, "Broker list and reconnect
            policy").
        call_timeout: ms a frame whose receipt the app waits for may stay
            unconfirmed during failover before the app gets an ``ERROR``, > 0.
            Artemis ``callTimeout`` (default 30000 ms); docs/behaviour.md, "During
            failover: stop the world".
        subscription_down_timeout: ms a subscription may be down (restoring, cancelled by
            the broker, waiting for its queue) before ``/readyz`` says not ready, >= 0; 0 =
            subscriptions are no reason. 15000 ms: longer than a failover or a broker's
            restart takes (about 5 s), shorter than ``call_timeout``, the bound of the
            session-wide rule (docs/behaviour.md, "Subscription health").
        confirmation_window_size: Bytes of unconfirmed upstream frames kept for
            replay, > 0; when full the sidecar stops reading from that app.
            Artemis ``confirmationWindowSize`` (docs/behaviour.md, "Confirmation
            window").
        connect_timeout: ms for TCP connect plus STOMP ``CONNECT``/``CONNECTED`` to
            one broker, > 0.
        max_connecting: Most connection attempts (TCP connect through ``CONNECTED``) the
            sessions have in flight at once to one broker, > 0; the next waits for one of them
            to end, in the order they came, before its ``connect_timeout`` starts (HAProxy's
            per-server ``maxconn`` queue). Thousands of sessions failing over at once then
            reach a backup at the pace it answers, rather than all timing out together and
            trying again (measured: docs/behaviour.md, "Broker list and reconnect policy").
        upstream_heartbeat: ``(cx, cy)`` ms, each >= 0, 0 = none (STOMP 1.2
            "Heart-beating"): the sidecar writes to an idle broker leg every ``cx`` (and
            promises the broker ``2 cx`` in its ``heart-beat`` header: ActiveMQ judges the
            promise with no tolerance) and judges the broker's silence by ``cy``
            (proxy.legs.connect_frame.upstream_heart_beat; docs/behaviour.md, "Failure
            detection").
        client_heartbeat: ``(sx, sy)`` ms the sidecar offers apps in ``CONNECTED``,
            each >= 0, when the broker's answer to the app's ask is not known (ActiveMQ and
            RabbitMQ: the app gets theirs; docs/brokers.md, "Heart-beats").
        heartbeat_grace: A peer silent for the negotiated interval times this is
            dead, > 1.0 (STOMP 1.2: "use some tolerance to account for timing
            inaccuracies"; docs/behaviour.md, "Failure detection").
        handshake_timeout: ms an app has to complete ``CONNECT``, > 0 (docs/behaviour.md,
            "Limits and bad input").
        drain_timeout: ms of graceful shutdown before sessions are cut, > 0.
        max_frame_bytes: Largest frame accepted from an app, bytes, > 0.
        max_headers: Most headers in one frame, > 0.
        max_header_line_bytes: Longest header line, bytes, > 0.
        max_subscriptions: Most live subscriptions per app session, > 0.
        max_unacked: Most delivered-but-unacked messages per app session, > 0.
        id_cache_size: Duplicate-detection ids (``mq-sidecar-id``) remembered per
            subscription, > 0 (Artemis' ``id-cache-size``, same default): a copy that arrives
            after more ids than this came on its subscription is shown again; with the outbox,
            also the ids kept on disk per queue (docs/behaviour.md, "Duplicate detection").
        max_transaction_size: Bytes a session's open transactions may hold, > 0: the SENDs
            kept to re-run them after a failover (``transaction_failover = replay``), 256 per
            message an ACK settled in one, 512 per open transaction. A frame that would go
            past it gets an ERROR naming the option and its transaction is aborted upstream
            (docs/behaviour.md, "Transactions").
        max_sessions: Most app sessions at once, > 0; the next app's ``CONNECT`` is
            answered with an ``ERROR`` naming the option. Each session holds two sockets
            (app and broker), so the file descriptor limit must allow twice this.
        max_memory_bytes: Bytes all sessions may hold together, at least twice
            ``max_frame_bytes`` plus 64 KiB (384 MiB): the confirmation windows, the
            frames being read from apps, what open transactions keep. Past it no app is
            read and a new app's ``CONNECT`` is answered with an ``ERROR`` naming the option
            (docs/behaviour.md, "One memory budget").
        events_destination: Reserved destination of the in-band control channel
            (docs/behaviour.md, "Control channel"); never sent upstream.
        failover_mode: :class:`FailoverMode` (docs/behaviour.md, "Duplicate detection").
        transaction_failover: :class:`TransactionFailover` (docs/behaviour.md,
            "Transactions").
        log_level: ``"debug"``, ``"info"``, ``"warning"`` or ``"error"``.
        log_format: ``"text"`` or ``"json"``.
        tracing: OpenTelemetry traces of the sessions' frames (issue 27; docs/operations.md,
            "Traces"), exported as OpenTelemetry's ``OTEL_*`` variables say; needs the
            ``otel`` extra. Off: OpenTelemetry is not imported.
        outbox: Store and forward (issue 17; docs/outbox.md): an app SEND whose destination
            matches ``outbox_destinations`` gets its RECEIPT once the frame is durable in
            ``outbox_dir`` (fsync), and is forwarded to the broker later, in order per
            session; an app's CONNECT is answered even when no broker is up.
        outbox_dir: Directory of the outbox (created if missing; one sidecar process at a
            time: it is locked). Required when ``outbox`` is true.
        outbox_destinations: Destination patterns whose SENDs are spooled, matched with
            :func:`fnmatch.fnmatchcase` (``*`` matches any characters, ``/`` and ``.``
            included; ``?``, ``[...]``); ``None`` = every destination.
        outbox_max_bytes: Frame bytes the outbox may hold, > 0 (1 GiB; disk use is about
            1.4-1.7 times that, docs/outbox.md). Full: the app is not read until there is
            room; a SEND that waits past ``call_timeout`` gets an ERROR naming this option.
        outbox_max_age: ms a frame may wait in the outbox, >= 0 (0: no age limit). An older
            frame that no forwarder has read yet is dropped with the outcome ``expired``:
            named to its app in an OUTCOME event when its session is connected, logged
            otherwise, counted in ``mq_sidecar_outbox_expired_total`` (docs/outbox.md).
    """

    listen: tuple[str, int] = ("127.0.0.1", 61613)
    admin_listen: tuple[str, int] = ("0.0.0.0", 9464)
    admin_token_file: str | None = None
    admin_token_metrics: bool = False
    broker_probe_interval: int = 5_000
    brokers: tuple[Broker, ...] = ()
    brokers_file: str | None = None
    dns_refresh_interval: int = 5_000
    dns_servers: tuple[str, ...] | None = None
    login: str | None = None
    passcode: Secret | None = None
    client_login: str | None = None
    client_passcode: Secret | None = None
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_key_password_file: str | None = None
    tls_verify_hostname: bool = True
    tls_server_name: str | None = None
    tls_min_version: str = "1.2"
    tls_ciphers: str | None = None
    retry_interval: int = 100
    retry_interval_multiplier: float = 2.0
    max_retry_interval: int = 5000
    reconnect_attempts: int = -1
    initial_connect_attempts: int = 3
    reconnect_period: int = 300_000
    initial_connect_period: int = 30_000
    jitter: float = 1.0
    randomize: bool = False
    priority_backup: bool = False
    call_timeout: int = 30_000
    subscription_down_timeout: int = 15_000
    confirmation_window_size: int = 1_048_576
    connect_timeout: int = 5_000
    max_connecting: int = 64
    upstream_heartbeat: tuple[int, int] = (5_000, 5_000)
    client_heartbeat: tuple[int, int] = (10_000, 10_000)
    heartbeat_grace: float = 2.0
    handshake_timeout: int = 10_000
    drain_timeout: int = 10_000
    max_frame_bytes: int = 150_994_944  # 144 MiB: protocol.Limits, docs/configuration.md
    max_headers: int = 2000
    max_header_line_bytes: int = 65_536
    max_subscriptions: int = 1000
    max_unacked: int = 10_000
    id_cache_size: int = 20_000
    max_transaction_size: int = 16_777_216  # 16 MiB
    max_sessions: int = 1000
    max_memory_bytes: int = 402_653_184  # 384 MiB
    events_destination: str = "/mq-sidecar/events"
    failover_mode: FailoverMode = FailoverMode.TRANSPARENT
    transaction_failover: TransactionFailover = TransactionFailover.REPLAY
    log_level: str = "info"
    log_format: str = "text"
    tracing: bool = False
    outbox: bool = False
    outbox_dir: str | None = None
    outbox_destinations: tuple[str, ...] | None = None
    outbox_max_bytes: int = 1 << 30  # 1 GiB
    outbox_max_age: int = 0

    def __post_init__(self) -> None:
        # The mode options arrive as text from TOML, environment and flags: a known value
        # becomes its enum here; an unknown one is left as given for validation to report.
        for name, kind in (
            ("failover_mode", FailoverMode),
            ("transaction_failover", TransactionFailover),
        ):
            value = getattr(self, name)
            if not isinstance(value, kind) and value in set(kind):
                object.__setattr__(self, name, kind(value))

    @property
    def durations(self) -> Durations:
        """Every duration option in seconds (:class:`Durations`): the one place where the
        options' milliseconds (Artemis' unit, kept for users) become the running code's
        seconds (trio's unit)."""
        return Durations.of(self)

    def redacted(self) -> dict[str, object]:
        """A JSON-able view for ``/status`` and ``check-config``.

        Addresses become ``"host:port"`` strings, heart-beats ``[x, y]`` lists, brokers
        their labels (no credentials, no virtual host), and every credential that is
        set becomes ``"***"`` (unset ones stay ``None``).
        """
        out: dict[str, object] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in _CREDENTIAL_FIELDS:
                out[f.name] = None if value is None else REDACTED
            elif f.name in ("listen", "admin_listen"):
                out[f.name] = format_address(*value)
            elif f.name == "brokers":
                out[f.name] = [b.label for b in value]
            elif isinstance(value, tuple):
                out[f.name] = list(value)
            else:
                out[f.name] = value
        return out

    def __repr__(self) -> str:
        return _safe_repr(self)


@dataclass(frozen=True, slots=True)
class Durations:
    """The duration options of a :class:`Config` in seconds, for the running code.

    Users write milliseconds (Artemis' convention); trio counts seconds. Built once per
    consumer from :attr:`Config.durations`, so no ``/ 1000`` is scattered through the code.
    ``reconnect_period``, ``initial_connect_period``, ``outbox_max_age`` and
    ``subscription_down_timeout`` are None when the option is 0 (no time bound).
    """

    handshake_timeout: float
    call_timeout: float
    connect_timeout: float
    drain_timeout: float
    broker_probe_interval: float
    dns_refresh_interval: float
    retry_interval: float
    max_retry_interval: float
    reconnect_period: float | None
    initial_connect_period: float | None
    outbox_max_age: float | None
    subscription_down_timeout: float | None = None

    @classmethod
    def of(cls, config: Config) -> Durations:
        """Convert ``config``'s millisecond options."""
        return cls(
            handshake_timeout=config.handshake_timeout / 1000,
            call_timeout=config.call_timeout / 1000,
            connect_timeout=config.connect_timeout / 1000,
            drain_timeout=config.drain_timeout / 1000,
            broker_probe_interval=config.broker_probe_interval / 1000,
            dns_refresh_interval=config.dns_refresh_interval / 1000,
            retry_interval=config.retry_interval / 1000,
            max_retry_interval=config.max_retry_interval / 1000,
            reconnect_period=config.reconnect_period / 1000 if config.reconnect_period else None,
            initial_connect_period=(
                config.initial_connect_period / 1000 if config.initial_connect_period > 0 else None
            ),
            outbox_max_age=config.outbox_max_age / 1000 if config.outbox_max_age > 0 else None,
            subscription_down_timeout=(
                config.subscription_down_timeout / 1000
                if config.subscription_down_timeout > 0
                else None
            ),
        )


class ConfigError(Exception):
    """The configuration is unusable. Carries *every* problem found, not just the first.

    Attributes:
        problems: One line per problem, each naming the option and where its value
            came from, e.g. ``"retry_interval: must be > 0, got -5 (from
            MQ_SIDECAR_RETRY_INTERVAL)"``. Never contains a credential.

    ``str(err)`` is the problems joined with newlines.
    """

    def __init__(self, problems: list[str]) -> None:
        self.problems: list[str] = list(problems)
        super().__init__("\n".join(self.problems))

    def __str__(self) -> str:
        return "\n".join(self.problems)
