"""What a publish and drain measured, turned into the report's parts: the timeline from the
sampler's and the reader's series (:func:`timeline_of`), the delivery counts from the
reconciliation (:func:`delivery_fields`), and the report's files, JSON and PNG
(:func:`write_files`). Times are seconds since the publish started."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from pipeline.drill.options import DrillOptions
from pipeline.drill.streaming import DriverKill
from pipeline.faults import FaultInjector, Sampler
from pipeline.report.document import DrillReport
from pipeline.report.png import write_png
from pipeline.report.records import Delivery, FailoverIncident, FaultRecord
from pipeline.report.timeline import Timeline
from pipeline.verify import ConsumingApp, Received, Reconciliation

__all__ = ["delivery_fields", "timeline_of", "write_files"]


def timeline_of(
    *,
    sampler: Sampler,
    reader: ConsumingApp,
    residual: Received,
    faults: FaultInjector,
    incidents: list[FailoverIncident],
    t0: float,
    publish_end: float,
    driver_kills: Sequence[DriverKill] = (),
) -> Timeline:
    """The run's :class:`~pipeline.report.timeline.Timeline`: ``sampler``'s publish and
    outbox samples, the arrivals at ``reader`` and at the ``residual`` check relative to
    ``t0`` (monotonic seconds at the publish's start), the kills of ``faults`` and their
    outages: for a broker (or cluster node) kill the longest session outage of its
    ``incidents`` (else the broker's takeover), for the other kinds until the service was
    back (or ``publish_end``); and the streaming consumer's ``driver_kills`` (their Unix
    times taken to the same t = 0: the wall clock at ``t0``, read now)."""
    wall0 = time.time() - (time.monotonic() - t0)
    consumed = sorted(t - t0 for t in reader.snapshot().arrivals + residual.arrivals)
    kills = [f.at for f in faults.faults]
    outages: list[tuple[float, float]] = []
    for fault in faults.faults:
        if fault.kind not in ("broker", "node"):  # until the service was back (or the end)
            end = fault.restored_at if fault.restored_at is not None else publish_end
            outages.append((fault.at, max(fault.at, end)))
            continue
        longest = max((i.outage_ms_max for i in incidents if i.fault == fault.index), default=None)
        if longest is None:
            longest = fault.takeover_ms or 0
        outages.append((fault.at, fault.at + longest / 1000))
    return Timeline(
        published=list(sampler.samples),
        consumed=consumed,
        publish_end=publish_end,
        drain_end=max(consumed[-1] + 0.001 if consumed else 0.0, publish_end),
        kills=kills,
        outages=outages,
        outbox=list(sampler.outbox_samples),
        fault_kind=faults.kind,
        kill_kinds=[f.kind for f in faults.faults],
        driver_kills=[
            (
                k.at_wall - wall0,
                None if k.running_after_s is None else k.at_wall - wall0 + k.running_after_s,
            )
            for k in driver_kills
        ],
    )


def delivery_fields(
    rows: int, sent: int, result: Reconciliation, residual: Received
) -> dict[str, Any]:
    """The :class:`~pipeline.report.records.Delivery` fields of a run (``rows`` in the
    source, ``sent`` confirmed, the reconciliation's counts, the ``residual`` check's
    messages), as keyword arguments for a report."""
    return asdict(
        Delivery(
            rows=rows,
            sent=sent,
            received=result.received,
            unique=result.unique,
            lost=result.lost,
            duplicates=result.duplicates,
            mismatched=len(result.mismatched),
            unexpected=len(result.unexpected) + result.anonymous,
            residual=residual.total,
        )
    )


def write_files(options: DrillOptions, report: DrillReport, timeline: Timeline) -> None:
    """Draw ``timeline`` (and the baseline's) into ``options.png`` and write ``report`` as
    JSON to ``options.report``, both named in ``report.files``; a PNG that cannot be written
    is an error in the report, a JSON file that cannot be written raises ``OSError``."""
    title = (
        f"mq-sidecar drill{' --outbox' if options.outbox else ''}: {report.rows:,} flights, "
        f"{_faults_title(report.faults)}, lost {report.lost}, duplicates {report.duplicates}"
    )
    for mode, o in report.overhead.items():
        title += f"\n{mode} / direct (no sidecar, no fault): {o.summary()}"
    baseline = report.baseline.timeline if report.baseline is not None else None
    try:
        write_png(options.png, timeline, title, baseline)
        report.files["png"] = str(options.png)
    except (OSError, ValueError) as exc:
        report.errors.append(f"PNG not written: {exc}")
    report.files["report"] = str(options.report)
    report.write_json(options.report)


def _faults_title(faults: list[FaultRecord]) -> str:
    """The faults made, for the PNG's title."""
    if faults and faults[0].kind == "all-down":
        downtime = faults[0].downtime
        return "every broker down" + ("" if downtime is None else f" {downtime:.0f} s")
    if faults and faults[0].kind == "sidecar":
        return "kill -9 of the producer's sidecar"
    kills = sum(1 for f in faults if f.kind != "rolling-restart")
    if any(f.kind == "rolling-restart" for f in faults):
        return f"RabbitMQ cluster: {kills} kill -9 of the connected node, a rolling restart"
    return f"{kills} kill -9"
