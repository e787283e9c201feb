"""Snapshots of the running daemon (``statistics()`` results) and the view of the daemon that
the admin plane and the metrics collector read.

The session, the daemon, the admin plane and the gauges all import it; it imports only the
rooms below telemetry (the legs, reconnecting, tracking: the values it shows), so the
statistics types close no import cycle (the rooms' order: docs/architecture.md, "Rooms and
their order").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import trio
from prometheus_client import CollectorRegistry

from config import Broker, Config
from proxy.legs.opening import BrokerStreams
from proxy.reconnect.discovery import BrokerDiscovery
from proxy.reconnect.evacuations import Evacuation
from proxy.telemetry.events import EventBus
from proxy.telemetry.metrics import Metrics
from proxy.telemetry.vocabulary import ProbeOutcome
from proxy.tracking.budget import BudgetStatistics
from proxy.tracking.health import SubscriptionStatistics
from proxy.tracking.window import WindowStatistics

__all__ = [
    "BrokerHealth",
    "ForwarderStatistics",
    "OutboxStatistics",
    "Readiness",
    "RotationView",
    "SessionStatistics",
    "SidecarStatistics",
    "SidecarView",
]


@dataclass(frozen=True, slots=True)
class SessionStatistics:
    """Snapshot of one session for ``/status`` and metrics.

    ``state``: handshake, running, reconnecting, closing or closed. ``reconnect_attempts``:
    attempts made in the reconnect now in progress (0 when running). ``app_address``: the
    app's ``host:port`` as the listener accepted it (None: not a socket). ``outbox_backlog``:
    frames the session stored in the outbox that no broker has confirmed yet (None: the
    outbox is off).
    ``per_subscription``: each subscription's state (``/status``'s ``subscriptions``, the
    gauge ``mq_sidecar_subscriptions``; :mod:`proxy.tracking.health`).
    """

    session_id: str
    state: str
    app_version: str | None
    broker: str | None
    upstream_version: str | None
    subscriptions: int
    transactions: int
    unacked: int
    pending_receipts: int
    frames_from_app: int
    frames_to_app: int
    window: WindowStatistics | None
    reconnect_attempts: int
    failovers: int
    duplicates_hidden: int
    redeliveries_hidden: int
    reconnecting_for: float | None = None  # seconds since the leg was lost, while reconnecting
    oldest_unconfirmed_age: float | None = None  # seconds the oldest window entry has waited
    app_address: str | None = None
    outbox_backlog: int | None = None
    per_subscription: tuple[SubscriptionStatistics, ...] = ()


@dataclass(frozen=True, slots=True)
class ForwarderStatistics:
    """Snapshot of the outbox forwarder (``/status``'s ``outbox.forwarder``; docs/outbox.md).

    Attributes:
        state: ``idle`` (nothing left to it), ``connecting`` (keys left to it, no broker yet)
            or ``forwarding``.
        broker: the broker it is connected to (its label), None when not connected.
        session: the session key whose frames it forwards now, None when none.
        session_forwarded: frames of that key forwarded (confirmed and removed) so far.
        sessions_left: keys left to it, the one in progress included.
        sessions_done: keys it finished since start.
        forwarded_total: frames it forwarded since start; refused_total: frames a broker
            refused with an ERROR (logged, removed).
        last_error: why its last connection ended or failed, None before any did.
    """

    state: str
    broker: str | None
    session: str | None
    session_forwarded: int
    sessions_left: int
    sessions_done: int
    forwarded_total: int
    refused_total: int
    last_error: str | None

    def status(self) -> dict[str, object]:
        """``/status``'s ``outbox.forwarder`` object."""
        return {
            "state": self.state,
            "broker": self.broker,
            "session": self.session,
            "session_forwarded": self.session_forwarded,
            "sessions_left": self.sessions_left,
            "sessions_done": self.sessions_done,
            "forwarded_total": self.forwarded_total,
            "refused_total": self.refused_total,
            "last_error": self.last_error,
        }


@dataclass(frozen=True, slots=True)
class OutboxStatistics:
    """Snapshot of the outbox (issue 17; ``/status``'s ``outbox``, the outbox gauges).

    Attributes:
        frames, bytes: what it holds now (frame bytes); max_bytes: ``outbox_max_bytes``.
        oldest_age_seconds: age of its oldest frame (wall clock, read about once a second),
            None when empty.
        sessions: session keys with frames in it (read about once a second).
        forwarded_total: frames forwarded, confirmed by a broker and removed since start.
        commits: transactions committed since start (one fsync each).
        recovered_frames: frames it held when it was opened at start.
        recovery_problems: what recovery at start reported, one line each (empty: clean).
        unowned_sessions: session keys left to the outbox forwarder (no live session
            forwards them: a previous process's, an ended session's), not done yet.
        seen_recorded: consumer-side duplicate-suppression ids persisted since start
            (docs/behaviour.md, "Duplicate detection"); seen_failed: ids a write error lost.
        room_waiters: appends waiting for room now (the outbox is full for them).
        expired_total: frames dropped unforwarded since start, older than ``outbox_max_age``.
        drain_left_seconds: on SIGTERM, the seconds left for forwarding the outbox before
            the sidecar exits (the drain's deadline); None while it runs.
        forwarder: the outbox forwarder's progress (None: not started).
    """

    frames: int
    bytes: int
    max_bytes: int
    oldest_age_seconds: float | None
    sessions: int
    forwarded_total: int
    commits: int
    recovered_frames: int
    recovery_problems: tuple[str, ...]
    unowned_sessions: int = 0
    seen_recorded: int = 0
    seen_failed: int = 0
    room_waiters: int = 0
    expired_total: int = 0
    drain_left_seconds: float | None = None
    forwarder: ForwarderStatistics | None = None

    def status(self) -> dict[str, object]:
        """``/status``'s ``outbox`` object (ages rounded to ms)."""
        age = self.oldest_age_seconds
        return {
            "frames": self.frames,
            "bytes": self.bytes,
            "max_bytes": self.max_bytes,
            "oldest_age_seconds": None if age is None else round(age, 3),
            "sessions": self.sessions,
            "forwarded_total": self.forwarded_total,
            "expired_total": self.expired_total,
            "commits": self.commits,
            "unowned_sessions": self.unowned_sessions,
            "seen_recorded": self.seen_recorded,
            "seen_failed": self.seen_failed,
            "room_waiters": self.room_waiters,
            "drain_left_seconds": (
                None if self.drain_left_seconds is None else round(self.drain_left_seconds, 3)
            ),
            "forwarder": self.forwarder.status() if self.forwarder is not None else None,
            "recovery": {
                "frames": self.recovered_frames,
                "clean": not self.recovery_problems,
                "problems": list(self.recovery_problems),
            },
        }


@dataclass(frozen=True, slots=True)
class BrokerHealth:
    """What the prober knows about one broker. Times are trio seconds.

    ``state``: ``"unknown"`` (no check finished yet), ``"up"`` (the last finished check was
    answered) or ``"down"`` (it failed, or was not answered within ``stale_after`` seconds).
    ``last_check``: when the last check finished; ``last_answer``: when the broker last
    answered one.
    """

    broker: str
    state: str
    last_check: float | None
    last_answer: float | None
    last_outcome: ProbeOutcome | None
    detail: str
    checks: int
    failures: int


@dataclass(frozen=True, slots=True)
class Readiness:
    """The verdict of ``/readyz``: ``reasons`` say why not when ``ready`` is false."""

    ready: bool
    reasons: tuple[str, ...]
    brokers_up: tuple[str, ...]
    #: Outbox mode: what the outbox holds (``outbox: F frame(s), B of M bytes``); None: off.
    outbox: str | None = None

    def text(self) -> str:
        """The response body: ``ready`` or ``not ready`` and one line per reason/broker."""
        if self.ready:
            if self.outbox is None:
                return "ready: broker(s) reachable: " + ", ".join(self.brokers_up) + "\n"
            if self.brokers_up:
                brokers = "broker(s) reachable: " + ", ".join(self.brokers_up)
            else:
                brokers = "no broker reachable: SENDs are stored in the outbox"
            return f"ready: {brokers}; {self.outbox}\n"
        return "not ready:\n" + "".join(f"- {r}\n" for r in self.reasons)


@dataclass(frozen=True, slots=True)
class SidecarStatistics:
    """Snapshot of the whole daemon: listener address, every live session, the outbox (None
    when ``outbox`` is off), the memory budget (``max_memory_bytes``)."""

    listen: tuple[str, int] | None
    sessions_total: int
    sessions: tuple[SessionStatistics, ...]
    admin_listen: tuple[str, int] | None = None
    outbox: OutboxStatistics | None = None
    memory: BudgetStatistics | None = None


class RotationView(Protocol):
    """What the admin plane reads and does of the brokers in rotation
    (:class:`proxy.rotation.BrokerRotation`): the list in force, the live list's sources, the
    evacuations, and the operator's evacuate and readmit."""

    @property
    def discovery(self) -> BrokerDiscovery: ...
    def brokers(self) -> tuple[Broker, ...]: ...
    def connecting(self, broker: str) -> tuple[int, int]: ...
    def evacuations(self) -> tuple[Evacuation, ...]: ...
    def evacuate(
        self, broker: str, reason: str, *, for_seconds: float | None = None, check: bool = True
    ) -> Evacuation: ...
    def readmit(self, broker: str) -> Evacuation | None: ...


class SidecarView(Protocol):
    """What the admin plane and the gauges read of the running daemon
    (:class:`proxy.app.Sidecar`), and the operations the admin plane's actions call
    (:mod:`proxy.admin.actions`)."""

    @property
    def config(self) -> Config: ...
    @property
    def registry(self) -> CollectorRegistry: ...
    @property
    def metrics(self) -> Metrics: ...
    @property
    def events(self) -> EventBus: ...
    @property
    def shutdown_requested(self) -> trio.Event: ...
    @property
    def streams(self) -> BrokerStreams: ...
    def statistics(self) -> SidecarStatistics: ...
    def live_leg_to(self, broker: str) -> bool: ...
    @property
    def rotation(self) -> RotationView: ...
    def request_shutdown(self) -> None: ...
