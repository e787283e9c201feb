"""Bad input to the stomp writer fails the job with one clear error, never a hang or a skipped row
(issue 26): bad options (on the driver, before any task), a sidecar that is not there or does
not answer, rows that cannot be sent, a destination the broker refuses, the sidecar's own limit.

Against real brokers through real mq-sidecar processes on ``local[2,2]`` (a failed task is tried
twice, so each task-side case also shows that the retry fails the same way and the job ends).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from testbed import ActiveMQ, free_port
from testbed.sidecar import SidecarProcess
from tests.spark.conftest import SIDECAR_OPTIONS
from tests.spark.support import Drain, unique

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def error_of(action: Callable[[], object]) -> str:
    """The text of the exception ``action`` raises (AssertionError if it raises none)."""
    try:
        action()
    except Exception as exc:  # Spark's AnalysisException, PythonException...
        return str(exc)
    raise AssertionError("the write did not fail")


def save(df: DataFrame, mode: str = "append", **options: str) -> Callable[[], None]:
    """A ``df.write.format("stomp")`` with ``options``, to run later."""

    def run() -> None:
        writer = df.write.format("stomp")
        for key, value in options.items():
            writer = writer.option(key, value)
        writer.mode(mode).save()

    return run


def small(spark: SparkSession) -> DataFrame:
    from pyspark.sql import functions as F

    return spark.range(0, 10, numPartitions=2).select(
        "id", F.concat(F.lit("t"), "id").alias("text")
    )


# -- options: refused on the driver ---------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({}, "option destination is required"),
        (
            {"destination": "/queue/x", "recipt_every": "5"},
            "unknown option(s) recipt_every; the stomp writer knows: host, port, destination, "
            "login, passcode, receipt_every, max_in_flight, id_columns, id_prefix, "
            "header_columns, body_format, body_column, persistent, timeout",
        ),
        (
            {"destination": "/queue/x", "receipt_every": "0"},
            "receipt_every='0': must be at least 1",
        ),
        ({"destination": "/queue/x", "max_in_flight": "many"}, "max_in_flight='many': not an"),
        ({"destination": "/queue/x", "timeout": "-1"}, "timeout='-1': must be > 0"),
        ({"destination": "/queue/x", "port": "70000"}, "port='70000': must be at most 65535"),
        ({"destination": "/queue/x", "persistent": "yes"}, "persistent='yes': true or false"),
        ({"destination": "/queue/x", "body_format": "xml"}, "body_format='xml': one of json"),
        ({"destination": "/queue/x", "body_format": "string"}, "needs option body_column"),
        (
            {"destination": "/queue/x", "body_format": "binary", "body_column": "text"},
            "column 'text' is of type string; body_format binary needs a binary column",
        ),
        ({"destination": "/queue/x", "id_columns": "id,nope"}, "no column 'nope' in the"),
        ({"destination": "/queue/x", "id_prefix": "a/b"}, "id_prefix='a/b': may not contain"),
    ],
)
def test_bad_option_fails_on_the_driver(
    spark: SparkSession, options: dict[str, str], expected: str
) -> None:
    """Each bad option fails ``save()`` at once, with a message naming it."""
    text = error_of(save(small(spark), **options))
    assert expected in text
    assert "OptionError" in text


def test_several_problems_are_named_together(spark: SparkSession) -> None:
    """One error names every bad option, a header column named like a header the writer
    sets, and a column with no JSON form."""
    from pyspark.sql import functions as F

    df = small(spark).withColumn("destination", F.lit("d"))
    text = error_of(
        save(df, destination="/queue/x", receipt_every="x", header_columns="destination")
    )
    assert "receipt_every='x': not an integer" in text
    assert "'destination' is a header the writer sets itself" in text
    interval = small(spark).withColumn("span", F.expr("INTERVAL '1' DAY"))
    text = error_of(save(interval, destination="/queue/x"))
    assert "column span is of type interval day, which has no JSON form" in text


def test_only_append_mode_is_accepted(spark: SparkSession) -> None:
    """Overwrite is refused by the data source; the default mode (ErrorIfExists) and Ignore
    by Spark itself, for every Python data source (pyspark 4.3)."""
    text = error_of(save(small(spark), mode="overwrite", destination="/queue/x"))
    assert "save mode overwrite is not supported" in text
    for mode, name in (("errorifexists", "ErrorIfExists"), ("ignore", "Ignore")):
        text = error_of(save(small(spark), mode=mode, destination="/queue/x"))
        assert f'The data source "stomp" cannot be written in the "{name}" mode' in text


def test_a_batch_read_says_what_to_use(spark: SparkSession) -> None:
    """``spark.read.format("stomp")`` (issue 33 part 5: a raw NOT_IMPLEMENTED traceback before):
    one sentence on the driver that says to read a queue as a stream."""
    message = error_of(
        lambda: spark.read.format("stomp").option("destination", "/queue/q").load().collect()
    )
    assert "batch reads (spark.read) of a queue are not supported" in message
    assert "spark.readStream.format('stomp')" in message


def test_streaming_write_checks_its_options_too(spark: SparkSession, tmp_path: Path) -> None:
    """A streaming write with a bad option: the query fails when Spark makes its writer (on
    the query's thread, after ``start()`` returned), with the option named."""
    stream = spark.readStream.format("rate").option("rowsPerSecond", "1").load()
    query = (
        stream.writeStream.format("stomp")
        .option("destination", "/queue/x")
        .option("max_in_flight", "0")
        .option("checkpointLocation", str(tmp_path / "cp"))
        .start()
    )
    try:
        text = error_of(lambda: query.awaitTermination(60))
    finally:
        query.stop()
    assert "max_in_flight='0': must be at least 1" in text


# -- the sidecar not there, or silent ---------------------------------------------------------


def test_no_sidecar_listening_names_host_and_port(spark: SparkSession) -> None:
    port = free_port()
    started = time.monotonic()
    text = error_of(save(small(spark), destination="/queue/x", port=str(port), timeout="5"))
    assert f"cannot connect to the sidecar at 127.0.0.1:{port}: Connection refused" in text
    assert "StompConnectError" in text
    assert time.monotonic() - started < 60


def test_a_silent_peer_fails_the_connect_within_timeout(spark: SparkSession) -> None:
    """Something accepts the TCP connection but never answers the CONNECT (a hung sidecar):
    each attempt fails after ``timeout`` seconds."""
    with socket.create_server(("127.0.0.1", 0)) as silent:
        port = silent.getsockname()[1]
        started = time.monotonic()
        text = error_of(save(small(spark), destination="/queue/x", port=str(port), timeout="2"))
        elapsed = time.monotonic() - started
    assert f"no CONNECTED from 127.0.0.1:{port} within 2 s (option timeout)" in text
    assert elapsed < 60


# -- rows that cannot be sent ---------------------------------------------------------------


def test_a_null_id_column_fails_naming_the_row(
    spark: SparkSession, amq_sidecar: SidecarProcess
) -> None:
    """Row 3 of partition 0 has a null key: the job fails naming it; the rows before it were
    sent (and are on the broker), nothing is skipped silently."""
    from pyspark.sql import functions as F

    df = spark.range(0, 10, numPartitions=2).select(
        F.when(F.col("id") == 3, None).otherwise(F.col("id")).alias("key"), "id"
    )
    destination = unique()
    text = error_of(save(df, destination=destination, port=str(amq_sidecar.port), id_columns="key"))
    assert "RowError" in text
    assert "row 3 of partition 0: id column 'key' is null" in text


def test_a_null_body_column_fails_naming_the_row_id(
    spark: SparkSession, amq_sidecar: SidecarProcess
) -> None:
    from pyspark.sql import functions as F

    df = spark.range(0, 10, numPartitions=2).select(
        "id", F.when(F.col("id") == 7, None).otherwise(F.lit("x")).alias("text")
    )
    text = error_of(
        save(
            df,
            destination=unique(),
            port=str(amq_sidecar.port),
            id_columns="id",
            id_prefix="j",
            body_format="string",
            body_column="text",
        )
    )
    assert "row id 'j/7' (row 2 of partition 1): body column 'text' is null" in text


# -- ERROR frames: the broker's and the sidecar's -------------------------------------------


@pytest.mark.rabbitmq
def test_a_destination_rabbitmq_refuses_fails_with_its_error(
    spark: SparkSession, rmq_sidecar: SidecarProcess
) -> None:
    """RabbitMQ refuses a SEND to an exchange that does not exist; its ERROR (message and
    body), passed on by the sidecar, is in the job's error."""
    exchange = unique("nosuch")[1:].replace("/", "-")
    text = error_of(
        save(small(spark), destination=f"/exchange/{exchange}", port=str(rmq_sidecar.port))
    )
    assert "StompErrorFrame" in text
    assert f"the sidecar at 127.0.0.1:{rmq_sidecar.port} sent ERROR: not_found" in text
    assert f"NOT_FOUND - no exchange '{exchange}' in vhost '/'" in text


def test_a_row_over_the_sidecars_frame_limit_fails_with_its_error(
    spark: SparkSession, activemq: ActiveMQ, tmp_path: Path
) -> None:
    """A sidecar with ``max_frame_bytes = 4096``: the row whose SEND is larger gets the
    sidecar's own ERROR, and the job fails with it; the rows before it were confirmed."""
    from pyspark.sql import functions as F

    df = spark.range(0, 6, numPartitions=1).select(
        "id", F.when(F.col("id") == 4, F.repeat(F.lit("x"), 8000)).otherwise("id").alias("text")
    )
    destination = unique()
    sidecar = SidecarProcess(
        "limited",
        tmp_path,
        brokers=activemq.stomp_url,
        options={**SIDECAR_OPTIONS, "max_frame_bytes": 4096},
    )
    with sidecar, Drain(sidecar.port, destination) as drain:
        text = error_of(save(df, destination=destination, port=str(sidecar.port), id_columns="id"))
        shown = drain.settle(1.0)
    assert "StompErrorFrame" in text
    assert "frame too large (more than 4096 bytes)" in text
    # Both attempts sent rows 0..3 (same ids) before the large one: shown once each.
    assert sorted(m.headers["row-id"] for m in shown) == ["0", "1", "2", "3"]
