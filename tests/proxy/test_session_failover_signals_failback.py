"""Session: ``priority_backup`` failback within a bounded time even under steady traffic
(issue 16, part 5), on scripted brokers and the mock clock.

While on a backup the session tries the first broker every ``max_retry_interval``; once it
accepts, the app's next frame is held (outside a transaction) until the backup has confirmed
the window, then the session moves, and the restore on the first broker lets the app go on
(proxy.session.link, docs/behaviour.md "Broker list and reconnect policy").
"""

from __future__ import annotations

import trio

from protocol import Command
from proxy.reconnect.board import ReconnectBoard
from proxy.session.link import FAILBACK_HOLD
from tests.proxy.scripted_broker import (
    Network,
    Running,
    ScriptedBroker,
    make_config,
    start_session,
    wait_until,
)

QUEUE = "/queue/orders"
#: ``max_retry_interval`` of these tests, seconds: how often the first broker is tried.
INTERVAL = 1.0


async def held(running: Running) -> None:
    """Wait until a failback holds the app."""
    await wait_until(lambda: running.session.core.flow.failback_hold is not None, poll=0.001)


async def on_backup(
    nursery: trio.Nursery, network: Network
) -> tuple[ScriptedBroker, ScriptedBroker, Running]:
    """The first broker down, a session CONNECTED to the backup with ``priority_backup``."""
    primary = network.add("primary", 61001)
    backup = network.add("backup", 61002)
    primary.reachable = False
    running = await start_session(
        nursery,
        network,
        make_config(
            primary, backup, priority_backup=True, max_retry_interval=round(INTERVAL * 1000)
        ),
    )
    assert (await running.app.connect()).command is Command.CONNECTED
    await running.app.subscribe_events()
    assert running.session.statistics().broker == backup.label
    return primary, backup, running


async def confirm_late(broker: ScriptedBroker, delay: float) -> None:
    """Play a broker that answers every receipt ``delay`` to ``2 * delay`` seconds late (all
    links): what it held ``delay`` ago is released, what came since stays held."""
    held: dict[int, int] = {}
    while True:
        for link in broker.live_links():
            n = held.get(link.index, 0)
            if n:
                await link.release(count=n)
            held[link.index] = len(link.held)
        await trio.sleep(delay)


def sends(broker: ScriptedBroker) -> list[bytes]:
    return [f.body for f in broker.frames() if f.command is Command.SEND]


