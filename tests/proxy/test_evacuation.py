"""Evacuating a broker (docs/operations.md, "Actions"): the table (pure), the refusal of an
evacuation that would strand the sessions, the walk that skips an evacuated broker, and the
sessions' move off it at a quiet point, as a failback does (proxy.session.link), on scripted
brokers and the mock clock.

The admin plane's actions that ask for it are in test_admin_actions.py; the move under load
through a running sidecar and real brokers in tests/integration/test_evacuation.py.
"""

from __future__ import annotations

import math
import random
from typing import cast

import pytest
import trio
import trio.testing

from config import Broker
from protocol import Command
from proxy.app import Sidecar
from proxy.legs.broker import Upstream, UpstreamUnavailable
from proxy.reconnect.board import ReconnectBoard
from proxy.reconnect.evacuations import (
    MAX_EVACUATION_SECONDS,
    Evacuation,
    EvacuationRefused,
    Evacuations,
    UnknownBroker,
    stranded,
)
from proxy.reconnect.policy import ReconnectPolicy
from proxy.reconnect.walk import connect_by_policy
from tests.proxy.scripted_broker import (
    Network,
    Running,
    ScriptedBroker,
    make_config,
    start_session,
)
from tests.proxy.test_session_failover_signals_failback import confirm_late, sends

QUEUE = "/queue/orders"
#: ``max_retry_interval`` of these tests, seconds.
INTERVAL = 1.0
REASON = "requested on the admin plane by 10.0.0.7"

# -- the table (pure) ---------------------------------------------------------------------------


def test_an_evacuation_holds_until_readmitted_or_its_time_is_up() -> None:
    table = Evacuations()
    forever = table.evacuate("a:1", "r1", 10.0)
    timed = table.evacuate("b:2", "r2", 11.0, for_seconds=5.0)
    assert forever == Evacuation("a:1", "r1", 10.0, None)
    assert timed == Evacuation("b:2", "r2", 11.0, 16.0)
    assert table.active(12.0) == (forever, timed)
    assert table.get("b:2", 15.999) == timed
    assert table.get("b:2", 16.0) is None  # its time is up
    assert table.active(16.0) == (forever,)
    assert table.readmit("b:2", 17.0) is None  # nothing to readmit any more
    again = table.evacuate("a:1", "r3", 20.0, for_seconds=1.0)  # replaces the first
    assert table.active(20.5) == (again,)
    assert table.readmit("a:1", 20.5) == again
    assert table.active(20.5) == ()
    assert table.get("c:3", 0.0) is None


@pytest.mark.parametrize("seconds", [0.0, -1.0, math.inf, math.nan, MAX_EVACUATION_SECONDS + 1])
def test_for_seconds_out_of_range_is_refused(seconds: float) -> None:
    table = Evacuations()
    with pytest.raises(ValueError, match="for_seconds must be above 0"):
        table.evacuate("a:1", "r", 0.0, for_seconds=seconds)
    assert table.active(0.0) == ()


def test_stranded_says_why_the_sessions_would_have_nowhere_to_go() -> None:
    brokers = ["a:1", "b:2", "c:3"]
    assert stranded("a:1", ["a:1"], [], None) == (
        "a:1 is the only broker in the list: its sessions would have nowhere to go"
    )
    assert stranded("a:1", brokers, ["b:2", "c:3"], None) == (
        "every other broker is evacuated (b:2, c:3): readmit one first, or its sessions would "
        "have nowhere to go"
    )
    assert stranded("a:1", brokers, ["a:1"], None) is None  # evacuated again: fine
    states = {"a:1": ("up", ""), "b:2": ("down", "connection refused"), "c:3": ("unknown", "")}
    assert stranded("a:1", brokers, [], states) == (
        "no other broker can take the sessions: b:2: down (connection refused); c:3: not "
        "checked yet"
    )
    assert stranded("b:2", brokers, [], states) is None  # a:1 is up
    assert stranded("b:2", brokers, ["a:1"], states) == (
        "no other broker can take the sessions: c:3: not checked yet"
    )


