"""The gauges of ``/metrics``: things that *are* (sessions open, legs per broker, window
occupancy, reconnects in progress, broker reachability), read from the live objects when
Prometheus scrapes, plus the lock-free relay counters of :class:`proxy.telemetry.metrics.Metrics`.

Nothing here is kept in parallel with the session state: :class:`SidecarCollector` calls
``statistics()`` once per scrape. It sees the daemon and the admin plane only through the
small protocols below, so this module imports neither (no import cycle).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)

from proxy._version import VERSION
from proxy.telemetry.metrics import PREFIX
from proxy.telemetry.statistics import BrokerHealth, Readiness, SidecarView
from proxy.tracking.health import SubscriptionState

__all__ = ["AdminView", "SidecarCollector"]


class _ProberView(Protocol):
    def statistics(self) -> Sequence[BrokerHealth]: ...


class _AdminCounts(Protocol):
    @property
    def sse_clients(self) -> int: ...
    @property
    def connections(self) -> int: ...


class AdminView(Protocol):
    """What the collector reads of the admin plane (:class:`proxy.admin.server.AdminServer`)."""

    @property
    def prober(self) -> _ProberView: ...
    def readiness(self) -> Readiness: ...
    def statistics(self) -> _AdminCounts: ...


class _Families:
    """One scrape's metric families, typed (filled by :meth:`SidecarCollector.collect`)."""

    def __init__(self) -> None:
        p = PREFIX
        self.build = InfoMetricFamily(f"{p}_build", "mq-sidecar version.", labels=["version"])
        self.sessions = GaugeMetricFamily(
            f"{p}_sessions",
            "App sessions open now, by state (handshake, running, reconnecting, closing).",
            labels=["state"],
        )
        self.subscriptions = GaugeMetricFamily(
            f"{p}_subscriptions",
            "The apps' subscriptions now, by state (live, restoring, cancelled_by_broker, "
            "waiting_for_queue).",
            labels=["state"],
        )
        self.sessions_accepted = CounterMetricFamily(
            f"{p}_sessions_accepted", "App connections accepted since start."
        )
        self.upstream_connected = GaugeMetricFamily(
            f"{p}_upstream_connected",
            "Live upstream legs (one per connected session) per broker.",
            labels=["broker"],
        )
        self.upstream_connecting = GaugeMetricFamily(
            f"{p}_upstream_connecting",
            "Connection attempts to a broker now, by state: in_flight (holding one of its "
            "max_connecting slots) or waiting (for a slot).",
            labels=["broker", "state"],
        )
        self.evacuated = GaugeMetricFamily(
            f"{p}_broker_evacuated",
            "1 while a broker is evacuated (out of the rotation, its sessions moving away), by "
            "broker.",
            labels=["broker"],
        )
        self.window_frames = GaugeMetricFamily(
            f"{p}_window_frames", "Frames awaiting broker confirmation, summed over all sessions."
        )
        self.window_bytes = GaugeMetricFamily(
            f"{p}_window_bytes", "Bytes awaiting broker confirmation, summed over all sessions."
        )
        self.window_bytes_max = GaugeMetricFamily(
            f"{p}_window_max_bytes", "Bytes awaiting confirmation in the fullest session's window."
        )
        self.window_limit = GaugeMetricFamily(
            f"{p}_window_limit_bytes",
            "Size of each session's confirmation window (confirmation_window_size).",
        )
        self.reconnects = GaugeMetricFamily(
            f"{p}_reconnects_in_progress", "Sessions reconnecting (stopped) now."
        )
        self.relayed_frames = CounterMetricFamily(
            f"{p}_relayed_frames",
            "Frames relayed between apps and brokers, by direction and STOMP command.",
            labels=["direction", "command"],
        )
        self.relayed_bytes = CounterMetricFamily(
            f"{p}_relayed_bytes",
            "Body bytes of the relayed frames, by direction and STOMP command.",
            labels=["direction", "command"],
        )
        self.events_published = CounterMetricFamily(
            f"{p}_session_events_published",
            "RECONNECTING/FAILOVER/DISCONNECT events published to the event bus.",
        )
        self.event_subscribers = GaugeMetricFamily(
            f"{p}_event_subscribers",
            "Subscribers of session events now (SSE readers and in-band subscriptions).",
        )
        self.event_subscribers_dropped = CounterMetricFamily(
            f"{p}_event_subscribers_dropped",
            "Event subscribers (SSE or in-band) dropped because their buffer was full.",
        )
        self.broker_up = GaugeMetricFamily(
            f"{p}_broker_up",
            "1 when the broker answered a STOMP CONNECT recently (probe or live leg), else 0.",
            labels=["broker"],
        )
        self.tls_expiry = GaugeMetricFamily(
            f"{p}_upstream_tls_cert_expiry_seconds",
            "Expiry (notAfter) of the certificate a TLS broker presented in its last "
            "handshake, Unix seconds; alert on it minus time().",
            labels=["broker"],
        )
        self.outbox_frames = GaugeMetricFamily(
            f"{p}_outbox_frames", "Frames stored in the outbox, not yet forwarded."
        )
        self.outbox_bytes = GaugeMetricFamily(
            f"{p}_outbox_bytes", "Frame bytes stored in the outbox (what outbox_max_bytes bounds)."
        )
        self.outbox_oldest_age = GaugeMetricFamily(
            f"{p}_outbox_oldest_age_seconds",
            "Age of the oldest frame in the outbox, seconds (0 when empty).",
        )
        self.outbox_recovery_problems = GaugeMetricFamily(
            f"{p}_outbox_recovery_problems",
            "Problems the outbox's recovery found at start (damaged or lost frames, a database "
            "moved aside); 0 when clean.",
        )
        self.memory_held = GaugeMetricFamily(
            f"{p}_memory_held_bytes",
            "Bytes all sessions hold together: windows, frames being read, open "
            "transactions (what max_memory_bytes bounds).",
        )
        self.memory_reserved = GaugeMetricFamily(
            f"{p}_memory_reserved_bytes",
            "Bytes of max_memory_bytes kept back from app reads, not held: the broker legs' "
            "room and, for frames being read, the overdraft's frame.",
        )
        self.memory_free = GaugeMetricFamily(
            f"{p}_memory_free_bytes",
            "Bytes of max_memory_bytes app reads and new sessions may still take (0: new "
            "sessions are refused).",
        )
        self.memory_limit = GaugeMetricFamily(
            f"{p}_memory_budget_bytes", "The memory budget of all sessions (max_memory_bytes)."
        )
        self.ready = GaugeMetricFamily(f"{p}_ready", "1 when /readyz answers 200, else 0.")
        self.sse_clients = GaugeMetricFamily(f"{p}_sse_clients", "GET /events readers now.")
        self.admin_connections = GaugeMetricFamily(
            f"{p}_admin_connections", "Open HTTP connections to the admin plane."
        )

    def all(self) -> list[Metric]:
        return [v for v in vars(self).values() if isinstance(v, Metric)]


