"""The session's broker leg as the session sees it: the live leg (if any), which broker it is
on, what that broker does differently, whether frames may be queued on it, and the outage in
progress while there is none."""

from __future__ import annotations

import trio

from proxy.legs.broker import Upstream
from proxy.legs.dialect import BrokerDialect
from proxy.reconnect.walk import Attempt
from proxy.session.ending import Loss

__all__ = ["LegState"]


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
