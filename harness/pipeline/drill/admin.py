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
