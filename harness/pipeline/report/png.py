"""The drill's timeline as a PNG (``--png``), drawn with matplotlib's Agg backend (no display
needed): messages per second of publish and consume in 1-second bins, each kill as a vertical
line, each outage shaded (a rolling restart in purple, from its start to its end); each kill
of the streaming consumer's Spark driver (``--consumer spark``/``spark-stream``) the same way
in orange, shaded until the restarted driver's query ran; the baseline's publish and consume,
when there is one, as dashed lines on the same axes; with the outbox, a lower panel shows its
depth (frames) over the same seconds."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.report.records import FAULT_KINDS
from pipeline.report.timeline import Timeline, per_second

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["DRIVER_KILL", "DRIVER_RESTART", "draw", "write_png"]

#: The legend's labels of a kill of the streaming consumer's Spark driver and of the time until
#: the restarted driver's query ran (:attr:`Timeline.driver_kills`).
DRIVER_KILL = "kill -9 of the Spark driver"
DRIVER_RESTART = "Spark driver restarting (until its query runs again)"


def write_png(path: Path, timeline: Timeline, title: str, baseline: Timeline | None = None) -> None:
    """Draw the timeline (module docstring), and the ``baseline``'s if given, into ``path``
    (PNG, ~1200x500 px; ~1200x700 px with a lower panel of the outbox's depth in frames
    when ``timeline.outbox`` has samples)."""
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig = draw(timeline, title, baseline)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, format="png")
    finally:
        plt.close(fig)


def draw(timeline: Timeline, title: str, baseline: Timeline | None = None) -> Figure:
    """The figure :func:`write_png` saves (its first axes the rates, a second one the outbox's
    depth); the caller closes it (``matplotlib.pyplot.close``)."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

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
            xs, ys = per_second(run.published_at, run.publish_end)
            publish = "publish (SENDs relayed by the sidecar)" if not suffix else "publish"
            if not suffix and run.outbox:
                publish = "publish (the app's SENDs into the outbox)"
            ax.step(xs, ys, where="mid", label=publish + suffix, color="C0", ls=style, alpha=alpha)
            xs, ys = per_second(run.consumed_at, run.drain_end)
            consume = "consume (messages the app received)" if not suffix else "consume"
            ax.step(xs, ys, where="mid", label=consume + suffix, color="C2", ls=style, alpha=alpha)
        for axes in (ax, low):
            if axes is None:
                continue
            first = axes is ax
            labelled: set[str] = set()
            for i, (start, end) in enumerate(timeline.outages):
                kind = timeline.kind_of(i)
                label = _label(kind, 1) if first and "o" + kind not in labelled else None
                labelled.add("o" + kind)
                axes.axvspan(start, end, color=_color(kind), alpha=0.15, label=label)
            for i, t in enumerate(timeline.kills):
                kind = timeline.kind_of(i)
                label = _label(kind, 0) if first and "k" + kind not in labelled else None
                labelled.add("k" + kind)
                axes.axvline(t, color=_color(kind), linestyle="--", label=label)
            _driver_kills(axes, timeline, labelled=first)
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
    except BaseException:
        plt.close(fig)
        raise
    return fig


def _driver_kills(axes: Axes, timeline: Timeline, *, labelled: bool) -> None:
    """Each kill of the Spark driver as an orange dash-dot line, the time until its restarted
    query ran shaded (to the drain's end when it never ran); in the legend once when
    ``labelled``."""
    for i, (t, back) in enumerate(timeline.driver_kills):
        first = labelled and i == 0
        end = timeline.drain_end if back is None else back
        axes.axvspan(
            t, max(t, end), color=DRIVER_COLOR, alpha=0.12, label=DRIVER_RESTART if first else None
        )
        axes.axvline(t, color=DRIVER_COLOR, linestyle="-.", label=DRIVER_KILL if first else None)


def _label(kind: str, which: int) -> str:
    """The legend's label of a kill (``which`` 0) or an outage (1) of ``kind``."""
    return FAULT_KINDS.get(kind, FAULT_KINDS["broker"])[which]


#: The Spark driver's kills and restarts: apart from the brokers' red and the rolling
#: restart's purple.
DRIVER_COLOR = "darkorange"


def _color(kind: str) -> str:
    """Red for kills; purple for the rolling restart, so that both show apart."""
    return "purple" if kind == "rolling-restart" else "red"
