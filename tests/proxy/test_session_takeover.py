"""A session whose app connects during a broker takeover (issue 14, item 4), on scripted
brokers and the mock clock: its first connection keeps trying for ``initial_connect_period``
whatever ``initial_connect_attempts`` says, and while other sessions of the sidecar are
reconnecting it waits for their outcome (:class:`proxy.reconnect.walk.ReconnectBoard`) instead of
racing them. Also the pure parts: :meth:`ReconnectPolicy.give_up_at` and the tally.

Configs come from ``make_config``: no jitter, backoff 100 ms doubling to ``max_retry_interval``,
so a first connection's rounds start at 0, 0.1, 0.3, 0.7, 1.5... s and a reconnect's at 0.1,
0.3, 0.7, 1.5... s after the loss.
"""

from __future__ import annotations

import pytest
import trio

from config import Config
from protocol import Command
from proxy.reconnect.board import ReconnectBoard
from proxy.reconnect.policy import ReconnectPolicy
from proxy.reconnect.tally import ReconnectTally, Seen
from tests.proxy.scripted_broker import (
    AppClient,
    Network,
    Running,
    ScriptedBroker,
    make_config,
    start_session,
    wait_until,
)

#: The issue's policy: three quick rounds, then (before initial_connect_period) an ERROR.
ISSUE = {"initial_connect_attempts": 3, "retry_interval": 100, "max_retry_interval": 5000}


async def start(
    nursery: trio.Nursery,
    network: Network,
    config: Config,
    session_id: str,
    *,
    board: ReconnectBoard | None = None,
) -> Running:
    """:func:`start_session` sharing ``board``; the app has not sent CONNECT."""
    return await start_session(nursery, network, config, session_id=session_id, reconnects=board)


async def send_connect(app: AppClient) -> float:
    """Send the app's CONNECT without waiting for the answer; returns when it was sent."""
    await app.send(Command.CONNECT, {"accept-version": "1.2", "host": "/", "heart-beat": "0,0"})
    return trio.current_time()


async def answer(app: AppClient) -> tuple[float, str]:
    """The app's first frame: (arrival time, command)."""
    await app.signal.wait_until(lambda: bool(app.log))
    return app.log[0].at, str(app.log[0].frame.command)


def attempts_between(network: Network, start: float, end: float) -> list[tuple[str, bool]]:
    """Connection attempts (broker label, reached) made in ``(start, end]``."""
    return [(label, ok) for at, label, ok in network.attempts if start < at <= end + 1e-9]


# -- the first connection's period --------------------------------------------------------------


