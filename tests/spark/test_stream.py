"""The stream read (``stream=true``, issue 33 parts 1 and 2; docs/spark.md, "Stream read"): a
RabbitMQ stream read by Spark tasks through a real mq-sidecar process, in front of a real
RabbitMQ node, on a local SparkSession (``local[2,2]``, shared by the module).

Messages are published with stomp.py through the sidecar, each with a ``row-id`` header equal to
its place in the publishing order, which is its stream offset (the stream is new and has one
producer). A sink's rows are counted by it, so a record lost or read twice fails the test.
"""

from __future__ import annotations

import datetime
import json
import pickle
import re
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import stomp

from testbed import RabbitMQ
from testbed.sidecar import SidecarProcess
from tests.spark.support import ROW_ID, WAIT, new_stream, publish, sink_rows, wait_rows
from tests.spark.test_bad_input import error_of

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery
    from pyspark.sql.streaming.readwriter import DataStreamWriter

    from mq_sidecar_spark.stream import StompStreamSource

#: The wait for a probe's first MESSAGE: long, so a loaded machine never makes the driver take
#: a non-empty stream for an empty one (the probe returns at the first MESSAGE).
TAIL_WAIT = "10s"


def configure(reader: Any, sidecar: SidecarProcess, stream: str, options: dict[str, str]) -> Any:
    """``reader`` (a ``DataFrameReader`` or ``DataStreamReader`` of ``format("stomp")``) with
    ``stream=true``, the sidecar's port, ``stream`` as destination, :data:`TAIL_WAIT` and
    ``options``."""
    reader = (
        reader.option("stream", "true")
        .option("port", str(sidecar.port))
        .option("destination", stream)
        .option("tail_wait", TAIL_WAIT)
    )
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader


def read_stream(spark: SparkSession, sidecar: SidecarProcess, stream: str, **options: str) -> Any:
    """``spark.read.format("stomp")`` of ``stream`` (``stream=true``) with ``options``."""
    return configure(spark.read.format("stomp"), sidecar, stream, options).load()


def check_range(rows: list[Any], first: int, end: int) -> None:
    """``rows`` are offsets ``[first, end)`` of a stream :func:`publish` filled: each once, its
    ``row-id`` and body those of its offset."""
    offsets = Counter(int(row["offset"]) for row in rows)
    missing = [n for n in range(first, end) if offsets[n] == 0]
    twice = [n for n, count in offsets.items() if count > 1]
    assert not missing, f"{len(missing)} offsets missing, e.g. {missing[:5]}"
    assert not twice, f"{len(twice)} offsets read twice, e.g. {twice[:5]}"
    assert len(rows) == end - first
    for row in rows:
        assert row["headers"][ROW_ID] == str(row["offset"])
        assert row["body"] == f"m{row['offset']}".encode()


@pytest.fixture(scope="module")
def filled(rabbitmq: RabbitMQ, rmq_sidecar: SidecarProcess) -> str:
    """A stream of 1,000 messages (offsets 0-999, ``row-id`` = offset), shared by the module's
    batch reads (they only read it)."""
    stream = new_stream(rabbitmq)
    publish(("127.0.0.1", rmq_sidecar.port), stream, range(1000))
    return stream


def test_the_tasks_run_this_worktrees_package(spark: SparkSession) -> None:
    """The Python workers import the ``mq_sidecar_spark`` the test process imports (the tests'
    ``PYTHONPATH`` first), not another installed copy."""
    import mq_sidecar_spark

    def where(_: object) -> list[str]:
        import mq_sidecar_spark as package

        return [package.__file__ or ""]

    seen = spark.sparkContext.parallelize([0], 1).mapPartitions(where).collect()
    assert seen == [mq_sidecar_spark.__file__]


