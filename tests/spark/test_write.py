"""The stomp data source's batch and streaming write against real brokers through a real
mq-sidecar process, on a local SparkSession (``local[2,2]``, one per module; issue 26).

Each test writes with ``df.write.format("stomp")`` (or ``writeStream``) and reads back with a
stomp.py consumer through the sidecar (:class:`tests.spark.support.Drain`): counts, ids,
headers and bodies as the consuming app sees them. The re-run and replay tests also read the
sidecar's ``mq_sidecar_duplicates_suppressed_total``, to show that the broker did get the second
copies the app was not shown.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import TYPE_CHECKING

from testbed.sidecar import SidecarProcess
from tests.spark.support import Drain, unique

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

DUPLICATES = "mq_sidecar_duplicates_suppressed_total"


def write(df: DataFrame, sidecar: SidecarProcess, destination: str, **options: str) -> None:
    """``df.write.format("stomp")`` to ``destination`` through ``sidecar`` (append)."""
    writer = (
        df.write.format("stomp")
        .option("port", str(sidecar.port))
        .option("destination", destination)
        .option("timeout", "30")
    )
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.mode("append").save()


def sample(spark: SparkSession, rows: int = 200) -> DataFrame:
    """``rows`` rows in 2 partitions: id, a text, a timestamp, a nullable double, a flag."""
    from pyspark.sql import functions as F

    return spark.range(0, rows, numPartitions=2).select(
        F.col("id"),
        F.concat(F.lit("row-"), F.col("id")).alias("text"),
        (F.lit(1356998400) + F.col("id") * 60).cast("timestamp").alias("ts"),
        F.when(F.col("id") % 7 == 0, None).otherwise(F.col("id") / 4).alias("ratio"),
        (F.col("id") % 2 == 0).alias("even"),
    )


def test_batch_write_json_confirmed_and_read_back(
    spark: SparkSession, amq_sidecar: SidecarProcess
) -> None:
    """200 rows, ids from a key column, two header columns, receipts every 7th SEND with at
    most 2 outstanding: every row arrives once with its id, its headers and its JSON body
    (timestamps in UTC, nulls as null)."""
    destination = unique()
    df = sample(spark)
    with Drain(amq_sidecar.port, destination) as drain:
        write(
            df,
            amq_sidecar,
            destination,
            id_columns="id",
            id_prefix="job1",
            header_columns="text,even",
            receipt_every="7",
            max_in_flight="2",
        )
        messages = drain.wait_for(200)
        drain.settle(0.5)
    assert drain.row_ids() == {f"job1/{i}": 1 for i in range(200)}
    for m in messages:
        body = json.loads(m.body)
        i = body["id"]
        assert m.headers["row-id"] == f"job1/{i}"
        assert "mq-sidecar-id" not in m.headers
        assert m.headers["text"] == f"row-{i}"
        assert m.headers["even"] == ("true" if i % 2 == 0 else "false")
        assert m.headers["content-type"] == "application/json"
        assert m.headers["persistent"] == "true"
        expected_ts = dt.datetime(2013, 1, 1, tzinfo=dt.UTC) + dt.timedelta(minutes=i)
        assert body == {
            "id": i,
            "text": f"row-{i}",
            "ts": expected_ts.isoformat().replace("+00:00", "Z"),
            "ratio": None if i % 7 == 0 else i / 4,
            "even": i % 2 == 0,
        }