async def test_a_first_connect_keeps_trying_past_its_attempts_until_a_broker_is_back(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """Both brokers down when the app connects (the issue: 3 rounds, 100 ms): the session
    goes on past its three rounds (0, 0.1, 0.3 s) with the usual backoff (0.7, 1.5, 3.1 s)
    and the app gets CONNECTED from the backup at the first round after it is back, no
    ERROR. ``handshake_timeout`` (1 s here) does not cut the wait short."""
    primary = network.add("primary", 61001)
    backup = network.add("backup", 61002)
    primary.reachable = backup.reachable = False
    config = make_config(primary, backup, **ISSUE, handshake_timeout=1000)
    running = await start(nursery, network, config, "s1")
    sent = await send_connect(running.app)

    await trio.sleep(2.0)
    backup.reachable = True
    at, command = await answer(running.app)

    assert command == "CONNECTED"
    assert at - sent == pytest.approx(3.1)
    assert running.app.errors() == []
    assert running.app.log[0].frame.get("server") == "ActiveMQ/5.17.0"
    assert running.session.statistics().broker == backup.label
    assert len(network.attempts) == 5 * 2 + 2  # 5 failed rounds of 2, then primary, backup


@pytest.mark.parametrize(
    ("period_ms", "gives_up_after"),
    [(5000, 5.0), (0, 0.3)],
    ids=["period", "attempts-alone"],
)
async def test_a_first_connect_gives_up_when_its_attempts_and_its_period_are_spent(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    network: Network,
    period_ms: int,
    gives_up_after: float,
) -> None:
    """Every broker stays down: the app gets ``ERROR mq-sidecar could not connect to a
    broker`` when the period ends (5 s: the last delay, 3.2 s from 3.1 s, is cut short and
    no round starts then), or with the period 0 after its three rounds (0.3 s, the old
    rule)."""
    broker = network.add("broker", 61001)
    broker.reachable = False
    config = make_config(broker, **ISSUE, initial_connect_period=period_ms)
    running = await start(nursery, network, config, "s1")
    sent = await send_connect(running.app)

    error = await running.app.wait_error()
    assert (error.get("message") or "").startswith("mq-sidecar could not connect to a broker: ")
    assert running.app.arrival(lambda f: f.command is Command.ERROR) - sent == pytest.approx(
        gives_up_after
    )
    await running.app.wait_closed()
    rounds = [at - sent for at, _, _ in network.attempts]
    assert rounds[:3] == pytest.approx([0.0, 0.1, 0.3])
    # With the period, rounds at 0.7, 1.5 and 3.1 s more; none at 5.0 s, where it gives up.
    assert rounds[3:] == pytest.approx([] if period_ms == 0 else [0.7, 1.5, 3.1])


async def test_a_drain_stops_a_first_connect_at_once(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """SIGTERM while a first connection keeps trying (every broker down): the session stops
    trying and its app gets the drain's ERROR at once, not at the end of the period."""
    broker = network.add("broker", 61001)
    broker.reachable = False
    config = make_config(broker, **ISSUE, initial_connect_period=30_000)
    running = await start(nursery, network, config, "s1")
    await send_connect(running.app)
    await trio.sleep(1.0)
    drained_at = trio.current_time()
    running.session.request_drain()
    error = await running.app.wait_error()
    assert (error.get("message") or "").startswith("mq-sidecar is shutting down")
    assert running.app.arrival(lambda f: f.command is Command.ERROR) == pytest.approx(drained_at)
    await running.app.wait_closed()


async def test_a_login_refused_by_every_broker_is_not_retried_for_the_period(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """Brokers that answer CONNECT with an ERROR are up and say no: waiting does not help,
    so the app gets the broker's own ERROR after that one round, not after its three rounds
    or the period (issue 16)."""
    broker = network.add("broker", 61001)
    broker.refuse = "Authentication failed"
    config = make_config(broker, **ISSUE, initial_connect_period=30_000)
    running = await start(nursery, network, config, "s1")
    sent = await send_connect(running.app)

    error = await running.app.wait_error()
    assert error.get("message") == "Authentication failed"
    assert running.app.arrival(lambda f: f.command is Command.ERROR) - sent == pytest.approx(0.0)
    assert broker.connects == 1


# -- waiting for the other sessions' reconnects --------------------------------------------------


async def connected_on_primary(
    nursery: trio.Nursery,
    network: Network,
    config: Config,
    board: ReconnectBoard,
    primary: ScriptedBroker,
) -> Running:
    """A session of ``board`` whose app is CONNECTED through ``primary``."""
    running = await start(nursery, network, config, "old", board=board)
    assert (await running.app.connect()).command is Command.CONNECTED
    assert running.session.statistics().broker == primary.label
    return running


async def test_a_new_session_waits_for_the_reconnect_of_the_others_then_joins_them(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """The primary dies under a connected session ("old", reconnecting: rounds at 0.1,
    0.3, 0.7, 1.5 s after the loss); an app connects 50 ms after the loss. Its session makes
    no attempt of its own while "old" reconnects: when "old" reaches the backup (1.5 s; the
    backup answers from 1.0 s) the new session connects there at once, backup first."""
    primary = network.add("primary", 61001)
    backup = network.add("backup", 61002)
    backup.reachable = False
    board = ReconnectBoard()
    config = make_config(primary, backup, **ISSUE)
    old = await connected_on_primary(nursery, network, config, board, primary)

    primary.reachable = False
    lost = trio.current_time()
    await primary.link.drop("reset")
    await wait_until(lambda: board.reconnecting == 1)
    await trio.sleep(0.05)
    new = await start(nursery, network, config, "new", board=board)
    await send_connect(new.app)
    await trio.sleep(1.0 - (trio.current_time() - lost))
    backup.reachable = True

    at, command = await answer(new.app)
    assert command == "CONNECTED"
    assert at - lost == pytest.approx(1.5)
    assert new.session.statistics().broker == backup.label
    assert new.app.errors() == []
    # Only the old session's rounds (primary first: reattach) until it reached the backup,
    # then the new session's one attempt, to the backup.
    down = [(primary.label, False), (backup.label, False)]
    assert attempts_between(network, lost, lost + 1.0) == down * 3
    assert attempts_between(network, lost + 1.0, lost + 2.0) == [
        (primary.label, False),
        (backup.label, True),
        (backup.label, True),
    ]
    assert backup.connects == 2
    await wait_until(lambda: old.session.statistics().broker == backup.label)
    assert board.reconnecting == 0


async def test_a_new_session_goes_on_by_itself_when_the_others_give_up(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """The old session gives up its reconnect after two rounds (0.1, 0.3 s after the loss): the new
    session, which waited, starts its own rounds at once (0.3 s), goes on past its three
    rounds (initial_connect_period) and is CONNECTED when the broker is back."""
    primary = network.add("primary", 61001)
    board = ReconnectBoard()
    config = make_config(primary, **ISSUE, reconnect_attempts=2)
    old = await connected_on_primary(nursery, network, config, board, primary)

    primary.reachable = False
    lost = trio.current_time()
    await primary.link.drop("reset")
    await wait_until(lambda: board.reconnecting == 1)
    await trio.sleep(0.05)
    new = await start(nursery, network, config, "new", board=board)
    await send_connect(new.app)
    await old.app.wait_closed()
    assert board.reconnecting == 0

    await trio.sleep(1.0)
    primary.reachable = True
    at, command = await answer(new.app)
    assert command == "CONNECTED"
    own = [t - lost for t, _, _ in network.attempts if t - lost > 0.3 - 1e-9]
    # old's last round at 0.3 s; the new session's rounds at 0.3, 0.4, 0.6, 1.0, 1.8 s
    assert own == pytest.approx([0.3, 0.3, 0.4, 0.6, 1.0, 1.8])
    assert at - lost == pytest.approx(1.8)


async def test_a_backoff_of_a_first_connect_ends_when_another_session_reaches_a_broker(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """A first connection in a long backoff (brokers down, nobody reconnecting yet) is woken
    when another session reaches a broker, and connects to that one at once instead of at its
    next round."""
    primary = network.add("primary", 61001)
    backup = network.add("backup", 61002)
    board = ReconnectBoard()
    config = make_config(primary, backup, **ISSUE)
    old = await connected_on_primary(nursery, network, config, board, primary)
    primary.reachable = backup.reachable = False

    new = await start(nursery, network, config, "new", board=board)
    sent = await send_connect(new.app)
    await trio.sleep(3.2)  # rounds at 0, 0.1, 0.3, 0.7, 1.5, 3.1; the next one at 8.1 s
    backup.reachable = True
    lost = trio.current_time()
    await primary.link.drop("close")  # "old" reconnects: backup at 0.1 s

    at, command = await answer(new.app)
    assert command == "CONNECTED"
    assert at - lost == pytest.approx(0.1)
    assert at - sent == pytest.approx(3.3)
    assert new.session.statistics().broker == backup.label
    await wait_until(lambda: old.session.statistics().broker == backup.label)


# -- the pure parts -------------------------------------------------------------------------------


def test_give_up_at_needs_both_the_attempts_and_the_period_spent() -> None:
    policy = ReconnectPolicy(initial_connect_attempts=3, reconnect_period=300.0)
    give_up_at = policy.give_up_at
    assert give_up_at(2, initial=True, initial_period=30.0) == 300.0  # rounds left
    assert give_up_at(3, initial=True, initial_period=30.0) == 30.0
    assert give_up_at(3, initial=True, initial_period=None) == 0.0  # the old rule
    assert give_up_at(3, initial=True, initial_period=30.0, refused=True) == 0.0
    assert give_up_at(1, initial=True, initial_period=30.0, refused=True) == 0.0  # issue 16
    assert give_up_at(3, initial=False, initial_period=30.0) == 300.0  # reconnects: -1
    short = ReconnectPolicy(initial_connect_attempts=3, reconnect_period=10.0)
    # reconnect_period bounds a first connection too
    assert short.give_up_at(3, initial=True, initial_period=30.0) == 10.0
    unlimited = ReconnectPolicy(initial_connect_attempts=-1, reconnect_period=None)
    assert unlimited.give_up_at(10**6, initial=True, initial_period=30.0) is None
    assert policy.exhausted(3, 29.9, initial=True, initial_period=30.0) is False
    assert policy.exhausted(3, 30.0, initial=True, initial_period=30.0) is True


def test_the_tally_reports_the_latest_broker_reached_since_a_generation() -> None:
    tally = ReconnectTally()
    start = tally.generation
    assert tally.since(start) == Seen(None, idle=True)
    tally.reconnect_began()
    tally.reconnect_began()
    assert tally.since(start) == Seen(None, idle=False)
    tally.up(1)
    tally.reconnect_ended()
    assert tally.since(start) == Seen(1, idle=False)
    later = tally.generation
    assert tally.since(later) == Seen(None, idle=False)
    tally.reconnect_ended()
    assert tally.since(later) == Seen(None, idle=True)
    assert tally.since(start) == Seen(1, idle=True)
    with pytest.raises(ValueError, match="never began"):
        tally.reconnect_ended()
    with pytest.raises(ValueError, match="start at 0"):
        tally.up(-1)


async def test_the_board_counts_a_reconnect_however_it_ends_and_wakes_waiters(
    autojump_clock: trio.testing.MockClock,
) -> None:
    board = ReconnectBoard()
    assert await board.wait_up(2.0, until_idle=False) is None  # nothing: the full wait
    assert trio.current_time() == pytest.approx(2.0)

    async def reconnect_then_cancelled() -> None:
        with trio.move_on_after(1.0), board.reconnect():
            await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reconnect_then_cancelled)
        await trio.sleep(0.1)
        assert board.reconnecting == 1
        started = trio.current_time()
        assert await board.wait_up(5.0, until_idle=True) is None  # idle once cancelled
        assert trio.current_time() - started == pytest.approx(0.9)
    assert board.reconnecting == 0

    async def reach(broker: int) -> None:
        await trio.sleep(0.5)
        board.up(broker)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reach, 2)
        assert await board.wait_up(5.0, until_idle=False) == 2
    with trio.move_on_after(0.1) as scope:  # cancellation is never swallowed
        await board.wait_up(5.0, until_idle=False)
    assert scope.cancelled_caught
