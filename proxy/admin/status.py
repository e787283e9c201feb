"""The ``/status`` document: the brokers, the sessions, their windows, the outbox and the admin
plane, as JSON for people and scripts (docs/operations.md, "/status"). Never a credential: the
configuration is the redacted one, and its digest lets two pods be compared."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Sequence

import trio

from proxy._version import VERSION
from proxy.admin.actions import evacuation_status
from proxy.admin.health import stuck_for
from proxy.admin.http import format_address
from proxy.telemetry.statistics import BrokerHealth, Readiness, SidecarView

__all__ = ["MAX_STATUS_SESSIONS", "MAX_STATUS_SUBSCRIPTIONS", "status_document"]

#: ``/status`` lists at most this many sessions (a sidecar serves one app: a handful).
MAX_STATUS_SESSIONS = 1000
#: ...and at most this many subscriptions, all sessions together (``subscriptions``).
MAX_STATUS_SUBSCRIPTIONS = 1000


def status_document(
    sidecar: SidecarView,
    *,
    readiness: Readiness,
    probes: Sequence[BrokerHealth],
    admin: dict[str, object],
    admin_address: tuple[str, int] | None,
    started_at: float | None,
) -> dict[str, object]:
    """The ``/status`` document of ``sidecar`` now (JSON-able: ``json.dumps(..., default=str)``).

    Args:
        sidecar: the daemon reported on (statistics, configuration, TLS tracker, event bus).
        readiness: the ``/readyz`` verdict now.
        probes: the broker prober's view of each broker, in broker-list order.
        admin: the admin plane's statistics (``dataclasses.asdict`` of them).
        admin_address: where the admin plane listens, once bound.
        started_at: when the admin plane started serving (trio seconds), for the uptime.
    """
    stats = sidecar.statistics()
    now = trio.current_time()
    config = sidecar.config
    redacted = config.redacted()
    digest = hashlib.sha256(json.dumps(redacted, sort_keys=True).encode()).hexdigest()
    legs: dict[str, int] = {}
    sessions: list[dict[str, object]] = []
    subscriptions: list[dict[str, object]] = []
    window_frames = window_bytes = reconnecting = 0
    for s in stats.sessions:
        if s.broker is not None and s.state != "reconnecting":
            legs[s.broker] = legs.get(s.broker, 0) + 1
        reconnecting += s.state == "reconnecting"
        if s.window is not None:
            window_frames += s.window.frames
            window_bytes += s.window.bytes
        if len(sessions) < MAX_STATUS_SESSIONS:
            entry = dataclasses.asdict(s)
            del entry["per_subscription"]  # listed in ``subscriptions``
            entry["stuck_for_seconds"] = round(stuck_for(s), 3)
            sessions.append(entry)
        for sub in s.per_subscription[: MAX_STATUS_SUBSCRIPTIONS - len(subscriptions)]:
            subscriptions.append({"session_id": s.session_id, **dataclasses.asdict(sub)})

    wall = time.time()

    def age(t: float | None) -> float | None:
        return None if t is None else round(now - t, 3)

    def tls(label: str) -> dict[str, object] | None:
        """A TLS broker's certificate and last failure (None for a plain broker)."""
        record = sidecar.streams.tracker.get(label)
        return None if record is None else record.as_status(wall)

    evacuated = {e.broker: evacuation_status(e, now, wall) for e in sidecar.rotation.evacuations()}
    brokers = [
        {
            "broker": b.broker,
            # None, or why and until when it is out of the rotation (docs/operations.md, Actions)
            "evacuated": evacuated.get(b.broker),
            "state": b.state,
            "sessions": legs.get(b.broker, 0),
            "last_check_age_seconds": age(b.last_check),
            "last_answer_age_seconds": age(b.last_answer),
            "last_outcome": b.last_outcome,
            "detail": b.detail,
            "checks": b.checks,
            "failures": b.failures,
            "tls": tls(b.broker),
        }
        for b in probes
    ]
    return {
        "version": VERSION,
        "config_digest": f"sha256:{digest}",
        "config": redacted,
        "uptime_seconds": age(started_at),
        "ready": readiness.ready,
        "not_ready_reasons": list(readiness.reasons),
        "listen": format_address(*stats.listen) if stats.listen else None,
        "admin_listen": format_address(*admin_address) if admin_address else None,
        "brokers": brokers,
        "broker_list": _broker_list(sidecar, wall),
        "sessions_open": len(stats.sessions),
        "sessions_total": stats.sessions_total,
        "sessions_truncated": len(stats.sessions) > len(sessions),
        "windows": {
            "frames": window_frames,
            "bytes": window_bytes,
            "limit_bytes_per_session": config.confirmation_window_size,
        },
        "reconnects_in_progress": reconnecting,
        # Counters since start, which the admin page samples for its rate charts.
        "totals": sidecar.metrics.totals(),
        # What all sessions hold together against max_memory_bytes (proxy.tracking.budget).
        "memory": dataclasses.asdict(stats.memory) if stats.memory is not None else None,
        # The outbox (None when off): what it holds, how old its oldest frame is, what the
        # store's recovery found at start (docs/outbox.md).
        "outbox": stats.outbox.status() if stats.outbox is not None else None,
        "sessions": sessions,
        # Every session's subscriptions and their state: live, restoring, cancelled by the
        # broker, waiting for its queue (proxy.tracking.health; docs/operations.md).
        "subscriptions": subscriptions,
        "subscriptions_truncated": sum(len(s.per_subscription) for s in stats.sessions)
        > len(subscriptions),
        "events": dataclasses.asdict(sidecar.events.statistics()),
        "admin": admin,
    }


def _broker_list(sidecar: SidecarView, wall: float) -> dict[str, object]:
    """The broker list in force, each broker's source, and the updates not applied (a lookup
    that failed, a brokers file that does not parse: docs/operations.md, "The broker list at
    run time")."""
    stats = sidecar.rotation.discovery.statistics()
    return {
        "in_force": [
            {"broker": label, "source": source}
            for label, source in sidecar.rotation.discovery.sources()
        ],
        "updates": stats.updates,
        "last_change_age_seconds": None
        if stats.last_change is None
        else round(wall - stats.last_change, 3),
        "failed_updates": [
            {"source": f.source, "reason": f.reason, "age_seconds": round(wall - f.since, 3)}
            for f in stats.failed
        ],
    }