def test_the_sidecar_checks_the_label_and_the_others() -> None:
    """:meth:`BrokerRotation.evacuate` without an admin plane judges the list and the evacuations;
    ``check=False`` (a broker that left the list) evacuates whatever the others."""
    sidecar = Sidecar(make_config(ScriptedBroker("a", "h", 1), ScriptedBroker("b", "h", 2)))
    with pytest.raises(UnknownBroker, match=r"h:3 is not in the broker list \(h:1, h:2\)"):
        sidecar.rotation.evacuate("h:3", REASON)
    with pytest.raises(UnknownBroker):
        sidecar.rotation.readmit("h:3")

    async def main() -> None:
        sidecar.rotation.evacuate("h:1", REASON)
        with pytest.raises(EvacuationRefused, match="every other broker is evacuated"):
            sidecar.rotation.evacuate("h:2", REASON)
        sidecar.rotation.evacuate("h:2", "left the broker list", check=False)
        assert [e.broker for e in sidecar.rotation.evacuations()] == ["h:1", "h:2"]
        assert sidecar.rotation.readmit("h:1") is not None
        assert sidecar.rotation.readmit("h:1") is None
        assert [e.broker for e in sidecar.rotation.evacuations()] == ["h:2"]

    trio.run(main)


# -- sessions -----------------------------------------------------------------------------------


async def on_primary(
    nursery: trio.Nursery,
    network: Network,
    board: ReconnectBoard,
    *,
    sessions: int = 1,
    **config: object,
) -> tuple[ScriptedBroker, ScriptedBroker, list[Running]]:
    """Two brokers, ``sessions`` sessions CONNECTED to the first, sharing ``board``."""
    primary = network.add("primary", 61001)
    backup = network.add("backup", 61002)
    cfg = make_config(primary, backup, max_retry_interval=round(INTERVAL * 1000), **config)
    running = []
    for n in range(sessions):
        r = await start_session(nursery, network, cfg, session_id=f"s{n + 1}", reconnects=board)
        assert (await r.app.connect()).command is Command.CONNECTED
        await r.app.subscribe_events()
        assert r.session.statistics().broker == primary.label
        running.append(r)
    return primary, backup, running


