"""connect_by_policy: the waiting loop over the broker list, on trio's autojump clock.

``connect_one`` is a scripted coroutine (no sockets, no broker): it raises ConnectFailed or
UpstreamRefused, or returns a stand-in whose only use is to be handed back. Delays are exact:
the expected ones come from the same policy and a second, identically seeded Random.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import cast

import pytest
import trio
import trio.testing

from config import Broker
from protocol import Command, Frame
from proxy.legs.broker import ConnectFailed, Upstream, UpstreamRefused
from proxy.reconnect.policy import ReconnectPolicy
from proxy.reconnect.walk import Attempt, ReconnectExhausted, connect_by_policy

A = Broker("127.0.0.1", 61001)
B = Broker("127.0.0.1", 61002)
C = Broker("127.0.0.1", 61003)

REFUSAL = Frame(Command.ERROR, (("message", "bad credentials"),))
SERVER = "ActiveMQ/6.1.0"


@dataclass
class StandIn:
    """What connect_one returns: connect_by_policy only reads ``connected``."""

    broker: Broker
    connected: Frame


class Script:
    """A scripted ``connect_one``: each broker's attempts take the outcomes listed for it in
    turn ("up", "down", "timeout", "refused"), then ``default``. Records every call."""

    def __init__(
        self, outcomes: Mapping[Broker, Sequence[str]] | None = None, *, default: str = "down"
    ) -> None:
        self.outcomes = {b: list(o) for b, o in (outcomes or {}).items()}
        self.default = default
        self.start = trio.current_time()
        self.calls: list[tuple[float, str]] = []

    async def __call__(self, broker: Broker) -> Upstream:
        self.calls.append((trio.current_time() - self.start, broker.label))
        await trio.lowlevel.checkpoint()
        queue = self.outcomes.get(broker, [])
        outcome = queue.pop(0) if queue else self.default
        if outcome == "down":
            raise ConnectFailed(broker, "[Errno 111] Connection refused")
        if outcome == "timeout":
            raise ConnectFailed(broker, "no CONNECTED within 5 s")
        if outcome == "refused":
            raise UpstreamRefused(broker, REFUSAL)
        assert outcome == "up", outcome
        connected = Frame(Command.CONNECTED, (("version", "1.2"), ("server", SERVER)))
        return cast("Upstream", StandIn(broker, connected))

    @property
    def elapsed(self) -> float:
        return trio.current_time() - self.start

    def times(self) -> list[float]:
        return [t for t, _ in self.calls]

    def labels(self) -> list[str]:
        return [label for _, label in self.calls]


def constant(
    interval: float,
    *,
    reconnect_attempts: int = -1,
    initial_connect_attempts: int = -1,
    reconnect_period: float | None = None,
) -> ReconnectPolicy:
    """No growth, no jitter: every backoff is ``interval``."""
    return ReconnectPolicy(
        retry_interval=interval,
        retry_interval_multiplier=1.0,
        max_retry_interval=interval,
        jitter=0.0,
        reconnect_attempts=reconnect_attempts,
        initial_connect_attempts=initial_connect_attempts,
        reconnect_period=reconnect_period,
    )


def round_starts(policy: ReconnectPolicy, seed: int, rounds: int, *, initial: bool) -> list[float]:
    """When each round starts, drawn from a twin of the rng connect_by_policy gets: before
    reconnect round n, delay(n); an initial connection's first round starts at once and its
    round n waits delay(n - 1), so its second round comes after retry_interval (Artemis)."""
    twin = random.Random(seed)
    starts: list[float] = []
    now = 0.0
    for n in range(1, rounds + 1):
        backoff_round = n - 1 if initial else n
        if backoff_round >= 1:
            now += policy.delay(backoff_round, twin)
        starts.append(now)
    return starts


async def run(
    script: Script,
    policy: ReconnectPolicy,
    brokers: Sequence[Broker] = (A, B),
    *,
    seed: int = 0,
    current: int | None = None,
    initial: bool = True,
    seen: list[Attempt] | None = None,
) -> tuple[Upstream, int, list[Attempt]]:
    return await connect_by_policy(
        brokers,
        policy,
        random.Random(seed),
        script,
        current=current,
        initial=initial,
        on_attempt=None if seen is None else seen.append,
    )


def connected(broker: Broker) -> Attempt:
    return Attempt(broker.label, "connected", SERVER)


def down(broker: Broker) -> Attempt:
    return Attempt(broker.label, "unreachable", "[Errno 111] Connection refused")


# -- delays -----------------------------------------------------------------------------------


async def test_a_first_connection_tries_at_once(autojump_clock: trio.testing.MockClock) -> None:
    script = Script({A: ["up"]})
    upstream, index, attempts = await run(script, ReconnectPolicy(), initial=True)
    assert cast("StandIn", upstream).broker == A
    assert index == 0
    assert attempts == [connected(A)]
    assert script.calls == [(0.0, A.label)]
    assert script.elapsed == 0.0


async def test_a_reconnect_waits_before_its_first_round(
    autojump_clock: trio.testing.MockClock,
) -> None:
    policy = ReconnectPolicy()
    script = Script({A: ["up"]})
    await run(script, policy, seed=9, current=0, initial=False)
    (delay,) = round_starts(policy, 9, 1, initial=False)
    assert delay > 0.0
    assert script.calls == [(delay, A.label)]
    assert script.elapsed == delay


@pytest.mark.parametrize("initial", [True, False])
@pytest.mark.parametrize("seed", [0, 42, 2024])
async def test_sleeps_are_exactly_the_policys_delays(
    autojump_clock: trio.testing.MockClock, initial: bool, seed: int
) -> None:
    policy = ReconnectPolicy(
        retry_interval=0.1,
        retry_interval_multiplier=2.0,
        jitter=1.0,
        initial_connect_attempts=-1,
        reconnect_period=None,
    )
    script = Script({A: ["down"] * 4 + ["up"]})
    _, index, attempts = await run(
        script, policy, seed=seed, current=None if initial else 0, initial=initial
    )
    starts = round_starts(policy, seed, 5, initial=initial)
    assert index == 0
    assert len(attempts) == 9  # 4 rounds of A, B and A again
    assert script.labels() == [A.label, B.label] * 4 + [A.label]
    expected = [t for t in starts[:4] for _ in (A, B)] + [starts[4]]
    assert script.times() == pytest.approx(expected, abs=1e-9)
    assert script.elapsed == pytest.approx(starts[4], abs=1e-9)


async def test_backoff_grows_between_rounds_without_jitter(
    autojump_clock: trio.testing.MockClock,
) -> None:
    policy = ReconnectPolicy(
        retry_interval=0.5, retry_interval_multiplier=2.0, max_retry_interval=3.0, jitter=0.0
    )
    script = Script({A: ["down"] * 5 + ["up"]})
    await run(script, policy, [A], current=0, initial=False)
    # 0.5, then 1, 2, 3 (capped), 3, 3
    assert script.times() == pytest.approx([0.5, 1.5, 3.5, 6.5, 9.5, 12.5])


# -- attempts, order, refusals ----------------------------------------------------------------


async def test_attempts_are_recorded_and_reported_as_they_happen(
    autojump_clock: trio.testing.MockClock,
) -> None:
    script = Script({A: ["refused", "up"], B: ["timeout"], C: ["down"]})
    seen: list[Attempt] = []
    _, index, attempts = await run(script, constant(1.0), [A, B, C], seen=seen)
    assert index == 0
    assert attempts == [
        Attempt(A.label, "refused", "CONNECT refused: bad credentials"),
        Attempt(B.label, "timeout", "no CONNECTED within 5 s"),
        down(C),
        connected(A),
    ]
    assert seen == attempts


async def test_the_connected_attempt_reports_the_server_header(
    autojump_clock: trio.testing.MockClock,
) -> None:
    class Anonymous(Script):
        async def __call__(self, broker: Broker) -> Upstream:
            return cast("Upstream", StandIn(broker, Frame(Command.CONNECTED)))

    _, _, attempts = await run(Anonymous(), constant(1.0))
    assert attempts == [Attempt(A.label, "connected", "")]


@pytest.mark.parametrize(
    ("current", "order"),
    [(None, [A, B, C]), (0, [A, B, C]), (1, [B, C, A]), (2, [C, A, B])],
)
async def test_the_current_broker_is_tried_first_then_round_robin(
    autojump_clock: trio.testing.MockClock, current: int | None, order: list[Broker]
) -> None:
    script = Script()
    with pytest.raises(ReconnectExhausted):
        await run(
            script,
            constant(1.0, reconnect_attempts=2, initial_connect_attempts=2),
            [A, B, C],
            current=current,
            initial=current is None,
        )
    assert script.labels() == [b.label for b in order] * 2


async def test_a_later_broker_is_returned_with_its_index(
    autojump_clock: trio.testing.MockClock,
) -> None:
    script = Script({C: ["up"]})
    upstream, index, attempts = await run(
        script, constant(1.0), [A, B, C], current=1, initial=False
    )
    assert cast("StandIn", upstream).broker == C
    assert index == 2
    assert attempts == [down(B), connected(C)]
    assert script.elapsed == 1.0


async def test_randomize_keeps_the_current_broker_first(
    autojump_clock: trio.testing.MockClock,
) -> None:
    policy = ReconnectPolicy(randomize=True, reconnect_attempts=20, reconnect_period=None)
    brokers = [A, B, C, Broker("127.0.0.1", 61004)]
    script = Script()
    with pytest.raises(ReconnectExhausted):
        await run(script, policy, brokers, seed=5, current=2, initial=False)
    labels = script.labels()
    rounds = [labels[i : i + 4] for i in range(0, len(labels), 4)]
    assert len(rounds) == 20
    assert all(r[0] == C.label for r in rounds)
    assert all(sorted(r) == sorted(b.label for b in brokers) for r in rounds)
    assert len({tuple(r) for r in rounds}) > 1


async def test_a_refusing_broker_is_skipped_within_the_round(
    autojump_clock: trio.testing.MockClock,
) -> None:
    script = Script({A: ["refused"], B: ["up"]})
    _, index, attempts = await run(script, constant(1.0), current=0, initial=False)
    assert index == 1
    assert [a.outcome for a in attempts] == ["refused", "connected"]
    assert script.times() == [1.0, 1.0]  # B right after A's refusal, no extra wait


@pytest.mark.parametrize("initial", [True, False])
async def test_a_round_of_refusals_ends_the_connection_at_once(
    autojump_clock: trio.testing.MockClock, initial: bool
) -> None:
    """Every broker says no: no second round, whatever attempts and periods are left
    (the loop cannot spin on refusals either: there is no next round)."""
    script = Script(default="refused")
    with pytest.raises(ReconnectExhausted) as info:
        await run(script, constant(0.5), current=None if initial else 0, initial=initial)
    first = 0.0 if initial else 0.5
    assert script.times() == [first, first]
    assert info.value.refused
    assert info.value.rounds == 1
    assert script.elapsed == first  # at once after the round


# -- giving up --------------------------------------------------------------------------------


async def test_reconnect_attempts_zero_gives_up_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    script = Script({A: ["up"]})
    with pytest.raises(ReconnectExhausted) as info:
        await run(script, ReconnectPolicy(reconnect_attempts=0), current=0, initial=False)
    exc = info.value
    assert (exc.attempts, exc.rounds, exc.elapsed, exc.last) == ((), 0, 0.0, None)
    assert str(exc) == "gave up after 0 attempt(s) in 0 round(s) over 0.0 s"
    assert script.calls == []
    assert script.elapsed == 0.0


@pytest.mark.parametrize("initial", [True, False])
async def test_exhausted_after_the_allowed_rounds(
    autojump_clock: trio.testing.MockClock, initial: bool
) -> None:
    policy = ReconnectPolicy(
        initial_connect_attempts=3, reconnect_attempts=3, reconnect_period=None
    )
    script = Script()
    seen: list[Attempt] = []
    with pytest.raises(ReconnectExhausted) as info:
        await run(
            script, policy, seed=7, current=None if initial else 0, initial=initial, seen=seen
        )
    exc = info.value
    starts = round_starts(policy, 7, 3, initial=initial)
    assert exc.rounds == 3
    assert exc.attempts == (down(A), down(B)) * 3
    assert tuple(seen) == exc.attempts
    assert exc.elapsed == pytest.approx(starts[-1], abs=1e-9)
    assert script.elapsed == pytest.approx(starts[-1], abs=1e-9)  # no sleep after the last round
    assert isinstance(exc.last, ConnectFailed)
    assert exc.last.broker == B  # the last failure
    assert str(exc).startswith("gave up after 6 attempt(s) in 3 round(s) over ")
    assert str(exc).endswith(f": {B.label}: [Errno 111] Connection refused")


async def test_a_refusal_is_preferred_as_the_last_failure(
    autojump_clock: trio.testing.MockClock,
) -> None:
    script = Script({A: ["refused", "down"], B: ["down", "timeout"]})
    with pytest.raises(ReconnectExhausted) as info:
        await run(script, constant(1.0, initial_connect_attempts=2))
    exc = info.value
    assert [a.outcome for a in exc.attempts] == ["refused", "unreachable", "unreachable", "timeout"]
    assert isinstance(exc.last, UpstreamRefused)
    assert exc.last.broker == A
    assert exc.last.error == REFUSAL
    assert str(exc).endswith(f": {A.label}: CONNECT refused: bad credentials")


async def test_reconnect_period_ends_an_unlimited_reconnect(
    autojump_clock: trio.testing.MockClock,
) -> None:
    script = Script()
    with pytest.raises(ReconnectExhausted) as info:
        await run(script, constant(0.3, reconnect_period=1.0), current=0, initial=False)
    exc = info.value
    assert exc.elapsed >= 1.0
    assert exc.elapsed < 1.0 + 0.3 + 1e-9  # at most one backoff late
    assert exc.rounds in (3, 4)
    assert script.times()[:6] == pytest.approx([0.3, 0.3, 0.6, 0.6, 0.9, 0.9])


async def test_no_attempt_starts_after_the_reconnect_period(
    autojump_clock: trio.testing.MockClock,
) -> None:
    script = Script()
    with pytest.raises(ReconnectExhausted):
        await run(script, constant(0.3, reconnect_period=1.0), current=0, initial=False)
    assert max(script.times()) <= 1.0


async def test_reconnect_period_bounds_a_first_connection_too(
    autojump_clock: trio.testing.MockClock,
) -> None:
    script = Script()
    with pytest.raises(ReconnectExhausted) as info:
        await run(script, constant(0.5, reconnect_period=1.0), initial=True)
    assert info.value.elapsed >= 1.0
    assert script.times()[:2] == [0.0, 0.0]


async def test_other_errors_propagate_without_retry(
    autojump_clock: trio.testing.MockClock,
) -> None:
    calls: list[Broker] = []

    async def broken(broker: Broker) -> Upstream:
        calls.append(broker)
        raise RuntimeError("a bug, not an outage")

    with pytest.raises(RuntimeError, match="a bug"):
        await connect_by_policy(
            [A, B], ReconnectPolicy(), random.Random(0), broken, current=None, initial=True
        )
    assert calls == [A]
