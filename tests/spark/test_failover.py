"""A broker killed (SIGKILL) in the middle of a stomp batch write (issue 26): the tasks still
return with every row confirmed, because the sidecar fails over to the backup broker and replays
what the dead one had not confirmed; the consumer behind the sidecar is shown each row once.

A real ActiveMQ shared-store pair (``activemq_pair``: the backup takes over the store ~0.4 s
after the primary dies) behind a real mq-sidecar process, on ``local[2,2]``.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING

from testbed.sidecar import SidecarProcess, metric_total
from tests.conftest import ActiveMQPairFactory
from tests.spark.conftest import SIDECAR_OPTIONS
from tests.spark.support import WAIT, Drain, unique

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ROWS = 3000


def test_primary_killed_mid_write_every_row_confirmed_once(
    spark: SparkSession, activemq_pair: ActiveMQPairFactory, tmp_path: Path
) -> None:
    """3,000 persistent rows in 2 partitions, a receipt on every SEND and one outstanding (so
    the write lasts a few seconds); the primary is killed once the consumer has seen 300.
    The job succeeds, the sidecar failed over, and the consumer got all 3,000 ids once."""
    from pyspark.sql import functions as F

    primary, backup = activemq_pair()
    sidecar = SidecarProcess(
        "failover",
        tmp_path,
        brokers=f"failover:({primary.stomp_url},{backup.stomp_url})",
        options=SIDECAR_OPTIONS,
    )
    df = spark.range(0, ROWS, numPartitions=2).select(
        "id", F.repeat(F.lit("x"), 200).alias("padding")
    )
    destination = unique()
    # The write runs on this thread (a data source registered with the session is looked up
    # on the calling thread's active session); the kill comes from another one.
    killed_while_writing: list[bool] = []
    writing = threading.Event()

    def kill_when_under_way(drain: Drain) -> None:
        drain.wait_for(300)
        killed_while_writing.append(writing.is_set())
        primary.kill()

    with sidecar, Drain(sidecar.port, destination) as drain:
        killer = threading.Thread(target=kill_when_under_way, args=(drain,), name="killer")
        writing.set()
        killer.start()
        try:
            (
                df.write.format("stomp")
                .option("port", str(sidecar.port))
                .option("destination", destination)
                .option("id_columns", "id")
                .option("receipt_every", "1")
                .option("max_in_flight", "1")
                .option("timeout", "30")
                .mode("append")
                .save()
            )
            writing.clear()
        finally:
            killer.join(timeout=WAIT)
        assert killed_while_writing == [True], "the primary was killed during the write"
        drain.wait_for(ROWS)
        shown = drain.settle(1.0)
        failovers = metric_total(sidecar.metrics(), "mq_sidecar_failovers_total")
    ids = drain.row_ids()
    assert len(shown) == ROWS
    assert ids == {str(i): 1 for i in range(ROWS)}
    assert failovers >= 1, "the sidecar failed over"
