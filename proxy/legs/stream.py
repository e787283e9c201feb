"""A STOMP connection over a trio stream: the I/O shell around :class:`protocol.Connection`.

This is the only place where bytes of a STOMP leg meet a socket. It follows the shape of h11's
``examples/trio-server.py`` wrapper: the sans-I/O connection decides what bytes mean, this class
moves them, and a failed write is reported back to the state machine (``send_failed``).

Writes are coalesced: :meth:`FrameStream.queue` serializes a frame into an out-buffer without
any I/O, and :meth:`FrameStream.flush` writes everything queued in one ``send_all``. A relay
queues every frame of a burst it has already read and flushes once the burst is done, so a
burst of N frames costs one system call and one trip through the trio scheduler, not N
(``send`` is queue + flush, for single frames). The buffer is bounded: past
:data:`FLUSH_THRESHOLD` bytes ``needs_flush`` is true and callers flush before queueing more.
A frame of any size is queued (``max_frame_bytes`` bounds it when it is read); one of
:data:`FLUSH_THRESHOLD` bytes or more is written as it is, never joined with the others, so
its bytes are not copied again (docs/behaviour.md, "Limits and bad input").
One writer at a time: every write takes the leg's turn (``_WriteTurn``, a lean
:class:`trio.Lock`), so a reader task that forwards a frame and a heart-beat task never
interleave bytes on the stream (trio raises ``BusyResourceError`` otherwise); bytes leave in
the order they were queued. Heart-beat
bookkeeping uses :class:`protocol.HeartBeatTimer` with ``trio.current_time()`` passed in; the
arithmetic itself stays in ``protocol/``.
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

import trio

import protocol
from protocol import NEED_DATA, ConnectionClosed, Frame, HeartBeat, RawFrame

if TYPE_CHECKING:
    from proxy.legs.memory import MemoryBudgetGate
    from proxy.tracking.budget import ReadCharge

    #: A read held once bytes are ready (_receive_raw).
    _Reserve = tuple[MemoryBudgetGate, ReadCharge]

__all__ = ["FrameStream", "HeartBeatTimeout", "TransportLost"]

#: Bytes asked of the kernel per read. 64 KiB amortises the per-call cost of trio and the
#: parser over many small frames, and a 1 MiB body arrives in 16 reads.
RECEIVE_SIZE = 65536
#: Queued bytes past which a writer must flush before queueing more (``needs_flush``): bounds
#: the out-buffer of a leg and lets a big burst start leaving while the rest is read.
FLUSH_THRESHOLD = 65536
#: Seconds a read may take when its heart-beat deadline passed while the reader paused: long
#: enough to take what is buffered, too short to wait for anything (``_receive_stream``).
_LATE_READ = 0.001


class TransportLost(Exception):
    """The peer's TCP connection broke (reset, closed under a write, or silent too long)."""


class HeartBeatTimeout(TransportLost):
    """Nothing arrived within the negotiated heart-beat interval times the grace factor.

    Source: STOMP 1.2 "Heart-beating" (a peer may consider the connection dead after the
    receive interval "with a tolerance"); Artemis ``clientFailureCheckPeriod``.
    """


def _raw_socket(stream: trio.abc.Stream) -> socket.socket | None:
    """The non-blocking stdlib socket under a plain ``trio.SocketStream``, or None.

    :class:`FrameStream` does its reads and writes on it directly (the lean path) and keeps
    trio's stream methods for everything else (TLS, memory streams in tests). trio keeps it
    in ``SocketType._sock``; a trio that stops doing so only loses the lean path
    (``test_production_streams_take_the_lean_io_path`` says so).
    """
    if type(stream) is not trio.SocketStream:
        return None
    raw = getattr(stream.socket, "_sock", None)
    return raw if isinstance(raw, socket.socket) else None


