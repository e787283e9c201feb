"""The report's notes on the fault modes of issue 17 (``--faults all-down``,
``--kill-sidecar``): what happened around the downtime, in words."""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.report.outbox import OutboxSummary
from pipeline.report.records import FaultRecord
from pipeline.report.timeline import Throughput, Timeline

__all__ = ["fault_notes"]


def fault_notes(
    timeline: Timeline,
    faults: Sequence[FaultRecord],
    publish: Throughput,
    *,
    outbox: OutboxSummary | None,
    retried: int,
    duplicates_hidden: int,
) -> list[str]:
    """What happened around every broker down or the producer's sidecar killed, in words
    for the report's notes: the app's publish rate during the downtime against before it,
    its longest stall, the Spark task attempts retried (``retried``), the outbox's peak and
    drain (``outbox``), the copies the consumer's sidecar hid (``duplicates_hidden``)."""

    def rate(v: float | None) -> str:
        return "-" if v is None else f"{v:,.0f} msg/s"

    notes = []
    for fault in faults:
        if fault.kind in ("broker", "node"):
            continue
        if fault.kind == "rolling-restart":
            notes.append(_rolling_note(timeline, fault))
            continue
        end = fault.restored_at if fault.restored_at is not None else timeline.publish_end
        stall = timeline.longest_stall(fault.at, end)
        retries = f"{retried} Spark task attempt(s) retried after a failure"
        if fault.kind == "all-down":
            text = (
                f"every broker down from t={fault.at:.1f} s until one served again at "
                f"t={end:.1f} s: the app published {rate(publish.during)} meanwhile "
                f"({rate(publish.before)} before), its longest stall with rows still to send "
                f"{stall:.1f} s; {retries}"
            )
            if outbox is None:
                failed = (
                    "no task failed: the downtime stayed under the sidecar's call_timeout"
                    if not retried
                    else "tasks that waited past call_timeout got the sidecar's ERROR and "
                    "Spark ran them again"
                )
                text += (
                    "; without the outbox the writer waits for the brokers' receipts and a new "
                    f"task's CONNECT for a broker ({failed}): that stall is what --outbox removes"
                )
            else:
                text += f"; the outbox peaked at {outbox.peak_frames:,} frame(s)" + (
                    f" and was empty again at t={outbox.emptied_at:.1f} s"
                    if outbox.emptied_at is not None
                    else ""
                )
        else:
            again = "never" if fault.restored_at is None else f"at t={fault.restored_at:.1f} s"
            text = (
                f"the producer's sidecar (pid {fault.pid}) killed at t={fault.at:.1f} s, "
                f"ready again {again} on the same port and outbox_dir; {retries} (the "
                f"writer's connections failed); the consumer's sidecar hid "
                f"{duplicates_hidden:,} copies by mq-sidecar-id"
            )
            if outbox is not None and outbox.recovered_frames is not None:
                text += (
                    f"; the restarted sidecar found {outbox.recovered_frames:,} frame(s) "
                    "in outbox_dir and forwarded them"
                )
        notes.append(text)
    return notes


def _rolling_note(timeline: Timeline, fault: FaultRecord) -> str:
    """The RabbitMQ cluster's rolling restart: when, against the publish's end, and what the
    app received meanwhile (its reader stays subscribed until it ends)."""
    end = fault.restored_at
    if end is None:
        return f"the rolling restart begun at t={fault.at:.1f} s did not end"
    received = timeline.consumed_at(end) - timeline.consumed_at(fault.at)
    publish_end = timeline.publish_end
    when = (
        "the publish ended during it"
        if fault.at <= publish_end <= end
        else f"the publish ended at t={publish_end:.1f} s"
    )
    return (
        f"rolling restart from t={fault.at:.1f} s to t={end:.1f} s ({fault.detail}); {when}; "
        f"the app received {received:,.0f} message(s) meanwhile and its reader stayed "
        "subscribed until the last node was back"
    )