def test_batch_read_of_a_stream_and_of_a_range(
    spark: SparkSession, rmq_sidecar: SidecarProcess, filled: str
) -> None:
    """The whole stream by default (earliest to the tail), then offsets 200-699 in 3 tasks
    (``minPartitions``) and 100-349 in ranges of at most 100 (``maxRecordsPerPartition``), read
    twice: the same records each time, in offset order within a task."""
    whole = read_stream(spark, rmq_sidecar, filled).collect()
    check_range(whole, 0, 1000)
    assert [int(r["offset"]) for r in whole] == list(range(1000))
    assert all(r["destination"] == filled.replace("/amq/queue/", "/queue/") for r in whole)

    part = read_stream(
        spark,
        rmq_sidecar,
        filled,
        startingOffsets="200",
        endingOffsets="700",
        minPartitions="3",
    )
    assert part.rdd.getNumPartitions() == 3
    check_range(part.collect(), 200, 700)
    small = read_stream(
        spark,
        rmq_sidecar,
        filled,
        startingOffsets="100",
        endingOffsets="350",
        maxRecordsPerPartition="100",
    )
    assert small.rdd.getNumPartitions() == 3
    first = small.collect()
    check_range(first, 100, 350)
    assert [r["offset"] for r in small.collect()] == [r["offset"] for r in first]


# -- streaming -----------------------------------------------------------------------------------


def start_query(
    spark: SparkSession,
    sidecar: SidecarProcess,
    stream: str,
    *,
    checkpoint: Path,
    out: Path,
    available_now: bool = False,
    **options: str,
) -> StreamingQuery:
    reader = configure(spark.readStream.format("stomp"), sidecar, stream, options)
    writer: DataStreamWriter = (
        reader.load()
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
    )
    if available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime="200 milliseconds")
    return writer.start()


def sink(spark: SparkSession, out: Path) -> list[Any]:
    """What the Parquet sink committed (its ``_spark_metadata`` log)."""
    from mq_sidecar_spark.stream import STREAM_SCHEMA

    return sink_rows(spark, out, STREAM_SCHEMA)


def wait_sink(spark: SparkSession, out: Path, count: int, query: StreamingQuery) -> list[Any]:
    """Wait (at most 180 s) until the sink holds ``count`` rows; fails on a query exception."""
    from mq_sidecar_spark.stream import STREAM_SCHEMA

    return wait_rows(spark, out, count, query, 180, schema=STREAM_SCHEMA)


def progress(query: StreamingQuery, rows: int) -> list[Any]:
    """The query's progress reports of batches with rows, once they count ``rows`` in all (at
    most :data:`WAIT` s: Spark posts a batch's progress after its sink committed it)."""
    deadline = time.monotonic() + WAIT
    while True:
        batches = [p for p in query.recentProgress if p.numInputRows > 0]
        if sum(p.numInputRows for p in batches) >= rows or time.monotonic() > deadline:
            return batches
        time.sleep(0.2)


def test_streaming_read_into_parquet_then_a_restart_from_the_checkpoint(
    spark: SparkSession, rabbitmq: RabbitMQ, rmq_sidecar: SidecarProcess, tmp_path: Path
) -> None:
    """600 messages from ``earliest`` in batches of at most 250 (``maxRecordsPerTrigger``), 2
    tasks each (``minPartitions``), into Parquet; the query stopped, 400 more published, the
    query started again on its checkpoint: each of the 1,000 once in the sink, none missing.
    The progress shows the source's offsets and the tail (``reportLatestOffset``)."""
    stream = new_stream(rabbitmq)
    address = ("127.0.0.1", rmq_sidecar.port)
    publish(address, stream, range(600))
    checkpoint, out = tmp_path / "checkpoint", tmp_path / "out"

    def start() -> StreamingQuery:
        return start_query(
            spark,
            rmq_sidecar,
            stream,
            checkpoint=checkpoint,
            out=out,
            startingOffsets="earliest",
            maxRecordsPerTrigger="250",
            minPartitions="2",
        )

    query = start()
    try:
        check_range(wait_sink(spark, out, 600, query), 0, 600)
        batches = progress(query, 600)
        assert all(p.numInputRows <= 250 for p in batches)
        assert sum(p.numInputRows for p in batches) == 600
        source = batches[1].sources[0]  # the first batch's startOffset is null (Spark's)
        assert json.loads(source.startOffset) == {"stream": stream, "offset": 250}
        assert json.loads(source.endOffset) == {"stream": stream, "offset": 500}
        assert json.loads(source.latestOffset) == {"stream": stream, "offset": 600}
        print("progress of one micro-batch:", batches[1].json)  # shown with pytest -s
    finally:
        query.stop()
    publish(address, stream, range(600, 1000))
    query = start()
    try:
        check_range(wait_sink(spark, out, 1000, query), 0, 1000)
    finally:
        query.stop()


