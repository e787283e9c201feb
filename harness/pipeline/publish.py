"""The drill's publish: a DataFrame written with the Spark data source ``"stomp"``
(``mq_sidecar_spark``, docs/spark.md), and Spark's own count of its progress.

:func:`stomp_write` runs ``df.write.format("stomp")`` (a batch write) to the sidecar's (or, in
the baseline, the broker's) STOMP port. Each row's id is ``<job>/<row>``: ``id_prefix`` = the
drill's job and ``id_columns`` = :data:`pipeline.rows.ROW_COLUMN`, the row's position in the
CSV file. The data source sends it in ``mq-sidecar-id`` (the sidecars' duplicate detection, so
a Spark task retry is recognised downstream) and in ``row-id``, which the consuming app reads
(the sidecars never show ``mq-sidecar-id`` to a consumer). :func:`row_id` gives the same id on
the verifier's side, and the body is the row's JSON as :func:`pipeline.rows.serialise_row`
writes it (the data source's ``body_format=json`` is byte-identical for the flights schema).

:class:`SparkProgress` counts the rows of the publish job's finished tasks from Spark's status
tracker (the job runs in a job group of its own): the publish series of the baseline, where no
sidecar counts the SENDs. Its resolution is one task: a partition (at most 10,000 rows in the
drill) counts when its task has had every row confirmed.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipeline.rows import ROW_COLUMN

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["PublishSettings", "SparkProgress", "register", "row_id", "stomp_write"]


@dataclass(frozen=True)
class PublishSettings:
    """Where and how the drill publishes.

    Attributes:
        destination: STOMP destination, e.g. ``/queue/flights``.
        job: the drill's job name, every row id's prefix (no ``/``).
        host, port: the STOMP listener (the producer's sidecar; the broker in the baseline).
        receipt_every: a receipt on every N-th SEND (and the last) of a task.
        max_in_flight: receipts outstanding at most per task.
        timeout: seconds any one wait of a task may take (a receipt, the CONNECT).
    """

    destination: str
    job: str
    host: str = "127.0.0.1"
    port: int = 61613
    receipt_every: int = 100
    max_in_flight: int = 10
    timeout: float = 300.0

    def __post_init__(self) -> None:
        if self.receipt_every < 1 or self.max_in_flight < 1:
            raise ValueError("receipt_every and max_in_flight must be at least 1")
        if "/" in self.job or not self.job:
            raise ValueError(f"job must be a non-empty name without '/': {self.job!r}")


def row_id(job: str, row: int | str) -> str:
    """The id the data source gives the row whose :data:`ROW_COLUMN` is ``row``."""
    return f"{job}/{row}"


def register(spark: SparkSession) -> None:
    """Register :class:`mq_sidecar_spark.StompDataSource` with ``spark`` (idempotent)."""
    from mq_sidecar_spark import StompDataSource  # noqa: PLC0415

    spark.dataSource.register(StompDataSource)


def stomp_write(df: DataFrame, settings: PublishSettings, *, group: str | None = None) -> None:
    """Write every row of ``df`` to ``settings`` with ``df.write.format("stomp")``; returns
    once every row is confirmed (each task waits for its last receipt). ``group``: the Spark
    job group to run it in (for :class:`SparkProgress`). Raises the Spark job's error (a
    ``PythonException`` holding the task's ``StompWriteError``) when a task failed for good.
    """
    spark = df.sparkSession
    register(spark)
    context = spark.sparkContext
    if group is not None:
        context.setJobGroup(group, "mq-sidecar drill publish", interruptOnCancel=False)
    try:
        (
            df.write.format("stomp")
            .option("host", settings.host)
            .option("port", str(settings.port))
            .option("destination", settings.destination)
            .option("id_columns", ROW_COLUMN)
            .option("id_prefix", settings.job)
            .option("receipt_every", str(settings.receipt_every))
            .option("max_in_flight", str(settings.max_in_flight))
            .option("timeout", str(settings.timeout))
            .mode("append")
            .save()
        )
    finally:
        if group is not None:
            context.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]


class SparkProgress:
    """Rows published so far by the job group ``group`` of ``spark``, from Spark's status
    tracker: the finished tasks of its last stage times ``rows`` / its tasks (the partitions
    are of nearly equal size). :meth:`retried` counts its failed task attempts. Thread-safe
    (py4j calls from the sampler's thread); None when Spark does not answer."""

    def __init__(self, spark: SparkSession, rows: int, group: str) -> None:
        self._tracker = spark.sparkContext.statusTracker()
        self.rows = rows
        self.group = group
        self._lock = threading.Lock()
        self._failed = 0

    def _stages(self) -> list[tuple[int, int, int]]:
        """``(tasks, completed, failed)`` of every stage of the group's jobs."""
        stages = []
        for job in sorted(self._tracker.getJobIdsForGroup(self.group)):
            info = self._tracker.getJobInfo(job)
            for stage_id in sorted(info.stageIds) if info is not None else ():
                stage = self._tracker.getStageInfo(stage_id)
                if stage is not None:
                    stages.append((stage.numTasks, stage.numCompletedTasks, stage.numFailedTasks))
        return stages

    def total(self) -> float | None:
        """Rows of the finished tasks (module docstring); None if the tracker failed."""
        try:
            stages = self._stages()
        except Exception:  # py4j while Spark stops
            return None
        with self._lock:
            self._failed = max(self._failed, sum(failed for _, _, failed in stages))
        if not stages:
            return 0.0
        tasks, completed, _ = stages[-1]
        return self.rows * completed / tasks if tasks else 0.0

    def retried(self) -> int:
        """Failed task attempts seen so far (Spark retried each, or failed the job)."""
        self.total()
        with self._lock:
            return self._failed
