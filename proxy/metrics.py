"""Prometheus metrics of one sidecar: what the session and failover code record, and the gauges
read from the live objects at scrape time.

Two kinds of metrics, kept apart on purpose (STYLE §2 rule 16, DESIGN §3.7):

* **Things that happen** (a connect attempt, a failover, a receipt round trip...) are recorded
  by the code where they happen, through one method of :class:`Metrics` each. The instruments
  live on an app-owned :class:`prometheus_client.CollectorRegistry` (never the global
  ``REGISTRY``: two sidecars in one test process must not share counters).
* **Things that are** (sessions open, legs per broker, window occupancy, reconnects in
  progress) are *not* kept in parallel: :class:`SidecarCollector` reads
  ``Sidecar.statistics()`` (and the admin plane's prober) when Prometheus scrapes.

Labels are bounded: broker labels come from the configuration (``host:port``), every other
label value from a closed enum below. Session ids, destinations and credentials are never
labels (DESIGN §3.8).

Hot path. The relay records every frame, and the relay's budget is ≥ 0.95x the throughput of a
direct connection. A ``prometheus_client`` child ``inc()`` takes a lock (~0.35 µs); the
per-frame counters are therefore plain ``int`` cells in a dict pre-built for every
(direction, command) pair, bumped without a lock — everything runs in the one trio thread, and
the scrape, also in that thread, reads them through :class:`SidecarCollector`. The rare events
use ordinary pre-bound ``prometheus_client`` children.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)

from protocol import Command
from proxy._version import VERSION

if TYPE_CHECKING:
    from proxy.admin import AdminServer
    from proxy.app import Sidecar

__all__ = [
    "ClientErrorReason",
    "ConnectOutcome",
    "Direction",
    "FailoverReason",
    "Metrics",
    "OutageOutcome",
    "ProbeOutcome",
    "SidecarCollector",
    "TransactionOutcome",
]

#: Prefix of every metric this package defines.
PREFIX = "mq_sidecar"

#: Outage buckets, seconds: a reattach on loopback takes tens of ms, a failover to a backup
#: that must first take the store lock 1-10 s (BROKERS.md), ``reconnect_period`` is 300 s.
OUTAGE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
#: Receipt round-trip buckets, seconds: sub-millisecond on loopback up to seconds for a
#: persistent SEND on a busy broker.
RECEIPT_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip


class Direction(enum.StrEnum):
    """Which way a relayed frame went (label ``direction``)."""

    APP_TO_BROKER = "app_to_broker"
    BROKER_TO_APP = "broker_to_app"


class ConnectOutcome(enum.StrEnum):
    """Result of one attempt to open an upstream leg (label ``outcome``); the values are those
    of ``proxy.failover.Attempt.outcome``, so ``ConnectOutcome(attempt.outcome)`` works."""

    #: CONNECTED received: the leg is up.
    CONNECTED = "connected"
    #: The broker answered CONNECT with an ERROR (credentials refused...): ``UpstreamRefused``.
    REFUSED = "refused"
    #: No CONNECTED within ``connect_timeout`` (a hung broker accepts TCP and says nothing).
    TIMEOUT = "timeout"
    #: No STOMP session: TCP refused or reset, name not resolved, TLS failure, garbage.
    UNREACHABLE = "unreachable"


class ProbeOutcome(enum.StrEnum):
    """Result of one readiness probe of a broker (label ``outcome``)."""

    #: CONNECTED received.
    CONNECTED = "connected"
    #: The broker answered with an ERROR (it is up; the probe's credentials were refused).
    REFUSED = "refused"
    #: No answer: connection refused, reset, timeout, garbage.
    FAILED = "failed"
    #: No probe needed: a session leg to this broker is live (its heart-beats are the proof).
    LIVE_SESSION = "live_session"


class FailoverReason(enum.StrEnum):
    """Why a session left its upstream leg (label ``reason`` of failovers and reattaches)."""

    #: TCP EOF, reset, or a write that failed (DESIGN §3.2 "immediate").
    CONNECTION_LOST = "connection_lost"
    #: The broker was silent past the heart-beat tolerance (DESIGN §3.2 "silent death").
    HEARTBEAT_TIMEOUT = "heartbeat_timeout"
    #: The broker sent bytes that are not STOMP.
    PROTOCOL_ERROR = "protocol_error"
    #: The broker sent an ERROR frame that was not an answer to an app frame, then closed.
    BROKER_ERROR = "broker_error"
    #: ``priority_backup``: back to the first broker at a quiet point (not a failure).
    FAILBACK = "failback"


class OutageOutcome(enum.StrEnum):
    """How an outage ended (label ``outcome`` of ``mq_sidecar_outage_seconds``)."""

    #: Same broker again.
    REATTACHED = "reattached"
    #: Another broker (or the first one again with ``priority_backup``).
    FAILED_OVER = "failed_over"
    #: Reconnecting was given up; the app got DISCONNECT and its connection closed.
    DISCONNECTED = "disconnected"


class TransactionOutcome(enum.StrEnum):
    """What became of an app transaction (label ``outcome``; DESIGN §3.5)."""

    #: COMMIT confirmed by the broker.
    COMMITTED = "committed"
    #: ``transaction_failover = "replay"``: re-run on the new broker after a failover.
    REPLAYED = "replayed"
    #: ``transaction_failover = "rollback"``: dirty at failover, rolled back, COMMIT refused.
    ROLLED_BACK = "rolled_back"
    #: COMMIT sent but the leg died before its receipt: the outcome is unknown.
    IN_DOUBT = "in_doubt"


class ClientErrorReason(enum.StrEnum):
    """Why an app's frame or session was refused for the app's own fault (label ``reason``;
    DESIGN §3.8)."""

    #: Not STOMP, or over a limit (frame size, header count or length), unknown command, a
    #: frame before CONNECT: a ``protocol.RemoteProtocolError`` from the app's leg.
    MALFORMED_FRAME = "malformed_frame"
    #: No CONNECT within ``handshake_timeout``.
    HANDSHAKE_TIMEOUT = "handshake_timeout"
    #: ``accept-version`` names no version the sidecar speaks.
    UNSUPPORTED_VERSION = "unsupported_version"
    #: Wrong ``client_login`` / ``client_passcode``.
    AUTH_FAILED = "auth_failed"
    #: A well-formed frame the session cannot accept (unknown ack id or transaction, duplicate
    #: subscription id, too many subscriptions, NACK to a 1.0 broker...): a
    #: ``proxy.tracking.SessionError`` (session ends) or a ``FrameRejected`` (frame refused).
    INVALID_REQUEST = "invalid_request"
    #: The app was silent past its heart-beat tolerance.
    HEARTBEAT_TIMEOUT = "heartbeat_timeout"


class Metrics:
    """The counters and histograms of one sidecar, on ``registry``.

    Args:
        registry: the app-owned registry (``Sidecar.registry``); a fresh one if omitted.
        brokers: broker labels (``host:port``) from the configuration: their children are
            created up front, so every broker shows zeros before its first event.

    Every method is synchronous, never blocks and never raises for a valid argument. The
    enum-typed arguments are the whole label vocabulary: mypy rejects anything else.
    """

    def __init__(
        self, registry: CollectorRegistry | None = None, *, brokers: Sequence[str] = ()
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        p = PREFIX
        self.brokers = tuple(brokers)

        # -- hot path: plain int cells, exported by SidecarCollector --------------------------
        #: ``[frames, body_bytes]`` per (direction, command); read by :class:`SidecarCollector`.
        self.relayed: dict[tuple[Direction, Command], list[int]] = {
            (d, c): [0, 0] for d in Direction for c in Command
        }
        self._to_broker = {c: self.relayed[Direction.APP_TO_BROKER, c] for c in Command}
        self._to_app = {c: self.relayed[Direction.BROKER_TO_APP, c] for c in Command}

        # -- upstream legs --------------------------------------------------------------------
        self._connect_attempts = Counter(
            f"{p}_upstream_connect_attempts",
            "Attempts to open an upstream STOMP leg, by broker and outcome.",
            ["broker", "outcome"],
            registry=r,
        )
        self._connect = {
            (b, o): self._connect_attempts.labels(b, o)
            for b in self.brokers
            for o in ConnectOutcome
        }
        self._probes = Counter(
            f"{p}_broker_probes",
            "Readiness probes of a broker (a STOMP CONNECT by the admin plane), by outcome.",
            ["broker", "outcome"],
            registry=r,
        )
        self._probe = {
            (b, o): self._probes.labels(b, o) for b in self.brokers for o in ProbeOutcome
        }

        # -- failover -------------------------------------------------------------------------
        self._failovers = Counter(
            f"{p}_failovers",
            "Sessions moved to another broker, by old broker, new broker and reason.",
            ["from_broker", "to_broker", "reason"],
            registry=r,
        )
        self._reattaches = Counter(
            f"{p}_reattaches",
            "Sessions restored on the same broker after losing their leg, by reason.",
            ["broker", "reason"],
            registry=r,
        )
        self._reattach = {
            (b, reason): self._reattaches.labels(b, reason)
            for b in self.brokers
            for reason in FailoverReason
        }
        self._outage = Histogram(
            f"{p}_outage",
            "Seconds from losing an upstream leg to the restored session (or to giving up).",
            ["outcome"],
            unit="seconds",
            buckets=OUTAGE_BUCKETS,
            registry=r,
        )
        self._outages = {o: self._outage.labels(o) for o in OutageOutcome}
        self._window_full = Counter(
            f"{p}_window_full",
            "Times a confirmation window filled up and the session stopped reading its app.",
            registry=r,
        )
        self._receipt_rtt = Histogram(
            f"{p}_receipt_roundtrip",
            "Seconds from sending a frame with a receipt request upstream to its RECEIPT.",
            unit="seconds",
            buckets=RECEIPT_BUCKETS,
            registry=r,
        )
        self._replayed = Counter(
            f"{p}_replayed_frames",
            "Unconfirmed frames sent again to a new upstream leg after a reconnect.",
            registry=r,
        )
        self._duplicates = Counter(
            f"{p}_duplicates_suppressed",
            "Messages recognised as redeliveries or duplicates and not shown to the app again.",
            registry=r,
        )
        self._transactions = Counter(
            f"{p}_transactions",
            "App transactions by outcome (committed, replayed, rolled_back, in_doubt).",
            ["outcome"],
            registry=r,
        )
        self._transaction = {o: self._transactions.labels(o) for o in TransactionOutcome}
        self._lost = Counter(
            f"{p}_lost_frames",
            "Frames the broker never confirmed and the sidecar could not replay "
            "(reported to the app in its DISCONNECT event).",
            registry=r,
        )
        self._client_errors = Counter(
            f"{p}_client_protocol_errors",
            "App frames or sessions refused for the app's own fault, by reason.",
            ["reason"],
            registry=r,
        )
        self._client_error = {e: self._client_errors.labels(e) for e in ClientErrorReason}

        # -- admin plane ----------------------------------------------------------------------
        self._sse_dropped = Counter(
            f"{p}_sse_clients_dropped",
            "GET /events readers disconnected for being too slow.",
            registry=r,
        )
        self._http = Counter(
            f"{p}_admin_http_requests",
            "Requests answered by the admin plane, by endpoint and status code.",
            ["endpoint", "code"],
            registry=r,
        )

    # -- hot path -------------------------------------------------------------------------

    def frame_to_broker(self, command: Command, body_bytes: int) -> None:
        """One frame relayed from the app to the broker (``body_bytes`` = ``len(frame.body)``).

        Count only frames relayed for the app, not the sidecar's own (replays are counted by
        :meth:`frames_replayed`, restores and goodbyes not at all).
        """
        cell = self._to_broker[command]
        cell[0] += 1
        cell[1] += body_bytes

    def frame_to_app(self, command: Command, body_bytes: int) -> None:
        """One frame relayed from the broker to the app (``body_bytes`` = ``len(frame.body)``)."""
        cell = self._to_app[command]
        cell[0] += 1
        cell[1] += body_bytes

    # -- upstream legs ----------------------------------------------------------------------

    def connect_attempt(self, broker: str, outcome: ConnectOutcome) -> None:
        """One ``open_upstream`` attempt by a session (first connect or reconnect) ended."""
        child = self._connect.get((broker, outcome))
        if child is None:  # a broker not in the configuration: still bounded by the caller
            child = self._connect[broker, outcome] = self._connect_attempts.labels(broker, outcome)
        child.inc()

    def probe(self, broker: str, outcome: ProbeOutcome) -> None:
        """One readiness probe of ``broker`` ended (admin plane only)."""
        child = self._probe.get((broker, outcome))
        if child is None:
            child = self._probe[broker, outcome] = self._probes.labels(broker, outcome)
        child.inc()

    # -- failover ---------------------------------------------------------------------------

    def failover(self, from_broker: str, to_broker: str, reason: FailoverReason) -> None:
        """A session now runs on ``to_broker`` after losing (or leaving) ``from_broker``."""
        self._failovers.labels(from_broker, to_broker, reason).inc()

    def reattach(self, broker: str, reason: FailoverReason) -> None:
        """A session was restored on the broker it had lost."""
        child = self._reattach.get((broker, reason))
        if child is None:
            child = self._reattach[broker, reason] = self._reattaches.labels(broker, reason)
        child.inc()

    def outage(self, seconds: float, outcome: OutageOutcome) -> None:
        """An outage ended: ``seconds`` from the loss of the leg to ``outcome``."""
        self._outages[outcome].observe(seconds)

    def window_full(self) -> None:
        """A confirmation window became full; the session stops reading its app."""
        self._window_full.inc()

    def receipt_roundtrip(self, seconds: float) -> None:
        """A RECEIPT arrived ``seconds`` after the frame that asked for it was written."""
        self._receipt_rtt.observe(seconds)

    def frames_replayed(self, count: int) -> None:
        """``count`` unconfirmed frames were sent again on a new leg."""
        self._replayed.inc(count)

    def duplicates_suppressed(self, count: int = 1) -> None:
        """``count`` messages were recognised as already seen and hidden from the app."""
        self._duplicates.inc(count)

    def transaction(self, outcome: TransactionOutcome, count: int = 1) -> None:
        """``count`` app transactions ended as ``outcome``."""
        self._transaction[outcome].inc(count)

    def frames_lost(self, count: int) -> None:
        """``count`` frames were never confirmed and could not be replayed."""
        self._lost.inc(count)

    def client_protocol_error(self, reason: ClientErrorReason) -> None:
        """An app frame is refused, or its session ended, for the app's own fault."""
        self._client_error[reason].inc()

    # -- admin plane ------------------------------------------------------------------------

    def sse_dropped(self) -> None:
        """A ``GET /events`` reader was disconnected for being too slow."""
        self._sse_dropped.inc()

    def http_request(self, endpoint: str, code: int) -> None:
        """The admin plane answered a request (``endpoint`` from a fixed set, see admin.py)."""
        self._http.labels(endpoint, str(code)).inc()


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
        self.sessions_accepted = CounterMetricFamily(
            f"{p}_sessions_accepted", "App connections accepted since start."
        )
        self.upstream_connected = GaugeMetricFamily(
            f"{p}_upstream_connected",
            "Live upstream legs (one per connected session) per broker.",
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

    Window occupancy is ``SessionStatistics.window`` (a :class:`~proxy.window.WindowStatistics`).
    """

    def __init__(self, sidecar: Sidecar, admin: AdminServer | None = None) -> None:
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
        per_broker = dict.fromkeys((b.label for b in sidecar.config.brokers), 0)
        window_frames = window_bytes = window_max = 0
        for s in stats.sessions:
            states[s.state] = states.get(s.state, 0) + 1
            if s.broker is not None and s.state != "reconnecting":
                per_broker[s.broker] = per_broker.get(s.broker, 0) + 1
            if s.window is not None:
                window_frames += s.window.frames
                window_bytes += s.window.bytes
                window_max = max(window_max, s.window.bytes)
        for state, n in states.items():
            f.sessions.add_metric([state], n)
        f.sessions_accepted.add_metric([], stats.sessions_total)
        for broker, n in per_broker.items():
            f.upstream_connected.add_metric([broker], n)
        f.window_frames.add_metric([], window_frames)
        f.window_bytes.add_metric([], window_bytes)
        f.window_bytes_max.add_metric([], window_max)
        f.window_limit.add_metric([], sidecar.config.confirmation_window_size)
        f.reconnects.add_metric([], states["reconnecting"])

        for (direction, command), (frames, nbytes) in sidecar.metrics.relayed.items():
            if frames:
                f.relayed_frames.add_metric([direction, command], frames)
                f.relayed_bytes.add_metric([direction, command], nbytes)

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


def iter_metric_names(registry: CollectorRegistry) -> Iterator[str]:
    """Names of every family in ``registry`` (for tests and the README check)."""
    for family in registry.collect():
        yield family.name