async def test_fails_back_under_a_producer_that_never_pauses(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """A producer SENDs every millisecond, each with a receipt, and never waits for one; the
    backup confirms 5 ms late, so something is always unconfirmed (no quiet point ever).
    Once the first broker is back, the session fails back within ``max_retry_interval``
    plus the few milliseconds the app is held (``app_held_ms``), every SEND reaches exactly
    one broker, in order, and the app gets every RECEIPT once."""
    primary, backup, running = await on_backup(nursery, network)
    app = running.app
    backup.receipts = "hold"
    nursery.start_soon(confirm_late, backup, 0.005)
    produced = 0
    producing = trio.CancelScope()

    async def produce() -> None:
        nonlocal produced
        with producing:
            while True:
                await app.send(
                    Command.SEND,
                    {"destination": QUEUE, "receipt": f"r{produced}"},
                    f"m{produced}".encode(),
                )
                produced += 1
                await trio.sleep(0.001)

    nursery.start_soon(produce)
    unconfirmed = []
    for _ in range(200):  # 2 s on the backup: the window is never found empty
        await trio.sleep(0.01)
        stats = running.session.statistics()
        assert stats.window is not None
        unconfirmed.append(stats.window.frames)
    assert min(unconfirmed) > 0

    back_at = trio.current_time()
    primary.reachable = True
    failover = await app.wait_event("FAILOVER")
    moved = app.arrival(lambda f: f.get("event") == "FAILOVER") - back_at
    await trio.sleep(0.5)
    producing.cancel()
    total = produced
    await app.signal.wait_until(lambda: len(app.receipt_ids()) == total + 1)

    assert failover["reason"] == "failback to the first broker"
    assert (failover["from_broker"], failover["to_broker"]) == (backup.label, primary.label)
    assert failover["replayed_frames"] == 0  # the window was drained before the move
    assert moved <= INTERVAL + 0.05
    held = failover["app_held_ms"]
    assert isinstance(held, int)
    assert held <= 20
    print(f"\n[failback under a steady producer] {moved * 1000:.0f} ms, app held {held} ms")
    on_backup_, on_primary = sends(backup), sends(primary)
    assert on_backup_
    assert on_primary
    assert on_backup_ + on_primary == [f"m{i}".encode() for i in range(total)]
    assert app.receipt_ids() == ["events-sub", *(f"r{i}" for i in range(total))]
    assert app.errors() == []
    assert backup.links[0].commands()[-1] is Command.DISCONNECT
    await wait_until(lambda: running.session.statistics().broker == primary.label)


async def test_a_window_that_does_not_drain_gives_the_move_up_and_it_is_tried_again(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """The backup does not confirm a SEND: the session connects to the first broker, holds
    the app for at most FAILBACK_HOLD, then gives up (a DISCONNECT to the first broker, the
    app's held SEND goes to the backup, no event). Once the backup confirms, the next try
    moves the session: FAILOVER "failback to the first broker", the app's next SEND on the
    first broker."""
    primary, backup, running = await on_backup(nursery, network)
    app = running.app
    backup.receipts = "hold"
    await app.send(Command.SEND, {"destination": QUEUE, "receipt": "r1"}, b"one")
    await backup.wait_for(Command.SEND)
    primary.reachable = True
    await held(running)
    held_at = trio.current_time()
    await app.send(Command.SEND, {"destination": QUEUE, "receipt": "r2"}, b"two")
    await backup.wait_for(Command.SEND, 2)
    assert trio.current_time() - held_at >= FAILBACK_HOLD - 0.01  # held, then let go
    assert trio.current_time() - held_at <= FAILBACK_HOLD + 0.05
    await primary.signal.wait_until(lambda: primary.links[0].closed)
    assert primary.links[0].commands() == [Command.CONNECT, Command.DISCONNECT]
    assert app.events() == []

    released_at = trio.current_time()
    await backup.link.release()
    failover = await app.wait_event("FAILOVER")
    assert failover["reason"] == "failback to the first broker"
    assert app.arrival(lambda f: f.get("event") == "FAILOVER") - released_at <= INTERVAL + 0.1
    await app.send(Command.SEND, {"destination": QUEUE, "receipt": "r3"}, b"three")
    await app.wait_receipt("r3")
    assert app.receipt_ids() == ["events-sub", "r1", "r2", "r3"]
    assert sends(backup) == [b"one", b"two"]
    assert sends(primary) == [b"three"]


async def test_the_app_is_held_only_outside_a_transaction(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """A transaction open when the first broker is back finishes on the backup: the app goes
    on to its COMMIT (past ``max_retry_interval``, the hold is already asked for), and only
    its next frame waits; that one is the first broker's."""
    primary, backup, running = await on_backup(nursery, network)
    app = running.app
    await app.send(Command.BEGIN, {"transaction": "tx", "receipt": "b"})
    await app.wait_receipt("b")
    primary.reachable = True
    await primary.wait_for_links(1)
    for i in range(15):  # 1.5 s in the transaction
        await app.send(Command.SEND, {"destination": QUEUE, "transaction": "tx"}, b"%d" % i)
        await trio.sleep(0.1)
    assert app.events() == []
    await app.send(Command.COMMIT, {"transaction": "tx", "receipt": "c"})
    await app.send(Command.SEND, {"destination": QUEUE, "receipt": "after"}, b"after")
    failover = await app.wait_event("FAILOVER")
    await app.wait_receipt("after")
    assert failover["reason"] == "failback to the first broker"
    assert app.receipt_ids() == ["events-sub", "b", "c", "after"]
    assert backup.link.commands()[-2:] == [Command.COMMIT, Command.DISCONNECT]
    assert len(backup.link.received(Command.SEND)) == 15
    assert [f.body for f in primary.link.received(Command.SEND)] == [b"after"]
    assert primary.link.received(Command.BEGIN) == []


async def test_a_held_message_delays_the_move_at_most_max_retry_interval(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """The app holds a ``client`` message of the backup unacknowledged: the session waits up
    to ``max_retry_interval`` for its ACK (which would not reach the backup after the move),
    then moves anyway; the backup gets it back at the DISCONNECT (it redelivers it), and the
    app's late ACK is answered by the sidecar (``transparent``), nothing goes upstream."""
    primary, backup, running = await on_backup(nursery, network)
    app = running.app
    await app.send(
        Command.SUBSCRIBE, {"destination": QUEUE, "id": "c", "ack": "client", "receipt": "s"}
    )
    await app.wait_receipt("s")
    await backup.link.deliver(QUEUE, b"held", message_id="ID:1")
    await app.signal.wait_until(lambda: bool(app.messages(QUEUE)))
    primary.reachable = True
    await primary.wait_for_links(1)
    connected_at = trio.current_time()
    failover = await app.wait_event("FAILOVER")
    waited = app.arrival(lambda f: f.get("event") == "FAILOVER") - connected_at
    assert INTERVAL - 0.01 <= waited <= INTERVAL + 0.1
    assert failover["reason"] == "failback to the first broker"
    (message,) = app.messages(QUEUE)
    await app.send(Command.ACK, {"id": message.get("ack") or "", "receipt": "late"})
    await app.wait_receipt("late")
    assert primary.link.received(Command.ACK) == []
    assert backup.links[0].received(Command.ACK) == []
    (resubscribed,) = primary.link.received(Command.SUBSCRIBE)
    assert resubscribed.get("id") == "c"


async def test_the_failback_watch_skips_a_first_broker_that_refuses_for_its_cooldown(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """A first broker that refuses the login, two sessions on the backup sharing the
    sidecar's board: their failback watches share the broker's refusal cool-down as their
    reconnects do, so the first broker gets one CONNECT per watch interval, not one per
    session (and nobody leaves the backup)."""
    primary = network.add("primary", 61001)
    backup = network.add("backup", 61002)
    primary.refuse = "User name [app] or password is invalid."
    config = make_config(
        primary, backup, priority_backup=True, max_retry_interval=round(INTERVAL * 1000)
    )
    board = ReconnectBoard()
    sessions = []
    for n in (1, 2):
        running = await start_session(
            nursery, network, config, session_id=f"s{n}", reconnects=board
        )
        assert (await running.app.connect()).command is Command.CONNECTED
        sessions.append(running)
    before = primary.connects
    await trio.sleep(10 * INTERVAL + 0.5)
    tries = primary.connects - before
    assert 9 <= tries <= 11, tries  # one per interval: the other session skipped it
    assert all(r.session.statistics().broker == backup.label for r in sessions)
