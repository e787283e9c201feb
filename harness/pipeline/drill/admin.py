"""What the drill reads from its sidecars' admin ports after the drain: ``/metrics``
(:func:`metrics_of`), the broker its sessions use (:func:`connected_broker`, for the
RabbitMQ cluster's kills), the live sessions' hidden copies on ``/status``
(:func:`session_totals`), the producer's outbox until it is empty (:func:`outbox_emptied`),
and the monitors' FAILOVER events after the last kill (:func:`wait_failover_events`).
Timeouts are seconds."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from pipeline.faults import Fault
from pipeline.monitor import EventMonitor
from testbed.sidecar import Metrics, SidecarProcess

__all__ = [
    "ReadingNode",
    "connected_broker",
    "metrics_of",
    "outbox_emptied",
    "session_totals",
    "wait_failover_events",
]


def metrics_of(sidecar: SidecarProcess) -> Metrics:
    """One scrape of ``sidecar``'s ``/metrics``; empty if it does not answer (after a
    restart that failed)."""
    try:
        return sidecar.metrics()
    except OSError:
        return {}


def connected_broker(sidecar: SidecarProcess) -> str | None:
    """The broker (``host:port``) most of ``sidecar``'s sessions are connected to now
    (``/status`` ``brokers[].sessions``); None when it does not answer or has no session."""
    try:
        brokers = sidecar.status(timeout=5.0).get("brokers", [])
    except (OSError, ValueError):
        return None
    busiest = max(brokers, key=lambda b: int(b.get("sessions") or 0), default=None)
    if busiest is None or not busiest.get("sessions"):
        return None
    return str(busiest.get("broker"))


#: Messages a session of the consumer's sidecar must have been shown to count as a reading
#: task (:func:`reading_broker`) rather than one of the driver's probes (a probe takes at most
#: one chunk: the tail's, or a single MESSAGE).
READER_MIN_FRAMES = 50


class ReadingNode:
    """The broker (``host:port``) under a reader, for the kill of ``--consumer spark-stream``:
    calling it returns the node that the consumer sidecar's busiest subscribed session (a task
    reading its range; the driver's probes take few messages) is connected to. It looks every
    0.1 s for up to ``timeout`` s (the query's tasks come and go with its batches: on the
    loaded 2-core machine a batch's tasks read for about 4 s of its 4-8 s, and the first batch
    with rows spent 16 s before its tasks subscribed), then takes
    the broker with the most sessions (:func:`connected_broker`; None when there is none).
    :meth:`describe` says which it was, for the fault's record."""

    def __init__(self, sidecar: SidecarProcess, timeout: float = 30.0) -> None:
        self.sidecar = sidecar
        self.timeout = timeout
        #: The messages the chosen reading session had been shown (None: no reader found).
        self.frames: int | None = None

    def __call__(self) -> str | None:
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                sessions = self.sidecar.status(timeout=5.0).get("sessions", [])
            except (OSError, ValueError):
                sessions = []
            reading = [
                s
                for s in sessions
                if s.get("state") == "running"
                and s.get("broker")
                and int(s.get("subscriptions") or 0) > 0
                and int(s.get("frames_to_app") or 0) >= READER_MIN_FRAMES
            ]
            if reading:
                busiest = max(reading, key=lambda s: int(s.get("frames_to_app") or 0))
                self.frames = int(busiest.get("frames_to_app") or 0)
                return str(busiest["broker"])
            if time.monotonic() >= deadline:
                self.frames = None
                return connected_broker(self.sidecar)
            time.sleep(0.1)

    def describe(self) -> str:
        """The node's role, after a call."""
        if self.frames is None:
            return (
                f"no reading task seen within {self.timeout:.0f} s: the node with most of the "
                "consumer sidecar's sessions"
            )
        return f"the node under a reading task ({self.frames:,} messages read on its session)"


def session_totals(sidecar: SidecarProcess) -> dict[str, int]:
    """Duplicates and redeliveries hidden by the live sessions of ``sidecar`` (``/status``;
    keys ``duplicates_hidden``, ``redeliveries_hidden``; 0 when it does not answer)."""
    totals = {"duplicates_hidden": 0, "redeliveries_hidden": 0}
    try:
        status = sidecar.status()
    except (OSError, ValueError):
        return totals
    for session in status.get("sessions", []):
        for key in totals:
            totals[key] += int(session.get(key) or 0)
    return totals


def outbox_emptied(producer: SidecarProcess, timeout: float) -> dict[str, Any] | None:
    """Wait (at most ``timeout`` s, looking every 0.2 s) until ``producer``'s outbox is
    empty; return its last ``/status`` ``outbox`` object (None if it never answered with
    one)."""
    deadline = time.monotonic() + timeout
    last: dict[str, Any] | None = None
    while True:
        try:
            outbox = producer.status(timeout=5.0).get("outbox")
        except (OSError, ValueError):
            outbox = None
        if isinstance(outbox, dict):
            last = outbox
            if not outbox.get("frames"):
                return last
        if time.monotonic() >= deadline:
            return last
        time.sleep(0.2)


def wait_failover_events(
    monitors: Sequence[EventMonitor], faults: Sequence[Fault], timeout: float = 60.0
) -> None:
    """Wait (at most ``timeout`` s) until each of ``monitors``' own sessions reported its
    FAILOVER after the last of ``faults``: the monitors are connected throughout, so each
    fault moves them too. Returns at once without faults."""
    if not faults:
        return
    last = faults[-1].wall
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(
            any(float(e.body.get("timestamp", 0)) >= last for e in m.events("FAILOVER"))
            for m in monitors
        ):
            return
        time.sleep(0.1)