def test_available_now_reads_to_the_tail_seen_at_its_start_in_batches(
    spark: SparkSession, rabbitmq: RabbitMQ, rmq_sidecar: SidecarProcess, tmp_path: Path
) -> None:
    """``Trigger.AvailableNow`` with ``maxRecordsPerTrigger=100`` over 300 messages: 3 batches,
    then the query ends by itself; run again after 50 more, it reads just those."""
    stream = new_stream(rabbitmq)
    address = ("127.0.0.1", rmq_sidecar.port)
    publish(address, stream, range(300))
    checkpoint, out = tmp_path / "checkpoint", tmp_path / "out"
    for end in (300, 350):
        query = start_query(
            spark,
            rmq_sidecar,
            stream,
            checkpoint=checkpoint,
            out=out,
            available_now=True,
            startingOffsets="earliest",
            maxRecordsPerTrigger="100",
        )
        try:
            assert query.awaitTermination(int(WAIT * 3)), "the query did not end by itself"
            assert query.exception() is None
            sizes = [p.numInputRows for p in query.recentProgress if p.numInputRows > 0]
        finally:
            query.stop()
        assert sizes == ([100, 100, 100] if end == 300 else [50])
        check_range(sink(spark, out), 0, end)
        if end == 300:
            publish(address, stream, range(300, 350))


# -- bad input: one error naming the option, on the driver, before a task runs ---------------


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"destination": "/queue/orders"}, "option destination='/queue/orders'"),
        ({"startingOffsets": "soon"}, "option startingOffsets='soon'"),
        ({"startingOffsets": "timestamp:99999999999999"}, "the timestamp is in the future"),
        ({"maxBytesPerTrigger": "1000"}, "option maxBytesPerTrigger is not supported"),
        ({"minPartitions": "0"}, "option minPartitions=0: must be at least 1"),
        ({"startingOffsets": "latest"}, "option startingOffsets=latest"),
        ({"maxRecordsPerTrigger": "10"}, "option maxRecordsPerTrigger applies to"),
        ({"bogus": "1"}, "unknown option(s) for the stomp stream read: bogus"),
    ],
)
def test_bad_options_of_a_batch_read(
    spark: SparkSession,
    rmq_sidecar: SidecarProcess,
    filled: str,
    options: dict[str, str],
    expected: str,
) -> None:
    """Each bad option fails ``load()`` with one sentence naming it."""
    settings = {"destination": filled, **options}
    destination = settings.pop("destination")
    text = error_of(lambda: read_stream(spark, rmq_sidecar, destination, **settings).collect())
    assert expected in text, text


def test_stream_options_without_stream_true(spark: SparkSession) -> None:
    """A stream-only option on a queue read names ``stream=true``."""
    text = error_of(
        lambda: (
            spark.readStream.format("stomp")
            .option("destination", "/queue/q")
            .option("startingOffsets", "earliest")
            .load()
        )
    )
    assert "startingoffsets apply to a RabbitMQ stream read only: set stream=true" in text


def test_a_destination_that_is_not_a_stream(
    spark: SparkSession, rmq_sidecar: SidecarProcess
) -> None:
    """A classic queue named as a stream: RabbitMQ refuses ``x-stream-offset`` on it, and the
    read says the destination is not a stream."""
    queue = f"/amq/queue/classic_{uuid.uuid4().hex[:8]}"
    publish(("127.0.0.1", rmq_sidecar.port), queue.replace("/amq/queue/", "/queue/"), range(1))
    text = error_of(lambda: read_stream(spark, rmq_sidecar, queue).collect())
    assert f"option destination='{queue}' is not a RabbitMQ stream" in text


def test_an_offset_beyond_the_tail(
    spark: SparkSession, rmq_sidecar: SidecarProcess, filled: str
) -> None:
    """``startingOffsets`` past the stream's tail (1,000) is refused, naming the tail, once a
    SUBSCRIBE at offset 4,999 got nothing for ``tail_wait`` (1 s)."""
    text = error_of(
        lambda: read_stream(
            spark, rmq_sidecar, filled, startingOffsets="5000", tail_wait="1s"
        ).count()
    )
    assert "option startingOffsets=5000 is beyond the tail" in text
    assert "its next offset is 1000" in text