class _WriteTurn:
    """The turn to write on one leg: :class:`trio.Lock`'s job (one writer at a time; a turn
    released while others wait is handed to the first of them, in order) without its owner
    bookkeeping, which cost about 1.5 us a write (two writes per synchronous round trip).
    Only :class:`FrameStream` takes it, always releasing in a ``finally``."""

    __slots__ = ("_busy", "_lot")

    def __init__(self) -> None:
        self._busy = False
        self._lot = trio.lowlevel.ParkingLot()

    def locked(self) -> bool:
        """Whether a writer has the turn."""
        return self._busy

    def acquire_nowait(self) -> None:
        """Take the turn, which nobody has (:meth:`locked` is False): no checkpoint."""
        assert not self._busy
        self._busy = True

    async def acquire(self) -> None:
        """Take the turn, waiting for it (cancellable) when another writer has it."""
        if not self._busy:
            await trio.lowlevel.checkpoint_if_cancelled()
            self._busy = True
            return
        await self._lot.park()  # woken by release(), which handed the turn over

    def release(self) -> None:
        """Give the turn up: to the first writer waiting, else to nobody."""
        if self._lot:
            self._lot.unpark()
        else:
            self._busy = False


class FrameStream:
    """One STOMP leg: a :class:`protocol.Connection` bound to a :class:`trio.abc.Stream`.

    Args:
        stream: the byte stream (a ``trio.SocketStream`` in production, a memory stream in tests).
        conn: the sans-I/O connection, in the role we play on this leg.
        grace: heart-beat tolerance factor; a peer silent for ``receive interval * grace`` is dead.

    Counters ``frames_in``, ``frames_out``, ``bytes_in``, ``bytes_out`` count traffic on the leg.

    I/O on a plain TCP socket takes a lean path: ``recv``/``send`` on the socket itself, with
    trio's ``wait_readable``/``wait_writable`` only when the kernel says EAGAIN, one
    scheduling checkpoint per read that did not wait (as trio's own ``receive_some``), none
    after a write that completed at once (the relay's next read is one), and no cancel scope
    for the heart-beat deadline while :meth:`FrameStream.keep_alive` runs for the leg: that task
    judges the peer's silence (it wakes at the deadline anyway, a read does not need to) and
    wakes a reader it found silent with ``trio.lowlevel.notify_closing`` (the leg is over).
    Without it (a handshake, a goodbye) a wait carries its own deadline scope. trio's
    ``SocketStream`` pays an async context manager, two checkpoints and a cancel scope per
    call: with one frame per read (a synchronous request/reply) that was most of the sidecar's
    CPU.
    """

    def __init__(self, stream: trio.abc.Stream, conn: protocol.Connection, *, grace: float) -> None:
        self.stream = stream
        self._sock = _raw_socket(stream)
        self.conn = conn
        self.grace = grace
        self._send_lock = _WriteTurn()
        self._out: list[bytes] = []
        self._out_bytes = 0
        self._out_large = False  # a chunk of FLUSH_THRESHOLD bytes or more is queued
        self.timer: protocol.HeartBeatTimer | None = None
        self.broken: str | None = None  # why the stream failed, once a read or write did
        self.frames_in = 0
        self.frames_out = 0
        self.bytes_in = 0
        self.bytes_out = 0
        #: The first bytes received on the leg (up to 5), to tell a TLS record from STOMP.
        self.head = b""
        #: The last read took less than it asked for: the kernel had nothing more then, so
        #: the next read waits for readiness first instead of trying a read that would fail
        #: with EAGAIN (two system calls fewer per request/reply round trip, bench.syscalls).
        self._drained = False
        #: :meth:`keep_alive` judges the peer's silence for the reads (lean path only).
        self._watched = False
        #: It found the peer silent: every read raises :class:`HeartBeatTimeout` from now on.
        self._silent = False
        #: An app leg's hold on the process's memory budget (:meth:`use_memory`): each read
        #: waits for it; None: reads never wait for memory (broker legs).
        self._memory: MemoryBudgetGate | None = None
        self._memory_waits = True
        self.read_charge: ReadCharge | None = None

    def use_memory(
        self, gate: MemoryBudgetGate, charge: ReadCharge | None = None, *, wait: bool = True
    ) -> None:
        """Charge what this leg's read buffer holds to the process's memory budget
        (:mod:`proxy.legs.memory`), in ``charge`` (a new one when None), and read only as the
        budget allows (an app leg); ``wait=False``: never wait for it (a broker leg, whose
        RECEIPTs are what frees memory). The charge is released by :meth:`leave_memory`, or
        by its owner."""
        self._memory = gate
        self._memory_waits = wait
        self.read_charge = charge if charge is not None else gate.charge_for(RECEIVE_SIZE)

    @property
    def memory(self) -> MemoryBudgetGate | None:
        """The memory budget this leg's reads are charged to (:meth:`use_memory`), if any."""
        return self._memory

    def leave_memory(self) -> None:
        """The leg is done reading: release what its buffer is charged, charge no more."""
        if self.read_charge is not None:
            self.read_charge.close()
        self._memory = None
        self.read_charge = None

    def start_heartbeats(self, *, silence_ms: int = 0, send_share: float = 1.0) -> None:
        """Arm the heart-beat timer once the CONNECT/CONNECTED exchange has negotiated it.

        ``silence_ms``: when receiving beats was negotiated, judge silence against at least
        this interval (the peer is dead after ``max(negotiated, silence_ms) * grace``). The
        upstream leg asks the broker for beats twice as often as ``silence_ms`` and judges by
        ``silence_ms`` itself: a broker writes a beat only when it wrote nothing during its
        last check period, so its gaps reach twice the interval it was asked for (ActiveMQ's
        InactivityMonitor; RabbitMQ beats at half the interval). ``send_share``: that of
        :class:`protocol.HeartBeatTimer`.
        """
        send_ms, receive_ms = self.conn.heartbeat
        receive_ms = max(receive_ms, silence_ms) if receive_ms else 0
        self.timer = protocol.HeartBeatTimer(
            send_ms, receive_ms, trio.current_time(), grace=self.grace, send_share=send_share
        )

    async def send(self, frame: Frame, *, fatal: bool = True) -> None:
        """Serialize ``frame`` for this leg's negotiated version and write it, together with
        anything queued before it.

        ``fatal=False``: an ERROR that rejects one frame and keeps the connection
        (:meth:`protocol.Connection.send`).

        Raises:
            TransportLost: the stream is broken or closed.
            protocol.LocalProtocolError: the frame cannot be sent in this state/version.
        """
        self.queue(frame, fatal=fatal)
        await self.flush()

    def queue(self, frame: Frame | RawFrame, *, fatal: bool = True) -> None:
        """Serialize ``frame`` into the out-buffer (a :class:`protocol.RawFrame`: its bytes,
        :meth:`protocol.Connection.send`); no I/O. The bytes leave at the next
        :meth:`flush` (or :meth:`send`) on this stream, by whichever task calls it.

        Raises:
            TransportLost: the stream is already broken.
            protocol.LocalProtocolError: the frame cannot be sent in this state/version.
        """
        if self.broken is not None:
            raise TransportLost(self.broken)
        if self.conn.state is protocol.State.CLOSED:
            # The peer closed (our reader saw EOF) before the owner noticed: the leg is lost,
            # not misused (the state machine would call this a LocalProtocolError).
            raise TransportLost("connection closed by the peer")
        data = self.conn.send(frame, fatal=fatal)
        self._out.append(data)
        self._out_bytes += len(data)
        if len(data) >= FLUSH_THRESHOLD:
            self._out_large = True
        self.frames_out += 1

    @property
    def needs_flush(self) -> bool:
        """More than :data:`FLUSH_THRESHOLD` bytes are queued: flush before queueing more."""
        return self._out_bytes >= FLUSH_THRESHOLD

    @property
    def queued_bytes(self) -> int:
        """Bytes queued and not yet handed to the stream."""
        return self._out_bytes

    async def flush(self) -> None:
        """Write everything queued, in order, in one ``send_all``. When it returns, every
        frame queued before the call has been handed to the stream (another task's write in
        progress is waited for). Returns at once, without a checkpoint, when nothing is
        queued or being written.

        Raises:
            TransportLost: the write failed; the stream is broken from now on.
        """
        if not self._out and not self._send_lock.locked():
            return
        await self._write(None)

    async def send_heartbeat(self) -> None:
        """Write one EOL heart-beat (STOMP 1.2 "Heart-beating"), after anything queued."""
        if self.broken is not None:
            raise TransportLost(self.broken)
        await self._write(self.conn.send_heartbeat())

    async def keep_alive(self) -> None:
        """Keep the leg alive: write an EOL whenever nothing was written for the send
        interval; on a plain TCP leg, also judge the peer's silence for the reader: past the
        receive deadline with nothing read and nothing waiting in the kernel, the reader raises
        :class:`HeartBeatTimeout` (bytes waiting because the reader paused count as received:
        the peer is not silent, as a reader judges, STOMP 1.2 "Heart-beating").

        Run it in the owner's nursery: it runs until cancelled, or until it found the peer
        silent; returns at once when there is nothing to send or judge. Raises
        :class:`TransportLost` when a write fails.
        """
        timer = self.timer
        if timer is None:
            return
        watch = self._sock is not None and timer.receive_deadline() is not None
        self._watched = watch
        try:
            while True:
                send_at = timer.next_send_deadline()
                silent_at = timer.receive_deadline() if watch else None
                now = trio.current_time()
                if silent_at is not None and now >= silent_at:
                    if not self._bytes_waiting():
                        self._found_silent()
                        return
                    timer.data_received(now)
                    continue
                if send_at is not None and now >= send_at:
                    await self.send_heartbeat()
                    continue
                if send_at is None and silent_at is None:
                    return
                await trio.sleep_until(min(t for t in (send_at, silent_at) if t is not None))
        finally:
            self._watched = False

    async def _write(self, extra: bytes | None) -> None:
        lock = self._send_lock
        if lock.locked():
            await lock.acquire()
        else:
            # Uncontended: take it without a scheduling checkpoint (send_all has its own),
            # one trip through the scheduler less per write.
            lock.acquire_nowait()
        try:
            written = await self._write_locked(extra)
        finally:
            lock.release()
        if written:
            self.bytes_out += written
            if self.timer is not None:
                self.timer.data_sent(trio.current_time())

    async def _write_locked(self, extra: bytes | None) -> int:
        # Cancelled while taking the lock (its last step is a shielded checkpoint): leave now,
        # with the queue intact, rather than inside send_all after taking the bytes, which
        # would mark an untouched stream broken and lose them.
        await trio.lowlevel.checkpoint_if_cancelled()
        if self.broken is not None:  # the write we waited for failed
            raise TransportLost(self.broken)
        # Whatever was queued until we got the lock leaves now, in queue order.
        out = self._out
        if extra is not None:
            out.append(extra)
        if not out:
            return 0
        if len(out) == 1:
            writes = [out[0]]
        elif self._out_large:
            writes = _coalesced(out)
        else:
            writes = [b"".join(out)]
        out.clear()
        self._out_bytes = 0
        self._out_large = False
        written = 0
        try:
            for data in writes:
                if self._sock is not None:
                    await _send_all_raw(self._sock, data)
                else:
                    await self.stream.send_all(data)
                written += len(data)
        except BaseException as exc:
            # As in h11's trio example: a write that did not complete leaves the peer with a
            # partial frame, so the connection is unusable. Cancelled is re-raised too.
            self.conn.send_failed()
            self.broken = f"write failed: {exc or type(exc).__name__}"
            if isinstance(exc, trio.BrokenResourceError | trio.ClosedResourceError):
                raise TransportLost(self.broken) from exc
            raise
        return written

    async def receive_event(self) -> Frame | HeartBeat | ConnectionClosed:
        """Return the next frame, heart-beat or ``CONNECTION_CLOSED`` (clean EOF).

        Raises:
            TransportLost: the connection was reset.
            HeartBeatTimeout: nothing arrived within the negotiated receive interval * grace.
            protocol.RemoteProtocolError: the peer sent garbage (carries the ERROR to answer).
        """
        event = await self.receive_fast_event(fast=False)
        assert not isinstance(event, RawFrame)
        return event

    async def receive_fast_event(
        self, *, fast: bool = True
    ) -> Frame | RawFrame | HeartBeat | ConnectionClosed:
        """:meth:`receive_event`, with the frames of the connection's ``raw_commands`` as
        :class:`protocol.RawFrame` (:meth:`protocol.Connection.next_fast_event`): the fast
        lane's reads. ``fast=False``: never.

        Raises: as :meth:`receive_event`.
        """
        conn = self.conn
        while True:
            event = conn.next_fast_event() if fast else conn.next_event()
            if event is not NEED_DATA:
                assert not isinstance(event, protocol.NeedData)
                if isinstance(event, Frame | RawFrame):
                    self.frames_in += 1
                return event
            data: bytes | bytearray
            memory = self._memory
            reserve = None
            if memory is not None:
                charge = self.read_charge
                assert charge is not None
                buffered, total = conn.frame_in_progress()
                # Between frames, nothing charged, not over: no coroutine to make (every read).
                if not self._memory_waits:
                    memory.account(charge, buffered, total, self.frames_in)
                elif buffered or charge.charged or memory.budget.over:
                    await memory.before_read(charge, buffered, total, self.frames_in)
                reserve = (memory, charge) if self._memory_waits and not buffered else None
            try:
                if self._sock is not None:
                    data = await self._receive_raw(self._sock, reserve)  # notes the time
                else:
                    data = await self._receive_stream()
                    if self.timer is not None:
                        self.timer.data_received(trio.current_time())
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                self.broken = f"read failed: {exc or type(exc).__name__}"
                raise TransportLost(self.broken) from exc
            if not self.bytes_in:
                self.head = bytes(data[:5])
            self.bytes_in += len(data)
            conn.receive_data(bytes(data))

    def _silence(self) -> HeartBeatTimeout:
        # The interval silence is judged by (start_heartbeats), not always the negotiated one.
        interval = self.timer.receive_interval_ms if self.timer else self.conn.heartbeat[1]
        return HeartBeatTimeout(
            f"no data for {interval * self.grace / 1000:.1f} s "
            f"(heart-beat {interval} ms x {self.grace})"
        )

    def _bytes_waiting(self) -> bool:
        """Whether the kernel holds something of the peer's the reader has not taken yet:
        bytes, an EOF or a reset (lean path; a non-blocking peek, nothing consumed). Any of
        them is for the reader to find, not a silence."""
        assert self._sock is not None
        try:
            self._sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False
        except OSError:
            return True
        return True

    def _found_silent(self) -> None:
        """The peer is silent past its deadline: reads raise :class:`HeartBeatTimeout`, and a
        reader waiting now is woken to raise it (so is a writer waiting: the leg is over)."""
        self._silent = True
        assert self._sock is not None
        trio.lowlevel.notify_closing(self._sock)

    async def _receive_stream(self) -> bytes | bytearray:
        deadline = self.timer.receive_deadline() if self.timer is not None else None
        if deadline is None:
            return await self.stream.receive_some(RECEIVE_SIZE)
        # A deadline that passed while the reader paused (backpressure) gets a millisecond:
        # trio streams try to read before they wait, so what the peer sent meanwhile is
        # taken, and a peer that sent nothing is found silent at the first wait.
        with trio.move_on_at(max(deadline, trio.current_time() + _LATE_READ)):
            return await self.stream.receive_some(RECEIVE_SIZE)
        raise self._silence()

    async def _receive_raw(self, sock: socket.socket, reserve: _Reserve | None = None) -> bytes:
        """Read what the kernel has (``b""`` at EOF), waiting only if it has nothing, and note
        the time on the heart-beat timer (before any checkpoint: :meth:`keep_alive` judges).

        What is buffered is always taken before silence is judged: a reader that paused
        (backpressure) comes back to the bytes that arrived meanwhile, not to a deadline
        that passed while it was not reading.

        Raises: trio.BrokenResourceError (reset, closed), HeartBeatTimeout, Cancelled.
        """
        if self._silent:
            raise self._silence()
        timer = self.timer
        watched = self._watched
        deadline = timer.receive_deadline() if timer is not None and not watched else None
        # Read first, before any wait, when the last read filled its buffer (more may be
        # there: a stream) or when the silence deadline has passed (what came while the
        # reader paused is taken before silence is judged). After a short read the kernel
        # had nothing more: wait for readiness at once (a reply has rarely come already).
        if not self._drained or (deadline is not None and deadline <= trio.current_time()):
            await trio.lowlevel.checkpoint_if_cancelled()
            data = await self._recv(sock, reserve)
            if data is not None:
                # As trio's receive_some: a checkpoint that cannot lose the bytes just read.
                await trio.lowlevel.cancel_shielded_checkpoint()
                return data
        while True:
            if deadline is None:
                try:
                    await trio.lowlevel.wait_readable(sock)
                except trio.ClosedResourceError:
                    if self._silent:  # woken by keep_alive (_found_silent)
                        raise self._silence() from None
                    raise
            else:
                with trio.move_on_at(deadline) as scope:
                    await trio.lowlevel.wait_readable(sock)
                if scope.cancelled_caught:
                    raise self._silence()
            data = await self._recv(sock, reserve)
            if data is not None:
                return data
            deadline = timer.receive_deadline() if timer is not None and not watched else None

    async def _recv(self, sock: socket.socket, reserve: _Reserve | None) -> bytes | None:
        """One ``recv`` of up to :data:`RECEIVE_SIZE` bytes, the memory budget's room for it
        reserved first (then what it brought held), the time noted on the heart-beat timer at
        once (:meth:`keep_alive` may judge silence at the next checkpoint): the bytes (``b""``
        at EOF), or None (room given back). Raises trio.BrokenResourceError (reset, closed)."""
        if reserve is not None:
            await reserve[0].reserve_read(reserve[1])
        try:
            data = sock.recv(RECEIVE_SIZE)
        except BlockingIOError:
            if reserve is not None:
                reserve[1].take(0)
            return None
        except OSError as exc:
            raise trio.BrokenResourceError(f"recv: {exc}") from exc
        if reserve is not None:
            reserve[0].brought(reserve[1], len(data))
        self._drained = len(data) < RECEIVE_SIZE
        timer = self.timer
        if timer is not None:
            timer.data_received(trio.current_time())
        return data

    def next_buffered(self) -> Frame | HeartBeat | ConnectionClosed | None:
        """The next event if it is already in the buffer, else None; never does I/O.

        Lets a reader see whether a frame is the last of a burst, which gets a receipt so that
        a session going idle is confirmed (docs/behaviour.md, "Confirmation window").
        """
        event = self.next_buffered_fast(fast=False)
        assert not isinstance(event, RawFrame)
        return event

    def next_buffered_fast(
        self, *, fast: bool = True
    ) -> Frame | RawFrame | HeartBeat | ConnectionClosed | None:
        """:meth:`next_buffered` as :meth:`receive_fast_event` reads (``fast=False``: as
        :meth:`receive_event`)."""
        event = self.conn.next_fast_event() if fast else self.conn.next_event()
        if isinstance(event, protocol.NeedData):
            return None
        if isinstance(event, Frame | RawFrame):
            self.frames_in += 1
        return event

    async def aclose(self) -> None:
        """Close the stream (no goodbye frame; callers send DISCONNECT/ERROR first)."""
        await self.stream.aclose()


