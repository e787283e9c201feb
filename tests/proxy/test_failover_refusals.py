"""Brokers that refuse the login (issue 16, item 3): the cool-down that makes the sessions of a
sidecar skip a refusing broker, and giving up at once when every broker refuses.

Three layers: the pure parts (:meth:`ReconnectPolicy.refusal_cooldown`,
:class:`proxy.reconnect.tally.Refusals`), :func:`connect_by_policy` with the scripted
``connect_one`` of test_failover.py, and whole sessions on scripted brokers sharing a
:class:`ReconnectBoard` (docs/behaviour.md, "Broker list and reconnect policy"). All on trio's
autojump clock: times are exact.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
import trio
import trio.testing

from config import Broker
from protocol import Command, Frame
from proxy.legs.broker import Upstream, UpstreamRefused
from proxy.reconnect.board import ReconnectBoard
from proxy.reconnect.policy import ReconnectPolicy
from proxy.reconnect.tally import Refusals
from proxy.reconnect.walk import Attempt, ReconnectExhausted, connect_by_policy
from tests.proxy.scripted_broker import (
    Network,
    Running,
    ScriptedBroker,
    make_config,
    start_session,
    wait_until,
)
from tests.proxy.test_failover import REFUSAL, A, B, C, Script

#: No jitter; cool-downs and backoffs 0.1, 0.2, 0.4, 0.8, then 1.0 s.
GROWING = ReconnectPolicy(
    retry_interval=0.1,
    retry_interval_multiplier=2.0,
    max_retry_interval=1.0,
    jitter=0.0,
    reconnect_attempts=-1,
    initial_connect_attempts=1,
    reconnect_period=None,
)


# -- the pure parts ----------------------------------------------------------------------------


def test_the_cooldown_grows_from_retry_interval_and_is_capped_at_max_retry_interval() -> None:
    cooldowns = [GROWING.refusal_cooldown(n) for n in range(1, 8)]
    assert cooldowns == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0])
    assert ReconnectPolicy().refusal_cooldown(10**6) == 5.0  # the default cap, no overflow
    with pytest.raises(ValueError, match="refusals start at 1"):
        GROWING.refusal_cooldown(0)


@pytest.mark.parametrize("initial", [True, False])
def test_a_round_of_refusals_gives_up_at_once_whatever_is_left(initial: bool) -> None:
    unlimited = ReconnectPolicy(
        reconnect_attempts=-1, initial_connect_attempts=-1, reconnect_period=None
    )
    assert unlimited.give_up_at(1, initial=initial, refused=True) == 0.0
    assert unlimited.give_up_at(1, initial=initial, initial_period=30.0, refused=True) == 0.0
    assert unlimited.give_up_at(1, initial=initial) is None  # not refused: never


def test_a_refusal_stands_for_its_cooldown_then_one_caller_tries_again() -> None:
    refusals: Refusals[str, str] = Refusals()
    assert refusals.claim("b", 0.0) is None  # never refused: try it
    assert refusals.refused("b", "no", 0.0, GROWING) == pytest.approx(0.1)
    assert refusals.claim("b", 0.05) == "no"  # cooling down: skip, "no" is its answer
    assert refusals.claim("b", 0.1) is None  # over: this caller tries...
    assert refusals.claim("b", 0.1) == "no"  # ...and the others skip until it has the answer
    assert refusals.claim("b", 99.0) == "no"
    assert refusals.refused("b", "still no", 0.2, GROWING) == pytest.approx(0.2)
    entry = refusals.get("b")
    assert entry is not None
    assert (entry.error, entry.count, entry.until, entry.trying) == ("still no", 2, 0.4, False)
    assert refusals.claim("b", 0.3) == "still no"


def test_refusals_of_attempts_already_under_way_count_in_the_same_cooldown() -> None:
    """Ten sessions tried the broker at once before anyone knew: one cool-down, not ten."""
    refusals: Refusals[str, int] = Refusals()
    assert refusals.refused("b", 1, 0.0, GROWING) == pytest.approx(0.1)
    for n in range(2, 11):
        assert refusals.refused("b", n, 0.009 * n, GROWING) is None
    entry = refusals.get("b")
    assert entry is not None
    assert (entry.count, entry.error) == (1, 10)
    assert entry.until == pytest.approx(0.1)


def test_an_accepted_connect_forgets_the_refusals() -> None:
    refusals: Refusals[str, str] = Refusals()
    for n in range(4):  # 0.1, 0.2, 0.4, 0.8
        assert refusals.claim("b", 10.0 * n) is None
        refusals.refused("b", "no", 10.0 * n, GROWING)
    assert refusals.claim("b", 40.0) is None
    refusals.accepted("b")
    assert refusals.get("b") is None
    assert refusals.claim("b", 40.0) is None
    assert refusals.refused("b", "no", 41.0, GROWING) == pytest.approx(0.1)  # from the start


def test_no_answer_releases_the_retry_and_keeps_the_count() -> None:
    refusals: Refusals[str, str] = Refusals()
    refusals.refused("b", "no", 0.0, GROWING)
    assert refusals.claim("b", 1.0) is None  # retry...
    refusals.settled("b")  # ...unreachable, timed out or cancelled
    assert refusals.claim("b", 1.0) is None  # the next caller may try
    assert refusals.refused("b", "no", 1.0, GROWING) == pytest.approx(0.2)  # second in a row
    refusals.settled("unknown")  # no entry: nothing to do


def test_refusals_are_bounded_and_drop_the_oldest() -> None:
    refusals: Refusals[int, str] = Refusals(limit=3)
    for key in range(5):
        refusals.refused(key, f"no {key}", float(key), GROWING)
    assert len(refusals) == 3
    assert [refusals.get(k) is None for k in range(5)] == [True, True, False, False, False]
    refusals.refused(2, "again", 2.5, GROWING)  # refreshed: now the newest
    refusals.refused(5, "no 5", 5.0, GROWING)
    assert refusals.get(2) is not None
    assert refusals.get(3) is None
    with pytest.raises(ValueError, match="at least 1"):
        Refusals(limit=0)


def test_the_identity_is_the_connect_without_heart_beat_and_keyed_per_board() -> None:
    def connect(**headers: str) -> Frame:
        base = {"accept-version": "1.2", "host": "/", "heart-beat": "5000,2500"}
        return Frame(Command.CONNECT, tuple({**base, **headers}.items()))

    board = ReconnectBoard()
    same = board.identity(connect(login="app", passcode="secret-1"))
    assert board.identity(connect(passcode="secret-1", login="app")) == same  # order
    assert board.identity(connect(login="app", passcode="secret-2")) != same
    assert board.identity(connect(login="app", passcode="secret-1", host="vh")) != same
    assert board.identity(connect(login="app", passcode="secret-1", **{"client-id": "x"})) != same
    beat = board.identity(connect(login="app", passcode="secret-1", **{"heart-beat": "0,0"}))
    assert beat == same
    assert ReconnectBoard().identity(connect(login="app", passcode="secret-1")) != same
    assert b"secret-1" not in same
    assert len(same) == 32


# -- connect_by_policy -------------------------------------------------------------------------


async def walk(
    script: Script,
    policy: ReconnectPolicy = GROWING,
    brokers: Sequence[Broker] = (A, B),
    *,
    board: ReconnectBoard | None = None,
    current: int | None = 0,
    identity: bytes = b"app",
    skipped: list[str] | None = None,
) -> tuple[Upstream, int, list[Attempt]]:
    def on_skip(broker: Broker, refusal: UpstreamRefused) -> None:
        assert refusal.broker == broker
        if skipped is not None:
            skipped.append(broker.label)

    upstream, index, attempts = await connect_by_policy(
        brokers,
        policy,
        random.Random(0),
        script,
        current=current,
        initial=current is None,
        board=board,
        identity=lambda broker: identity,
        on_skip=on_skip,
    )
    return upstream, index, list(attempts)


async def test_every_broker_refusing_ends_a_reconnect_after_that_round(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The session's broker A refuses on the reattach, B too: one round, then the end; the
    exception carries B's refusal, the latest."""
    script = Script(default="refused")
    with pytest.raises(ReconnectExhausted) as info:
        await walk(script)
    exc = info.value
    assert script.labels() == [A.label, B.label]
    assert script.elapsed == pytest.approx(0.1)  # the round's own delay, nothing after it
    assert (exc.refused, exc.rounds, len(exc.attempts)) == (True, 1, 2)
    assert isinstance(exc.last, UpstreamRefused)
    assert exc.last.broker == B
    assert str(exc).endswith(
        ": every broker refused the CONNECT: 127.0.0.1:61002: CONNECT refused: bad credentials"
    )


