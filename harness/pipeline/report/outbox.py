"""The producer sidecar's outbox over the drill (``--outbox``, issue 17): its depth summed up
(:class:`OutboxSummary`, the report's ``outbox``) and what fails a drill with the outbox
beyond loss and duplicates (:func:`outbox_errors`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from pipeline.report.records import FaultRecord
from pipeline.report.timeline import Timeline

__all__ = ["STALL_LIMIT", "OutboxSummary", "outbox_errors", "outbox_summary"]

#: Seconds without a SEND of the app while every broker is down that fail a drill with the
#: outbox (:func:`outbox_errors`): the outbox should take the SENDs at once.
STALL_LIMIT = 5.0


@dataclass(frozen=True)
class OutboxSummary:
    """The producer sidecar's outbox over the drill (``--outbox``; the report's ``outbox``).

    ``directory``: its ``outbox_dir``; ``peak_frames`` / ``peak_bytes``: the most it held
    at any sample (frames; frame bytes), ``peak_at`` t of the frames' peak (None: no sample);
    ``emptied_at``: t of the first sample at 0 frames after the last non-empty one (when the
    outbox had drained to the brokers; None if it never held anything, or still held frames
    at the last sample); ``final_frames``: what it held at the end of the drain (the producer
    sidecar's ``/status``; None when it did not answer); ``forwarded_total``: frames the
    (last) producer sidecar forwarded and had confirmed since its start; ``recovered_frames``:
    frames the (last) producer sidecar found in ``outbox_dir`` when it started (after a
    ``--kill-sidecar``: what the killed one left); ``samples``: depth samples taken.
    """

    directory: str
    peak_frames: int
    peak_bytes: int
    peak_at: float | None
    emptied_at: float | None
    final_frames: int | None
    forwarded_total: int | None
    recovered_frames: int | None
    samples: int

    @property
    def drained(self) -> bool:
        """Empty at the end of the drain (by ``/status``, else by the last sample)."""
        if self.final_frames is not None:
            return self.final_frames == 0
        return self.peak_frames == 0 or self.emptied_at is not None

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (the report's ``outbox``), with ``drained``."""
        values = asdict(self)
        values["peak_at"] = None if self.peak_at is None else round(self.peak_at, 3)
        values["emptied_at"] = None if self.emptied_at is None else round(self.emptied_at, 3)
        values["drained"] = self.drained
        return values

    def describe(self) -> str:
        """One line for the text report."""
        peak = f"peak {self.peak_frames:,} frame(s) / {self.peak_bytes:,} bytes"
        if self.peak_at is not None and self.peak_frames:
            peak += f" at t={self.peak_at:.1f} s"
        if self.emptied_at is not None:
            peak += f", empty again at t={self.emptied_at:.1f} s"
        final = "?" if self.final_frames is None else f"{self.final_frames:,}"
        extra = [f"{final} frame(s) left at the end"]
        if self.forwarded_total is not None:
            extra.append(f"{self.forwarded_total:,} forwarded by the last producer sidecar")
        if self.recovered_frames:
            extra.append(f"{self.recovered_frames:,} recovered from {self.directory} at its start")
        return f"{peak}; " + ", ".join(extra)


def outbox_summary(
    timeline: Timeline, directory: str, status: dict[str, Any] | None
) -> OutboxSummary:
    """Summarise ``timeline.outbox`` and the producer sidecar's ``/status`` ``outbox`` object
    at the end (``status``: None when it did not answer; keys ``frames``,
    ``forwarded_total``, ``recovery.frames``, each optional)."""
    samples = timeline.outbox
    peak_frames = max((round(f) for _, f, _ in samples), default=0)
    peak_bytes = max((round(b) for _, _, b in samples), default=0)
    peak_at = next((t for t, f, _ in samples if round(f) == peak_frames), None)
    emptied_at = None
    last_full = max((i for i, (_, f, _) in enumerate(samples) if f > 0), default=None)
    if last_full is not None and last_full + 1 < len(samples):
        emptied_at = samples[last_full + 1][0]
    status = status or {}
    recovery = status.get("recovery")
    return OutboxSummary(
        directory=directory,
        peak_frames=peak_frames,
        peak_bytes=peak_bytes,
        peak_at=peak_at,
        emptied_at=emptied_at,
        final_frames=_int_or_none(status.get("frames")),
        forwarded_total=_int_or_none(status.get("forwarded_total")),
        recovered_frames=_int_or_none(
            recovery.get("frames") if isinstance(recovery, dict) else None
        ),
        samples=len(samples),
    )


def outbox_errors(
    outbox: OutboxSummary, timeline: Timeline, faults: Sequence[FaultRecord]
) -> list[str]:
    """What fails a drill with the outbox beyond loss and duplicates: frames still in the
    outbox after the drain, and an app's publish that stalled for :data:`STALL_LIMIT` seconds
    or more while every broker was down (the outbox is there so that it does not)."""
    errors = []
    if not outbox.drained:
        left = "?" if outbox.final_frames is None else f"{outbox.final_frames:,}"
        errors.append(
            f"the producer sidecar's outbox still held {left} frame(s) after the drain "
            "(never forwarded to a broker)"
        )
    for fault in faults:
        if fault.kind != "all-down":
            continue
        end = fault.restored_at if fault.restored_at is not None else timeline.publish_end
        stall = timeline.longest_stall(fault.at, end)
        if stall >= STALL_LIMIT:
            errors.append(
                f"the app's publish stalled {stall:.1f} s while every broker was down "
                f"(t={fault.at:.1f}-{end:.1f} s): the outbox should have taken its SENDs"
            )
    return errors


def _int_or_none(value: object) -> int | None:
    return int(value) if isinstance(value, int | float) else None