def _coalesced(chunks: list[bytes]) -> list[bytes]:
    """Queued chunks as writes, in order: each run of small ones joined into one, each one of
    :data:`FLUSH_THRESHOLD` bytes or more as it is (joining would copy a large body again)."""
    writes: list[bytes] = []
    run: list[bytes] = []
    for chunk in chunks:
        if len(chunk) < FLUSH_THRESHOLD:
            run.append(chunk)
            continue
        if run:
            writes.append(b"".join(run))
            run = []
        writes.append(chunk)
    if run:
        writes.append(b"".join(run))
    return writes


async def _send_all_raw(sock: socket.socket, data: bytes) -> None:
    """Write all of ``data`` to a non-blocking socket, waiting only when the kernel's buffer
    is full. No checkpoint when it all goes at once (see :class:`FrameStream`).

    Raises: trio.BrokenResourceError (reset, closed), Cancelled (while waiting).
    """
    try:
        sent = sock.send(data)
    except BlockingIOError:
        sent = 0
    except OSError as exc:
        raise trio.BrokenResourceError(f"send: {exc}") from exc
    if sent == len(data):
        return
    with memoryview(data) as view:
        while sent < len(view):
            await trio.lowlevel.wait_writable(sock)
            try:
                sent += sock.send(view[sent:])
            except BlockingIOError:
                continue
            except OSError as exc:
                raise trio.BrokenResourceError(f"send: {exc}") from exc
