"""One memory budget for the process (``max_memory_bytes``, issue 28): the pure accounting
(:mod:`proxy.tracking.budget`, the window's charges), the waits of app reads
(:mod:`proxy.legs.memory`, on trio's autojump clock), the refusal of a new session past it, the
configuration's bad input, and the parser's view of a frame being read. The same through a
sidecar process in front of ActiveMQ, with its RSS: tests/integration/test_memory_budget.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.lowlevel
import trio.testing

import protocol
from config import ConfigError, load_config
from protocol import Command, Frame, RawFrame
from proxy.legs.memory import MemoryBudgetGate
from proxy.tracking import TRANSACTION_OVERHEAD
from proxy.tracking.budget import MemoryBudget, ReadCharge
from proxy.tracking.window import ConfirmationWindow
from tests.proxy.scripted_broker import (
    Network,
    Running,
    ScriptedBroker,
    make_config,
    start_session,
    wait_until,
)
from tests.proxy.test_max_sessions import connect_app, make_sidecar, refused

CHUNK = 65536


def send(size: int) -> Frame:
    return Frame(Command.SEND, (("destination", "/queue/q"),), b"x" * size)


# -- the accounting ---------------------------------------------------------------------------


def test_charges_and_releases_keep_held_and_peak() -> None:
    budget = MemoryBudget(1000)
    budget.charge(600)
    budget.charge(300)
    assert (budget.held, budget.peak, budget.over) == (900, 900, False)
    budget.charge(100)
    assert budget.over
    budget.release(700)
    assert (budget.held, budget.peak, budget.over) == (300, 1000, False)
    stats = budget.statistics()
    assert (stats.held, stats.limit, stats.peak, stats.waiting) == (300, 1000, 1000, 0)
    with pytest.raises(ValueError, match="limit must be > 0"):
        MemoryBudget(0)


def test_a_release_while_a_read_waits_is_told() -> None:
    budget = MemoryBudget(1000)
    told: list[int] = []
    budget.on_release = lambda: told.append(budget.held)
    budget.charge(500)
    budget.release(100)
    assert told == []  # nobody waits: no call on the relay's path
    budget.waiting = 1
    budget.release(100)
    budget.charge(50)
    assert told == [300]


def test_read_charge_wants_nothing_between_frames_the_frame_once_known_else_one_read() -> None:
    budget = MemoryBudget(10 * CHUNK)
    charge = ReadCharge(budget, CHUNK)
    assert charge.wanted(0, -1, 0) == 0
    # Head not read yet (or no content-length): what is buffered, twice, and one read more.
    assert charge.wanted(100, -1, 0) == 2 * 100 + CHUNK
    assert charge.wanted(CHUNK, 5 * CHUNK, 0) == 10 * CHUNK  # the whole frame, twice
    charge.take(5 * CHUNK)
    assert budget.held == 5 * CHUNK
    # The frame was returned and the next one began in the same read: the charge is what of
    # it is buffered, not the returned frame's (whose bytes the window holds now).
    assert charge.wanted(1000, 3 * CHUNK, 1) == 6 * CHUNK
    assert (budget.held, charge.charged) == (1000, 1000)
    charge.take(6 * CHUNK)
    assert charge.wanted(0, -1, 2) == 0  # returned too, nothing buffered: the charge goes
    assert (budget.held, charge.charged) == (0, 0)
    charge.take(CHUNK)
    charge.close()
    assert budget.held == 0


def test_the_window_charges_the_budget_its_entries_sizes() -> None:
    """A frame kept as its bytes (the fast lane) is charged its size; a parsed one twice
    (serialized again when written: its body and its bytes on the wire)."""
    budget = MemoryBudget(1 << 20)
    window = ConfirmationWindow(1 << 20, receipt_prefix="s-r", budget=budget)
    head = b"SEND\ndestination:/queue/q\n\n"
    raw = RawFrame(Command.SEND, head + b"r" * 1000 + b"\x00", len(head) - 1)
    first = window.append(raw, app_receipt=None, want_receipt=False, now=0.0)
    second = window.append(send(2000), app_receipt=None, want_receipt=True, now=0.0)
    third = window.append(send(3000), app_receipt=None, want_receipt=False, now=0.0)
    assert first.charged == first.size
    assert (second.charged, third.charged) == (2 * second.size, 2 * third.size)
    assert budget.held == window.charged == first.size + 2 * second.size + 2 * third.size
    assert second.receipt is not None
    window.confirm(second.receipt)  # confirms the first too
    assert budget.held == window.charged == 2 * third.size
    window.drop(third)
    assert budget.held == window.charged == window.bytes == 0
    window.append(send(500), app_receipt=None, want_receipt=False, now=0.0)
    window.drop_all()
    assert budget.held == 0
    last = window.append(send(700), app_receipt=None, want_receipt=False, now=0.0)
    window.leave_budget()  # the session ended with it unconfirmed
    assert budget.held == 0
    assert list(window) == [last]  # still there for whatever names it
    window.drop_all()
    assert budget.held == 0


# -- the waits of app reads -------------------------------------------------------------------


async def test_a_read_between_frames_waits_while_over_and_goes_on_when_released(
    autojump_clock: trio.testing.MockClock,
) -> None:
    gate = MemoryBudgetGate(MemoryBudget(1000))
    gate.budget.charge(1000)  # a window holds everything
    charge = gate.charge_for(CHUNK)
    done: list[float] = []

    async def read() -> None:
        await gate.before_read(charge, 0, -1, 0)
        done.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read)
        await trio.sleep(5)
        assert done == []
        assert gate.budget.statistics().waiting == 1
        gate.budget.release(1)  # the broker confirmed something
    assert done == [5.0]
    assert gate.budget.waiting == 0


async def test_a_frame_being_read_holds_its_whole_size_and_waits_until_it_fits(
    autojump_clock: trio.testing.MockClock,
) -> None:
    gate = MemoryBudgetGate(MemoryBudget(4 * CHUNK))
    budget = gate.budget
    budget.charge(3 * CHUNK)  # a window
    charge = gate.charge_for(CHUNK)
    granted: list[float] = []

    async def read_on() -> None:
        # One read brought the head and a first chunk of a 3-chunk frame.
        await gate.before_read(charge, CHUNK, 3 * CHUNK // 2, 0)
        granted.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read_on)
        await trio.sleep(1)
        assert granted == []
        assert budget.held == 4 * CHUNK  # what the read brought is held, waiting or not
        budget.release(CHUNK)  # not enough yet: a window of 2 and a frame of 3 > 4
        await trio.sleep(1)
        assert granted == []
        budget.release(CHUNK)
        await trio.sleep(1)
    assert granted == [2.0]
    assert charge.charged == 3 * CHUNK
    assert budget.held == 4 * CHUNK
    await gate.before_read(charge, 0, -1, 1)  # the frame was returned
    assert budget.held == CHUNK


def test_a_broker_leg_is_charged_and_never_waits() -> None:
    """A MESSAGE being read from a broker counts (twice its size once known), even past the
    budget: the broker leg's RECEIPTs are what frees memory, so it is never held back."""
    gate = MemoryBudgetGate(MemoryBudget(CHUNK))
    gate.budget.charge(CHUNK)  # over
    charge = gate.charge_for(CHUNK)
    gate.account(charge, 100, 10 * CHUNK, 0)
    assert charge.charged == 20 * CHUNK
    gate.account(charge, 0, -1, 1)  # the MESSAGE was relayed: between frames again
    assert (charge.charged, gate.budget.held) == (0, CHUNK)