@pytest.mark.parametrize(
    ("headers", "body", "words"),
    [
        # RabbitMQ: the message says little, the body's first line says who was refused
        (
            (("message", "Bad CONNECT"),),
            b"Access refused for user 'app'\n",
            "CONNECT refused: Bad CONNECT (Access refused for user 'app')",
        ),
        # ActiveMQ: a stack trace under the message, whose first line repeats it
        (
            (("message", "User name [app] or password is invalid."),),
            b"java.lang.SecurityException: User name [app] or password is invalid.\n\tat x\n",
            "CONNECT refused: User name [app] or password is invalid.",
        ),
        ((), b"no message header\n", "CONNECT refused: no message header"),
    ],
)
def test_the_reason_given_up_with_carries_the_brokers_words(
    headers: tuple[tuple[str, str], ...], body: bytes, words: str
) -> None:
    refusal = UpstreamRefused(B, Frame(Command.ERROR, headers, body))
    exc = ReconnectExhausted([], 1, 0.25, refusal, refused=True)
    assert str(exc) == (
        "gave up after 0 attempt(s) in 1 round(s) over 0.2 s: every broker refused the "
        f"CONNECT: {B.label}: {words}"
    )


async def test_activemqs_client_id_still_in_use_is_not_a_lasting_refusal(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A reattach to the only broker right after the sidecar closed its leg: ActiveMQ still
    holds the ``client-id`` (it drops closed connections asynchronously) and refuses once.
    Not the end, no cool-down: the next round gets in."""
    in_use = Frame(
        Command.ERROR,
        (("message", "Broker: amq - Client: X already connected from tcp://127.0.0.1:4"),),
        b"javax.jms.InvalidClientIDException: Broker: amq - Client: X already connected\n\tat",
    )
    board = ReconnectBoard()

    class InUseOnce(Script):
        async def __call__(self, broker: Broker) -> Upstream:
            if not self.calls:
                self.calls.append((trio.current_time(), broker.label))
                raise UpstreamRefused(broker, in_use)
            return await super().__call__(broker)

    script = InUseOnce({A: ["up"]})
    _, index, attempts = await walk(script, brokers=(A,), board=board)
    assert script.times() == pytest.approx([0.1, 0.3])  # the next round, as for a down one
    assert index == 0
    assert [a.outcome for a in attempts] == ["refused", "connected"]
    assert board.refusals.get((0, b"app")) is None


async def test_a_down_broker_coming_back_refusing_makes_the_round_of_refusals(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A (lost) is down for three rounds, B refuses: the session goes on (A may come back),
    B's cool-down ending before each round (it grows with the backoff); A comes back
    refusing: every broker has said no, so that round is the last."""
    script = Script({A: ["down", "down", "down", "refused"], B: ["refused"] * 9})
    skipped: list[str] = []
    with pytest.raises(ReconnectExhausted) as info:
        await walk(script, skipped=skipped)
    # Rounds at 0.1, 0.3, 0.7, 1.5 s. B refused at 0.1 (cool-down 0.1 s), again at 0.3
    # (0.2 s: until 0.5), again at 0.7 (0.4 s: until 1.1), again at 1.5.
    assert script.labels() == [A.label, B.label] * 4
    assert script.times() == pytest.approx([0.1, 0.1, 0.3, 0.3, 0.7, 0.7, 1.5, 1.5])
    assert skipped == []
    assert info.value.refused
    assert info.value.rounds == 4


async def test_a_refusing_broker_is_never_skipped_for_good(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Some refuse, the others are down: not the end (the down one may come back). B's
    cool-down grows with the rounds' backoff, so a session alone tries B every round; when
    B's credentials are fixed it accepts, and its refusals are forgotten."""
    board = ReconnectBoard()
    script = Script({B: ["refused", "refused", "refused", "up"]})
    _, index, attempts = await walk(script, board=board)
    assert index == 1
    assert [t for t, label in script.calls if label == B.label] == pytest.approx(
        [0.1, 0.3, 0.7, 1.5]
    )
    outcomes = [a.outcome for a in attempts]
    assert outcomes == ["unreachable", "refused"] * 3 + ["unreachable", "connected"]
    assert board.refusals.get((1, b"app")) is None


class Slow(Script):
    """A Script whose attempts at some brokers take ``slow[broker]`` seconds."""

    def __init__(self, slow: dict[Broker, float], **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.slow = slow
        self.started: list[str] = []

    async def __call__(self, broker: Broker) -> Upstream:
        self.started.append(broker.label)
        await trio.sleep(self.slow.get(broker, 0.0))
        return await super().__call__(broker)


async def test_sessions_sharing_a_board_skip_a_broker_another_found_refusing(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    """Two sessions of one sidecar fail over from A; B refuses, C accepts. The first one
    tries B (refused at 0.1 s: cool-down until 0.2 s); the second, 50 ms later, skips B and
    goes on to C: B got one CONNECT, not two."""
    board = ReconnectBoard()
    script = Script({B: ["refused"], C: ["up"] * 2})
    skipped: list[str] = []
    results: list[int] = []

    async def session(delay: float) -> None:
        await trio.sleep(delay)
        _, index, _ = await walk(script, brokers=(A, B, C), board=board, skipped=skipped)
        results.append(index)

    async with trio.open_nursery() as sessions:
        sessions.start_soon(session, 0.0)
        sessions.start_soon(session, 0.05)
    assert results == [2, 2]
    assert script.labels() == [A.label, B.label, C.label, A.label, C.label]
    assert skipped == [B.label]


async def test_a_session_with_other_credentials_is_not_affected(
    autojump_clock: trio.testing.MockClock,
) -> None:
    board = ReconnectBoard()
    refused = Script({B: ["refused"], C: ["up"]})
    await walk(refused, brokers=(A, B, C), board=board, identity=b"app")
    other = Script({B: ["up"]})
    skipped: list[str] = []
    _, index, _ = await walk(
        other, brokers=(A, B, C), board=board, identity=b"other", skipped=skipped
    )
    assert index == 1
    assert skipped == []


async def test_a_first_connection_while_every_refusal_stands_gets_the_brokers_error_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Apps reconnecting to a sidecar whose brokers refused them a moment ago: their first
    connections end at once with the broker's refusal, without a CONNECT to any broker."""
    board = ReconnectBoard()
    latest = UpstreamRefused(B, Frame(Command.ERROR, (("message", "still no"),)))
    board.refusals.refused((0, b"app"), UpstreamRefused(A, REFUSAL), 0.0, GROWING)
    board.refusals.refused((1, b"app"), latest, 0.0, GROWING)
    script = Script(default="up")
    skipped: list[str] = []
    with pytest.raises(ReconnectExhausted) as info:
        await walk(script, board=board, current=None, skipped=skipped)
    exc = info.value
    assert script.calls == []
    assert skipped == [A.label, B.label]
    assert (exc.refused, exc.attempts, exc.rounds, exc.elapsed) == (True, (), 1, 0.0)
    assert exc.last is latest


async def test_after_the_cooldown_one_session_tries_while_the_others_skip(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    """B's cool-down is over; the session that tries it again takes 2 s to get an answer
    (a slow broker): meanwhile another session skips B (one CONNECT at a time to a broker
    known to refuse). The slow one is cancelled (its session ended): B is free to try again."""
    board = ReconnectBoard()
    board.refusals.refused((1, b"app"), UpstreamRefused(B, REFUSAL), -1.0, GROWING)
    slow = Slow({B: 2.0}, outcomes={B: ["up"]})
    first: trio.CancelScope = await nursery.start(_walk_in, slow, board)
    await wait_until(lambda: slow.started == [A.label, B.label])  # A down, B under way
    skipped: list[str] = []
    with pytest.raises(ReconnectExhausted) as info:
        await walk(
            Script(),
            ReconnectPolicy(reconnect_attempts=1, jitter=0.0),
            board=board,
            skipped=skipped,
        )
    assert skipped == [B.label]
    assert not info.value.refused  # A was down: only B's refusal stood
    first.cancel()
    await trio.testing.wait_all_tasks_blocked()
    again = Script({B: ["up"]})
    _, index, _ = await walk(again, board=board)
    assert index == 1
    assert again.labels() == [A.label, B.label]


async def _walk_in(
    script: Script,
    board: ReconnectBoard,
    *,
    task_status: trio.TaskStatus[trio.CancelScope] = trio.TASK_STATUS_IGNORED,
) -> None:
    with trio.CancelScope() as scope:
        task_status.started(scope)
        await walk(script, board=board)


# -- sessions on scripted brokers --------------------------------------------------------------

WORDS = "User name [app] or password is invalid."
#: What the sidecar's own reason shows of them: the app's login redacted (no credential in
#: events, logs or /status).
WORDS_SHOWN = "User name [***] or password is invalid."


async def on_primary(
    nursery: trio.Nursery, network: Network, board: ReconnectBoard, session_id: str
) -> Running:
    """A session of ``board`` whose app (login app) is CONNECTED, subscribed to events."""
    brokers = list(network.brokers.values())
    config = make_config(*brokers, reconnect_attempts=-1, reconnect_period=300_000)
    running = await start_session(nursery, network, config, session_id=session_id, reconnects=board)
    answer = await running.app.connect(login="app", passcode="pw")
    assert answer.command is Command.CONNECTED
    await running.app.subscribe_events()
    return running


async def lose(primary: ScriptedBroker, n: int) -> None:
    """The primary's ``n``-th link breaks (a reset)."""
    await primary.links[n - 1].drop("reset")


async def two_on_primary(
    nursery: trio.Nursery, network: Network
) -> tuple[ScriptedBroker, ScriptedBroker, list[Running]]:
    """A primary, a backup that refuses the apps' login, two sessions of one board on the
    primary."""
    primary = network.add("primary", 61001)
    backup = network.add("backup", 61002)
    backup.refuse = WORDS
    board = ReconnectBoard()
    sessions = [await on_primary(nursery, network, board, f"s{n}") for n in (1, 2)]
    return primary, backup, sessions


async def lose_both(primary: ScriptedBroker) -> float:
    """Both sessions' legs to the primary break at once; returns when."""
    lost = trio.current_time()
    await lose(primary, 1)
    await lose(primary, 2)
    return lost


async def test_every_broker_refusing_after_a_failover_tells_the_apps_within_the_round(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """Two sessions on the primary; their legs are cut and the primary now refuses their
    credentials (a restart with rotated passwords); the backup refuses them too. Each app
    gets a DISCONNECT event and an ERROR naming the broker's words right after its first
    round (100 ms after the loss), not after reconnect_period (300 s)."""
    primary, backup, sessions = await two_on_primary(nursery, network)
    primary.refuse = WORDS
    lost = await lose_both(primary)
    for running in sessions:
        await told(running, at=lost + 0.1)
    assert primary.connects == 2 + 2  # the first connections, then one round each
    assert backup.connects <= 2  # the two rounds ran at the same instant


async def test_a_refusing_backup_keeps_sessions_waiting_for_the_down_primary_until_it_refuses(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """The primary dies, the backup refuses: some refused, the other is down, so the
    sessions go on (rounds at 0.1, 0.3, 0.7 s after the loss), trying the backup again as its
    cool-down ends (0.1 s, then 0.2 s), one session at a time. The primary comes back at
    0.5 s refusing them: at 0.7 s every broker has said no, and both apps are told."""
    primary, backup, sessions = await two_on_primary(nursery, network)
    primary.reachable = False
    lost = await lose_both(primary)
    await trio.sleep(0.5)
    assert not any(running.app.errors() for running in sessions)
    primary.refuse = WORDS
    primary.reachable = True
    for running in sessions:
        await told(running, at=lost + 0.7)
    # 0.1 s: both try (nobody knew yet); 0.3 s and 0.7 s: one tries, the other skips.
    assert backup.connects == 4
    skips = [
        running.session.core.metrics.registry.get_sample_value(
            "mq_sidecar_upstream_refusal_skips_total", {"broker": backup.label}
        )
        for running in sessions
    ]
    assert sum(s or 0.0 for s in skips) == 2.0


async def told(running: Running, *, at: float) -> None:
    """The app got, at ``at``, a DISCONNECT event and then an ERROR with the broker's words,
    and its connection was closed."""
    app = running.app
    error = await app.wait_error()
    assert app.arrival(lambda f: f.command is Command.ERROR) == pytest.approx(at)
    body = error.body.decode()
    assert "every broker refused the CONNECT" in body
    assert WORDS_SHOWN in body
    (disconnect,) = app.events("DISCONNECT")
    assert WORDS_SHOWN in disconnect["reason"]
    assert app.index(lambda f: f.get("event") == "DISCONNECT") < app.index(
        lambda f: f.command is Command.ERROR
    )
    await app.wait_closed()


async def test_a_refusing_backup_is_skipped_by_the_next_session_on_the_way_to_another(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """Three brokers; the second refuses. The first session to fail over tries it (refused,
    cool-down 100 ms) and goes on to the third; the second session, 50 ms behind, does not
    try it at all: one CONNECT to the refusing broker, one skip counted."""
    primary = network.add("primary", 61001)
    refusing = network.add("refusing", 61002)
    third = network.add("third", 61003)
    refusing.refuse = WORDS
    board = ReconnectBoard()
    first = await on_primary(nursery, network, board, "s1")
    second = await on_primary(nursery, network, board, "s2")
    assert refusing.connects == 0  # the primary took both: nothing tried beyond it
    primary.reachable = False
    await lose(primary, 1)
    await trio.sleep(0.05)
    await lose(primary, 2)
    for running in (first, second):
        failover = await running.app.wait_event("FAILOVER")
        assert failover["to_broker"] == third.label
    assert refusing.connects == 1
    registry = second.session.core.metrics.registry
    sample = "mq_sidecar_upstream_refusal_skips_total"
    assert registry.get_sample_value(sample, {"broker": refusing.label}) == 1.0
    first_registry = first.session.core.metrics.registry
    assert not first_registry.get_sample_value(sample, {"broker": refusing.label})
    assert len(third.live_links()) == 2


def test_the_login_a_broker_quotes_in_its_refusal_is_redacted_in_the_reason() -> None:
    """The reason of a refusal goes to logs, events and /status, where no credential may
    appear: the CONNECT's login is shown as ``***`` wherever the broker quoted it, as a whole
    word only (the app's ERROR is the broker's own frame, untouched)."""
    broker = Broker("127.0.0.1", 61613)
    amq = Frame(
        Command.ERROR,
        (("message", "User name [app7] or password is invalid."),),
        b"java.lang.SecurityException: User name [app7] or password is invalid.\n\tat ...",
    )
    refused = UpstreamRefused(broker, amq, login="app7")
    assert refused.reason == "CONNECT refused: User name [***] or password is invalid."
    assert refused.error is amq
    rabbit = Frame(
        Command.ERROR,
        (("message", "Bad CONNECT"),),
        b"Access refused for user 'app7' (app7x keeps its name)\n",
    )
    exhausted = ReconnectExhausted([], 1, 0.1, UpstreamRefused(broker, rabbit, login="app7"))
    assert "Access refused for user '***' (app7x keeps its name)" in str(exhausted)
    assert "'app7'" not in str(exhausted)
