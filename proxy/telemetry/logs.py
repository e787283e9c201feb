"""Logging set-up: one line per event, as text or JSON (``--log-format json``).

Credentials never reach a log line: the code logs broker labels (``host:port``) and STOMP
commands, never CONNECT headers, and config objects render secrets as ``***``.

Structured fields. A log call may pass ``extra={"session": id, "broker": label, "event": kind}``;
the JSON format shows them as keys of their own (``session``, ``broker``, ``event``), so a log
shipper can filter on them; the text format has them in the message already.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections import Counter

from proxy.telemetry.events import EventKind, SessionEvent
from proxy.telemetry.vocabulary import FrameOutcome

__all__ = ["STRUCTURED_FIELDS", "JsonFormatter", "configure_logging", "log_session_event"]

#: ``extra=`` keys the JSON format copies into the record's object.
STRUCTURED_FIELDS = ("session", "broker", "event")

_events_log = logging.getLogger("mq_sidecar.events")
#: Frames an OUTCOME event's log line names at most; the rest follow on lines of their own,
#: as many as needed (each frame is named, and no line grows with the window).
OUTCOME_NAMES_PER_LINE = 100


class JsonFormatter(logging.Formatter):
    """Render a record as one JSON object: ts (RFC 3339, UTC), level, logger, message, and the
    :data:`STRUCTURED_FIELDS` given as ``extra``."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        out: dict[str, object] = {
            "ts": f"{ts}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in STRUCTURED_FIELDS:
            value = record.__dict__.get(key)
            if value is not None:
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def configure_logging(level: str, fmt: str) -> None:
    """Send ``mq_sidecar.*`` logs to stderr at ``level`` ("debug"... "error") as ``fmt``."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("mq_sidecar")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


def _event_message(e: SessionEvent) -> str:
    attempts = f"{e.attempts} attempt(s)"
    if e.kind is EventKind.RECONNECTING:
        return (
            f"session {e.session_id}: RECONNECTING: lost broker {e.from_broker or '-'}: {e.reason}"
        )
    if e.kind is EventKind.FAILOVER:
        where = (
            f"reattached to {e.to_broker}"
            if e.reattached
            else f"failed over {e.from_broker or '-'} -> {e.to_broker or '-'}"
        )
        parts = [f"session {e.session_id}: FAILOVER: {where} after {attempts}"]
        if e.outage_ms is not None:
            parts.append(f"outage {e.outage_ms} ms")
        parts.append(f"replayed {e.replayed_frames} frame(s)")
        if e.transactions_replayed:
            parts.append(f"transactions replayed {len(e.transactions_replayed)}")
        if e.transactions_rolled_back:
            parts.append(f"transactions rolled back {len(e.transactions_rolled_back)}")
        if e.redeliveries_hidden:
            parts.append(f"redeliveries hidden {e.redeliveries_hidden}")
        if e.frames_lost:
            parts.append(f"frames lost {len(e.frames_lost)}")
        return ", ".join(parts) + f" ({e.reason})"
    if e.kind is EventKind.STREAM_GAP:
        ranges = "; ".join(
            f"subscription {sub!r} to {dest}: offsets {first}..{last}"
            for sub, dest, first, last in e.offsets_missed
        )
        return (
            f"session {e.session_id}: STREAM_GAP: {e.offsets_missed_count} offset(s) no longer "
            f"in the stream, never shown ({ranges}) on {e.to_broker or '-'}: {e.reason}"
        )
    if e.kind is EventKind.SPOOLING:
        return (
            f"session {e.session_id}: SPOOLING: no broker up, SENDs stored in the outbox "
            f"({e.spooled_frames} of the session's, outbox {e.outbox_frames} frame(s), "
            f"{e.outbox_bytes} of {e.outbox_max_bytes} bytes): {e.reason}"
        )
    if e.kind is EventKind.SPOOL_DRAINED:
        return (
            f"session {e.session_id}: SPOOL_DRAINED: {e.forwarded_frames} stored frame(s) "
            f"forwarded to {e.to_broker or '-'} after {e.spooled_ms} ms: {e.reason}"
        )
    if e.kind is EventKind.OUTBOX_FORWARDING:
        return (
            f"session {e.session_id}: OUTBOX_FORWARDING: {e.stored_frames} stored frame(s) "
            f"to {e.to_broker or '-'} by the outbox forwarder: {e.reason}"
        )
    if e.kind is EventKind.OUTBOX_FORWARDED:
        refused = f", {len(e.frames)} refused by the broker" if e.frames else ""
        return (
            f"session {e.session_id}: OUTBOX_FORWARDED: {e.forwarded_frames} stored frame(s) "
            f"forwarded to {e.to_broker or '-'} in {e.spooled_ms} ms{refused}: {e.reason}"
        )
    lost = f"; {len(e.frames_lost)} frame(s) never confirmed" if e.frames_lost else ""
    return (
        f"session {e.session_id}: DISCONNECT from {e.from_broker or '-'} after {attempts}: "
        f"{e.reason}{lost}"
    )


def _outcome_lines(e: SessionEvent) -> list[str]:
    """An OUTCOME event's lines: the counts by outcome and the first frames' names, then the
    other frames' names, :data:`OUTCOME_NAMES_PER_LINE` a line."""
    counts = Counter(str(f.outcome) for f in e.frames)
    by_outcome = ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items()))
    names = [f.describe() for f in e.frames]
    step = OUTCOME_NAMES_PER_LINE
    head = f"session {e.session_id}: OUTCOME: {len(names)} frame(s) ({by_outcome}): {e.reason}"
    lines = []
    for start in range(0, len(names), step):
        chunk = ", ".join(names[start : start + step])
        if start == 0:
            lines.append(f"{head}: {chunk}")
        else:
            lines.append(f"session {e.session_id}: OUTCOME (continued): {chunk}")
    return lines or [head]


