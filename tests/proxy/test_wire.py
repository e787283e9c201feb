"""FrameStream: queued writes, flushes, failure reporting (proxy/legs/stream.py), on memory
streams."""

from __future__ import annotations

import socket
import struct
from functools import partial

import pytest
import trio
import trio.testing

import protocol
from protocol import Command, Frame, Role
from proxy.legs.stream import (
    FLUSH_THRESHOLD,
    FrameStream,
    HeartBeatTimeout,
    TransportLost,
)


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


# -- the lean path on real sockets ----------------------------------------------------------


def socket_pair() -> tuple[trio.SocketStream, trio.SocketStream]:
    """Two ends of a real TCP connection on loopback."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        a = socket.create_connection(listener.getsockname())
        b, _ = listener.accept()
    return (
        trio.SocketStream(trio.socket.from_stdlib_socket(a)),
        trio.SocketStream(trio.socket.from_stdlib_socket(b)),
    )


def beating_client(stream: trio.abc.Stream, receive_ms: int) -> FrameStream:
    """A client-role FrameStream whose broker promised a heart-beat every ``receive_ms``."""
    conn = protocol.Connection(Role.CLIENT)
    conn.send(
        Frame.build(
            Command.CONNECT, {"accept-version": "1.2", "host": "h", "heart-beat": f"0,{receive_ms}"}
        )
    )
    conn.receive_data(f"CONNECTED\nversion:1.2\nheart-beat:{receive_ms},0\n\n\0".encode())
    assert isinstance(conn.next_event(), Frame)
    fs = FrameStream(stream, conn, grace=2.0)
    fs.start_heartbeats()
    return fs


async def _hold(stream: trio.SocketStream) -> None:
    await trio.sleep_forever()


async def test_production_streams_take_the_lean_io_path() -> None:
    """TCP legs (a trio.SocketStream, as the listener and connect_upstream make) read and write
    their socket directly; anything else (TLS, test streams) keeps trio's stream methods."""
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, _hold, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        tcp = await trio.open_tcp_stream("127.0.0.1", port)
        try:
            assert connected_client(tcp)._sock is not None
            assert connected_client(CountingStream())._sock is None
        finally:
            await tcp.aclose()
            nursery.cancel_scope.cancel()


async def test_lean_path_relays_frames_both_ways_in_order() -> None:
    ours, theirs = socket_pair()
    async with ours, theirs:
        await _relay_both_ways(connected_client(ours), theirs)


async def _relay_both_ways(fs: FrameStream, theirs: trio.SocketStream) -> None:
    big = b"y" * (3 * FLUSH_THRESHOLD)  # larger than a socket buffer: the write must wait
    async with trio.open_nursery() as nursery:

        async def drain() -> None:  # all of it: unread bytes at close would mean a reset
            got = bytearray()
            while got.count(b"\0") < 2:
                got += await theirs.receive_some(65536)
            assert sent_numbers([bytes(got)]) == [1, 2]

        nursery.start_soon(drain)
        fs.queue(send(1, big))
        fs.queue(send(2, big))
        await fs.flush()
    await theirs.send_all(b"RECEIPT\nreceipt-id:r1\n\n\0\nMESSAGE\ndestination:/q\nmessage-id:1\n")
    first = await fs.receive_event()
    assert isinstance(first, Frame)
    assert first.get("receipt-id") == "r1"
    assert await fs.receive_event() is protocol.HEARTBEAT
    await theirs.send_all(b"subscription:s\n\nhi\0")
    message = await fs.receive_event()
    assert isinstance(message, Frame)
    assert message.body == b"hi"
    await theirs.aclose()
    assert await fs.receive_event() is protocol.CONNECTION_CLOSED


async def test_a_reader_that_paused_takes_what_arrived_before_judging_silence(
    mock_clock: trio.testing.MockClock,
) -> None:
    """A reader that stopped reading (backpressure: window full, app holding max_unacked)
    for longer than the heart-beat tolerance gets the bytes that arrived meanwhile; the peer
    is only silent when nothing came. (Judging the deadline before reading declared a live
    broker dead after any long pause.)"""
    ours, theirs = socket_pair()
    async with ours, theirs:
        await _pause_then_read(beating_client(ours, receive_ms=1000), theirs, mock_clock)


async def _pause_then_read(
    fs: FrameStream, theirs: trio.SocketStream, mock_clock: trio.testing.MockClock
) -> None:
    await theirs.send_all(b"\n")  # silent after 2 s
    mock_clock.jump(30)  # the reader was busy elsewhere for 30 s
    assert await fs.receive_event() is protocol.HEARTBEAT
    mock_clock.autojump_threshold = 0
    with pytest.raises(HeartBeatTimeout, match=r"no data for 2\.0 s"):
        await fs.receive_event()
    assert trio.current_time() == pytest.approx(32.0)


