"""The per-broker slots of connection attempts (``max_connecting``,
:meth:`proxy.reconnect.board.ReconnectBoard.connect_slot`): at most that many in flight to one
broker, the others waiting first come first served, other brokers not held up, nothing kept
for a broker once no attempt holds or waits for a slot; a session waiting for one still has
its frames named at ``call_timeout``."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from protocol import Command
from proxy.reconnect.board import ReconnectBoard
from tests.proxy.scripted_broker import Network
from tests.proxy.test_session_modes import connected

QUEUE = "/queue/orders"


async def test_attempts_wait_for_a_slot_in_the_order_they_came(
    autojump_clock: trio.testing.MockClock,
) -> None:
    board = ReconnectBoard(max_connecting=2)
    started: list[tuple[int, float]] = []

    async def attempt(n: int, broker: str = "a:1") -> None:
        async with board.connect_slot(broker):
            started.append((n, trio.current_time()))
            await trio.sleep(1.0)  # the attempt's TCP connect and CONNECTED

    async with trio.open_nursery() as nursery:
        for n in range(5):
            nursery.start_soon(attempt, n)
            await trio.sleep(0.01)  # queued in this order
        nursery.start_soon(attempt, 99, "b:2")  # another broker: its own slots
        await trio.sleep(0.5)
        assert board.connecting("a:1") == (2, 3)
        assert board.connecting("b:2") == (1, 0)
    assert [n for n, _ in started] == [0, 1, 99, 2, 3, 4]
    waits = {n: round(at) for n, at in started}
    assert (waits[0], waits[1], waits[99], waits[2], waits[3], waits[4]) == (0, 0, 0, 1, 1, 2)
    assert board.connecting("a:1") == (0, 0)
    assert board._slots == {}  # nothing kept for idle brokers


async def test_a_cancelled_waiter_leaves_the_queue_and_frees_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    board = ReconnectBoard(max_connecting=1)
    order: list[str] = []

    async def attempt(name: str, seconds: float) -> None:
        async with board.connect_slot("a:1"):
            order.append(name)
            await trio.sleep(seconds)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(attempt, "first", 2.0)
        await trio.sleep(0.1)
        nursery.start_soon(attempt, "second", 1.0)
        waiter = trio.CancelScope()

        async def cancelled() -> None:
            with waiter:
                await attempt("cancelled", 1.0)

        nursery.start_soon(cancelled)
        await trio.sleep(0.1)
        assert board.connecting("a:1") == (1, 2)
        waiter.cancel()
        await trio.sleep(0.1)
        assert board.connecting("a:1") == (1, 1)
    assert order == ["first", "second"]
    assert board.connecting("a:1") == (0, 0)


def test_max_connecting_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_connecting must be > 0"):
        ReconnectBoard(max_connecting=0)


async def test_a_session_waiting_for_a_slot_still_names_its_frames_at_call_timeout(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """A reconnect that waits for a slot (every one of its broker's held) is no new ending: at
    ``call_timeout`` the SEND the lost leg had is ``unknown`` and the one handed over meanwhile
    ``lost``, in one OUTCOME and an ERROR each, as for any reconnect; once a slot frees, the
    session reconnects and carries on."""
    broker = network.add("broker", 61001)
    running = await connected(
        nursery, network, broker, call_timeout=1000, reconnect_attempts=-1, max_connecting=1
    )
    app, board = running.app, running.session.link.reconnects
    release = trio.Event()

    async def hold_the_slot(task_status: trio.TaskStatus[None]) -> None:
        async with board.connect_slot(broker.config.label):
            task_status.started()
            await release.wait()

    await nursery.start(hold_the_slot)
    broker.receipts = "hold"
    await app.send(Command.SEND, {"destination": QUEUE, "receipt": "r1"}, b"x")
    await broker.wait_for(Command.SEND, 1)
    await broker.link.drop("reset")
    await app.wait_event("RECONNECTING")
    await app.send(Command.SEND, {"destination": QUEUE, "receipt": "r2"}, b"y")
    await app.wait_error(2)
    assert board.connecting(broker.config.label) == (1, 1)  # the session waits its turn
    assert len(broker.links) == 1  # and has not connected meanwhile
    event = await app.wait_event("OUTCOME")
    assert [(f["receipt"], f["outcome"]) for f in event["frames"]] == [
        ("r1", "unknown"),
        ("r2", "lost"),
    ]
    assert [e.get("mq-sidecar-outcome") for e in app.errors()] == ["unknown", "lost"]
    broker.receipts = "auto"
    release.set()
    await app.wait_event("FAILOVER")
    await app.send(Command.SEND, {"destination": QUEUE, "receipt": "r3"}, b"z")
    await app.wait_receipt("r3")
    assert len(broker.links) == 2