def log_session_event(event: SessionEvent) -> None:
    """Log one session event on ``mq_sidecar.events`` (with session and broker): one line,
    or for an OUTCOME event naming many frames, one line per :data:`OUTCOME_NAMES_PER_LINE`.

    RECONNECTING is a warning, FAILOVER (the session runs again) info, DISCONNECT an error,
    SPOOLING and STREAM_GAP warnings, SPOOL_DRAINED, OUTBOX_FORWARDING and OUTBOX_FORWARDED info;
    OUTCOME is info when every frame was replayed, else a warning.
    """
    kind = event.kind
    if kind is EventKind.OUTCOME:
        replayed = all(f.outcome is FrameOutcome.REPLAYED for f in event.frames)
        level = logging.INFO if replayed else logging.WARNING
        lines = _outcome_lines(event)
    else:
        level = {
            EventKind.RECONNECTING: logging.WARNING,
            EventKind.FAILOVER: logging.INFO,
            EventKind.DISCONNECT: logging.ERROR,
            EventKind.SPOOLING: logging.WARNING,
            EventKind.SPOOL_DRAINED: logging.INFO,
            EventKind.OUTBOX_FORWARDING: logging.INFO,
            EventKind.OUTBOX_FORWARDED: logging.INFO,
            EventKind.STREAM_GAP: logging.WARNING,
        }[kind]
        lines = [_event_message(event)]
    broker = (
        event.to_broker
        if kind
        in (
            EventKind.FAILOVER,
            EventKind.STREAM_GAP,
            EventKind.SPOOL_DRAINED,
            EventKind.OUTBOX_FORWARDING,
            EventKind.OUTBOX_FORWARDED,
        )
        else event.from_broker
    )
    for line in lines:
        _events_log.log(
            level,
            "%s",
            line,
            extra={"session": event.session_id, "broker": broker, "event": str(kind)},
        )
