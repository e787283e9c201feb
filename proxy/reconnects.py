"""What the sidecar's sessions know together about their brokers during an outage (pure).

When a broker dies, every session on it reconnects by the policy, each with its own jittered
backoff. A session whose app connects in the middle of that would otherwise race them with a
first connection of its own, and spend its rounds on brokers the others already know to be
down. Instead the sessions report here: a reconnect begins (:meth:`ReconnectTally.begin`), a
connection to broker *i* succeeded (:meth:`ReconnectTally.up`), a reconnect ended, given up,
cancelled or done (:meth:`ReconnectTally.end`). A new session's first connection reads the
tally: while others are reconnecting it waits for their outcome and then tries first the
broker that answered (docs/behaviour.md, "Broker list and reconnect policy").

This module keeps the counts only: integers, no queue, no clock, no trio. The waiting (a trio
Event woken on every change) is :class:`proxy.failover.ReconnectBoard`, which owns one tally;
the sidecar owns one board (``proxy.app.Sidecar.reconnects``).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ReconnectTally", "Seen"]


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

    def begin(self) -> None:
        """A session lost its broker and starts reconnecting."""
        self.reconnecting += 1
        self.generation += 1

    def end(self) -> None:
        """A reconnect is over: succeeded (after :meth:`up`), given up, or the session ended.

        Raises:
            ValueError: no reconnect was in progress (a :meth:`begin` is missing).
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
