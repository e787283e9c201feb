"""The baseline (``--baseline``) in the report: the run straight to the broker
(:class:`BaselineReport`) and each mode's rates as a share of its rates (:class:`Overhead`,
:func:`overhead`; the windows in :mod:`pipeline.report`). Rates are messages per second."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from pipeline.report.records import Delivery
from pipeline.report.timeline import Throughput, Timeline, mean_rate, reached_at, rounded

__all__ = ["BaselineReport", "Overhead", "Ratio", "overhead"]


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
            mean_rate(timeline.published_at, [(0.0, end)]),
            mean_rate(timeline.consumed_at, [(0.0, end)]),
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
            **rounded({"direct": self.direct, "through": self.through}),
            "ratio": None if ratio is None else round(ratio, 3),
        }


@dataclass(frozen=True)
class Overhead:
    """A mode's publish and consume rates as shares of the baseline's (:mod:`pipeline.report`).

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
