"""The drill's series and its throughput: the publish's cumulative SENDs and every message's
arrival (:class:`Timeline`), and messages per second before, during and after the faults
(:func:`throughput`; the windows in :mod:`pipeline.report`). Times are seconds since the
publish started, rates messages per second."""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

__all__ = [
    "Throughput",
    "Timeline",
    "mean_rate",
    "per_second",
    "reached_at",
    "rounded",
    "throughput",
]


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

    ``published``: ``(t, cumulative SENDs)`` samples (relayed by the sidecar; with the
    outbox, the app's own, see :mod:`pipeline.report`); ``consumed``: arrival time of every
    message the app received (sorted); ``publish_end`` / ``drain_end``: t of the end of each
    phase; ``outages``: ``(start, end)`` of each fault's outage; ``outbox``: ``(t, frames,
    bytes)`` samples of the producer sidecar's outbox depth (empty without the outbox);
    ``fault_kind``: what the kills were (a key of :data:`pipeline.report.records.FAULT_KINDS`);
    ``kill_kinds``: each kill's own kind where they differ (the RabbitMQ cluster's node kill
    and rolling restart; empty: every kill is ``fault_kind``); ``driver_kills``: ``(t of the
    SIGKILL, t when the restarted driver's query ran)`` of each kill of the streaming
    consumer's Spark driver (``--consumer spark``/``spark-stream``; the second None when it
    never ran again).
    """

    published: list[tuple[float, float]] = field(default_factory=list)
    consumed: list[float] = field(default_factory=list)
    publish_end: float = 0.0
    drain_end: float = 0.0
    kills: list[float] = field(default_factory=list)
    outages: list[tuple[float, float]] = field(default_factory=list)
    outbox: list[tuple[float, float, float]] = field(default_factory=list)
    fault_kind: str = "broker"
    kill_kinds: list[str] = field(default_factory=list)
    driver_kills: list[tuple[float, float | None]] = field(default_factory=list)

    def kind_of(self, i: int) -> str:
        """The kind of kill ``i`` (and of its outage)."""
        return self.kill_kinds[i] if i < len(self.kill_kinds) else self.fault_kind

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

    def sends_done(self) -> float:
        """t of the first sample at the publish's final count: the app had handed over its
        last SEND (the publish ends later, once that is confirmed and the tasks closed)."""
        final = max((n for _, n in self.published), default=0.0)
        return next((t for t, n in self.published if n >= final), self.publish_end)

    def longest_stall(self, start: float, end: float) -> float:
        """The longest time within ``[start, end]`` in which the publish count did not grow
        while the app still had SENDs to make (clipped to :meth:`sends_done`: a task waiting
        for its last receipts or its DISCONNECT is not a stall), seconds; from the samples: a
        stall shorter than the sampling interval does not show."""
        end = min(end, self.publish_end, self.sends_done())
        if end <= start:
            return 0.0
        longest = 0.0
        last_growth = start
        previous: float | None = None
        for t, n in self.published:
            if previous is not None and n > previous:
                if t > start:
                    longest = max(longest, min(t, end) - last_growth)
                last_growth = max(start, t)
            previous = n
            if t >= end:
                break
        return max(longest, end - last_growth)

    def outbox_frames(self) -> list[int]:
        """The outbox's depth (frames) at the end of each second of the drill (the last
        sample at or before it; 0 before the first), up to the drain's end; empty without
        outbox samples."""
        if not self.outbox:
            return []
        times = [s[0] for s in self.outbox]
        depth = []
        for second in range(max(1, math.ceil(self.drain_end))):
            i = bisect.bisect_right(times, second + 1.0)
            depth.append(round(self.outbox[i - 1][1]) if i else 0)
        return depth

    def to_dict(self) -> dict[str, object]:
        """Per-second rates (messages in second ``i``, the last one partial), kills and
        outages, the Spark driver's kills and restarts, and the outbox's depth per second
        (None without the outbox), for the JSON report."""
        return {
            "publish_per_second": [
                round(v) for v in per_second(self.published_at, self.publish_end)[1]
            ],
            "consume_per_second": [
                round(v) for v in per_second(self.consumed_at, self.drain_end)[1]
            ],
            "publish_end": round(self.publish_end, 3),
            "drain_end": round(self.drain_end, 3),
            "kills": [round(t, 3) for t in self.kills],
            "outages": [[round(a, 3), round(b, 3)] for a, b in self.outages],
            "peak_backlog": self.peak_backlog(),
            "fault_kind": self.fault_kind,
            "kill_kinds": [self.kind_of(i) for i in range(len(self.kills))],
            "driver_kills": [
                [round(t, 3), None if back is None else round(back, 3)]
                for t, back in self.driver_kills
            ],
            "outbox_frames_per_second": self.outbox_frames() if self.outbox else None,
        }


def mean_rate(
    count_at: Callable[[float], float], windows: Sequence[tuple[float, float]]
) -> float | None:
    """Messages per second over ``windows`` (``(start, end)`` in seconds; empty ones skipped),
    counted by ``count_at(t)`` (cumulative messages at ``t``); None when they span no time."""
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
    """Publish (``which="publish"``) or consume throughput of ``timeline``, msg/s: overall
    and, when there were kills, before, during and after them (windows in
    :mod:`pipeline.report`)."""
    if which == "publish":
        count_at, end = timeline.published_at, timeline.publish_end
    else:
        count_at, end = timeline.consumed_at, timeline.drain_end
    before, during, after = _windows(0.0, end, timeline.kills, timeline.outages)
    overall = mean_rate(count_at, [(0.0, end)]) or 0.0
    return Throughput(
        overall=overall,
        before=mean_rate(count_at, before) if timeline.kills else None,
        during=mean_rate(count_at, during) if timeline.kills else None,
        after=mean_rate(count_at, after) if timeline.kills else None,
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


def rounded(values: dict[str, float | None]) -> dict[str, float | None]:
    """``values`` (rates, msg/s) rounded to 0.1 for the JSON report; None stays None."""
    return {k: None if v is None else round(v, 1) for k, v in values.items()}


def per_second(count_at: Callable[[float], float], end: float) -> tuple[list[float], list[float]]:
    """``(bin centres, messages per second)`` in 1-second bins from 0 to ``end`` (seconds),
    counted by ``count_at(t)`` (cumulative messages at ``t``); the last, partial bin as a
    rate."""
    seconds = max(1, math.ceil(end))
    xs = [float(s) + 0.5 for s in range(seconds)]
    ys = [count_at(min(s + 1.0, end)) - count_at(float(s)) for s in range(seconds)]
    last = end - (seconds - 1)
    if 0 < last < 1:
        ys[-1] = ys[-1] / last  # the last, partial second as a rate
    return xs, ys
