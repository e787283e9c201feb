"""The upstream leg: one STOMP client connection from the sidecar to one broker.

``open_upstream`` is an async context manager that owns the leg's task (docs/architecture.md,
"Every task has an owner"): it connects, performs the CONNECT/CONNECTED exchange, and runs the
leg's heart-beat sender in a nursery it owns; leaving the block cancels that task and closes
the socket. The session reads frames from it with
:meth:`Upstream.receive_event` (one reader) and writes with :meth:`Upstream.send`. Opening the
byte stream (TCP, TLS, and why it failed) is :mod:`proxy.legs.opening`; the CONNECT frame is
:mod:`proxy.legs.connect_frame`; what the broker does differently is
:mod:`proxy.legs.dialect`.

Connecting is bounded by ``connect_timeout`` (TCP connect, TLS handshake and CONNECTED
together): a broker that accepts TCP but never answers CONNECT (a SIGSTOPped JVM still
completes the kernel's handshake: docs/brokers.md, "Takeover and hung brokers") fails the
attempt like a refused one.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import trio

import protocol
from config import REDACTED, Broker
from protocol import Command, ConnectionClosed, Frame, HeartBeat, RawFrame
from proxy.legs.connect_frame import UPSTREAM_SEND_SHARE
from proxy.legs.dialect import BrokerDialect
from proxy.legs.opening import StreamOpener, silence_reason, tls_reason
from proxy.legs.stream import FrameStream, TransportLost
from proxy.legs.tls import TlsFailed

__all__ = [
    "ConnectFailed",
    "TlsConnectFailed",
    "Upstream",
    "UpstreamRefused",
    "UpstreamStatistics",
    "UpstreamUnavailable",
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
        dialect: how this broker confirms, what it copies, which ids it understands
            (:class:`~proxy.legs.dialect.BrokerDialect`).
    """

    def __init__(self, broker: Broker, wire: FrameStream, connected: Frame) -> None:
        self.broker = broker
        self.wire = wire
        self.connected = connected
        self.version = wire.conn.version
        #: What this broker does differently, read off CONNECTED's ``server`` header once.
        self.dialect = BrokerDialect.from_server(connected.get("server"))
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
        """The out-buffer is past :data:`proxy.legs.stream.FLUSH_THRESHOLD`: flush before
        queueing."""
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
        reason = await silence_reason(broker, wire, open_stream)
        if reason is not None:
            raise TlsConnectFailed(broker, reason) from None
        raise ConnectFailed(broker, f"no CONNECTED within {connect_timeout:g} s") from None
    except TlsFailed as exc:
        raise TlsConnectFailed(broker, str(exc)) from exc
    except (OSError, TransportLost, protocol.RemoteProtocolError, trio.BrokenResourceError) as exc:
        if wire is not None:
            await trio.aclose_forcefully(wire.stream)
        reason = await tls_reason(exc, broker, wire, open_stream)
        if reason is not None:
            raise TlsConnectFailed(broker, reason) from exc
        raise ConnectFailed(broker, str(exc) or type(exc).__name__) from exc
    except _ClosedEarly as exc:
        await trio.aclose_forcefully(exc.wire.stream)
        reason = await tls_reason(None, broker, exc.wire, open_stream)
        if reason is not None:
            raise TlsConnectFailed(broker, reason) from None
        raise ConnectFailed(broker, "connection closed before CONNECTED") from None
    except BaseException:
        if wire is not None:
            await trio.aclose_forcefully(wire.stream)
        raise
    # Silence is judged against the receive interval the caller offered, not the halved one
    # it asked the broker for (see FrameStream.start_heartbeats); beats go out at half the
    # interval promised (UPSTREAM_SEND_SHARE, proxy.legs.connect_frame.upstream_heart_beat).
    offered = protocol.parse_heartbeat(connect.get("heart-beat"))[1]
    wire.start_heartbeats(silence_ms=offered * 2, send_share=UPSTREAM_SEND_SHARE)
    return Upstream(broker, wire, connected)


class _ClosedEarly(Exception):
    """The broker closed the connection before CONNECTED (handled in connect_upstream)."""

    def __init__(self, wire: FrameStream) -> None:
        super().__init__("connection closed before CONNECTED")
        self.wire = wire


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
