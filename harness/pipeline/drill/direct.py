"""The baseline run (``--baseline``, :mod:`pipeline.baseline`): before the drill, the same
publish (the data source, :mod:`pipeline.publish`) and drain straight to the serving broker,
no sidecar, no fault, on the same Spark session and cached partitions; its rates are what the
report gives the drill's as a share of. Its publish series is Spark's own count of the rows
of the finished tasks (:class:`pipeline.publish.SparkProgress`): no sidecar counts the
SENDs."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from pipeline.drill.context import DrillContext
from pipeline.drill.results import delivery_fields, timeline_of
from pipeline.drill.startup import open_reader
from pipeline.drill.transfer import drain, publish
from pipeline.faults import FaultInjector, Sampler
from pipeline.report.overhead import BaselineReport
from pipeline.report.timeline import throughput
from pipeline.verify import expected, reconcile

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from pipeline.publish import PublishSettings

__all__ = ["run_baseline"]


def run_baseline(
    ctx: DrillContext, spark: SparkSession, df: DataFrame, rows: int, settings: PublishSettings
) -> tuple[BaselineReport, dict[str, bytes]]:
    """Publish the ``rows`` rows of ``df`` with the drill's publish ``settings`` pointed at the
    serving broker (the first of ``--brokers``) on the drill's queue with ``.baseline``
    appended, drain it there, and reconcile; phases ``warm-up``, ``baseline publish``,
    ``baseline drain``, ``baseline verify``. Returns the baseline's report and the source
    rows (``row id: body digest``, :func:`pipeline.verify.expected`): the drill's rows carry
    the same ids and bodies, so its verify reuses them. Raises
    :class:`~pipeline.drill.startup.DrillError` if the reader cannot subscribe."""
    from pipeline.baseline import broker_address, warm_workers  # noqa: PLC0415
    from pipeline.publish import SparkProgress  # noqa: PLC0415

    opts = ctx.options
    if opts.brokers is not None:
        host, port = broker_address(opts.brokers)
    else:
        assert ctx.state.pair is not None
        serving = ctx.state.pair.serving
        host, port = serving.host, serving.stomp_port
    with ctx.phase("warm-up"):
        warm_workers(spark)
    direct = replace(settings, destination=f"{settings.destination}.baseline", host=host, port=port)
    group = f"{ctx.job}-baseline"
    progress = SparkProgress(spark, rows, group)
    reader = open_reader(ctx, direct.destination, host, port)
    none = FaultInjector((), rows, pair=None, pids=(), say=ctx.say)
    sampler = Sampler(
        progress.total,
        reader,
        rows,
        none,
        progress=opts.progress,
        labels=("baseline publish", "baseline drain"),
    )
    ctx.state.sampler = sampler
    ctx.say(
        f"baseline: publishing {rows:,} rows straight to the broker {host}:{port} "
        f"({direct.destination}), no sidecar, no fault"
    )
    published = publish(ctx, df, rows, direct, sampler, group=group, prefix="baseline ")
    drained = drain(ctx, reader, rows, sampler, prefix="baseline ")
    with ctx.phase("baseline verify"):
        source = expected(df, ctx.job)  # the same ids and bodies as the drill's
        received = reader.snapshot()
        received.merge(drained.residual)
        result = reconcile(source, received)
    timeline = timeline_of(
        sampler=sampler,
        reader=reader,
        residual=drained.residual,
        faults=none,
        incidents=[],
        t0=published.t0,
        publish_end=published.end,
    )
    base = BaselineReport(
        **delivery_fields(rows, published.sent, result, drained.residual),
        broker=f"{host}:{port}",
        destination=direct.destination,
        publish=throughput(timeline, "publish").overall,
        consume=throughput(timeline, "consume").overall,
        errors=published.errors + drained.errors,
        timeline=timeline,
    )
    ctx.say(
        f"baseline: publish {base.publish:,.0f} msg/s, consume {base.consume:,.0f} msg/s; "
        f"{base.lost:,} lost, {base.duplicates:,} duplicates"
    )
    return base, source
