"""A STOMP connection over a trio stream: the I/O shell around :class:`protocol.Connection`.

This is the only place where bytes of a STOMP leg meet a socket. It follows the shape of h11's
``examples/trio-server.py`` wrapper: the sans-I/O connection decides what bytes mean, this class
moves them, and a failed write is reported back to the state machine (``send_failed``).

One writer at a time: every write goes through a :class:`trio.Lock`, so a reader task that
forwards a frame and a heart-beat task never interleave bytes on the stream (trio raises
``BusyResourceError`` otherwise). Heart-beat bookkeeping uses :class:`protocol.HeartBeatTimer`
with ``trio.current_time()`` passed in; the arithmetic itself stays in ``protocol/``.
"""

from __future__ import annotations

import trio

import protocol
from protocol import NEED_DATA, ConnectionClosed, Frame, HeartBeat

__all__ = ["FrameStream", "HeartBeatTimeout", "TransportLost", "send_heartbeats"]

#: Bytes asked of the kernel per read. 64 KiB amortises the per-call cost of trio and the
#: parser over many small frames, and a 1 MiB body arrives in 16 reads.
RECEIVE_SIZE = 65536


class TransportLost(Exception):
    """The peer's TCP connection broke (reset, closed under a write, or silent too long)."""


class HeartBeatTimeout(TransportLost):
    """Nothing arrived within the negotiated heart-beat interval times the grace factor.

    Source: STOMP 1.2 "Heart-beating" (a peer may consider the connection dead after the
    receive interval "with a tolerance"); Artemis ``clientFailureCheckPeriod``.
    """


class FrameStream:
    """One STOMP leg: a :class:`protocol.Connection` bound to a :class:`trio.abc.Stream`.

    Args:
        stream: the byte stream (a ``trio.SocketStream`` in production, a memory stream in tests).
        conn: the sans-I/O connection, in the role we play on this leg.
        grace: heart-beat tolerance factor; a peer silent for ``receive interval * grace`` is dead.

    Counters ``frames_in``, ``frames_out``, ``bytes_in``, ``bytes_out`` count traffic on the leg.
    """

    def __init__(self, stream: trio.abc.Stream, conn: protocol.Connection, *, grace: float) -> None:
        self.stream = stream
        self.conn = conn
        self.grace = grace
        self._send_lock = trio.Lock()
        self.timer: protocol.HeartBeatTimer | None = None
        self.broken: str | None = None  # why the stream failed, once a read or write did
        self.frames_in = 0
        self.frames_out = 0
        self.bytes_in = 0
        self.bytes_out = 0

    def start_heartbeats(self, *, silence_ms: int = 0) -> None:
        """Arm the heart-beat timer once the CONNECT/CONNECTED exchange has negotiated it.

        ``silence_ms``: when receiving beats was negotiated, judge silence against at least
        this interval (the peer is dead after ``max(negotiated, silence_ms) * grace``). The
        upstream leg asks the broker for beats twice as often as ``silence_ms`` and judges by
        ``silence_ms`` itself: a broker writes a beat only when it wrote nothing during its
        last check period, so its gaps reach twice the interval it was asked for (ActiveMQ's
        InactivityMonitor; RabbitMQ beats at half the interval).
        """
        send_ms, receive_ms = self.conn.heartbeat
        if receive_ms:
            receive_ms = max(receive_ms, silence_ms)
        self.timer = protocol.HeartBeatTimer(
            send_ms, receive_ms, trio.current_time(), grace=self.grace
        )

    async def send(self, frame: Frame, *, fatal: bool = True) -> None:
        """Serialize ``frame`` for this leg's negotiated version and write it.

        ``fatal=False``: an ERROR that rejects one frame and keeps the connection
        (:meth:`protocol.Connection.send`).

        Raises:
            TransportLost: the stream is broken or closed.
            protocol.LocalProtocolError: the frame cannot be sent in this state/version.
        """
        if self.broken is not None:
            raise TransportLost(self.broken)
        data = self.conn.send(frame, fatal=fatal)
        await self._write(data)
        self.frames_out += 1

    async def send_heartbeat(self) -> None:
        """Write one EOL heart-beat (STOMP 1.2 "Heart-beating")."""
        if self.broken is not None:
            raise TransportLost(self.broken)
        await self._write(self.conn.send_heartbeat())

    async def _write(self, data: bytes) -> None:
        async with self._send_lock:
            try:
                await self.stream.send_all(data)
            except BaseException as exc:
                # As in h11's trio example: a write that did not complete leaves the peer with
                # a partial frame, so the connection is unusable. Cancelled is re-raised too.
                self.conn.send_failed()
                self.broken = f"write failed: {exc or type(exc).__name__}"
                if isinstance(exc, trio.BrokenResourceError | trio.ClosedResourceError):
                    raise TransportLost(self.broken) from exc
                raise
        self.bytes_out += len(data)
        if self.timer is not None:
            self.timer.data_sent(trio.current_time())

    async def receive_event(self) -> Frame | HeartBeat | ConnectionClosed:
        """Return the next frame, heart-beat or ``CONNECTION_CLOSED`` (clean EOF).

        Raises:
            TransportLost: the connection was reset.
            HeartBeatTimeout: nothing arrived within the negotiated receive interval * grace.
            protocol.RemoteProtocolError: the peer sent garbage (carries the ERROR to answer).
        """
        while True:
            event = self.conn.next_event()
            if event is not NEED_DATA:
                assert not isinstance(event, protocol.NeedData)
                if isinstance(event, Frame):
                    self.frames_in += 1
                return event
            deadline = self.timer.receive_deadline() if self.timer is not None else None
            try:
                if deadline is None:
                    data = await self.stream.receive_some(RECEIVE_SIZE)
                else:
                    with trio.move_on_at(deadline) as scope:
                        data = await self.stream.receive_some(RECEIVE_SIZE)
                    if scope.cancelled_caught:
                        raise HeartBeatTimeout(
                            f"no data for {self.conn.heartbeat[1] * self.grace / 1000:.1f} s "
                            f"(heart-beat {self.conn.heartbeat[1]} ms x {self.grace})"
                        )
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                self.broken = f"read failed: {exc or type(exc).__name__}"
                raise TransportLost(self.broken) from exc
            self.bytes_in += len(data)
            if self.timer is not None:
                self.timer.data_received(trio.current_time())
            self.conn.receive_data(bytes(data))

    def next_buffered(self) -> Frame | HeartBeat | ConnectionClosed | None:
        """The next event if it is already in the buffer, else None; never does I/O.

        Lets a reader see whether a frame is the last of a burst (DESIGN §3.3: request a
        receipt when the session goes idle).
        """
        event = self.conn.next_event()
        if isinstance(event, protocol.NeedData):
            return None
        if isinstance(event, Frame):
            self.frames_in += 1
        return event

    async def aclose(self) -> None:
        """Close the stream (no goodbye frame; callers send DISCONNECT/ERROR first)."""
        await self.stream.aclose()


async def send_heartbeats(fs: FrameStream) -> None:
    """Keep ``fs`` alive: write an EOL whenever nothing was written for the send interval.

    Runs until cancelled by its owner; returns at once when no heart-beats were negotiated.
    Raises :class:`TransportLost` when the write fails.
    """
    timer = fs.timer
    if timer is None:
        return
    while True:
        deadline = timer.next_send_deadline()
        if deadline is None:
            return
        if trio.current_time() >= deadline:
            await fs.send_heartbeat()
        else:
            await trio.sleep_until(deadline)
