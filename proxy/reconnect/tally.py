"""What the sidecar's sessions know together about their brokers during an outage (pure).

When a broker dies, every session on it reconnects by the policy, each with its own jittered
backoff. A session whose app connects in the middle of that would otherwise race them with a
first connection of its own, and spend its rounds on brokers the others already know to be
down. Instead the sessions report here: a reconnect begins (:meth:`ReconnectTally.begin`), a
connection to broker *i* succeeded (:meth:`ReconnectTally.up`), a reconnect ended, given up,
cancelled or done (:meth:`ReconnectTally.end`). A new session's first connection reads the
tally: while others are reconnecting it waits for their outcome and then tries first the
broker that answered (docs/behaviour.md, "Broker list and reconnect policy").

They also share what brokers answered: a broker that refused a CONNECT (an ERROR in answer,
typically the credentials) is skipped for a cool-down by every session that would send it the
same CONNECT (:class:`Refusals`), so three hundred sessions failing over together do not each
try a broker that already said no.

This module keeps the counts only: integers and the latest refusals, no queue, no clock, no
trio (times are the caller's, in seconds). The waiting (a trio Event woken on every change) is
:class:`proxy.reconnect.walk.ReconnectBoard`, which owns one tally and one :class:`Refusals`; the
sidecar owns one board (``proxy.app.Sidecar.reconnects``).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

from proxy.reconnect.policy import ReconnectPolicy

__all__ = ["ReconnectTally", "Refusal", "Refusals", "Seen"]

K = TypeVar("K", bound=Hashable)
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Seen:
    """What a waiter learnt since it started waiting (:meth:`ReconnectTally.since`).

    Attributes:
        broker: index (in the configured list) of the latest broker a session reached since
            then, or None.
        idle: no session is reconnecting any more (they succeeded, gave up or ended).
    """

    broker: int | None
    idle: bool


class ReconnectTally:
    """Counts of the sessions' reconnects and the latest broker reached, by generation.

    Every change bumps :attr:`generation`; a waiter notes the generation when it starts and
    asks :meth:`since` what happened after it. Memory is constant whatever the number of
    sessions or outcomes.
    """

    __slots__ = ("_latest_up", "generation", "reconnecting")

    def __init__(self) -> None:
        #: Sessions whose reconnect is in progress.
        self.reconnecting = 0
        #: Bumped by every change.
        self.generation = 0
        self._latest_up: tuple[int, int] | None = None  # (generation, broker index)

    def reconnect_began(self) -> None:
        """A session lost its broker and starts reconnecting."""
        self.reconnecting += 1
        self.generation += 1

    def reconnect_ended(self) -> None:
        """A reconnect is over: succeeded (after :meth:`up`), given up, or the session ended.

        Raises:
            ValueError: no reconnect was in progress (a :meth:`reconnect_began` is missing).
        """
        if self.reconnecting < 1:
            raise ValueError("a reconnect ended that never began")
        self.reconnecting -= 1
        self.generation += 1

    def up(self, broker: int) -> None:
        """A session (reconnecting, or connecting for the first time) reached broker index
        ``broker``: it answers CONNECT now.

        Raises:
            ValueError: ``broker`` is negative.
        """
        if broker < 0:
            raise ValueError(f"broker indexes start at 0, got {broker}")
        self.generation += 1
        self._latest_up = (self.generation, broker)

    def since(self, generation: int) -> Seen:
        """What happened after ``generation``: the latest broker reached since then (None if
        none), and whether no reconnect is in progress now."""
        latest = self._latest_up
        broker = latest[1] if latest is not None and latest[0] > generation else None
        return Seen(broker, self.reconnecting == 0)


@dataclass(slots=True)
class Refusal(Generic[R]):
    """A broker's standing refusal of one CONNECT (:class:`Refusals`).

    Attributes:
        error: the latest refusal (the broker's ERROR, as the caller keeps it).
        count: cool-downs so far: refusals in a row, one per cool-down (refusals of attempts
            that were under way when a cool-down began count in that one).
        until: end of the current cool-down, in the caller's seconds.
        trying: a session is trying the broker again after the cool-down; until it has the
            answer, the refusal stands for everyone else.
    """

    error: R
    count: int
    until: float
    trying: bool = False


class Refusals(Generic[K, R]):
    """Which brokers refused which CONNECT lately, and until when they are skipped.

    Keyed by whatever names "this broker, this CONNECT" to the caller (the sidecar: broker
    index and a keyed digest of the CONNECT headers, so only a session presenting the same
    credentials to the same broker skips it). The life of one key:

    * :meth:`claim` before an attempt: returns the standing refusal (skip the broker and count
      that as its answer) while the cool-down runs or another session is trying it again;
      else None, and the caller tries (the key is now being tried).
    * then exactly one of :meth:`refused` (a new cool-down, longer by the policy,
      :meth:`ReconnectPolicy.refusal_cooldown`), :meth:`accepted` (forgotten: the next
      refusal starts again from the shortest cool-down) or :meth:`settled` (no answer:
      unreachable, timed out, cancelled; the refusal no longer stands, the count is kept).

    At most ``limit`` keys are kept; a new one beyond it evicts the one refused longest ago
    (its sessions then try that broker once more). Memory: ``limit`` entries, whatever the
    number of sessions or attempts.
    """

    __slots__ = ("_entries", "limit")

    def __init__(self, limit: int = 256) -> None:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        self.limit = limit
        self._entries: dict[K, Refusal[R]] = {}  # oldest refusal first

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: K) -> Refusal[R] | None:
        """The entry of ``key`` (read-only use: tests, ``/status``), or None."""
        return self._entries.get(key)

    def claim(self, key: K, now: float) -> R | None:
        """Before an attempt at ``now``: the refusal that still stands for ``key`` (skip the
        broker), or None (try it; if it had refused before, the others now skip it until
        this attempt ends: one CONNECT at a time to a broker known to refuse)."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry.trying or now < entry.until:
            return entry.error
        entry.trying = True
        return None

    def refused(self, key: K, error: R, now: float, policy: ReconnectPolicy) -> float | None:
        """The attempt for ``key`` was refused at ``now`` with ``error``.

        Returns the cool-down it starts, in seconds; None when one was already running (an
        attempt under way when another one's refusal began it: same cool-down, latest words).
        """
        entry = self._entries.pop(key, None)
        if entry is not None and now < entry.until:
            entry.error = error
            self._entries[key] = entry
            return None
        count = 1 if entry is None else entry.count + 1
        cooldown = policy.refusal_cooldown(count)
        if entry is None and len(self._entries) >= self.limit:
            del self._entries[next(iter(self._entries))]
        self._entries[key] = Refusal(error, count, now + cooldown)
        return cooldown

    def accepted(self, key: K) -> None:
        """The broker accepted the CONNECT of ``key``: its refusals are forgotten."""
        self._entries.pop(key, None)

    def settled(self, key: K) -> None:
        """The attempt for ``key`` ended without an answer (unreachable, timeout, TLS error,
        cancelled): the refusal no longer stands for the others; its count is kept."""
        entry = self._entries.get(key)
        if entry is not None:
            entry.trying = False