def run_available_now(query: StreamingQuery) -> str | None:
    """Wait (bounded) for a query that ends by itself (``availableNow``) or fails; the text of
    its exception, or None."""
    from pyspark.errors import StreamingQueryException

    try:
        assert query.awaitTermination(int(WAIT * 3)), "the query did not end"
    except StreamingQueryException as exc:
        return str(exc)
    finally:
        query.stop()
    failure = query.exception()
    return None if failure is None else str(failure)


def test_contradicting_trigger_limits(
    spark: SparkSession, rmq_sidecar: SidecarProcess, filled: str, tmp_path: Path
) -> None:
    """``minRecordsPerTrigger`` above ``maxRecordsPerTrigger`` fails the query at its start."""
    query = start_query(
        spark,
        rmq_sidecar,
        filled,
        checkpoint=tmp_path / "c",
        out=tmp_path / "o",
        minRecordsPerTrigger="500",
        maxRecordsPerTrigger="100",
    )
    text = run_available_now(query)
    assert text is not None
    assert "option minRecordsPerTrigger=500 is above maxRecordsPerTrigger=100" in text
    assert not (tmp_path / "o" / "_spark_metadata").exists() or not sink(spark, tmp_path / "o")


def test_a_checkpoint_of_another_stream_or_of_the_queue_reader(
    spark: SparkSession, rabbitmq: RabbitMQ, rmq_sidecar: SidecarProcess, tmp_path: Path
) -> None:
    """A stream read started on a checkpoint written by a read of another stream, or by the
    queue reader, fails with one error naming both, before a task reads anything; so does the
    queue reader started on a stream read's checkpoint."""
    first, second = new_stream(rabbitmq), new_stream(rabbitmq)
    address = ("127.0.0.1", rmq_sidecar.port)
    publish(address, first, range(10))
    publish(address, second, range(10))
    checkpoint = tmp_path / "checkpoint"
    ok = start_query(
        spark,
        rmq_sidecar,
        first,
        checkpoint=checkpoint,
        out=tmp_path / "o1",
        available_now=True,
        startingOffsets="earliest",
    )
    assert run_available_now(ok) is None
    other = start_query(
        spark,
        rmq_sidecar,
        second,
        checkpoint=checkpoint,
        out=tmp_path / "o1",
        available_now=True,
        startingOffsets="earliest",
    )
    text = run_available_now(other)
    assert text is not None
    assert f"of '{first}', not of the stream {second}" in text

    queue = f"/queue/spark_q_{uuid.uuid4().hex[:8]}"
    publish(address, queue, range(3))
    queue_checkpoint = tmp_path / "queue-checkpoint"
    reader = (
        spark.readStream.format("stomp")
        .option("port", str(rmq_sidecar.port))
        .option("destination", queue)
        .option("checkpoint_location", str(queue_checkpoint))
        .load()
    )
    queue_query = (
        reader.writeStream.format("parquet")
        .option("path", str(tmp_path / "o2"))
        .option("checkpointLocation", str(queue_checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    assert run_available_now(queue_query) is None
    text = run_available_now(
        start_query(
            spark,
            rmq_sidecar,
            first,
            checkpoint=queue_checkpoint,
            out=tmp_path / "o2",
            available_now=True,
        )
    )
    assert text is not None
    assert "of the queue reader (stream=false)" in text

    queue_on_stream = (
        spark.readStream.format("stomp")
        .option("port", str(rmq_sidecar.port))
        .option("destination", queue)
        .option("checkpoint_location", str(checkpoint))
        .load()
        .writeStream.format("parquet")
        .option("path", str(tmp_path / "o1"))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    text = run_available_now(queue_on_stream)
    assert text is not None
    assert "it was written by a stream read (stream=true)" in text


# -- retention ---------------------------------------------------------------------------------


def test_retention_past_the_checkpoint_with_fail_on_data_loss_both_ways(
    spark: SparkSession, rabbitmq: RabbitMQ, rmq_sidecar: SidecarProcess, tmp_path: Path
) -> None:
    """A query reads 10 messages, then the stream's retention (a policy: segments of 5,000
    bytes, 50,000 bytes kept) removes them and more while 1,000 others are published. Started
    again on its checkpoint, the query fails naming the lost offsets and ``failOnDataLoss``
    (the default); with ``failOnDataLoss=false`` it goes on from the stream's first offset, and
    what it reads is each once. A batch read from offset 0 does the same both ways."""
    name = f"spark_retention_{uuid.uuid4().hex[:8]}"
    rabbitmq.rabbitmqctl(
        "set_policy",
        "--apply-to",
        "queues",
        name,
        f"^{name}$",
        '{"stream-max-segment-size-bytes": 5000, "max-length-bytes": 50000}',
    )
    stream = new_stream(rabbitmq, name=name)
    address = ("127.0.0.1", rmq_sidecar.port)
    publish(address, stream, range(10))
    checkpoint, out = tmp_path / "checkpoint", tmp_path / "out"

    def run(**options: str) -> str | None:
        return run_available_now(
            start_query(
                spark,
                rmq_sidecar,
                stream,
                checkpoint=checkpoint,
                out=out,
                available_now=True,
                startingOffsets="earliest",
                **options,
            )
        )

    assert run() is None
    check_range(sink(spark, out), 0, 10)
    publish(address, stream, range(10, 1010), prefix="m" + "x" * 100)
    text = run()
    assert text is not None
    assert "that the query's checkpoint expects are no longer in the stream" in text, text[:3000]
    assert "option failOnDataLoss=false skips them" in text
    assert run(failOnDataLoss="false") is None
    ids = Counter(int(row["headers"][ROW_ID]) for row in sink(spark, out))
    assert set(ids.values()) == {1}
    kept = sorted(ids)
    first_kept = kept[10]
    assert kept == [*range(10), *range(first_kept, 1010)]
    assert first_kept > 10

    text = error_of(lambda: read_stream(spark, rmq_sidecar, stream, startingOffsets="0").count())
    assert "option startingOffsets=0: offsets 0-" in text
    rows = read_stream(
        spark, rmq_sidecar, stream, startingOffsets="0", failOnDataLoss="false"
    ).collect()
    assert sorted(int(r["headers"][ROW_ID]) for r in rows)[-1] == 1009


def test_min_records_per_trigger_holds_a_batch_until_max_trigger_delay(
    spark: SparkSession, rabbitmq: RabbitMQ, rmq_sidecar: SidecarProcess, tmp_path: Path
) -> None:
    """``minRecordsPerTrigger=100``: 50 messages make no batch (a trigger that found them
    made none: Spark reports it as a progress of 0 rows), 110 make one of 110. Started again
    with ``maxTriggerDelay=2s``, 10 more make a batch of 10 once the delay passed."""
    stream = new_stream(rabbitmq)
    address = ("127.0.0.1", rmq_sidecar.port)
    checkpoint, out = tmp_path / "checkpoint", tmp_path / "out"

    def start(delay: str) -> StreamingQuery:
        return start_query(
            spark,
            rmq_sidecar,
            stream,
            checkpoint=checkpoint,
            out=out,
            startingOffsets="earliest",
            minRecordsPerTrigger="100",
            maxTriggerDelay=delay,
        )

    spark.conf.set("spark.sql.streaming.noDataProgressEventInterval", "100ms")
    query = start("1h")
    try:
        publish(address, stream, range(50))
        published = time.time()
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline and not any(
            p.numInputRows == 0 and p.timestamp > _iso(published) for p in query.recentProgress
        ):
            time.sleep(0.2)
        assert query.exception() is None
        assert sink(spark, out) == []
        publish(address, stream, range(50, 110))
        check_range(wait_sink(spark, out, 110, query), 0, 110)
        sizes = [p.numInputRows for p in progress(query, 110)]
    finally:
        query.stop()
        spark.conf.unset("spark.sql.streaming.noDataProgressEventInterval")
    assert sizes == [110]
    query = start("2s")
    try:
        publish(address, stream, range(110, 120))
        check_range(wait_sink(spark, out, 120, query), 0, 120)
        sizes = [p.numInputRows for p in progress(query, 10)]
    finally:
        query.stop()
    assert sizes == [10]


def _iso(epoch: float) -> str:
    """``epoch`` as Spark's progress timestamps are written (UTC, ms, ``Z``), comparable as text."""
    moment = datetime.datetime.fromtimestamp(epoch, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def test_a_retried_writers_copies_are_dropped_within_a_tasks_range_only(
    spark: SparkSession, rabbitmq: RabbitMQ, rmq_sidecar: SidecarProcess
) -> None:
    """Five messages, then their copies with the same ``mq-sidecar-id`` (what a retried write
    task sends), at the stream's tail. The reading task's sidecar hides a copy whose original
    that task read: one task over the range gets 5 rows and still ends (its range ends in hidden
    copies); two tasks, originals in one and copies in the other, get all 10."""
    stream = new_stream(rabbitmq)
    conn = stomp.Connection12([("127.0.0.1", rmq_sidecar.port)], heartbeats=(0, 0), vhost="/")
    conn.connect(wait=True)
    try:
        for n in range(10):
            headers = {"mq-sidecar-id": f"k{n % 5}", ROW_ID: str(n % 5), "persistent": "true"}
            conn.send(stream, f"m{n % 5}".encode(), headers=headers)
    finally:
        conn.disconnect(receipt="bye")  # the sidecar answers once every SEND is confirmed
    one = read_stream(spark, rmq_sidecar, stream, endingOffsets="10").collect()
    assert sorted(int(r["offset"]) for r in one) == [0, 1, 2, 3, 4]
    two = read_stream(
        spark, rmq_sidecar, stream, endingOffsets="10", maxRecordsPerPartition="5"
    ).collect()
    assert sorted(int(r["offset"]) for r in two) == list(range(10))
    assert Counter(r["headers"][ROW_ID] for r in two) == {str(n): 2 for n in range(5)}


# -- docs/spark.md's examples run as written (issue 33 part 5) --------------------------------
#
# Every ``python`` block of the guide runs, in order, in one namespace holding the module's
# SparkSession as ``spark``, against the module's sidecar in front of RabbitMQ. Two things are
# replaced, and only these: ``61613`` (the sidecar's default port, which tests on a shared
# machine must not depend on) by the test sidecar's port, and ``/tmp/stomp-guide`` by a
# temporary directory. Here rather than in a module of its own: one SparkSession less.

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "spark.md"
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.DOTALL | re.MULTILINE)


def guide_blocks() -> list[str]:
    """The ``python`` blocks of docs/spark.md, in order."""
    return BLOCK.findall(GUIDE.read_text())


def test_the_guide_has_its_examples() -> None:
    """The blocks this test runs: registration, the writes, the queue read, the stream."""
    text = "\n".join(guide_blocks())
    for needle in (
        "spark.dataSource.register(StompDataSource)",
        'orders.write.format("stomp")',
        'events.writeStream.format("stomp")',
        'spark.readStream.format("stomp")',
        '"x-queue-type": "stream"',
        'spark.read.format("stomp")',
        '.option("stream", "true")',
    ):
        assert needle in text, needle


def test_the_guides_examples_run_as_written(
    spark: SparkSession, rmq_sidecar: SidecarProcess, tmp_path: Path
) -> None:
    """Each block runs without an error, and the data went where the guide says: 3 orders
    through the queue into Parquet, 3 into the stream, read back by the batch read and by the
    ``availableNow`` query."""
    namespace: dict[str, Any] = {"spark": spark}
    for number, block in enumerate(guide_blocks(), 1):
        code = block.replace("61613", str(rmq_sidecar.port))
        code = code.replace("/tmp/stomp-guide", str(tmp_path))
        exec(compile(code, f"docs/spark.md python block {number}", "exec"), namespace)
    assert spark.read.parquet(str(tmp_path / "orders")).count() == 3
    log = namespace["log"].collect()
    assert sorted(int(r["headers"]["row-id"]) for r in log) == [1, 2, 3]
    assert spark.read.parquet(str(tmp_path / "orders-log")).count() == 3
    progress = namespace["query"].lastProgress
    assert json.loads(progress["sources"][0]["latestOffset"])["offset"] == 3


# -- the driver's and the task's calls in this process (no Spark), on the real node ----------


def source(sidecar: SidecarProcess, stream: str, **options: str) -> StompStreamSource:
    """A :class:`StompStreamSource` as Spark's driver-side runner makes it."""
    from mq_sidecar_spark.stream import STREAM_SCHEMA, StompStreamSource

    settings = {"stream": "true", "destination": stream, "port": str(sidecar.port)}
    return StompStreamSource(STREAM_SCHEMA, {**settings, "tail_wait": TAIL_WAIT, **options})


def test_the_driver_calls_in_process(rmq_sidecar: SidecarProcess, filled: str) -> None:
    """``initialOffset``, ``latestOffset`` under each ``ReadLimit``, ``partitions``,
    ``reportLatestOffset``, ``commit`` and AvailableNow's target, called as Spark's runner
    calls them, on the 1,000-message stream; and a task's ``read`` of a range."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows

    at = {"stream": filled}
    reader = source(rmq_sidecar, filled, startingOffsets="earliest", maxRecordsPerTrigger="300")
    assert reader.initialOffset() == {**at, "offset": 0}
    assert reader.getDefaultReadLimit() == ReadMaxRows(300)
    assert reader.reportLatestOffset() is None
    start = {**at, "offset": 0}
    assert reader.latestOffset(start, ReadMaxRows(300)) == {**at, "offset": 300}
    assert reader.reportLatestOffset() == {**at, "offset": 1000}
    assert reader.latestOffset(start, ReadAllAvailable()) == {**at, "offset": 1000}
    assert reader.latestOffset(start, ReadMinRows(2000)) == start
    assert reader.latestOffset({**at, "offset": 1000}, ReadAllAvailable()) == {**at, "offset": 1000}
    parts = reader.partitions(start, {**at, "offset": 300})
    assert [(p.start, p.end) for p in parts] == [(0, 300)]  # type: ignore[attr-defined]
    reader.commit({**at, "offset": 300})
    reader.prepareForTriggerAvailableNow()
    assert reader.latestOffset({**at, "offset": 900}, ReadMaxRows(300)) == {**at, "offset": 1000}

    assert source(rmq_sidecar, filled).initialOffset() == {**at, "offset": 1000}
    assert source(rmq_sidecar, filled, startingOffsets="7").initialOffset() == {**at, "offset": 7}
    early = source(rmq_sidecar, filled, startingOffsets="timestamp:0")
    assert early.initialOffset() == {**at, "offset": 0}
    held = source(rmq_sidecar, filled, minRecordsPerTrigger="2000")
    assert held.getDefaultReadLimit() == ReadMinRows(2000)
    assert held.latestOffset(start, ReadMinRows(2000)) == start

    task = pickle.loads(pickle.dumps(reader))
    batches = list(task.read(parts[0]))
    offsets = [o for batch in batches for o in batch.column("offset").to_pylist()]
    assert offsets == list(range(300))
    headers = batches[0].column("headers")[5].as_py()
    assert dict(headers)[ROW_ID] == "5"


def test_checkpointed_offsets_that_are_not_this_streams(
    rmq_sidecar: SidecarProcess, filled: str
) -> None:
    """The offsets Spark gives back from a checkpoint are checked before anything is read."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from mq_sidecar_spark.errors import StreamOffsetError

    reader = source(rmq_sidecar, filled)
    for given, expected in (
        ({"seq": 4}, "of the queue reader (stream=false)"),
        ({"stream": "/amq/queue/other", "offset": 4}, "of '/amq/queue/other', not of the stream"),
        ({"stream": filled, "offset": -1}, "is not a stream offset"),
    ):
        with pytest.raises(StreamOffsetError, match=re.escape(expected)):
            reader.latestOffset(given, ReadAllAvailable())
        with pytest.raises(StreamOffsetError, match=re.escape(expected)):
            reader.partitions(given, given)
    beyond = source(rmq_sidecar, filled, tail_wait="1s")
    with pytest.raises(StreamOffsetError, match="shows no message at or past offset 4999"):
        beyond.latestOffset({"stream": filled, "offset": 5000}, ReadAllAvailable())
    lenient = source(rmq_sidecar, filled, tail_wait="1s", failOnDataLoss="false")
    past = {"stream": filled, "offset": 5000}
    assert lenient.latestOffset(past, ReadAllAvailable()) == past


def test_a_task_without_a_sidecar_names_host_and_port() -> None:
    """A task whose executor has no sidecar at ``host:port`` fails with that address."""
    from mq_sidecar_spark._stream_options import parse_stream_options
    from mq_sidecar_spark.errors import StompReadError
    from mq_sidecar_spark.stream import read_range
    from testbed import free_port

    port = free_port()
    options = parse_stream_options(
        {"stream": "true", "destination": "/amq/queue/x", "port": str(port)}, batch=True
    )
    with pytest.raises(StompReadError, match=f"cannot connect to the sidecar at 127.0.0.1:{port}"):
        list(read_range(options, 0, 10))
