"""The PySpark writer and the verifier against a real ActiveMQ through a real mq-sidecar.

Every test publishes with :func:`pipeline.writer.publish` (one stomp.py connection per
partition, Spark's Python workers), drains with :class:`pipeline.verify.Reader` through the
same sidecar, and reconciles against the source DataFrame by id and content. The retry and
replay tests also check, on the sidecar's statistics, that the broker really did get the
second copies the app never saw: without the deterministic ids those would be duplicates.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.rows import load_flights
from pipeline.verify import Reader, expected, reconcile
from pipeline.writer import StreamPublisher, WriterSettings, publish, start_stream
from tests.integration.support import SidecarThread, unique

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: Generous bound for a drain on a loaded 2-core machine (no test waits this long normally).
DRAIN_TIMEOUT = 120.0


def reader_for(sidecar: SidecarThread, destination: str) -> Reader:
    reader = Reader(destination, port=sidecar.address[1])
    reader.start()
    return reader


def hidden_by_live_sessions(sidecar: SidecarThread) -> int:
    """Duplicates the sidecar hid from its live sessions (the reader's, here)."""
    return sum(s.duplicates_hidden for s in sidecar.statistics().sessions)


def test_publish_and_verify_flights_sample(
    spark: SparkSession, amq_sidecar: SidecarThread, flights_sample_csv: Path
) -> None:
    """1,000 real rows (nulls, a timestamp column) in 2 partitions: each arrives exactly once
    with the content the source DataFrame has."""
    from pyspark.sql import functions as F

    df = load_flights(spark, flights_sample_csv).repartition(2, "row").cache()
    assert df.count() == 1000
    assert df.filter(F.col("arr_delay").isNull()).count() > 0, "the sample has nulls"
    destination = unique("/queue/pipeline")
    settings = WriterSettings(
        destination=destination,
        job="sample",
        port=amq_sidecar.address[1],
        key="row",
        receipt_every=50,
        max_in_flight=4,
    )
    reader = reader_for(amq_sidecar, destination)
    try:
        assert publish(df, settings) == 1000
        assert reader.wait_for(1000, idle=30.0, timeout=DRAIN_TIMEOUT)
        reader.settle(0.5, timeout=10.0)
    finally:
        reader.close()
    result = reconcile(expected(df, settings), reader.snapshot())
    df.unpersist()
    assert result.ok, result.to_dict(10)
    assert (result.expected, result.received, result.unique) == (1000, 1000, 1000)
    ids = reader.snapshot().counts
    assert {mid.split("/")[1] for mid in ids} == {"0", "1"}, "both partitions published"
    assert all(mid.startswith("sample/") for mid in ids)


def test_verifier_catches_what_the_app_did_not_get(
    spark: SparkSession, amq_sidecar: SidecarThread
) -> None:
    """The reconciliation is not vacuous: rows 0..39 are the source, row 7 is never
    published and row 3 is published with other content; the real drain shows exactly that
    one row lost and one mismatched."""
    from pyspark.sql import functions as F

    source_df = spark.range(0, 40, numPartitions=2).withColumn("v", F.col("id") * 2)
    sent_df = source_df.filter("id != 7").withColumn(
        "v", F.when(F.col("id") == 3, -1).otherwise(F.col("v"))
    )
    destination = unique("/queue/pipeline")
    settings = WriterSettings(
        destination=destination, job="check", port=amq_sidecar.address[1], key="id"
    )
    reader = reader_for(amq_sidecar, destination)
    try:
        assert publish(sent_df, settings) == 39
        assert reader.wait_for(39, idle=30.0, timeout=DRAIN_TIMEOUT)
        reader.settle(0.5, timeout=10.0)
    finally:
        reader.close()
    result = reconcile(expected(source_df, settings), reader.snapshot())
    assert not result.ok
    assert result.missing == ("check/0/7",)
    assert result.mismatched == ("check/0/3",)
    assert (result.duplicates, result.unexpected, result.received) == (0, (), 39)


def test_task_retry_creates_no_duplicate_downstream(
    spark: SparkSession, amq_sidecar: SidecarThread, tmp_path: Path
) -> None:
    """Partition 1 fails at its 50th row on the first attempt (after publishing 50 rows);
    Spark retries the task (local[2,2]), which publishes the whole partition again with the
    same ids. The broker gets 50 second copies; the app sees none of them."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType

    marker = str(tmp_path / "failed-once")
    fail_at = 150  # partition 1 holds ids 100..199

    def key_or_null(row_id: int) -> int | None:
        # Runs in a Python worker: the first evaluation of row 150 leaves the key null,
        # which makes the writer raise at that row (pipeline.rows.row_key).
        import os

        if row_id == fail_at and not os.path.exists(marker):
            with open(marker, "w"):
                pass
            return None
        return row_id

    key = F.udf(key_or_null, LongType(), useArrow=False).asNondeterministic()
    df = spark.range(0, 200, numPartitions=2).select(
        key("id").alias("key"), F.col("id"), F.concat(F.lit("row-"), "id").alias("text")
    )
    destination = unique("/queue/pipeline")
    settings = WriterSettings(
        destination=destination,
        job="retry",
        port=amq_sidecar.address[1],
        key="key",
        receipt_every=10,
        max_in_flight=2,
    )
    reader = reader_for(amq_sidecar, destination)
    try:
        assert publish(df, settings) == 200  # the failed attempt is not counted
        assert Path(marker).exists(), "the first attempt failed"
        assert reader.wait_for(200, idle=30.0, timeout=DRAIN_TIMEOUT)
        reader.settle(1.0, timeout=10.0)
        hidden = hidden_by_live_sessions(amq_sidecar)
    finally:
        reader.close()
    result = reconcile(expected(df, settings), reader.snapshot())
    assert result.ok, result.to_dict(10)
    assert result.received == 200
    assert hidden == 50, "the retry re-sent rows 100..149, which the sidecar recognised"


def _write_json_files(directory: Path, batches: int, per_batch: int) -> None:
    directory.mkdir()
    for b in range(batches):
        lines = [
            json.dumps({"id": b * per_batch + i, "ts": f"2013-01-0{b + 1}T0{i % 10}:00:00Z"})
            for i in range(per_batch)
        ]
        (directory / f"part-{b}.json").write_text("\n".join(lines) + "\n")


def test_streaming_foreach_batch_publishes_each_batch_once(
    spark: SparkSession, amq_sidecar: SidecarThread, tmp_path: Path
) -> None:
    """A file stream (3 files, one per micro-batch) published with ``foreachBatch``: every
    row arrives once, with the batch id in its message id. Then the last batch's commit is
    removed and the query restarted: Spark runs batch 2 again with the same rows, and the
    sidecar hides the second copies (same ids)."""
    from pyspark.sql.types import LongType, StructField, StructType, TimestampType

    source = tmp_path / "in"
    _write_json_files(source, batches=3, per_batch=20)
    schema = StructType(
        [StructField("id", LongType(), False), StructField("ts", TimestampType(), True)]
    )
    destination = unique("/queue/pipeline")
    settings = WriterSettings(
        destination=destination, job="stream", port=amq_sidecar.address[1], key="id"
    )
    sources: dict[str, bytes] = {}

    def record(batch: DataFrame, batch_settings: WriterSettings) -> None:
        sources.update(expected(batch, batch_settings))

    def run_query() -> StreamPublisher:
        stream = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).json(str(source))
        publisher = StreamPublisher(settings, on_batch=record)
        query = start_stream(stream, publisher, str(tmp_path / "checkpoint"))
        try:
            assert query.awaitTermination(int(DRAIN_TIMEOUT)), "the query did not finish"
            assert query.exception() is None
        finally:
            query.stop()
        return publisher

    reader = reader_for(amq_sidecar, destination)
    try:
        first = run_query()
        assert (first.batches, first.sent) == (3, 60)
        assert reader.wait_for(60, idle=30.0, timeout=DRAIN_TIMEOUT)
        for name in ("2", ".2.crc"):  # as if the driver died before committing batch 2
            (tmp_path / "checkpoint" / "commits" / name).unlink(missing_ok=True)
        again = run_query()
        assert (again.batches, again.sent) == (1, 20), "batch 2 ran again"
        reader.settle(1.0, timeout=10.0)
        hidden = hidden_by_live_sessions(amq_sidecar)
    finally:
        reader.close()
    result = reconcile(sources, reader.snapshot())
    assert result.ok, result.to_dict(10)
    assert result.received == 60
    assert {mid.split("/")[1] for mid in sources} == {"b0", "b1", "b2"}
    assert hidden == 20, "the second copies of batch 2 reached the sidecar, not the app"
