"""Walking the broker list under the reconnect policy: the only place that waits for backoff.

:func:`connect_by_policy` makes rounds over the brokers in the order the
:class:`~proxy.policy.ReconnectPolicy` gives (current broker first: reattach; then the others:
failover), sleeping the policy's jittered delay before each round but the first of a session's
initial connection, until one broker accepts the session or the policy is exhausted. A broker
that refuses the login is reported and skipped for that round; the backoff between rounds keeps
a refusing broker list from spinning (docs/behaviour.md, "Broker list and reconnect policy").
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import trio

from config import Broker
from proxy.policy import ReconnectPolicy
from proxy.upstream import ConnectFailed, Upstream, UpstreamRefused, UpstreamUnavailable

__all__ = ["Attempt", "ReconnectExhausted", "connect_by_policy"]


@dataclass(frozen=True, slots=True)
class Attempt:
    """One connection attempt: broker label, outcome ("connected", "refused", "timeout",
    "unreachable") and a one-line detail (never credentials)."""

    broker: str
    outcome: str
    detail: str


class ReconnectExhausted(Exception):
    """The policy gave up: ``attempts`` were made over ``rounds`` rounds in ``elapsed``
    seconds; ``last`` is the last failure (a refusal is preferred, it carries the broker's
    words)."""

    def __init__(
        self,
        attempts: Sequence[Attempt],
        rounds: int,
        elapsed: float,
        last: UpstreamUnavailable | None,
    ) -> None:
        detail = f": {last}" if last is not None else ""
        super().__init__(
            f"gave up after {len(attempts)} attempt(s) in {rounds} round(s) over "
            f"{elapsed:.1f} s{detail}"
        )
        self.attempts = tuple(attempts)
        self.rounds = rounds
        self.elapsed = elapsed
        self.last = last


def _outcome(exc: UpstreamUnavailable) -> str:
    if isinstance(exc, UpstreamRefused):
        return "refused"
    if isinstance(exc, ConnectFailed) and exc.reason.startswith("no CONNECTED within"):
        return "timeout"
    return "unreachable"


async def connect_by_policy(
    brokers: Sequence[Broker],
    policy: ReconnectPolicy,
    rng: random.Random,
    connect_one: Callable[[Broker], Awaitable[Upstream]],
    *,
    current: int | None,
    initial: bool,
    on_attempt: Callable[[Attempt], None] | None = None,
) -> tuple[Upstream, int, list[Attempt]]:
    """Connect to a broker: returns ``(upstream, broker index, attempts)``.

    No round starts after ``reconnect_period`` has passed: a delay that would end past it is
    cut short and the policy gives up instead.

    Args:
        brokers: the configured broker list.
        policy: delays, limits and order.
        rng: randomness for jitter and ``randomize`` (seeded in tests).
        connect_one: opens one upstream leg; raises :class:`UpstreamUnavailable` on failure.
        current: index of the broker of the lost leg (tried first), None for a first connect.
        initial: a session's first connection (``initial_connect_attempts``, no delay before
            the first round) rather than a reconnect (``reconnect_attempts``).
        on_attempt: called after every attempt (logs, metrics).

    Raises:
        ReconnectExhausted: the policy's attempts or period ran out.
    """
    started = trio.current_time()
    attempts: list[Attempt] = []
    failures: list[UpstreamUnavailable] = []
    rounds = 0

    def give_up_if_exhausted() -> None:
        elapsed = trio.current_time() - started
        if policy.exhausted(rounds, elapsed, initial=initial):
            refused = [f for f in failures if isinstance(f, UpstreamRefused)]
            last = refused[-1] if refused else (failures[-1] if failures else None)
            raise ReconnectExhausted(attempts, rounds, elapsed, last)

    while True:
        give_up_if_exhausted()
        # Before reconnect round k: delay(k). A first connection tries at once, then waits
        # delay(1) = retry_interval before its second round, delay(2) before its third...
        backoff_round = rounds if initial else rounds + 1
        if backoff_round >= 1:
            delay = policy.delay(backoff_round, rng)
            if policy.reconnect_period is not None:  # never sleep past the period
                delay = min(
                    delay, max(0.0, started + policy.reconnect_period - trio.current_time())
                )
            await trio.sleep(delay)
            give_up_if_exhausted()
        for index in policy.order(len(brokers), current, rng):
            broker = brokers[index]
            try:
                upstream = await connect_one(broker)
            except UpstreamUnavailable as exc:
                attempt = Attempt(broker.label, _outcome(exc), exc.reason)
                failures.append(exc)
                attempts.append(attempt)
                if on_attempt is not None:
                    on_attempt(attempt)
                continue
            attempt = Attempt(broker.label, "connected", upstream.connected.get("server") or "")
            attempts.append(attempt)
            if on_attempt is not None:
                on_attempt(attempt)
            return upstream, index, attempts
        rounds += 1
