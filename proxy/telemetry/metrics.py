"""Prometheus metrics of one sidecar: what the session and failover code record (the gauges
read from the live objects at scrape time are in :mod:`proxy.telemetry.gauges`).

Two kinds of metrics, kept apart on purpose (docs/architecture.md, "Metrics read state at
scrape time"):

* **Things that happen** (a connect attempt, a failover, a receipt round trip...) are recorded
  by the code where they happen, through one method of :class:`Metrics` each. The instruments
  live on an app-owned :class:`prometheus_client.CollectorRegistry` (never the global
  ``REGISTRY``: two sidecars in one test process must not share counters).
* **Things that are** (sessions open, legs per broker, window occupancy, reconnects in
  progress) are *not* kept in parallel: :class:`proxy.telemetry.gauges.SidecarCollector` reads
  ``Sidecar.statistics()`` (and the admin plane's prober) when Prometheus scrapes.

Labels are bounded: broker labels come from the configuration (``host:port``), every other
label value from a closed enum below. Session ids, destinations and credentials are never
labels (docs/operations.md, "Metrics").

Hot path. The relay records every frame, and the relay's budget is ≥ 0.95x the throughput of a
direct connection. A ``prometheus_client`` child ``inc()`` takes a lock (~0.35 µs); the
per-frame counters are therefore plain ``int`` cells in a dict pre-built for every
(direction, command) pair, bumped without a lock — everything runs in the one trio thread, and
the scrape, also in that thread, reads them through
:class:`proxy.telemetry.gauges.SidecarCollector`. The rare events use ordinary pre-bound
``prometheus_client`` children.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Histogram

from protocol import Command
from proxy.telemetry.vocabulary import (
    ActionResult,
    AdminAction,
    ClientErrorReason,
    ConnectOutcome,
    DrainResult,
    FailoverReason,
    FrameOutcome,
    OutageOutcome,
    ProbeOutcome,
    RelayDirection,
    TransactionOutcome,
)

__all__ = [
    "Metrics",
]

#: Prefix of every metric this package defines.
PREFIX = "mq_sidecar"

#: Outage buckets, seconds: a reattach on loopback takes tens of ms, a failover to a backup
#: that must first take the store lock 1-10 s (docs/brokers.md, "Takeover and hung brokers"),
#: ``reconnect_period`` is 300 s.
OUTAGE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
#: Receipt round-trip buckets, seconds: sub-millisecond on loopback up to seconds for a
#: persistent SEND on a busy broker.
RECEIPT_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip


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

        # -- hot path: plain int cells, exported by proxy.telemetry.gauges.SidecarCollector ---
        #: ``[frames, body_bytes]`` per (direction, command), read at scrape time.
        self.relayed: dict[tuple[RelayDirection, Command], list[int]] = {
            (d, c): [0, 0] for d in RelayDirection for c in Command
        }
        self._to_broker = {c: self.relayed[RelayDirection.APP_TO_BROKER, c] for c in Command}
        self._to_app = {c: self.relayed[RelayDirection.BROKER_TO_APP, c] for c in Command}

        def counter(name: str, documentation: str, labels: Sequence[str] = ()) -> Counter:
            return Counter(f"{PREFIX}_{name}", documentation, labels, registry=r)

        # -- upstream legs --------------------------------------------------------------------
        self._connect_attempts = counter(
            "upstream_connect_attempts",
            "Attempts to open an upstream STOMP leg, by broker and outcome.",
            ["broker", "outcome"],
        )
        self._connect = _children(self._connect_attempts, self.brokers, ConnectOutcome)
        self._refusal_skips = counter(
            "upstream_refusal_skips",
            "Connection attempts not made: the broker refused the same CONNECT within its "
            "cool-down, by broker.",
            ["broker"],
        )
        self._refusal_skip = {b: self._refusal_skips.labels(b) for b in self.brokers}
        self._probes = counter(
            "broker_probes",
            "Readiness probes of a broker (a STOMP CONNECT by the admin plane), by outcome.",
            ["broker", "outcome"],
        )
        self._probe = _children(self._probes, self.brokers, ProbeOutcome)

        # -- failover -------------------------------------------------------------------------
        self._failovers = counter(
            "failovers",
            "Sessions moved to another broker, by old broker, new broker and reason.",
            ["from_broker", "to_broker", "reason"],
        )
        self._reattaches = counter(
            "reattaches",
            "Sessions restored on the same broker after losing their leg, by reason.",
            ["broker", "reason"],
        )
        self._reattach = _children(self._reattaches, self.brokers, FailoverReason)
        self._outage = Histogram(
            f"{p}_outage",
            "Seconds from losing an upstream leg to the restored session (or to giving up).",
            ["outcome"],
            unit="seconds",
            buckets=OUTAGE_BUCKETS,
            registry=r,
        )
        self._outages = {o: self._outage.labels(o) for o in OutageOutcome}
        self._window_full = counter(
            "window_full",
            "Times a confirmation window filled up and the session stopped reading its app.",
        )
        self._receipt_rtt = Histogram(
            f"{p}_receipt_roundtrip",
            "Seconds from sending a frame with a receipt request upstream to its RECEIPT.",
            unit="seconds",
            buckets=RECEIPT_BUCKETS,
            registry=r,
        )
        self._replayed = counter(
            "replayed_frames",
            "Unconfirmed frames sent again to a new upstream leg after a reconnect.",
        )
        #: The same count as a plain int, for ``/status`` (:meth:`totals`).
        self.replayed_total = 0
        self._duplicates = counter(
            "duplicates_suppressed",
            "Messages recognised as redeliveries or duplicates and not shown to the app again.",
        )
        self._stream_gap = counter(
            "stream_offsets_missed",
            "Offsets of stream subscriptions a resumed leg skipped because retention had "
            "removed them (each range named to the app in a STREAM_GAP event).",
        )
        self._transactions = counter(
            "transactions",
            "App transactions by outcome (committed, replayed, rolled_back, in_doubt).",
            ["outcome"],
        )
        self._transaction = {o: self._transactions.labels(o) for o in TransactionOutcome}
        self._lost = counter(
            "lost_frames",
            "Frames the broker never confirmed and the sidecar could not replay "
            "(reported to the app in its DISCONNECT event).",
        )
        self._frame_outcomes = counter(
            "frame_outcomes",
            "App frames that did not end plainly confirmed, by outcome (each named to its app "
            "by receipt id and mq-sidecar-id in an OUTCOME event).",
            ["outcome"],
        )
        self._frame_outcome = {o: self._frame_outcomes.labels(o) for o in FrameOutcome}
        self._drains = counter(
            "drains",
            "Sessions drained on SIGTERM, by result: completed (everything confirmed before "
            "drain_timeout) or deadline (something still unconfirmed, named to the app).",
            ["result"],
        )
        self._drain = {r: self._drains.labels(r) for r in DrainResult}
        self._client_errors = counter(
            "client_protocol_errors",
            "App frames or sessions refused for the app's own fault, by reason.",
            ["reason"],
        )
        self._client_error = {e: self._client_errors.labels(e) for e in ClientErrorReason}
        self._sessions_refused = counter(
            "sessions_refused",
            "App connections refused because max_sessions sessions were open.",
        )
        self._outbox_forwarded = counter(
            "outbox_forwarded",
            "Frames forwarded from the outbox, confirmed by a broker and removed from it.",
        )
        self._outbox_expired = counter(
            "outbox_expired",
            "Frames dropped from the outbox unforwarded: older than outbox_max_age.",
        )

        # -- admin plane ----------------------------------------------------------------------
        self._sse_dropped = counter(
            "sse_clients_dropped",
            "GET /events readers disconnected for being too slow.",
        )
        self._http = counter(
            "admin_http_requests",
            "Requests answered by the admin plane, by endpoint and status code.",
            ["endpoint", "code"],
        )
        self._unauthorized = counter(
            "admin_unauthorized",
            "Admin plane requests refused with 401: no or a wrong bearer token (admin_token_file).",
        )
        self._actions = counter(
            "admin_actions",
            "Actions asked of the admin plane (POST /actions/...), by action and result.",
            ["action", "result"],
        )
        self._action = _children(self._actions, AdminAction, ActionResult)

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

    def totals(self) -> dict[str, int]:
        """Counters since start for ``/status``'s ``totals`` (the admin page's rate charts
        sample them): ``sends`` (SEND frames relayed app to broker), ``messages`` (MESSAGE
        frames relayed broker to app), ``replayed_frames`` (sent again after a reconnect)."""
        return {
            "sends": self._to_broker[Command.SEND][0],
            "messages": self._to_app[Command.MESSAGE][0],
            "replayed_frames": self.replayed_total,
        }

    # -- upstream legs ----------------------------------------------------------------------

    def add_broker(self, broker: str) -> None:
        """A broker joined the list at run time: its children now, so it shows zeros before
        its first event, as a configured one does."""
        if broker in self.brokers:
            return
        self.brokers = (*self.brokers, broker)
        for outcome in ConnectOutcome:
            self._connect.setdefault(
                (broker, outcome), self._connect_attempts.labels(broker, outcome)
            )
        for probe in ProbeOutcome:
            self._probe.setdefault((broker, probe), self._probes.labels(broker, probe))
        for reason in FailoverReason:
            self._reattach.setdefault((broker, reason), self._reattaches.labels(broker, reason))
        self._refusal_skip.setdefault(broker, self._refusal_skips.labels(broker))

    def connect_attempt(self, broker: str, outcome: ConnectOutcome) -> None:
        """One ``open_upstream`` attempt by a session (first connect or reconnect) ended."""
        child = self._connect.get((broker, outcome))
        if child is None:  # a broker not in the configuration: still bounded by the caller
            child = self._connect[broker, outcome] = self._connect_attempts.labels(broker, outcome)
        child.inc()

    def refusal_skip(self, broker: str) -> None:
        """A session skipped ``broker``: it refused the same CONNECT within its cool-down
        (proxy.reconnect.walk); its refusal stood as its answer."""
        child = self._refusal_skip.get(broker)
        if child is None:  # a broker not in the configuration: still bounded by the caller
            child = self._refusal_skip[broker] = self._refusal_skips.labels(broker)
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
        self.replayed_total += count

    def duplicates_suppressed(self, count: int = 1) -> None:
        """``count`` messages were recognised as already seen and hidden from the app."""
        self._duplicates.inc(count)

    def stream_offsets_missed(self, count: int) -> None:
        """A stream subscription resumed past ``count`` offsets no longer in the stream."""
        self._stream_gap.inc(count)

    def transaction(self, outcome: TransactionOutcome, count: int = 1) -> None:
        """``count`` app transactions ended as ``outcome``."""
        self._transaction[outcome].inc(count)

    def frames_lost(self, count: int) -> None:
        """``count`` frames were never confirmed and could not be replayed."""
        self._lost.inc(count)

    def frame_outcome(self, outcome: FrameOutcome, count: int = 1) -> None:
        """``count`` app frames ended as ``outcome`` (and were named to their app)."""
        self._frame_outcome[outcome].inc(count)

    def drain(self, result: DrainResult) -> None:
        """A session's drain on SIGTERM ended with ``result``."""
        self._drain[result].inc()

    def client_protocol_error(self, reason: ClientErrorReason) -> None:
        """An app frame is refused, or its session ended, for the app's own fault."""
        self._client_error[reason].inc()

    def session_refused(self) -> None:
        """An app connection was refused: ``max_sessions`` sessions were open."""
        self._sessions_refused.inc()

    def outbox_forwarded(self, count: int) -> None:
        """``count`` outbox frames were confirmed by a broker and removed from the outbox."""
        self._outbox_forwarded.inc(count)

    def outbox_expired(self, count: int) -> None:
        """``count`` outbox frames were older than ``outbox_max_age`` and dropped."""
        self._outbox_expired.inc(count)

    # -- admin plane ------------------------------------------------------------------------

    def sse_dropped(self) -> None:
        """A ``GET /events`` reader was disconnected for being too slow."""
        self._sse_dropped.inc()

    def http_request(self, endpoint: str, code: int) -> None:
        """The admin plane answered a request (``endpoint`` from a fixed set, see admin.py)."""
        self._http.labels(endpoint, str(code)).inc()

    def admin_unauthorized(self) -> None:
        """The admin plane refused a request without the admin token (401)."""
        self._unauthorized.inc()

    def admin_action(self, action: AdminAction, result: ActionResult) -> None:
        """An operator's action on the admin plane ended with ``result``."""
        self._action[action, result].inc()


def _children(metric: Counter, *label_values: Iterable[str]) -> dict[tuple[str, ...], Counter]:
    """The children of ``metric`` for every combination of ``label_values`` (one iterable
    per label, in label order), created up front so every series shows zeros before its
    first event and recording needs no ``labels()`` call."""
    return {key: metric.labels(*key) for key in itertools.product(*label_values)}


def iter_metric_names(registry: CollectorRegistry) -> Iterator[str]:
    """Names of every family in ``registry`` (for tests and the docs check)."""
    for family in registry.collect():
        yield family.name
