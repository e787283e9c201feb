"""One publish and its drain, as the drill runs them through the sidecars and the baseline
straight to the broker: the Spark job publishes while the reader drains and the sampler
follows both (and makes the planned faults), then the reader waits until the queue is quiet
and a fresh session looks for leftovers. Times are monotonic seconds (``t0``) or seconds
since it (``end``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipeline.drill.context import DrillContext
from pipeline.faults import Sampler
from pipeline.verify import ConsumingApp, Reader, Received

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from pipeline.publish import PublishSettings

__all__ = ["Drained", "Published", "drain", "publish", "residual", "split_residual"]


@dataclass
class Published:
    """What :func:`publish` did: ``t0``, monotonic seconds at its start (the timeline's
    t = 0); ``end``, seconds after ``t0`` when the Spark job returned; ``sent``, rows the
    writer published and had confirmed (0 when the job failed); ``errors``: the job's
    failure, if it failed."""

    t0: float
    end: float
    sent: int
    errors: list[str]


@dataclass
class Drained:
    """What :func:`drain` found: ``residual``, what a fresh session still found on the queue
    (should be nothing); ``errors``: the drain stopping before every row came."""

    residual: Received
    errors: list[str]


def publish(
    ctx: DrillContext,
    df: DataFrame,
    rows: int,
    settings: PublishSettings,
    sampler: Sampler,
    *,
    group: str,
    prefix: str = "",
) -> Published:
    """Start ``sampler`` (and its fault injector's clock) and write the ``rows`` rows of
    ``df`` with ``settings`` (:func:`pipeline.publish.stomp_write`, in Spark job group
    ``group``), timed as phase ``<prefix>publish``; a failed Spark job is an error, not an
    exception (the rows are still reconciled)."""
    from pipeline.publish import stomp_write  # noqa: PLC0415

    errors: list[str] = []
    t0 = time.monotonic()
    sampler.t0 = sampler.faults.t0 = t0
    sampler.start()
    sent = 0
    with ctx.phase(f"{prefix}publish"):
        try:
            stomp_write(df, settings, group=group)
            sent = rows
        except Exception as exc:  # the Spark job failed: report it, still reconcile
            errors.append(f"publish failed: {type(exc).__name__}: {_first_line(exc)}")
    end = time.monotonic() - t0
    sampler.sample()
    return Published(t0, end, sent, errors)


def drain(
    ctx: DrillContext,
    reader: ConsumingApp,
    rows: int,
    sampler: Sampler,
    *,
    prefix: str = "",
    before_close: Callable[[], None] | None = None,
    check_residual: bool = True,
) -> Drained:
    """Wait until ``reader`` has ``rows`` rows or nothing came for the options'
    :meth:`~pipeline.drill.options.DrillOptions.drain_idle_for_plan` seconds (an error
    then), until the queue is quiet for ``settle`` seconds; stop ``sampler``; run
    ``before_close`` while the reader's session is still open; close the reader and look
    for leftovers (:func:`residual`; not with ``check_residual`` false: a stream keeps its
    messages, nothing is left on it). Timed as phase ``<prefix>drain``."""
    opts = ctx.options
    errors: list[str] = []
    with ctx.phase(f"{prefix}drain"):
        idle = opts.drain_idle_for_plan()
        complete = reader.wait_for(rows, idle=idle, timeout=3600.0)
        reader.settle(opts.settle, timeout=60.0)
        sampler.stop()
        if before_close is not None:
            before_close()
        reader.close()
        left = residual(ctx, reader) if check_residual else Received()
    if not complete:
        errors.append(
            f"drain stopped after {idle:.0f} s without a message: "
            f"{reader.unique:,} of {rows:,} rows received"
        )
    return Drained(left, errors)


def residual(ctx: DrillContext, reader: ConsumingApp) -> Received:
    """What a fresh session where ``reader`` was still finds on its queue after the drain
    (should be none): it takes what comes until the queue is quiet for ``settle`` seconds
    (at most 60 s)."""
    check = Reader(
        reader.destination,
        host=reader.host,
        port=reader.port,
        ack="client-individual",
        subscription="check",
    )
    ctx.state.readers.append(check)
    check.start()
    check.settle(ctx.options.settle, timeout=60.0)
    check.close()
    return check.snapshot()


def split_residual(
    left: Received, sink: Received, last_batch: set[str]
) -> tuple[Received, int, int]:
    """Split what the residual check found (``left``) by what the streaming consumer's
    ``sink`` holds. Returns the messages not in the sink (a :class:`Received`, its arrivals
    the first of ``left``'s), the count of those of the query's last batch (``last_batch``:
    its row ids; delivered and written but not yet ACKed when the query stopped: the source
    ACKs a batch once Spark has committed it and asks for the next), and the count of those
    in the sink from an
    earlier batch (their ACKs did not take effect: an error)."""
    kept = Received(anonymous=left.anonymous)
    in_last = in_earlier = 0
    for mid, count in left.counts.items():
        if mid in sink.counts:
            if mid in last_batch:
                in_last += count
            else:
                in_earlier += count
            continue
        kept.counts[mid] = count
        kept.digests[mid] = left.digests[mid]
        if mid in left.conflicts:
            kept.conflicts.add(mid)
    kept.arrivals = sorted(left.arrivals)[: sum(kept.counts.values()) + kept.anonymous]
    return kept, in_last, in_earlier


def _first_line(exc: BaseException) -> str:
    """The line of a Spark job's failure that names the error (at most 500 characters)."""
    text = str(exc).strip()
    for line in text.splitlines():
        if "StompWriteError" in line or "Error:" in line:
            return line.strip()[:500]
    return (text.splitlines() or [""])[0][:500]
