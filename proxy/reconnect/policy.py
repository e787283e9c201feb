"""The reconnect policy: an immutable value with pure arithmetic (docs/architecture.md, "Pure
reconnect policy").

Terms follow Artemis (``retryInterval``, ``retryIntervalMultiplier``, ``maxRetryInterval``,
``reconnectAttempts``, ``initialConnectAttempts``; Artemis "Client Reconnection and Session
Reattachment") with ActiveMQ Classic's failover transport as the model for walking a broker
list: one *round* tries every broker once, the current one first (reattach), then the others
in list order (or shuffled, ``randomize``), and a backoff delay precedes every round.
``reconnect_attempts`` and ``initial_connect_attempts`` count rounds, as ActiveMQ's
``maxReconnectAttempts`` counts passes over its URI list; ``initial_connect_period`` makes a
first connection go on for a while after its attempts are spent (:meth:`give_up_at`). It is
an argument, not a field: a policy value built by hand keeps the attempts-only rule.

Nothing here sleeps or reads a clock: :mod:`proxy.reconnect.walk` owns the waiting, and tests pass a
seeded :class:`random.Random` to check exact delays.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from config import Config

__all__ = ["ReconnectPolicy"]


@dataclass(frozen=True, slots=True)
class ReconnectPolicy:
    """When and where to reconnect. Durations in seconds.

    Attributes:
        retry_interval: backoff before the first round (Artemis ``retryInterval``).
        retry_interval_multiplier: growth of the backoff per round (>= 1.0).
        max_retry_interval: cap of the backoff (Artemis ``maxRetryInterval``).
        reconnect_attempts: rounds after a loss before giving up; -1 unlimited, 0 none.
        initial_connect_attempts: rounds for a session's first connection; -1 unlimited.
        reconnect_period: give up after this long even with attempts left; None: no bound.
        jitter: fraction of each backoff that is random; 1.0 is "full jitter" (AWS
            Architecture Blog, "Exponential Backoff And Jitter"): a fleet of sidecars that
            lost the same broker does not come back in lockstep.
        randomize: walk the non-current brokers in random order (ActiveMQ ``randomize``).
        priority_backup: go back to the first broker when it is reachable again
            (ActiveMQ ``priorityBackup``).
    """

    retry_interval: float = 0.1
    retry_interval_multiplier: float = 2.0
    max_retry_interval: float = 5.0
    reconnect_attempts: int = -1
    initial_connect_attempts: int = 3
    reconnect_period: float | None = 300.0
    jitter: float = 1.0
    randomize: bool = False
    priority_backup: bool = False

    @classmethod
    def from_config(cls, config: Config) -> ReconnectPolicy:
        """The policy a :class:`config.Config` describes (its durations in seconds from
        :attr:`config.Config.durations`)."""
        seconds = config.durations
        return cls(
            retry_interval=seconds.retry_interval,
            retry_interval_multiplier=config.retry_interval_multiplier,
            max_retry_interval=seconds.max_retry_interval,
            reconnect_attempts=config.reconnect_attempts,
            initial_connect_attempts=config.initial_connect_attempts,
            reconnect_period=seconds.reconnect_period,
            jitter=config.jitter,
            randomize=config.randomize,
            priority_backup=config.priority_backup,
        )

    def backoff(self, round_number: int) -> float:
        """The un-jittered delay before round ``round_number`` (1-based), in seconds:
        ``min(retry_interval * multiplier ** (round - 1), max_retry_interval)``."""
        if round_number < 1:
            raise ValueError(f"round numbers start at 1, got {round_number}")
        exponent = round_number - 1
        ceiling = self.max_retry_interval
        if self.retry_interval >= ceiling:
            return ceiling
        # Compare in log space: multiplier ** exponent overflows a float long before a
        # reconnect loop with unlimited attempts gives up.
        if self.retry_interval_multiplier > 1.0 and exponent * math.log(
            self.retry_interval_multiplier
        ) >= math.log(ceiling / self.retry_interval):
            return ceiling
        return min(self.retry_interval * self.retry_interval_multiplier**exponent, ceiling)

    def delay(self, round_number: int, rng: random.Random) -> float:
        """The jittered delay before round ``round_number``, in seconds.

        ``backoff * (1 - jitter) + uniform(0, backoff * jitter)``: with ``jitter`` 1.0 a
        uniform draw from ``[0, backoff]``, with 0.0 exactly ``backoff``.
        """
        base = self.backoff(round_number)
        return base * (1.0 - self.jitter) + rng.uniform(0.0, base * self.jitter)

    def give_up_at(
        self,
        rounds_done: int,
        *,
        initial: bool,
        initial_period: float | None = None,
        refused: bool = False,
    ) -> float | None:
        """Seconds after the start of a connection at which it gives up, once
        ``rounds_done`` rounds have failed: 0.0 at once, None never.

        ``initial`` selects ``initial_connect_attempts`` (a session's first connection) over
        ``reconnect_attempts`` (after a loss). ``initial_period`` (seconds, the option
        ``initial_connect_period``; None or 0: none) makes a first connection go on after its
        attempts are spent until that period has passed: it gives up once *both* its rounds
        and its period are spent, so the attempts still count when they outlast the period
        (-1 stays unlimited). ``reconnect_period`` bounds every connection, the first one too.

        ``refused``: every broker of the last round refused the login (answered CONNECT with
        an ERROR, or did so within its cool-down, :meth:`refusal_cooldown`): give up at once,
        whatever the attempts and periods left. A broker that says "no" is an answer, not an
        outage: waiting for it does not help, and the app should hear the broker's reason
        now, not after ``reconnect_period`` (issue 16; Qpid JMS's failover provider stops
        reconnecting on a security failure "to avoid a spinning reconnect cycle that can
        never complete"). A round in which some broker was only unreachable is not refused.
        """
        if refused:
            return 0.0
        limit = self.initial_connect_attempts if initial else self.reconnect_attempts
        at: float | None = None
        if limit != -1 and rounds_done >= limit:
            extend = initial and initial_period is not None and initial_period > 0
            at = initial_period if extend else 0.0
        if self.reconnect_period is not None:
            at = self.reconnect_period if at is None else min(at, self.reconnect_period)
        return at

    def exhausted(
        self,
        rounds_done: int,
        elapsed: float,
        *,
        initial: bool,
        initial_period: float | None = None,
        refused: bool = False,
    ) -> bool:
        """Whether to give up after ``rounds_done`` failed rounds and ``elapsed`` seconds
        (:meth:`give_up_at`, whose keyword arguments these are)."""
        at = self.give_up_at(
            rounds_done, initial=initial, initial_period=initial_period, refused=refused
        )
        return at is not None and elapsed >= at

    def refusal_cooldown(self, refusals: int) -> float:
        """Seconds a broker is skipped after its ``refusals``-th refusal in a row of one
        CONNECT (the same credentials), counted once per cool-down: :meth:`backoff` of that
        number, ``min(retry_interval * multiplier ** (refusals - 1), max_retry_interval)``,
        without jitter.

        Exponential from ``retry_interval``: a refusal that goes away by itself (a broker
        still loading its users) costs little, one that stays is tried less and less often.
        Capped
        at ``max_retry_interval``, the longest the operator lets the policy wait between two
        tries of a broker: a refusing broker is never tried more often than that once its
        refusals persist (one CONNECT per cool-down per broker and credentials for the whole
        sidecar, :class:`proxy.reconnect.tally.Refusals`), and a credential fixed on the broker
        (a user created, a Secret rotated) is noticed within that time, as a broker coming
        back is. No jitter: the sessions' own round delays are jittered already.

        Raises:
            ValueError: ``refusals`` is below 1.
        """
        if refusals < 1:
            raise ValueError(f"refusals start at 1, got {refusals}")
        return self.backoff(refusals)

    def order(self, brokers: int, current: int | None, rng: random.Random) -> list[int]:
        """Indexes of the brokers to try in one round.

        The current broker first (reattach: "stay on the current broker while it answers",
        docs/behaviour.md, "Broker list and reconnect policy"), then the others in list order
        starting after it (round robin), or shuffled when ``randomize``. With no current broker
        (first connection) the list starts at its first broker (or in random order when
        ``randomize``).
        """
        if brokers < 1:
            raise ValueError("no brokers")
        if current is None:
            indexes = list(range(brokers))
            if self.randomize:
                rng.shuffle(indexes)
            return indexes
        rest = [(current + k) % brokers for k in range(1, brokers)]
        if self.randomize:
            rng.shuffle(rest)
        return [current, *rest]

    def describe(self) -> dict[str, object]:
        """The policy as plain values (for ``/status`` and logs)."""
        return {
            "retry_interval_s": self.retry_interval,
            "retry_interval_multiplier": self.retry_interval_multiplier,
            "max_retry_interval_s": self.max_retry_interval,
            "reconnect_attempts": self.reconnect_attempts,
            "initial_connect_attempts": self.initial_connect_attempts,
            "reconnect_period_s": self.reconnect_period,
            "jitter": self.jitter,
            "randomize": self.randomize,
            "priority_backup": self.priority_backup,
        }