class SidecarCollector:
    """Gauges (and the lock-free relay counters) read from live objects at scrape time.

    Args:
        sidecar: the running daemon; its ``statistics()`` is called once per scrape.
        admin: the admin plane, for broker reachability, readiness and SSE readers.

    Window occupancy is ``SessionStatistics.window`` (a
    :class:`~proxy.tracking.window.WindowStatistics`).
    """

    def __init__(self, sidecar: SidecarView, admin: AdminView | None = None) -> None:
        self.sidecar = sidecar
        self.admin = admin

    def describe(self) -> Iterable[Metric]:
        """The metric families (without samples), so the registry can check for clashes."""
        return _Families().all()

    def collect(self) -> Iterable[Metric]:
        """Build every family from one ``statistics()`` snapshot."""
        f = _Families()
        sidecar = self.sidecar
        stats = sidecar.statistics()

        f.build.add_metric([], {"version": VERSION})
        states = dict.fromkeys(("handshake", "running", "reconnecting", "closing"), 0)
        per_broker = dict.fromkeys((b.label for b in sidecar.rotation.brokers()), 0)
        window_frames = window_bytes = window_max = 0
        subscriptions = dict.fromkeys(SubscriptionState, 0)
        for s in stats.sessions:
            states[s.state] = states.get(s.state, 0) + 1
            for sub in s.per_subscription:
                subscriptions[SubscriptionState(sub.state)] += 1
            if s.broker is not None and s.state != "reconnecting":
                per_broker[s.broker] = per_broker.get(s.broker, 0) + 1
            if s.window is not None:
                window_frames += s.window.frames
                window_bytes += s.window.bytes
                window_max = max(window_max, s.window.bytes)
        for state, n in states.items():
            f.sessions.add_metric([state], n)
        for sub_state, n in subscriptions.items():
            f.subscriptions.add_metric([sub_state.value], n)
        f.sessions_accepted.add_metric([], stats.sessions_total)
        for broker, n in per_broker.items():
            f.upstream_connected.add_metric([broker], n)
        for label in per_broker:
            in_flight, waiting = sidecar.rotation.connecting(label)
            f.upstream_connecting.add_metric([label, "in_flight"], in_flight)
            f.upstream_connecting.add_metric([label, "waiting"], waiting)
        evacuated = {e.broker for e in sidecar.rotation.evacuations()}
        for label in (b.label for b in sidecar.rotation.brokers()):
            f.evacuated.add_metric([label], 1 if label in evacuated else 0)
        f.window_frames.add_metric([], window_frames)
        f.window_bytes.add_metric([], window_bytes)
        f.window_bytes_max.add_metric([], window_max)
        f.window_limit.add_metric([], sidecar.config.confirmation_window_size)
        f.reconnects.add_metric([], states["reconnecting"])
        if stats.memory is not None:
            f.memory_held.add_metric([], stats.memory.held)
            f.memory_reserved.add_metric([], stats.memory.reserved)
            f.memory_free.add_metric([], stats.memory.free)
            f.memory_limit.add_metric([], stats.memory.limit)
        outbox = stats.outbox
        if outbox is not None:
            f.outbox_frames.add_metric([], outbox.frames)
            f.outbox_bytes.add_metric([], outbox.bytes)
            f.outbox_oldest_age.add_metric([], outbox.oldest_age_seconds or 0.0)
            f.outbox_recovery_problems.add_metric([], len(outbox.recovery_problems))

        for (direction, command), (frames, nbytes) in sidecar.metrics.relayed.items():
            if frames:
                f.relayed_frames.add_metric([direction, command], frames)
                f.relayed_bytes.add_metric([direction, command], nbytes)

        for record in sidecar.streams.tracker.records():
            if record.certificate is not None:
                f.tls_expiry.add_metric([record.broker], record.certificate.not_after)

        bus = sidecar.events.statistics()
        f.events_published.add_metric([], bus.published)
        f.event_subscribers.add_metric([], bus.subscribers)
        f.event_subscribers_dropped.add_metric([], bus.dropped_subscribers)

        admin = self.admin
        if admin is not None:
            for probe in admin.prober.statistics():
                f.broker_up.add_metric([probe.broker], 1 if probe.state == "up" else 0)
            f.ready.add_metric([], 1 if admin.readiness().ready else 0)
            a = admin.statistics()
            f.sse_clients.add_metric([], a.sse_clients)
            f.admin_connections.add_metric([], a.connections)
        return f.all()