async def test_every_session_moves_off_an_evacuated_broker_with_a_failover_event(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """Two idle sessions on the primary: evacuated, each moves to the backup at once (its
    quiet point is now), RECONNECTING then FAILOVER with reason ``evacuated`` and the
    evacuation's words; the primary gets a DISCONNECT from each, the backup their
    subscriptions again. A new session goes to the backup, not to the first broker."""
    board = ReconnectBoard()
    primary, backup, running = await on_primary(nursery, network, board, sessions=2)
    for r in running:
        await r.app.send(Command.SUBSCRIBE, {"destination": QUEUE, "id": "c", "receipt": "s"})
        await r.app.wait_receipt("s")
    at = trio.current_time()
    board.evacuate(primary.label, REASON)
    for r in running:
        failover = await r.app.wait_event("FAILOVER")
        reconnecting = r.app.events("RECONNECTING")[0]
        assert (
            failover["reason"]
            == reconnecting["reason"]
            == (f"broker {primary.label} evacuated: {REASON}")
        )
        assert (failover["from_broker"], failover["to_broker"]) == (primary.label, backup.label)
        assert failover["reattached"] is False
        assert failover["replayed_frames"] == 1  # its SUBSCRIBE, nothing of the window
        assert failover["attempts"] == 1
        assert r.app.arrival(lambda f: f.get("event") == "FAILOVER") - at < 0.05
        assert r.app.errors() == []
        await r.app.signal.wait_until(lambda: True)  # the FAILOVER is written: it runs there
        assert r.session.statistics().broker == backup.label
    for link in primary.links:
        assert link.commands()[-1] is Command.DISCONNECT
    await backup.wait_for(Command.SUBSCRIBE, 2)
    assert [len(link.received(Command.SUBSCRIBE)) for link in backup.links] == [1, 1]
    newcomer = await start_session(
        nursery, network, running[0].session.core.config, session_id="s3", reconnects=board
    )
    assert (await newcomer.app.connect()).command is Command.CONNECTED
    assert newcomer.session.statistics().broker == backup.label
    assert len(primary.links) == 2


async def test_a_producer_that_never_pauses_moves_with_nothing_lost_or_twice(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """A SEND with a receipt every millisecond, never waiting, the primary confirming 5 ms
    late: the session moves within a few milliseconds of the app held, every SEND reaches
    exactly one broker in order, the app gets every RECEIPT once."""
    board = ReconnectBoard()
    primary, backup, (running,) = await on_primary(nursery, network, board)
    app = running.app
    primary.receipts = "hold"
    nursery.start_soon(confirm_late, primary, 0.005)
    produced = 0
    producing = trio.CancelScope()

    async def produce() -> None:
        nonlocal produced
        with producing:
            while True:
                receipt = {"destination": QUEUE, "receipt": f"r{produced}"}
                await app.send(Command.SEND, receipt, f"m{produced}".encode())
                produced += 1
                await trio.sleep(0.001)

    nursery.start_soon(produce)
    await trio.sleep(0.5)
    board.evacuate(primary.label, REASON)
    failover = await app.wait_event("FAILOVER")
    await trio.sleep(0.5)
    producing.cancel()
    total = produced
    await app.signal.wait_until(lambda: len(app.receipt_ids()) == total + 1)
    assert failover["reason"] == f"broker {primary.label} evacuated: {REASON}"
    held = failover["app_held_ms"]
    assert isinstance(held, int)
    assert held <= 20
    on_primary_, on_backup = sends(primary), sends(backup)
    assert on_primary_
    assert on_backup
    assert on_primary_ + on_backup == [f"m{i}".encode() for i in range(total)]
    assert app.receipt_ids() == ["events-sub", *(f"r{i}" for i in range(total))]
    assert app.errors() == []
    print(f"\n[evacuation under a steady producer] {total} SENDs, app held {held} ms")


async def test_with_no_other_broker_up_the_session_stays_and_tries_again(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """The backup is down: the session stays on the evacuated primary (no event) and tries
    the backup again every ``max_retry_interval``; once it answers, the session moves."""
    board = ReconnectBoard()
    primary, backup, (running,) = await on_primary(nursery, network, board)
    backup.reachable = False
    board.evacuate(primary.label, REASON)
    await trio.sleep(3.5 * INTERVAL)
    assert backup.refused_attempts == 4  # at once, then every interval
    assert running.app.events() == []
    assert running.session.statistics().broker == primary.label
    backup.reachable = True
    failover = await running.app.wait_event("FAILOVER")
    assert failover["to_broker"] == backup.label
    assert failover["attempts"] == 1


async def test_a_readmission_before_the_move_keeps_the_session_where_it_is(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """The backup down, the primary evacuated then readmitted: the session never moves and
    stops trying the backup; evacuated again later, it moves then."""
    board = ReconnectBoard()
    primary, backup, (running,) = await on_primary(nursery, network, board)
    backup.reachable = False
    board.evacuate(primary.label, REASON)
    await trio.sleep(1.5 * INTERVAL)
    assert board.readmit(primary.label) is not None
    tried = backup.refused_attempts
    await trio.sleep(10 * INTERVAL)
    assert backup.refused_attempts == tried
    assert running.app.events() == []
    backup.reachable = True
    board.evacuate(primary.label, "left the broker list")
    failover = await running.app.wait_event("FAILOVER")
    assert failover["reason"] == f"broker {primary.label} evacuated: left the broker list"


async def test_a_transaction_open_finishes_on_the_evacuated_broker(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """The move waits for a quiet point: a transaction open at the evacuation goes on to its
    COMMIT on the primary (past ``max_retry_interval``: the hold is asked for by then); the
    app's next frame goes to the backup."""
    board = ReconnectBoard()
    primary, backup, (running,) = await on_primary(nursery, network, board)
    app = running.app
    await app.send(Command.BEGIN, {"transaction": "tx", "receipt": "b"})
    await app.wait_receipt("b")
    board.evacuate(primary.label, REASON)
    await backup.wait_for_links(1)
    for i in range(15):  # 1.5 s in the transaction
        await app.send(Command.SEND, {"destination": QUEUE, "transaction": "tx"}, b"%d" % i)
        await trio.sleep(0.1)
    assert app.events() == []
    await app.send(Command.COMMIT, {"transaction": "tx", "receipt": "c"})
    await app.send(Command.SEND, {"destination": QUEUE, "receipt": "after"}, b"after")
    await app.wait_event("FAILOVER")
    await app.wait_receipt("after")
    assert app.receipt_ids() == ["events-sub", "b", "c", "after"]
    assert primary.link.commands()[-2:] == [Command.COMMIT, Command.DISCONNECT]
    assert [f.body for f in backup.link.received(Command.SEND)] == [b"after"]


async def test_priority_backup_does_not_fail_back_to_an_evacuated_first_broker(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """With ``priority_backup``: the first broker evacuated, the session moves to the backup
    and stays there (the failback watch does not even try the first broker): readmitted, it
    fails back as after an outage."""
    board = ReconnectBoard()
    primary, backup, (running,) = await on_primary(nursery, network, board, priority_backup=True)
    board.evacuate(primary.label, REASON)
    away = await running.app.wait_event("FAILOVER")
    assert away["to_broker"] == backup.label
    links = len(primary.links)
    await trio.sleep(10 * INTERVAL)
    assert len(primary.links) == links  # not tried while evacuated
    board.readmit(primary.label)
    back = await running.app.wait_event("FAILOVER", 2)
    assert back["reason"] == "failback to the first broker"
    assert back["to_broker"] == primary.label


async def test_a_timed_evacuation_ends_by_itself(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """Evacuated for 5 s: the session moves; once the time is up the first broker is back in
    the rotation (a new session connects to it), and the moved session stays where it is."""
    board = ReconnectBoard()
    primary, backup, (running,) = await on_primary(nursery, network, board)
    board.evacuate(primary.label, REASON, for_seconds=5.0)
    await running.app.wait_event("FAILOVER")
    config = running.session.core.config
    early = await start_session(nursery, network, config, session_id="s2", reconnects=board)
    assert (await early.app.connect()).command is Command.CONNECTED
    assert early.session.statistics().broker == backup.label
    await trio.sleep(5.0)
    late = await start_session(nursery, network, config, session_id="s3", reconnects=board)
    assert (await late.app.connect()).command is Command.CONNECTED
    assert late.session.statistics().broker == primary.label
    assert running.session.statistics().broker == backup.label
    assert board.evacuated(primary.label) is None


# -- the walk -----------------------------------------------------------------------------------


class _Leg:
    """What connect_by_policy reads of a leg it returns."""

    connected: dict[str, str] = {}  # noqa: RUF012 - read only


@pytest.mark.parametrize("shared", [True, False])
async def test_the_walk_skips_evacuated_brokers_unless_all_are(
    autojump_clock: trio.testing.MockClock, shared: bool
) -> None:
    """A reconnect from the evacuated current broker tries the others only; with every broker
    evacuated it walks them all. ``shared``: the board is the sessions' (``board=``), else
    only its evacuations count (``evacuations=``, the outbox forwarder's way)."""
    brokers = tuple(ScriptedBroker(n, "h", p).config for n, p in (("a", 1), ("b", 2), ("c", 3)))
    board = ReconnectBoard()
    tried: list[str] = []

    async def connect_one(broker: Broker) -> Upstream:
        tried.append(broker.label)
        if broker.label != "h:1":
            raise UpstreamUnavailable(broker, "connection refused")
        return cast("Upstream", _Leg())

    async def walk() -> int:
        tried.clear()
        policy = ReconnectPolicy(retry_interval=0.1, jitter=0.0)
        _, index, _ = await connect_by_policy(
            brokers,
            policy,
            random.Random(1),
            connect_one,
            current=1,
            initial=False,
            board=board if shared else None,
            evacuations=None if shared else board,
        )
        return index

    board.evacuate("h:1", REASON)
    board.evacuate("h:2", REASON)
    with trio.move_on_after(0.35):
        await walk()
    assert set(tried) == {"h:3"}  # only c, round after round
    board.evacuate("h:3", REASON)
    assert await walk() == 0  # every one evacuated: all walked
    assert tried == ["h:2", "h:3", "h:1"]
