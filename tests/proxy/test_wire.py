"""FrameStream: queued writes, flushes, failure reporting (proxy/wire.py), on memory streams."""

from __future__ import annotations

import pytest
import trio
import trio.testing

import protocol
from protocol import Command, Frame, Role
from proxy.wire import FLUSH_THRESHOLD, FrameStream, TransportLost


class CountingStream(trio.abc.Stream):
    """A stream that records every ``send_all`` and can be made to block or fail."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.gate: trio.Event | None = None  # set: writes wait for it
        self.fail = False

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        # Like trio's SocketStream: a cancelled caller is told before any byte is written.
        await trio.lowlevel.checkpoint_if_cancelled()
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            raise trio.BrokenResourceError("peer reset")
        self.writes.append(bytes(data))
        await trio.lowlevel.cancel_shielded_checkpoint()

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


def connected_client(stream: trio.abc.Stream) -> FrameStream:
    """A client-role FrameStream past CONNECT/CONNECTED (STOMP 1.2)."""
    conn = protocol.Connection(Role.CLIENT)
    conn.send(Frame.build(Command.CONNECT, {"accept-version": "1.2", "host": "h"}))
    conn.receive_data(b"CONNECTED\nversion:1.2\n\n\0")
    assert isinstance(conn.next_event(), Frame)
    return FrameStream(stream, conn, grace=2.0)


def send(n: int, body: bytes = b"x") -> Frame:
    return Frame.build(Command.SEND, {"destination": "/queue/a", "n": str(n)}, body)


def sent_numbers(writes: list[bytes]) -> list[int]:
    parser = protocol.FrameParser(protocol.Limits(), version="1.2")
    parser.receive_data(b"".join(writes))
    out = []
    while isinstance(event := parser.next_event(), Frame):
        out.append(int(event.get("n") or -1))
    return out


async def test_queued_frames_leave_in_one_write_in_order() -> None:
    stream = CountingStream()
    fs = connected_client(stream)
    for i in range(50):
        fs.queue(send(i))
    assert stream.writes == []
    assert fs.queued_bytes > 0
    await fs.flush()
    assert len(stream.writes) == 1
    assert sent_numbers(stream.writes) == list(range(50))
    assert fs.frames_out == 50
    assert fs.bytes_out == len(stream.writes[0])
    assert fs.queued_bytes == 0


async def test_flush_with_nothing_queued_writes_nothing() -> None:
    stream = CountingStream()
    fs = connected_client(stream)
    await fs.flush()
    assert stream.writes == []


async def test_send_writes_what_was_queued_before_it() -> None:
    stream = CountingStream()
    fs = connected_client(stream)
    fs.queue(send(1))
    await fs.send(send(2))
    assert len(stream.writes) == 1
    assert sent_numbers(stream.writes) == [1, 2]


async def test_needs_flush_past_the_threshold() -> None:
    fs = connected_client(CountingStream())
    body = b"y" * 1024
    while not fs.needs_flush:
        fs.queue(send(0, body))
    assert fs.queued_bytes >= FLUSH_THRESHOLD
    assert fs.queued_bytes < FLUSH_THRESHOLD + 2048


async def test_flush_waits_for_a_write_in_progress() -> None:
    """A flush returns only once frames queued before it are written, even when another task's
    write already took them (the sidecar ACKs an auto-acked message only after that)."""
    stream = CountingStream()
    fs = connected_client(stream)
    stream.gate = trio.Event()
    flushed: list[str] = []

    async def first() -> None:
        await fs.flush()
        flushed.append("first")

    async def second() -> None:
        await fs.flush()  # nothing queued any more, but the first write is not done
        flushed.append("second")

    fs.queue(send(1))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(first)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(second)
        await trio.testing.wait_all_tasks_blocked()
        assert flushed == []
        stream.gate.set()
    assert sent_numbers(stream.writes) == [1]
    assert sorted(flushed) == ["first", "second"]


async def test_a_failed_write_breaks_the_stream_for_every_writer() -> None:
    stream = CountingStream()
    fs = connected_client(stream)
    stream.gate = trio.Event()
    stream.fail = True
    errors: list[BaseException] = []

    async def flush() -> None:
        try:
            await fs.flush()
        except TransportLost as exc:
            errors.append(exc)

    fs.queue(send(1))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(flush)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(flush)  # waits for the first write, which fails
        await trio.testing.wait_all_tasks_blocked()
        stream.gate.set()
    assert len(errors) == 2
    assert fs.broken is not None
    with pytest.raises(TransportLost):
        fs.queue(send(2))


async def test_queue_after_the_peer_closed_is_a_lost_transport() -> None:
    """Once the reader saw EOF the leg is lost: queueing raises TransportLost, not the state
    machine's LocalProtocolError (found by the chaos soak after a kill -9)."""
    stream = CountingStream()
    fs = connected_client(stream)
    fs.conn.receive_data(b"")
    assert fs.conn.next_event() is protocol.CONNECTION_CLOSED
    with pytest.raises(TransportLost, match="closed by the peer"):
        fs.queue(send(1))


async def test_heartbeat_goes_after_queued_frames() -> None:
    stream = CountingStream()
    fs = connected_client(stream)
    fs.queue(send(1))
    await fs.send_heartbeat()
    assert len(stream.writes) == 1
    assert stream.writes[0].endswith(b"\0\n")


async def test_a_write_cancelled_before_it_starts_keeps_the_stream_usable() -> None:
    """A writer cancelled after it got the send lock but before its write started must not
    mark the stream broken: nothing was written, and the session's final ERROR must still go
    out (seen as a lost heart-beat ERROR when a heart-beat write was cancelled by _end)."""
    stream = CountingStream()
    fs = connected_client(stream)
    fs.queue(send(1))
    scope = trio.CancelScope()

    async def flush_in_scope() -> None:
        with scope:
            await fs.flush()

    async with trio.open_nursery() as nursery:
        await fs._send_lock.acquire()
        nursery.start_soon(flush_in_scope)
        await trio.testing.wait_all_tasks_blocked()  # parked on the lock
        fs._send_lock.release()  # hands the lock over: the writer is rescheduled...
        scope.cancel()  # ...and cancelled before it runs again
    assert scope.cancelled_caught
    assert fs.broken is None
    assert stream.writes == []
    await fs.send(send(2))
    assert sent_numbers(stream.writes) == [1, 2]
