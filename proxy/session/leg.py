"""The session's broker leg as the session sees it: the live leg (if any), which broker it is
on, what that broker does differently, whether frames may be queued on it, and the outage in
progress while there is none."""

from __future__ import annotations

import trio

from proxy.legs.broker import Upstream
from proxy.legs.dialect import BrokerDialect
from proxy.reconnect.walk import Attempt
from proxy.session.ending import Loss

__all__ = ["STABLE_LEG_SECONDS", "LegState"]

#: Seconds a leg must live for a loss after it to start a new count of unstable legs: RabbitMQ
#: ends a leg that replays into a queue it cannot take within milliseconds (measured, issue 25).
STABLE_LEG_SECONDS = 5.0


class LegState:
    """One session's hold on its broker leg.

    Attributes:
        upstream: the live leg, or None while connecting or reconnecting.
        broker_index: the index in the broker list of the broker the session is on (or was
            last on), None before the first connect.
        dialect: what the current (or last) broker does differently
            (:class:`~proxy.legs.dialect.BrokerDialect`, read off its CONNECTED once); a
            STOMP 1.2 broker's defaults before the first leg.
        scope: the link task's cancel scope (cancelled when the session ends).
        failovers: reconnects that moved the session to another broker.
        reconnect_attempts: the attempts of the reconnect in progress (an event reports them).
        loss: the current outage, while reconnecting.
        send_lock: appending to the window and sending happen under this lock, which a
            restore also holds while it replays, so frames reach the broker in window order.
        unstable: legs lost in a row before what was replayed on them was confirmed, or to
            an ERROR retried as a reconnect (:meth:`note_loss`); 0 after a stable one.
        unstable_since: when the first of those legs was lost (trio seconds), else None.
    """

    __slots__ = (
        "_ready",
        "_up",
        "broker_index",
        "dialect",
        "failovers",
        "loss",
        "reconnect_attempts",
        "scope",
        "send_lock",
        "unstable",
        "unstable_since",
        "upstream",
    )

    def __init__(self) -> None:
        self.upstream: Upstream | None = None
        self.broker_index: int | None = None
        self.dialect = BrokerDialect()
        self.scope = trio.CancelScope()
        self.failovers = 0
        self.reconnect_attempts: list[Attempt] = []
        self.loss: Loss | None = None
        self.send_lock = trio.Lock()
        self._ready = False
        self._up = trio.Event()
        self.unstable = 0
        self.unstable_since: float | None = None

    def note_loss(
        self, now: float, *, lived: float, retryable: bool, replay_unconfirmed: bool
    ) -> None:
        """A leg was lost at ``now`` after ``lived`` seconds (trio time). It was in trouble
        when the broker ended it with an ERROR retried as a reconnect (``retryable``), or when
        frames replayed on it were still unconfirmed (``replay_unconfirmed``: RabbitMQ crashes
        a connection that publishes into a quorum queue electing its leader, measured, issue
        25). Troubled legs that lived less than :data:`STABLE_LEG_SECONDS` count up, and the
        next reconnect waits a backoff that grows with the count; one that lived longer starts
        a new count at 1; a loss without trouble resets it."""
        if not (retryable or replay_unconfirmed):
            self.unstable = 0
            self.unstable_since = None
        elif self.unstable and lived < STABLE_LEG_SECONDS:
            self.unstable += 1
        else:
            self.unstable = 1
            self.unstable_since = now

    def outage_since(self, now: float, leg_lived: float | None) -> float | None:
        """When the outage in progress began (trio seconds), for ``/status`` and readiness:
        the first of the unstable legs in a row while the current one (alive for
        ``leg_lived`` seconds; None: no leg) has not yet lived :data:`STABLE_LEG_SECONDS`,
        else the loss being reconnected from, else None."""
        if self.unstable and (leg_lived is None or leg_lived < STABLE_LEG_SECONDS):
            return self.unstable_since
        return self.loss.at if self.loss is not None else None

    @property
    def ready(self) -> bool:
        """Frames may be queued on :attr:`upstream` as the app sends them (False while
        connecting, reconnecting, or while a restore writes the window)."""
        return self._ready

    @ready.setter
    def ready(self, ready: bool) -> None:
        if ready and not self._ready:
            self._up.set()
        elif not ready and self._ready:
            self._up = trio.Event()
        self._ready = ready

    async def wait_ready(self) -> None:
        """Wait until :attr:`ready` (at once when it is)."""
        if not self._ready:
            await self._up.wait()
