"""Walking the broker list under the reconnect policy: the only place that waits for backoff.

:func:`connect_by_policy` makes rounds over the brokers in the order the
:class:`~proxy.reconnect.policy.ReconnectPolicy` gives (current broker first: reattach; then the
others: failover), sleeping the policy's jittered delay before each round but the first of a
session's initial connection, until one broker accepts the session or the policy is exhausted. A
first connection goes on past its attempts until ``initial_connect_period`` has passed.

A broker that refuses the login (answers CONNECT with an ERROR) fails that attempt and the
round moves on (another broker may hold other users); it is then skipped for a cool-down by every
session sending it the same CONNECT (:class:`proxy.reconnect.tally.Refusals`), its refusal standing
as its answer. A round in which every broker refused, now or within its cool-down, ends the
connection at once with the broker's reason; a round in which some broker was only unreachable
goes on by the policy, the refusing ones tried again as each cool-down ends (docs/behaviour.md,
"Broker list and reconnect policy").

An evacuated broker (:mod:`proxy.reconnect.evacuations`) is out of the rotation: the walk
skips it, unless every broker of the list is evacuated (then it walks them all: a broker that
answers beats none). A broker that left the list (a :class:`~proxy.reconnect.brokers.BrokerTable`
slot out of force) is never walked.

What the sessions of one sidecar share while they walk (their reconnects in progress, the
brokers' refusals, the evacuations) is the :class:`~proxy.reconnect.board.ReconnectBoard`.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import trio

from config import Broker
from protocol import Frame
from proxy.legs.broker import (
    ConnectFailed,
    TlsConnectFailed,
    Upstream,
    UpstreamRefused,
    UpstreamUnavailable,
)
from proxy.reconnect.board import ReconnectBoard, RefusalKey, lasting_refusal
from proxy.reconnect.brokers import walk_order
from proxy.reconnect.policy import ReconnectPolicy
from proxy.reconnect.tally import Refusals

__all__ = ["Attempt", "ReconnectExhausted", "attempt_outcome", "connect_by_policy"]

log = logging.getLogger("mq_sidecar.failover")


@dataclass(frozen=True, slots=True)
class Attempt:
    """One connection attempt: broker label, outcome ("connected", "refused", "timeout",
    "tls_error", "unreachable": :class:`proxy.telemetry.vocabulary.ConnectOutcome`) and a one-line
    detail (never credentials)."""

    broker: str
    outcome: str
    detail: str


class ReconnectExhausted(Exception):
    """The policy gave up: ``attempts`` were made over ``rounds`` rounds in ``elapsed``
    seconds; ``last`` is the last failure (a refusal is preferred, it carries the broker's
    words). ``refused``: it gave up because every broker of the last round refused the
    CONNECT (now or within its cool-down), not because attempts or time ran out."""

    def __init__(
        self,
        attempts: Sequence[Attempt],
        rounds: int,
        elapsed: float,
        last: UpstreamUnavailable | None,
        *,
        refused: bool = False,
    ) -> None:
        detail = f": {last}" if last is not None else ""
        if isinstance(last, UpstreamRefused):
            more = last.redact(_more_words(last.error))
            detail += f" ({more})" if more else ""
        if refused:
            detail = f": every broker refused the CONNECT{detail}"
        super().__init__(
            f"gave up after {len(attempts)} attempt(s) in {rounds} round(s) over "
            f"{elapsed:.1f} s{detail}"
        )
        self.attempts = tuple(attempts)
        self.rounds = rounds
        self.elapsed = elapsed
        self.last = last
        self.refused = refused


def _more_words(error: Frame) -> str:
    """What a broker's refusal says beyond its ``message`` header: the first line of its body
    when that line is not in the message (RabbitMQ: ``Bad CONNECT`` and ``Access refused for
    user 'app'``; ActiveMQ's body is a stack trace under the message), at most 200
    characters; else ``""``."""
    message = error.get("message")
    if not message:  # the body is the reason already (UpstreamRefused)
        return ""
    line = error.body[:1024].decode("utf-8", "replace").strip().partition("\n")[0].strip()
    if not line or line in message or message in line:
        return ""
    return line[:200]


def attempt_outcome(exc: UpstreamUnavailable) -> str:
    """The :attr:`Attempt.outcome` of a failed attempt that raised ``exc``."""
    if isinstance(exc, UpstreamRefused):
        return "refused"
    if isinstance(exc, TlsConnectFailed):
        return "tls_error"
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
    initial_period: float | None = None,
    board: ReconnectBoard | None = None,
    identity: Callable[[Broker], bytes] | None = None,
    on_skip: Callable[[Broker, UpstreamRefused], None] | None = None,
    evacuations: ReconnectBoard | None = None,
) -> tuple[Upstream, int, list[Attempt]]:
    """Connect to a broker: returns ``(upstream, broker index, attempts)``.

    No round starts once the policy gives up (:meth:`ReconnectPolicy.give_up_at`): a delay
    that would end past that point is cut short and the policy gives up instead.

    Refusals: a broker that answers CONNECT with an ERROR is skipped, while its cool-down
    (:meth:`ReconnectPolicy.refusal_cooldown`) runs, by every connection that would send it
    the same CONNECT (the same ``identity``), its refusal counting as its answer (no
    attempt, ``on_skip``). After a round in which every broker refused, now or within its
    cool-down, the policy gives up at once (``ReconnectExhausted.refused``); a round in
    which any broker was unreachable goes on by the policy.

    With a ``board``, evacuated brokers are skipped (all are walked when all are), a
    reconnect is counted on it while it runs and every success is
    reported to it; a first connection (``initial``) consults it: while other sessions are
    reconnecting it first waits for their outcome (at most ``max_retry_interval``, the
    longest any of them waits between rounds, and never past the give-up point), and any of
    its backoff delays ends early when a session reaches a broker. The broker reached is
    then tried first.

    Args:
        brokers: the broker list: the sidecar's :class:`~proxy.reconnect.brokers.BrokerTable`
            (its brokers in force are walked, in list order), or a plain sequence.
        policy: delays, limits and order.
        rng: randomness for jitter and ``randomize`` (seeded in tests).
        connect_one: opens one upstream leg; raises :class:`UpstreamUnavailable` on failure.
        current: index of the broker of the lost leg (tried first), None for a first connect.
        initial: a session's first connection (``initial_connect_attempts``, no delay before
            the first round) rather than a reconnect (``reconnect_attempts``).
        on_attempt: called after every attempt (logs, metrics).
        initial_period: seconds a first connection goes on after its attempts are spent
            (``initial_connect_period``; None: the attempts alone).
        board: the sidecar's :class:`ReconnectBoard` (None: no sharing; refusals are then
            kept for this call only).
        identity: the CONNECT identity ``connect_one`` presents to a broker
            (:meth:`ReconnectBoard.identity` of its CONNECT frame); None: one identity for all.
        on_skip: called for every broker skipped because its refusal stands (metrics).
        evacuations: the board whose evacuated brokers are skipped, without the rest of the
            board's sharing (the outbox forwarder); default: ``board``.

    Raises:
        ReconnectExhausted: every broker refused, or the policy's attempts or period ran out.
    """
    walk = _Walk(
        brokers,
        policy,
        rng,
        connect_one,
        initial=initial,
        initial_period=initial_period,
        board=board,
        on_attempt=on_attempt,
        identity=identity,
        on_skip=on_skip,
        evacuations=evacuations if evacuations is not None else board,
    )
    if board is None:
        return await walk.run(current)
    if initial:
        result = await walk.run(current)
        board.up(result[1])
        return result
    with board.reconnect():
        result = await walk.run(current)
        board.up(result[1])
        return result


class _Walk:
    """One :func:`connect_by_policy` call: its rounds, attempts and failures so far."""

    def __init__(
        self,
        brokers: Sequence[Broker],
        policy: ReconnectPolicy,
        rng: random.Random,
        connect_one: Callable[[Broker], Awaitable[Upstream]],
        *,
        initial: bool,
        initial_period: float | None,
        board: ReconnectBoard | None,
        on_attempt: Callable[[Attempt], None] | None,
        identity: Callable[[Broker], bytes] | None,
        on_skip: Callable[[Broker, UpstreamRefused], None] | None,
        evacuations: ReconnectBoard | None,
    ) -> None:
        self.brokers = brokers
        self.policy = policy
        self.rng = rng
        self.connect_one = connect_one
        self.initial = initial
        self.initial_period = initial_period if initial else None
        self.board = board if initial else None  # only a first connection waits on it
        self.evacuations = evacuations
        self.refusals: Refusals[RefusalKey, UpstreamRefused] = (
            board.refusals if board is not None else Refusals()
        )
        self.identity = identity
        self.on_attempt = on_attempt
        self.on_skip = on_skip
        self.started = trio.current_time()
        self.attempts: list[Attempt] = []
        self.last_failure: UpstreamUnavailable | None = None
        self.last_refusal: UpstreamRefused | None = None  # preferred: the broker's words
        self.rounds = 0
        self.refused = False  # every broker of the last round refused (now or standing)

    def _left(self) -> float | None:
        """Seconds until the policy gives up (None: never)."""
        at = self.policy.give_up_at(
            self.rounds,
            initial=self.initial,
            initial_period=self.initial_period,
            refused=self.refused,
        )
        return None if at is None else max(0.0, self.started + at - trio.current_time())

    def _give_up_if_exhausted(self) -> None:
        if self._left() == 0.0:
            last = self.last_refusal or self.last_failure
            elapsed = trio.current_time() - self.started
            raise ReconnectExhausted(
                self.attempts, self.rounds, elapsed, last, refused=self.refused
            )

    async def _pause(self, seconds: float, *, until_idle: bool) -> int | None:
        """Wait ``seconds`` (never past the give-up point); with a board, return early with
        the index of a broker another session reached."""
        left = self._left()
        if left is not None:
            seconds = min(seconds, left)
        if self.board is None:
            await trio.sleep(seconds)
            return None
        return await self.board.wait_up(seconds, until_idle=until_idle)

    async def run(self, current: int | None) -> tuple[Upstream, int, list[Attempt]]:
        policy = self.policy
        first = current
        board = self.board
        if board is not None and board.reconnecting:
            # Other sessions are reconnecting to these brokers: wait for their outcome
            # instead of racing them; try first the broker one of them reached, if any.
            self._give_up_if_exhausted()
            first = await self._pause(policy.max_retry_interval, until_idle=True)
        while True:
            self._give_up_if_exhausted()
            # Before reconnect round k: delay(k). A first connection tries at once, then waits
            # delay(1) = retry_interval before its second round, delay(2) before its third...
            backoff_round = self.rounds if self.initial else self.rounds + 1
            if backoff_round >= 1:
                reached = await self._pause(policy.delay(backoff_round, self.rng), until_idle=False)
                if reached is not None:
                    first = reached
                self._give_up_if_exhausted()
            refused = True
            order = walk_order(self.brokers, policy, first, self.rng)
            for index in self._in_rotation(order):
                broker = self.brokers[index]
                key = (index, b"" if self.identity is None else self.identity(broker))
                standing = self.refusals.claim(key, trio.current_time())
                if standing is not None:  # refused lately: that is its answer for now
                    self.last_refusal = standing
                    if self.on_skip is not None:
                        self.on_skip(broker, standing)
                    continue
                try:
                    upstream = await self.connect_one(broker)
                except UpstreamUnavailable as exc:
                    refused = refused and lasting_refusal(exc)
                    self._failed(key, broker, exc)
                    continue
                except BaseException:  # cancelled (or a bug): the others may try it again
                    self.refusals.settled(key)
                    raise
                self.refusals.accepted(key)
                server = upstream.connected.get("server") or ""
                self._record(Attempt(broker.label, "connected", server))
                return upstream, index, self.attempts
            self.rounds += 1
            self.refused = refused
            first = current

    def _in_rotation(self, order: list[int]) -> list[int]:
        """``order`` without the evacuated brokers; all of it when every one is evacuated."""
        board = self.evacuations
        if board is None:
            return order
        kept = [i for i in order if board.evacuated(self.brokers[i].label) is None]
        return kept or order

    def _failed(self, key: RefusalKey, broker: Broker, exc: UpstreamUnavailable) -> None:
        """Record a failed attempt; a lasting refusal starts (or joins) the broker's
        cool-down."""
        self._record(Attempt(broker.label, attempt_outcome(exc), exc.reason))
        self.last_failure = exc
        if not isinstance(exc, UpstreamRefused) or not lasting_refusal(exc):
            self.refusals.settled(key)
            return
        self.last_refusal = exc
        cooldown = self.refusals.refused(key, exc, trio.current_time(), self.policy)
        entry = self.refusals.get(key)
        if cooldown is not None and entry is not None and entry.count == 1:
            # Once per broker and CONNECT until it accepts one (attempts are counted in
            # metrics). Not the broker's words: ActiveMQ's name the login (docs/configuration.md,
            # "Credentials"); they reach the app, login redacted, in its DISCONNECT event.
            log.warning(
                "broker %s refused a CONNECT; sessions sending the same CONNECT skip it for "
                "%g s, longer while it keeps refusing",
                broker.label,
                cooldown,
            )

    def _record(self, attempt: Attempt) -> None:
        self.attempts.append(attempt)
        if self.on_attempt is not None:
            self.on_attempt(attempt)
