"""The drill's baseline (``mq-sidecar drill --baseline``): what the same job does without a
sidecar, so that the report can give the sidecar's rates as a share of it (issue 18, part 4).

Before the real drill, on the same brokers (the serving ActiveMQ, no kill), the same Spark
session and the same cached partitions, the drill publishes the rows with the same data source
write (:func:`pipeline.publish.stomp_write`, same receipts and window) pointed at the broker's
own STOMP port, so the receipts are the broker's, while the same consuming app drains the queue
straight from the broker (:class:`pipeline.verify.Reader`; with ``--consumer spark`` still
this stomp.py reader: the baseline measures the publish and a plain drain); then it reconciles
as the drill does. The baseline uses its own queue (the drill's destination with ``.baseline``
appended) and the drill's job name, so its rows carry the same ids and bodies.

There is no sidecar to count the SENDs, so the publish series is Spark's own progress: the
rows of the job's finished tasks (:class:`pipeline.publish.SparkProgress`), one step per
partition.

:func:`warm_workers` starts Spark's Python workers and imports the data source's writer in
them before the baseline: otherwise the baseline alone would pay for that (about a second),
and the drill after it would find them warm.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from config import ConfigError, parse_broker_url

if TYPE_CHECKING:
    from collections.abc import Iterable

    from pyspark.sql import SparkSession

__all__ = ["broker_address", "warm_workers"]


def broker_address(brokers: str) -> tuple[str, int]:
    """``(host, port)`` of the first broker of a failover URL (``--brokers``), where the
    baseline publishes and drains. Raises ``ValueError`` for a URL that does not parse or a
    first broker behind TLS (the writer and the reader speak plain STOMP)."""
    try:
        parsed, _ = parse_broker_url(brokers)
    except ConfigError as exc:
        raise ValueError(f"--brokers: {exc}") from exc
    first = parsed[0]
    if first.tls:
        raise ValueError(
            "--baseline goes straight to the first broker of --brokers with plain STOMP; "
            f"{first.host}:{first.port} is behind TLS"
        )
    return first.host, first.port


def warm_workers(spark: SparkSession) -> None:
    """Run one trivial task per core that imports the data source's writer and pyarrow
    (module docstring)."""
    tasks = max(1, spark.sparkContext.defaultParallelism)

    def load(_: Iterable[int]) -> None:
        import importlib  # noqa: PLC0415

        import stomp  # noqa: F401, PLC0415

        import mq_sidecar_spark.writer  # noqa: F401, PLC0415

        importlib.import_module("pyarrow")  # what Spark's Python data source writes need

    spark.sparkContext.parallelize(range(tasks), tasks).foreachPartition(load)