async def test_keep_alive_judges_silence_for_a_reader_waiting_without_a_deadline(
    mock_clock: trio.testing.MockClock,
) -> None:
    """While keep_alive runs for a TCP leg, the reader's waits carry no deadline (no
    cancel scope per read: the synchronous round trip's cost); the task wakes a waiting reader
    of a silent peer at the deadline, which raises HeartBeatTimeout as before."""
    ours, theirs = socket_pair()
    async with ours, theirs:
        fs = beating_client(ours, receive_ms=1000)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fs.keep_alive)
            await trio.testing.wait_all_tasks_blocked()
            assert fs._watched
            await theirs.send_all(b"\n")
            assert await fs.receive_event() is protocol.HEARTBEAT
            mock_clock.autojump_threshold = 0
            with pytest.raises(HeartBeatTimeout, match=r"no data for 2\.0 s"):
                await fs.receive_event()
            assert trio.current_time() == pytest.approx(2.0)
            with pytest.raises(HeartBeatTimeout):  # and for good: the leg is over
                await fs.receive_event()
        assert not fs._watched


async def test_keep_alive_counts_bytes_waiting_for_a_paused_reader_as_received(
    mock_clock: trio.testing.MockClock,
) -> None:
    """A reader that paused (backpressure) while the peer's bytes wait in the kernel is not
    declared silent by the task: it gets the bytes when it reads again, and silence is judged
    from there."""
    ours, theirs = socket_pair()
    async with ours, theirs:
        fs = beating_client(ours, receive_ms=1000)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fs.keep_alive)
            await theirs.send_all(b"\n")
            mock_clock.autojump_threshold = 0
            await trio.sleep(30)  # the reader was busy elsewhere; the task looked 15 times
            assert not fs._silent
            assert await fs.receive_event() is protocol.HEARTBEAT
            with pytest.raises(HeartBeatTimeout):
                await fs.receive_event()
            assert 32.0 <= trio.current_time() <= 34.0
            nursery.cancel_scope.cancel()


async def test_keep_alive_leaves_an_eof_to_a_paused_reader(
    mock_clock: trio.testing.MockClock,
) -> None:
    """A peer that closed while the reader paused is not a silence: the reader finds the EOF
    when it reads again (CONNECTION_CLOSED, as without the task)."""
    ours, theirs = socket_pair()
    async with ours:
        fs = beating_client(ours, receive_ms=1000)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fs.keep_alive)
            await theirs.aclose()
            mock_clock.autojump_threshold = 0
            await trio.sleep(30)
            assert not fs._silent
            assert await fs.receive_event() is protocol.CONNECTION_CLOSED
            nursery.cancel_scope.cancel()


async def test_lean_path_reports_a_reset_as_transport_lost() -> None:
    ours, theirs = socket_pair()
    async with ours:
        fs = connected_client(ours)
        linger = struct.pack("ii", 1, 0)  # close with a RST
        theirs.socket.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_LINGER, linger)
        await theirs.aclose()
        with pytest.raises(TransportLost, match="reset"):
            await fs.receive_event()
        with pytest.raises(TransportLost):
            await fs.send(send(1))


async def test_a_paused_reader_of_a_trio_stream_takes_what_arrived_too(
    mock_clock: trio.testing.MockClock,
) -> None:
    """The same on the generic path (TLS legs, test streams)."""
    ours, theirs = trio.testing.memory_stream_pair()
    fs = beating_client(ours, receive_ms=1000)
    await theirs.send_all(b"\n")
    mock_clock.jump(30)
    assert await fs.receive_event() is protocol.HEARTBEAT
    mock_clock.autojump_threshold = 0
    with pytest.raises(HeartBeatTimeout, match=r"no data for 2\.0 s"):
        await fs.receive_event()
    assert trio.current_time() == pytest.approx(32.0)


@pytest.mark.parametrize(
    ("server", "cumulative_receipts", "client_ack_per_subscription", "artemis_ids"),
    [
        ("ActiveMQ/5.17.6", True, True, False),
        ("RabbitMQ/3.10.8", False, False, False),
        ("ActiveMQ-Artemis/2.31.2 ActiveMQ Artemis Messaging Engine", True, True, True),
        (None, True, True, True),  # an unknown broker gets what STOMP and Artemis promise
    ],
)
async def test_what_a_leg_knows_of_its_broker_by_its_server_header(
    server: str | None,
    cumulative_receipts: bool,
    client_ack_per_subscription: bool,
    artemis_ids: bool,
) -> None:
    """The broker differences the sidecar adapts to, read from the CONNECTED ``server``
    header (measured on ActiveMQ 5.17 and RabbitMQ 3.10; Artemis' from its documentation)."""
    from config import Broker
    from proxy.legs.broker import Upstream
    from proxy.legs.dialect import BrokerDialect

    headers = {"version": "1.2"} | ({"server": server} if server else {})
    connected = Frame.build(Command.CONNECTED, headers)
    leg = Upstream(
        Broker("127.0.0.1", 61613),
        connected_client(CountingStream()),
        connected,
    )
    assert leg.dialect.cumulative_receipts is cumulative_receipts
    assert leg.dialect.client_ack_per_subscription is client_ack_per_subscription
    assert leg.dialect.artemis_duplicate_ids is artemis_ids
    assert leg.dialect == BrokerDialect.from_server(server)