async def test_frames_being_read_never_wait_on_each_other(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Ten reads each hold a first chunk of a large frame and together fill the budget: they
    do not wait on each other forever. One at a time gets its whole frame, reads it, returns
    it (here: its window confirms at once), and the next goes on."""
    gate = MemoryBudgetGate(MemoryBudget(10 * CHUNK))
    budget = gate.budget
    frames_read = 0

    async def session() -> None:
        nonlocal frames_read
        charge = gate.charge_for(CHUNK)
        charge.take(CHUNK)  # its first read
        await trio.lowlevel.checkpoint()
        await gate.before_read(charge, CHUNK, 2 * CHUNK, 0)
        await trio.sleep(1)  # the rest of the frame arrives
        frames_read += 1
        await gate.before_read(charge, 0, -1, 1)  # between frames again

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for _ in range(10):
                nursery.start_soon(session)
            await trio.sleep(0.5)
            # All ten first chunks are held, and some frames (not all) got their room.
            assert 13 * CHUNK <= budget.held < 40 * CHUNK
            assert budget.waiting > 0
    assert frames_read == 10
    assert budget.held == 0
    # Past the budget by no more than one read per session that began a frame under it.
    assert budget.peak <= budget.limit + 10 * CHUNK


async def test_a_session_only_its_app_can_free_is_read_past_the_budget(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Its window waits for the app's COMMIT (or its relay for the app's ACKs): holding its
    reads back would make it wait for itself. Its reads are charged all the same."""
    gate = MemoryBudgetGate(MemoryBudget(4 * CHUNK))
    gate.budget.charge(4 * CHUNK)
    charge = gate.charge_for(CHUNK)
    stalled = [True]
    charge.must_read = lambda: stalled[0]
    with trio.fail_after(1):
        await gate.before_read(charge, 0, -1, 0)  # between frames
        await gate.before_read(charge, CHUNK, 2 * CHUNK, 0)  # inside one
    assert charge.charged == 4 * CHUNK
    assert gate.budget.held == 8 * CHUNK
    stalled[0] = False
    with trio.move_on_after(5) as scope:
        await gate.before_read(charge, 0, -1, 1)
    assert scope.cancelled_caught  # an ordinary session waits


async def budgeted_session(
    nursery: trio.Nursery, network: Network
) -> tuple[ScriptedBroker, Running, MemoryBudget]:
    """A connected Session on a scripted broker, under a budget of 1 MiB of its own."""
    broker = network.add("broker", 61001)
    gate = MemoryBudgetGate(MemoryBudget(1 << 20))
    config = make_config(broker, max_frame_bytes=1 << 18, max_memory_bytes=1 << 20)
    running = await start_session(nursery, network, config, memory=gate)
    assert (await running.app.connect()).command is Command.CONNECTED
    return broker, running, gate.budget


async def test_a_session_does_not_read_its_app_while_the_budget_is_over(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """A real Session on a scripted broker: past the budget (the other sessions hold it) its
    app's next SEND stays unread; once memory is released it goes upstream and is confirmed.
    The window's bytes are charged while unconfirmed; the session's end gives everything
    back."""
    broker, running, budget = await budgeted_session(nursery, network)
    app = running.app
    budget.charge(1 << 20)  # the other sessions hold it all
    # The read already waiting takes what comes (a memory stream, as TLS: one read past it).
    await app.send(Command.SEND, {"destination": "/queue/q", "receipt": "r0"}, b"x" * 1000)
    await app.wait_receipt("r0")
    # ...the next one waits for the budget.
    await app.send(Command.SEND, {"destination": "/queue/q", "receipt": "r1"}, b"x" * 1000)
    await trio.sleep(5)
    assert len(broker.links[-1].received(Command.SEND)) == 1
    assert budget.statistics().waiting == 1
    broker.receipts = "hold"
    # RECEIPTs of other sessions: under the limit with room for this session's broker leg.
    freed = budget.broker_room + 1
    budget.release(freed)
    others = (1 << 20) - freed
    await wait_until(lambda: len(broker.links[-1].received(Command.SEND)) == 2)
    assert budget.held == others + running.session.core.flow.window.charged
    assert running.session.core.flow.window.charged > 1000  # charged while unconfirmed
    await broker.links[-1].release()
    await app.wait_receipt("r1")
    assert budget.held == others
    await app.stream.aclose()  # the app leaves
    await running.done.wait()
    assert budget.held == others
    assert budget.broker_room == 0  # the session's broker leg gave its room back
    assert budget.waiting == 0


async def test_open_transactions_are_charged_and_their_app_is_read_past_the_budget(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """What an open transaction keeps for replay counts against the budget; past the budget
    its app is read all the same (only its COMMIT frees it), and the COMMIT gives it back."""
    _broker, running, budget = await budgeted_session(nursery, network)
    app = running.app
    await app.send(Command.BEGIN, {"transaction": "t1", "receipt": "b"})
    await app.wait_receipt("b")
    await app.send(
        Command.SEND, {"destination": "/queue/q", "transaction": "t1", "receipt": "s"}, b"x" * 1000
    )
    await app.wait_receipt("s")
    state = running.session.core.state
    assert state is not None
    kept = state.transaction_bytes.used
    assert kept > 1000 + TRANSACTION_OVERHEAD  # the SEND kept to re-run it, the transaction
    assert budget.held == kept  # the window is confirmed: only the transaction holds memory
    budget.charge(1 << 20)  # the other sessions hold it all
    # The read already waiting takes one more SEND (a memory stream: one read past it)...
    await app.send(
        Command.SEND, {"destination": "/queue/q", "transaction": "t1", "receipt": "s2"}, b"y"
    )
    await app.wait_receipt("s2")
    # ...and the COMMIT is read past the budget too: only it frees the transaction's bytes.
    await app.send(Command.COMMIT, {"transaction": "t1", "receipt": "c"})
    with trio.fail_after(5):
        await app.wait_receipt("c")
    assert state.transaction_bytes.used == 0
    assert budget.held == 1 << 20


# -- a new session past the budget ------------------------------------------------------------


@pytest.mark.parametrize("short", ["memory is full", "reserves are large"])
async def test_a_new_session_past_the_budget_gets_an_error_naming_what_was_short(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, short: str
) -> None:
    """Past the budget a new session is refused with an ERROR that says which was short:
    what the sessions hold (windows: "memory is full") or the reserves kept for frames being
    read ("reserves are large", naming max_frame_bytes), with held, reserved and free."""
    sidecar = make_sidecar(max_sessions=10, max_memory_bytes=1 << 20, max_frame_bytes=1 << 18)
    budget = sidecar.memory.budget
    # The overdraft's reserve: twice one frame and a read; the broker legs' shared read, twice.
    assert budget.reserve == 2 * (1 << 18) + CHUNK
    assert budget.broker_room == 2 * CHUNK
    reading = ReadCharge(budget, CHUNK)
    if short == "memory is full":  # windows hold everything but the broker legs' room
        budget.charge((1 << 20) - budget.broker_room)
        held, reserved = (1 << 20) - 2 * CHUNK, 2 * CHUNK
    else:  # frames being read hold everything the overdraft's reserve leaves
        held = (1 << 20) - budget.reserve - budget.broker_room
        reading.take(held)
        reserved = budget.reserve + budget.broker_room
    stats = budget.statistics()
    assert (stats.held, stats.reserved, stats.free) == (held, reserved, 0)
    app = connect_app(sidecar, nursery)
    answer = await app.connect()
    assert answer.command is Command.ERROR
    assert answer.get("message") == f"out of memory: max_memory_bytes (1048576) reached: {short}"
    assert answer.body.startswith(f"{short}: the sessions of this mq-sidecar hold {held}".encode())
    assert f"{reserved} are kept in reserve and 0 are free".encode() in answer.body
    assert b"(max_memory_bytes = 1048576)" in answer.body
    assert (b"max_frame_bytes (262144)" in answer.body) == (short == "reserves are large")
    await app.wait_closed()
    assert not sidecar.sessions
    assert refused(sidecar) == 1
    assert sidecar.statistics().memory is not None
    assert sidecar.statistics().memory.refused_total == 1  # type: ignore[union-attr]
    if reading.charged:
        reading.take(reading.charged - 1)  # under again: the next one is let in
    else:  # under what the reserves leave, by one byte
        budget.release(budget.reserve + 1)
    connect_app(sidecar, nursery)
    await wait_until(lambda: len(sidecar.sessions) == 1)


async def test_a_thousand_broker_legs_that_get_only_receipts_share_one_read_of_room(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    """The default configuration's budget (384 MiB) against the reserve of one 144 MiB frame
    (twice, 288 MiB): a thousand broker legs of producers connected and 80 MiB held in
    windows refuse no one (issue 34: 128 KiB of room per leg refused at ~770 sessions)."""
    sidecar = make_sidecar(max_sessions=2000)
    budget = sidecar.memory.budget
    assert budget.reserve > budget.limit // 2
    legs = [ReadCharge(budget, CHUNK, broker=True) for _ in range(1000)]
    for leg in legs:  # each read a RECEIPT split across two reads once
        leg.take(2 * 60)
        leg.take(0)
    budget.charge(80 << 20)  # windows: 80 MiB
    assert budget.broker_room == 2 * CHUNK + 1000 * 2 * 60  # not 128 KiB per leg
    stats = budget.statistics()
    assert stats.free == budget.limit - budget.reserve - budget.broker_room - stats.held
    assert stats.held + stats.reserved + stats.free == budget.limit
    assert stats.reserved == budget.reserve + budget.broker_room
    connect_app(sidecar, nursery)  # no broker here: admitted is what counts
    await wait_until(lambda: len(sidecar.sessions) == 1)
    assert refused(sidecar) == 0
    for leg in legs:
        leg.close()
    assert budget.broker_room == 2 * CHUNK


# -- bad input --------------------------------------------------------------------------------


def test_a_budget_below_one_frame_is_refused_at_start(tmp_path: Path) -> None:
    path = tmp_path / "mq-sidecar.toml"
    path.write_text(
        'brokers = "stomp://127.0.0.1:61613"\nmax_frame_bytes = 1048576\n'
        "max_memory_bytes = 2097152\n"
    )
    with pytest.raises(ConfigError) as info:
        load_config(path=path, env={})
    assert info.value.problems == [
        "max_memory_bytes: must be at least twice max_frame_bytes (1048576) plus 65536: one "
        "frame of that size costs twice its size and one read while it is read, got 2097152 "
        f"(from {path})"
    ]


def test_the_parser_tells_the_frame_being_read() -> None:
    conn = protocol.Connection(protocol.Role.SERVER, judge_frames=False)
    assert conn.frame_in_progress() == (0, -1)
    head = b"SEND\ndestination:/queue/q\ncontent-length:100\n\n"
    conn.receive_data(head[:10])
    assert conn.next_event() is protocol.NEED_DATA
    assert conn.frame_in_progress() == (10, -1)  # the head is not read yet
    conn.receive_data(head[10:] + b"x" * 40)
    assert conn.next_event() is protocol.NEED_DATA
    assert conn.frame_in_progress() == (len(head) + 40, len(head) + 101)
    conn.receive_data(b"x" * 60 + b"\x00")
    assert isinstance(conn.next_event(), Frame)
    assert conn.frame_in_progress() == (0, -1)


def test_past_the_budget_one_read_at_a_time_once_only_waiting_reads_hold_it() -> None:
    """A read waiting for room past the budget goes on alone (the overdraft) once everything
    held belongs to reads waiting like it (nothing else will drain), until its frame is handed
    on: reads waiting on each other never wait forever, and only one goes past the budget."""
    budget = MemoryBudget(1000)
    first, second = ReadCharge(budget, 100), ReadCharge(budget, 100)
    first.take(400)
    second.take(400)
    budget.charge(100)  # a window: it drains by itself
    budget.waiting_bytes = 400  # the second waits
    assert not budget.grants(first, 400)  # past the limit: wait for the window
    assert budget.grants(first, 100)  # fits under the limit
    first.take(500)
    budget.release(100)  # the window was confirmed: only waiting reads and this one hold it
    assert budget.grants(first, 400)  # past the limit: the overdraft
    assert id(budget.overdraft) == id(first)
    first.take(900)
    budget.waiting_bytes = 900  # now the first waits too
    assert not budget.grants(second, 100)  # the overdraft is taken
    first.handed(0)
    assert budget.overdraft is None
    budget.waiting_bytes = 0
    assert budget.grants(second, 100)  # under the limit again


# -- the reserves: held stays under the limit ---------------------------------------------------


def test_app_reads_leave_the_overdrafts_reserve_which_the_overdraft_takes() -> None:
    """App reads stop ``reserve`` under the limit (twice one frame of max_frame_bytes and a
    read: the sidecar's); the overdraft, once only waiting reads hold memory, takes it, so it
    stays under the limit too."""
    budget = MemoryBudget(1000, reserve=300)
    first, second = ReadCharge(budget, 100), ReadCharge(budget, 100)
    first.take(400)
    second.take(300)
    assert budget.grants(first, 0)
    assert not budget.grants(first, 1)  # 701 + 300 > 1000
    assert budget.over
    budget.waiting_bytes = 300  # the second waits
    assert budget.grants(first, 300)  # the overdraft, out of the reserve
    first.take(700)
    assert budget.held == budget.limit


def test_a_broker_leg_keeps_room_for_the_largest_message_it_read() -> None:
    """A broker leg is never held back: what it once held, it may hold again, so app reads
    leave that room (MemoryBudget.broker_room) until the leg is closed."""
    budget = MemoryBudget(1000)
    broker = ReadCharge(budget, 100, broker=True)
    broker.take(400)  # a MESSAGE being read
    assert (budget.held, budget.broker_room) == (400, 0)
    broker.wanted(0, -1, 1)  # relayed: between frames
    assert (budget.held, budget.broker_room) == (0, 400)
    budget.charge(500)  # a window
    assert budget.fits(100)
    assert not budget.fits(101)  # 500 + 101 + the broker's 400 > 1000
    broker.take(400)  # the next MESSAGE as large: inside the limit
    assert budget.held == 900
    broker.close()
    assert (budget.held, budget.broker_room) == (500, 0)
    assert MemoryBudget(100, reserve=1000).fits(50)  # nothing held: reserves never stop a read


def test_legs_that_receive_messages_keep_a_read_each_the_others_share_one() -> None:
    """A producer's broker leg gets RECEIPTs only: the legs share one read (twice) of room,
    and each keeps what it once held. A leg whose session subscribed may get MESSAGEs of any
    size: at least one read, twice, of its own (issue 34: 128 KiB for every leg at once
    refused newcomers with the defaults past ~770 sessions)."""
    budget = MemoryBudget(10_000, broker_read=200)
    producer, consumer = (ReadCharge(budget, 100, broker=True) for _ in range(2))
    assert budget.broker_room == 200
    consumer.receives()
    consumer.receives()  # once
    assert budget.broker_room == 400
    consumer.take(1000)  # a MESSAGE split across reads: held, not kept in reserve
    assert (budget.held, budget.broker_room) == (1000, 200)  # 200 + 1000 kept, 1000 held
    consumer.take(0)  # handed on: it may hold as much again
    assert budget.broker_room == 1200
    producer.take(60)  # a RECEIPT split across two reads
    producer.take(0)
    assert budget.broker_room == 1260
    ReadCharge(budget, 100).receives()  # an app leg's charge: nothing
    assert budget.broker_room == 1260
    producer.close()
    consumer.close()
    consumer.close()  # once
    assert (budget.held, budget.broker_room) == (0, 200)


def test_every_receiving_leg_keeps_room_for_the_largest_message_any_of_them_held() -> None:
    """The broker chooses MESSAGE sizes, and consumers of one destination get alike ones: once
    a receiving leg held a 1,000-byte MESSAGE, every receiving leg keeps room for as much
    (measured: eight consumers starting their first 1 MiB MESSAGEs at once took the budget
    past its limit when each kept only its own largest). The room starts again from one read
    once no leg receives."""
    budget = MemoryBudget(100_000, broker_read=200)
    first, second, third = (ReadCharge(budget, 100, broker=True) for _ in range(3))
    first.receives()
    second.receives()
    assert budget.broker_room == 200 + 2 * 200
    first.take(1000)
    assert (budget.held, budget.broker_room) == (1000, 200 + 0 + 1000)
    first.take(0)
    assert budget.broker_room == 200 + 2 * 1000
    third.take(500)  # a producer's leg, receiving later: its largest joins the shared room
    third.receives()
    assert budget.broker_room == 200 + 2 * 1000 + (1000 - 500)
    for leg in (first, second, third):
        leg.close()
    assert (budget.held, budget.broker_room) == (0, 200)
    fourth = ReadCharge(budget, 100, broker=True)
    fourth.receives()
    assert budget.broker_room == 200 + 200


def test_a_frame_entering_the_window_moves_its_charge_there() -> None:
    """The app leg's charge of a returned frame (twice its size) gives way to the window's
    entry (its size, or twice) when the frame enters the window: never both at once."""
    budget = MemoryBudget(1 << 20)
    window = ConfirmationWindow(1 << 20, receipt_prefix="s-r", budget=budget)
    charge = ReadCharge(budget, CHUNK)
    window.handoff = charge
    charge.take(2 * 3000 + 200)  # a frame of about 3000 bytes and 100 of the next one
    charge.position = lambda: (100, 1)  # the leg returned it: 100 bytes of the next one
    entry = window.append(send(3000), app_receipt=None, want_receipt=False, now=0.0)
    assert charge.charged == 100
    assert budget.held == 100 + entry.charged
    window.append(send(10), app_receipt=None, want_receipt=False, now=0.0)
    assert charge.charged == 100  # handed over once


async def test_a_read_between_frames_holds_its_read_before_it_reads(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """With bytes ready, an app leg between frames holds one read (twice) before reading it,
    waiting until that fits: so reads in progress are inside the budget."""
    gate = MemoryBudgetGate(MemoryBudget(4 * CHUNK))
    budget = gate.budget
    budget.charge(3 * CHUNK)  # a window
    charge = gate.charge_for(CHUNK)
    done: list[float] = []

    async def read() -> None:
        await gate.reserve_read(charge)
        done.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read)
        await trio.sleep(1)
        assert done == []
        budget.release(CHUNK)  # the window was confirmed in part
    assert done == [1.0]
    assert charge.charged == 2 * CHUNK
    assert budget.held == budget.limit
