"""The upstream leg: one STOMP client connection from the sidecar to one broker.

``open_upstream`` is an async context manager that owns the leg's task (docs/architecture.md,
"Every task has an owner"): it connects, performs the CONNECT/CONNECTED exchange, and runs the
leg's heart-beat sender in a nursery it owns; leaving the block cancels that task and closes
the socket. The session reads frames from it with
:meth:`Upstream.receive_event` (one reader) and writes with :meth:`Upstream.send`.

Connecting is bounded by ``connect_timeout`` (TCP connect, TLS handshake and CONNECTED
together): a broker that accepts TCP but never answers CONNECT (a SIGSTOPped JVM still
completes the kernel's handshake: docs/brokers.md, "Takeover and hung brokers") fails the
attempt like a refused one.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import trio

import protocol
from config import REDACTED, Broker, Config
from protocol import Command, ConnectionClosed, Frame, HeartBeat, RawFrame
from proxy.tls import (
    CLOSED_IN_HANDSHAKE,
    DIAGNOSIS_SECONDS,
    PLAIN_PORT,
    SILENT_AFTER_HANDSHAKE,
    TLS_PORT,
    TlsFailed,
    TlsTracker,
    answers_stomp,
    answers_tls,
    client_context,
    looks_like_tls,
    peer_certificate,
    server_name,
    tls_failure,
)
from proxy.wire import FrameStream, TransportLost

__all__ = [
    "BrokerStreams",
    "ConnectFailed",
    "StreamOpener",
    "TlsConnectFailed",
    "Upstream",
    "UpstreamRefused",
    "UpstreamStatistics",
    "UpstreamUnavailable",
    "connect_frame",
    "connect_upstream",
    "open_upstream",
]


class UpstreamUnavailable(Exception):
    """Connecting to a broker failed. ``broker`` is the one tried; ``str()`` says why."""

    def __init__(self, broker: Broker, reason: str) -> None:
        super().__init__(f"{broker.label}: {reason}")
        self.broker = broker
        self.reason = reason


class ConnectFailed(UpstreamUnavailable):
    """No STOMP session: refused, reset, timed out, or garbage instead of CONNECTED."""


class TlsConnectFailed(ConnectFailed):
    """TLS failed: a certificate refused (expired, not yet valid, unknown CA, another host), a
    handshake alert from the broker (a client certificate demanded), a file that cannot be
    used, or TLS on one side only. ``reason`` says which in one line."""


class UpstreamRefused(UpstreamUnavailable):
    """The broker answered CONNECT with an ERROR frame (typically authentication refused).

    ``error`` is that frame, to pass on to the app when no other broker accepts the session
    (issue 2: "a broker that refuses the login: the app gets the broker's ERROR message").
    """

    def __init__(self, broker: Broker, error: Frame, *, login: str | None = None) -> None:
        self.login = login
        message = error.get("message") or error.body.decode("utf-8", "replace").strip()
        message = self.redact(message or "ERROR without message")
        super().__init__(broker, f"CONNECT refused: {message}")
        self.error = error

    def redact(self, text: str) -> str:
        """``text`` with the CONNECT's login shown as ``***`` wherever the broker quoted it
        (ActiveMQ "User name [app] or password is invalid", RabbitMQ "Access refused for user
        'app'"): the reason goes to logs, events and ``/status``, where no credential may
        appear (docs/configuration.md, "Credentials"). The app's ERROR is the broker's own."""
        if not self.login:
            return text
        return re.sub(rf"(?<!\w){re.escape(self.login)}(?!\w)", REDACTED, text)


@dataclass(frozen=True, slots=True)
class UpstreamStatistics:
    """Snapshot of one upstream leg (``/status``, metrics). Times in trio seconds."""

    broker: str
    version: str
    server: str | None
    heartbeat_ms: tuple[int, int]
    connected_at: float
    frames_in: int
    frames_out: int
    bytes_in: int
    bytes_out: int


class Upstream:
    """A live, CONNECTED leg to ``broker``. Created only by :func:`open_upstream`.

    Attributes:
        broker: the broker this leg talks to.
        connected: the broker's CONNECTED frame (``server``, ``session``, ``version``...).
        version: the STOMP version negotiated with the broker.
    """

    def __init__(self, broker: Broker, wire: FrameStream, connected: Frame) -> None:
        self.broker = broker
        self.wire = wire
        self.connected = connected
        self.version = wire.conn.version
        self.connected_at = trio.current_time()
        self.closed = False

    async def send(self, frame: Frame) -> None:
        """Write a frame to the broker. Raises :class:`TransportLost` if the leg is broken."""
        await self.wire.send(frame)

    def queue(self, frame: Frame | RawFrame) -> None:
        """Queue a frame for the broker without I/O; it leaves at the next :meth:`flush`
        (:meth:`FrameStream.queue`). Raises :class:`TransportLost` if the leg is broken."""
        self.wire.queue(frame)

    async def flush(self) -> None:
        """Write what is queued. Raises :class:`TransportLost` if the write fails."""
        await self.wire.flush()

    @property
    def needs_flush(self) -> bool:
        """The out-buffer is past :data:`proxy.wire.FLUSH_THRESHOLD`: flush before queueing."""
        return self.wire.needs_flush

    def next_buffered(self) -> Frame | HeartBeat | ConnectionClosed | None:
        """The next event already read from the broker, else None; no I/O
        (:meth:`FrameStream.next_buffered`)."""
        return self.wire.next_buffered()

    async def receive_event(self) -> Frame | HeartBeat | ConnectionClosed:
        """Next frame, heart-beat or ``CONNECTION_CLOSED`` from the broker.

        Raises:
            TransportLost: reset, or silent past the heart-beat tolerance (HeartBeatTimeout).
            protocol.RemoteProtocolError: the broker sent something that is not STOMP.
        """
        return await self.wire.receive_event()

    async def keep_alive(self) -> None:
        """Send heart-beats until cancelled (run it in the owner's nursery).

        A failed heart-beat write means the leg is broken; the reader sees the reset or EOF
        and reports it, so this just returns rather than tearing its owner's scope down.
        """
        try:
            await self.wire.keep_alive()
        except TransportLost:
            return

    async def aclose(self) -> None:
        """Close the socket at once (no DISCONNECT: callers say goodbye first if they want)."""
        self.closed = True
        await trio.aclose_forcefully(self.wire.stream)

    @property
    def _server(self) -> str:
        """The broker's ``server`` header of CONNECTED ("" if none), e.g. ``ActiveMQ/5...``,
        ``RabbitMQ/3...``, ``ActiveMQ-Artemis/2...``: the behaviours below follow from it."""
        return self.connected.get("server") or ""

    @property
    def confirms_in_order(self) -> bool:
        """Whether one RECEIPT confirms every frame sent before it. RabbitMQ sends a SEND's
        RECEIPT when the message is confirmed (publisher confirms), a transient message at
        once and a persistent one after it is on disk, so its receipts overtake each other
        (measured in tests/integration/test_failover.py): there every SEND needs its own."""
        return not self._server.startswith("RabbitMQ")

    @property
    def artemis_duplicate_ids(self) -> bool:
        """Whether SENDs carry Artemis' duplicate-detection header ``_AMQ_DUPL_ID`` beside
        ``mq-sidecar-id`` (docs/behaviour.md, "Duplicate detection"): yes unless the broker
        says it is ActiveMQ Classic (``server:ActiveMQ/5...``) or RabbitMQ, which ignore it but
        store it as one more message property (Artemis says ``ActiveMQ-Artemis/...``)."""
        return not self._server.startswith(("ActiveMQ/", "RabbitMQ"))

    @property
    def client_ack_per_subscription(self) -> bool:
        """Whether a ``client``-mode ACK settles only its own subscription's messages
        (ActiveMQ, Artemis). RabbitMQ's is an AMQP ``basic.ack`` with ``multiple`` on the
        connection's channel: it also settled another subscription's unacknowledged message
        (measured with RabbitMQ 3.10)."""
        return not self._server.startswith("RabbitMQ")

    @property
    def acks_ignore_subscription(self) -> bool:
        """Whether a STOMP 1.1 ACK/NACK is settled by its ``message-id`` alone, whatever its
        ``subscription`` header names: RabbitMQ (measured with RabbitMQ 3.10)."""
        return self._server.startswith("RabbitMQ")

    @property
    def copies_receipt_into_messages(self) -> bool:
        """Whether the broker copies a SEND's ``receipt`` header into the MESSAGEs it delivers
        (RabbitMQ: it keeps every header of the SEND; measured with the Ruby stomp gem, whose
        ``unreceive`` re-sent it and got a RECEIPT it never asked for)."""
        return self._server.startswith("RabbitMQ")

    @property
    def stomp10_rabbitmq(self) -> bool:
        """Whether STOMP 1.0 frames follow RabbitMQ's rules here: a 1.0 client's NACK is
        accepted (ActiveMQ refuses it: "NACK received but connection is in v1.0 mode"), and a
        durable SUBSCRIBE without ``id`` is refused ("Header 'id' is required for durable
        subscriptions"; ActiveMQ accepts it). Measured with RabbitMQ 3.10 / ActiveMQ 5.17."""
        return self._server.startswith("RabbitMQ")

    @property
    def receipt_breaks_wildcard_subscribe(self) -> bool:
        """Whether a ``receipt`` on a SUBSCRIBE to a wildcard destination (``/queue/a.*``,
        ``/queue/a.>``) can make the broker dispatch none of the messages already waiting:
        ActiveMQ Classic 5.17 (measured: 0 of 2 waiting messages in about half the tries with
        a receipt, 2 of 2 every time without one, and every time when the receipt rides on a
        later frame instead)."""
        return self._server.startswith("ActiveMQ/")

    @property
    def stable_message_ids(self) -> bool:
        """Whether this broker keeps a message's ``message-id`` across redelivery and
        failover: ActiveMQ Classic and Artemis do, RabbitMQ does not (docs/brokers.md,
        "Message ids")."""
        return self._server.startswith("ActiveMQ")

    def statistics(self) -> UpstreamStatistics:
        """Counters and negotiated parameters of this leg."""
        w = self.wire
        return UpstreamStatistics(
            broker=self.broker.label,
            version=self.version,
            server=self.connected.get("server"),
            heartbeat_ms=w.conn.heartbeat,
            connected_at=self.connected_at,
            frames_in=w.frames_in,
            frames_out=w.frames_out,
            bytes_in=w.bytes_in,
            bytes_out=w.bytes_out,
        )


#: Headers of an app's CONNECT that the sidecar sets itself on the upstream CONNECT.
_CONNECT_OWN_HEADERS = ("accept-version", "host", "heart-beat", "login", "passcode")


def connect_frame(
    broker: Broker, config: Config, *, heart_beat: str, app_connect: Frame | None = None
) -> Frame:
    """The CONNECT for ``broker``, the same for sessions and readiness probes.

    Offers every STOMP version (the sidecar speaks the broker's best). ``host`` (STOMP 1.2
    "CONNECT"; RabbitMQ reads it as the vhost and refuses one that does not exist) is the
    app's, as it would reach the broker directly, unless it names the sidecar itself (the
    loopback address or name an app connects to: then it means "this server", and the broker's
    equivalent is used); that equivalent is the broker's configured virtual host, else its
    host name. Credentials are the broker's own, else the sidecar's (``login``/``passcode``),
    else, for a session (``app_connect`` given), the app's. The app's other CONNECT headers
    (``client-id`` for ActiveMQ durable subscriptions...) pass through.
    """
    host = broker.virtual_host if broker.virtual_host is not None else broker.host
    app_host = app_connect.get("host") if app_connect is not None else None
    if app_host is not None and not _names_the_sidecar(app_host, config):
        host = app_host
    headers: list[tuple[str, str]] = [
        ("accept-version", ",".join(protocol.VERSIONS)),
        ("host", host),
        ("heart-beat", heart_beat),
    ]
    login: str | None
    passcode: str | None
    if broker.login is not None:
        login, passcode = broker.login, broker.passcode.reveal() if broker.passcode else None
    elif config.login is not None:
        login, passcode = config.login, config.passcode.reveal() if config.passcode else None
    elif app_connect is not None:
        login, passcode = app_connect.get("login"), app_connect.get("passcode")
    else:
        login, passcode = None, None
    if login is not None:
        headers.append(("login", login))
        if passcode is not None:
            headers.append(("passcode", passcode))
    if app_connect is not None:
        headers.extend(
            (k, v)
            for k, v in app_connect.headers
            if k not in _CONNECT_OWN_HEADERS and _connect_representable(k, v)
        )
    return Frame(Command.CONNECT, tuple(headers))


def _names_the_sidecar(host: str, config: Config) -> bool:
    """Whether a CONNECT ``host`` header names the server the app connected to, the sidecar
    (stomp.py and others send the address they connected to, ``127.0.0.1`` or ``localhost``
    for a sidecar), rather than a virtual host."""
    name = host.strip().lower()
    if name.startswith("[") and "]" in name:  # [::1]:61613
        name = name[1 : name.index("]")]
    elif name.count(":") == 1:  # localhost:61613
        name = name.partition(":")[0]
    return (
        name in ("", "localhost", "::1", "0.0.0.0", "::", config.listen[0].lower())
        or name.startswith("127.")
        or name.endswith(".localhost")
    )


def _connect_representable(name: str, value: str) -> bool:
    """Whether a header can go in a CONNECT frame, which is never escaped (STOMP 1.2 "Value
    Encoding"): an app's CONNECT may carry a lone CR inside a value, the broker's cannot."""
    return not any(c in name for c in ":\r\n") and "\r" not in value and "\n" not in value


#: Opens the byte stream to a broker: :class:`BrokerStreams` (TCP, and TLS for ``stomp+ssl``)
#: in the daemon; unit tests pass one that returns a memory stream to a scripted broker.
StreamOpener = Callable[[Broker], Awaitable[trio.abc.Stream]]


class BrokerStreams:
    """The daemon's :data:`StreamOpener` (call it with a broker): a TCP connection to
    ``broker.host:broker.port``, wrapped in TLS for a TLS broker with a context built from
    ``config`` at each call (:func:`proxy.tls.client_context`: rotated files apply at the next
    connect). ``tracker`` keeps each TLS broker's certificate and last failure.

    Raises (from a call):
        OSError: the broker cannot be reached (refused, unreachable, name not resolved).
        proxy.tls.TlsFailed: the TLS handshake or its files failed (one-line reason).
    """

    def __init__(self, config: Config, tracker: TlsTracker | None = None) -> None:
        self.config = config
        self.tracker = tracker if tracker is not None else TlsTracker(config.brokers)

    async def __call__(self, broker: Broker) -> trio.abc.Stream:
        # Names are resolved on every attempt: a Kubernetes Service may move
        # (docs/behaviour.md, "Broker list and reconnect policy").
        tcp = await trio.open_tcp_stream(broker.host, broker.port)
        if not broker.tls:
            return tcp
        name = server_name(broker, self.config)
        try:
            context = client_context(broker, self.config)
            tls = trio.SSLStream(tcp, context, server_hostname=name)
            await tls.do_handshake()
        except BaseException as exc:
            await trio.aclose_forcefully(tcp)
            reason = tls_failure(exc, broker, self.config)
            if reason is None or not isinstance(exc, Exception):
                raise
            if reason.endswith(CLOSED_IN_HANDSHAKE):
                with trio.move_on_after(DIAGNOSIS_SECONDS):
                    if await answers_stomp(broker.host, broker.port):
                        reason = PLAIN_PORT
            self.tracker.failed(broker, reason)
            raise TlsFailed(reason) from exc
        self.tracker.succeeded(broker, peer_certificate(tls, name))
        return tls

    def after_handshake(self, broker: Broker, reason: str) -> None:
        """A TLS failure that showed only after the handshake (TLS 1.3 sends the broker's
        "certificate required" alert with its first record), for the tracker."""
        self.tracker.failed(broker, reason)


async def connect_upstream(
    broker: Broker,
    connect: Frame,
    *,
    limits: protocol.Limits,
    grace: float,
    connect_timeout: float,
    open_stream: StreamOpener,
) -> Upstream:
    """Connect to ``broker``, send ``connect`` and return the CONNECTED leg.

    The caller owns the result: it runs :meth:`Upstream.keep_alive` in a nursery of its own
    and calls :meth:`Upstream.aclose` when done (or uses :func:`open_upstream`).

    Args:
        broker: where to connect.
        connect: the CONNECT frame to send (credentials, ``host``, ``heart-beat`` set by caller).
        limits: parser limits for frames coming from the broker.
        grace: heart-beat tolerance factor for this leg.
        connect_timeout: seconds for TCP + TLS + CONNECTED together.
        open_stream: how the byte stream is opened (:class:`BrokerStreams`).

    Raises:
        UpstreamRefused: the broker answered with an ERROR frame.
        TlsConnectFailed: TLS failed (see :class:`TlsConnectFailed`).
        ConnectFailed: anything else that prevented a STOMP session.
    """
    wire: FrameStream | None = None
    try:
        with trio.fail_after(connect_timeout):
            stream = await open_stream(broker)
            conn = protocol.Connection(protocol.Role.CLIENT, limits)
            wire = FrameStream(stream, conn, grace=grace)
            await wire.send(connect)
            while True:
                event = await wire.receive_event()
                if isinstance(event, HeartBeat):
                    continue
                if isinstance(event, ConnectionClosed):
                    raise _ClosedEarly(wire)
                if event.command is Command.ERROR:
                    raise UpstreamRefused(broker, event, login=connect.get("login"))
                connected = event
                break
    except trio.TooSlowError:
        if wire is not None:
            await trio.aclose_forcefully(wire.stream)
        reason = await _silence_reason(broker, wire, open_stream)
        if reason is not None:
            raise TlsConnectFailed(broker, reason) from None
        raise ConnectFailed(broker, f"no CONNECTED within {connect_timeout:g} s") from None
    except TlsFailed as exc:
        raise TlsConnectFailed(broker, str(exc)) from exc
    except (OSError, TransportLost, protocol.RemoteProtocolError, trio.BrokenResourceError) as exc:
        if wire is not None:
            await trio.aclose_forcefully(wire.stream)
        reason = await _tls_reason(exc, broker, wire, open_stream)
        if reason is not None:
            raise TlsConnectFailed(broker, reason) from exc
        raise ConnectFailed(broker, str(exc) or type(exc).__name__) from exc
    except _ClosedEarly as exc:
        await trio.aclose_forcefully(exc.wire.stream)
        reason = await _tls_reason(None, broker, exc.wire, open_stream)
        if reason is not None:
            raise TlsConnectFailed(broker, reason) from None
        raise ConnectFailed(broker, "connection closed before CONNECTED") from None
    except BaseException:
        if wire is not None:
            await trio.aclose_forcefully(wire.stream)
        raise
    # Silence is judged against the receive interval the caller offered, not the halved one
    # it asked the broker for (see FrameStream.start_heartbeats).
    offered = protocol.parse_heartbeat(connect.get("heart-beat"))[1]
    wire.start_heartbeats(silence_ms=offered * 2)
    return Upstream(broker, wire, connected)


class _ClosedEarly(Exception):
    """The broker closed the connection before CONNECTED (handled in connect_upstream)."""

    def __init__(self, wire: FrameStream) -> None:
        super().__init__("connection closed before CONNECTED")
        self.wire = wire


async def _tls_reason(
    exc: BaseException | None,
    broker: Broker,
    wire: FrameStream | None,
    open_stream: StreamOpener,
) -> str | None:
    """Why a connect failed, when TLS is why: an ``ssl`` error under ``exc`` (a TLS broker),
    or a TLS listener behind a plain URL: TLS records received, or the connection closed or
    reset before a byte arrived and the port answers a ClientHello (:func:`answers_tls`)."""
    if broker.tls:
        config = open_stream.config if isinstance(open_stream, BrokerStreams) else None
        reason = None if exc is None else tls_failure(exc, broker, config)
        if reason is None and wire is not None and wire.bytes_in == 0:
            # Under TLS 1.3 a broker refuses our certificate (or its absence) with an alert
            # after the handshake; the connection's reset can overtake that alert (a reset
            # discards what the kernel has not handed over yet).
            reason = SILENT_AFTER_HANDSHAKE
        if reason is not None and isinstance(open_stream, BrokerStreams):
            open_stream.after_handshake(broker, reason)
        return reason
    if wire is None or not isinstance(open_stream, BrokerStreams):
        return None
    if looks_like_tls(wire.head):
        return TLS_PORT
    return await _silence_reason(broker, wire, open_stream)


async def _silence_reason(
    broker: Broker, wire: FrameStream | None, open_stream: StreamOpener
) -> str | None:
    """When a broker said nothing (closed, reset or silent before a byte): whether the port
    speaks the other protocol than the URL says (:func:`proxy.tls.answers_tls`,
    :func:`proxy.tls.answers_stomp`), within ``DIAGNOSIS_SECONDS``; None otherwise."""
    if not isinstance(open_stream, BrokerStreams):
        return None
    if broker.tls:
        if wire is not None:  # the handshake completed: TLS it is
            return None
        with trio.move_on_after(DIAGNOSIS_SECONDS):
            if await answers_stomp(broker.host, broker.port):
                open_stream.after_handshake(broker, PLAIN_PORT)
                return PLAIN_PORT
        return None
    if wire is None or wire.bytes_in > 0 or wire.frames_out == 0:
        return None
    with trio.move_on_after(DIAGNOSIS_SECONDS):
        if await answers_tls(broker.host, broker.port):
            return TLS_PORT
    return None


@asynccontextmanager
async def open_upstream(
    broker: Broker,
    connect: Frame,
    *,
    limits: protocol.Limits,
    grace: float,
    connect_timeout: float,
    open_stream: StreamOpener,
) -> AsyncIterator[Upstream]:
    """:func:`connect_upstream` as an async context manager that owns the leg's heart-beat
    task and closes the socket on exit (for short-lived legs such as readiness probes)."""
    upstream = await connect_upstream(
        broker,
        connect,
        limits=limits,
        grace=grace,
        connect_timeout=connect_timeout,
        open_stream=open_stream,
    )
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(upstream.keep_alive)
            yield upstream
            nursery.cancel_scope.cancel()
    finally:
        await upstream.aclose()
