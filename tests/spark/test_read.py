"""The stomp data source's streaming read (issue 26, part 4; docs/spark.md, "Streaming read"):
exactly once into a Spark sink, against a real ActiveMQ behind a real mq-sidecar process, on a
local SparkSession (``local[2]``, shared by the module).

Messages are published with stomp.py, each with a ``row-id`` header of its own; the sink's rows
are counted by it, so a message lost or emitted twice fails the test.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from testbed.sidecar import SidecarProcess, metric_total
from tests.spark.support import (
    ROW_ID,
    check_exactly_once,
    left_on_queue,
    publish,
    sink_rows,
    unique,
    wait_rows,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from tests.conftest import ActiveMQPairFactory

FAST = {"retry_interval": 50, "max_retry_interval": 500, "connect_timeout": 2000}

#: A driver of its own (a separate process with its own SparkSession and JVM) running one
#: query from the stomp source into a Parquet sink until the file ``stop`` appears (then it
#: stops the query and the session) or it is killed. argv[1]: JSON settings.
DRIVER = """
import json, sys, time
from pathlib import Path
from mq_sidecar_spark import StompDataSource
from pipeline.spark import start_spark, stop_spark

cfg = json.loads(sys.argv[1])
spark = start_spark("read-driver", master="local[2]", log_file=Path(cfg["log"]))
spark.dataSource.register(StompDataSource)
reader = spark.readStream.format("stomp")
for key, value in cfg["options"].items():
    reader = reader.option(key, value)
query = (
    reader.load().writeStream.format("parquet")
    .option("path", cfg["out"]).option("checkpointLocation", cfg["checkpoint"])
    .trigger(processingTime="300 milliseconds").start()
)
stop = Path(cfg["stop"])
deadline = time.monotonic() + 300
while not stop.exists() and time.monotonic() < deadline and query.exception() is None:
    time.sleep(0.2)
failure = query.exception()
query.stop()
stop_spark(spark)
if failure is not None:
    print("QUERY FAILED:", failure, file=sys.stderr)
    sys.exit(3)
"""


# -- helpers ------------------------------------------------------------------------------------


def start_query(
    spark: SparkSession,
    *,
    port: int,
    destination: str,
    checkpoint: Path,
    out: Path,
    **options: str,
) -> StreamingQuery:
    reader = (
        spark.readStream.format("stomp")
        .option("port", str(port))
        .option("destination", destination)
        .option("checkpoint_location", str(checkpoint))
    )
    for key, value in options.items():
        reader = reader.option(key, value)
    return (
        reader.load()
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="200 milliseconds")
        .start()
    )


def read_until(
    spark: SparkSession,
    *,
    port: int,
    destination: str,
    checkpoint: Path,
    out: Path,
    count: int,
    options: dict[str, str],
) -> tuple[list[Any], list[Any]]:
    """Run a query until the sink holds ``count`` rows and a few triggers more, then stop it;
    return the sink's rows and the query's progress reports."""
    query = start_query(
        spark, port=port, destination=destination, checkpoint=checkpoint, out=out, **options
    )
    try:
        wait_rows(spark, out, count, query, timeout=120)
        time.sleep(1.5)  # a few more triggers: nothing more may come
        return sink_rows(spark, out), query.recentProgress
    finally:
        query.stop()


# -- tests --------------------------------------------------------------------------------------


def stopped_mid_batch_then_read(
    spark: SparkSession,
    sidecar: SidecarProcess,
    destination: str,
    tmp_path: Path,
    *,
    counts: tuple[int, int],
    options: dict[str, str],
) -> tuple[list[Any], list[Any]]:
    """Publish ``counts[0]`` messages, run a query and stop it while a batch runs (read,
    logged, not ACKed), publish ``counts[1]`` more, and run it again until the sink holds all;
    return the sink's rows and the second run's progress reports."""
    before, after = counts
    checkpoint, out = tmp_path / "checkpoint", tmp_path / "out"
    port = sidecar.port
    publish(sidecar.address, destination, range(before))
    query = start_query(
        spark, port=port, destination=destination, checkpoint=checkpoint, out=out, **options
    )
    stop_mid_batch(query, checkpoint)
    publish(sidecar.address, destination, range(before, before + after))
    return read_until(
        spark,
        port=port,
        destination=destination,
        checkpoint=checkpoint,
        out=out,
        count=before + after,
        options=options,
    )


def test_messages_reach_a_parquet_sink_exactly_once(
    spark: SparkSession, amq_sidecar: SidecarProcess, tmp_path: Path
) -> None:
    """3,000 messages in batches of at most 400; the query is stopped while a batch runs (read,
    logged, not ACKed) and started again, with 500 more: Spark re-runs the batch from the read
    log, ActiveMQ redelivers its messages and they are recognised. Every message is once in the
    sink, with its destination, message-id, broker timestamp and headers, and none is left on
    the queue (the idle query ACKed the last batch)."""
    destination = unique("/queue/read")
    options = {"max_messages_per_batch": "400", "prefetch": "800"}
    rows, progress = stopped_mid_batch_then_read(
        spark, amq_sidecar, destination, tmp_path, counts=(3000, 500), options=options
    )
    check_exactly_once(rows, range(3500))
    sizes = [p["numInputRows"] for p in progress if p["numInputRows"]]
    assert max(sizes) <= 400, sizes
    row = next(row for row in rows if row["headers"][ROW_ID] == "0")
    assert row["destination"] == destination
    assert row["message_id"].startswith("ID:")  # ActiveMQ's
    assert row["duplicate_id"] is None  # the sidecar never shows mq-sidecar-id
    assert row["timestamp"] is not None
    assert abs(row["timestamp"].timestamp() - time.time()) < 600
    assert row["redelivered"] is False
    assert "ack" not in row["headers"]
    assert left_on_queue(amq_sidecar.address, destination) == 0
    check_progress(progress, dropped=True)


def check_progress(progress: list[Any], *, dropped: bool) -> None:
    """The reader's progress in each ``StreamingQueryProgress`` (``reportLatestOffset``, shown
    as the source's ``latestOffset``; docs/spark.md, "Progress of the read"): the received
    position at or past the batch's end, the settled ranges with their ACKs and Spark's commit
    before them, and (``dropped``) redeliveries dropped."""
    # A batch a restarted query runs again from its offset log is not planned again: no
    # latestOffset, so none reported.
    reports = [
        (json.loads(s["startOffset"]), json.loads(s["endOffset"]), json.loads(s["latestOffset"]))
        for p in progress
        for s in p["sources"]
        if p["numInputRows"] and s["latestOffset"] not in (None, "null")
    ]
    print("progress of the read:", *reports, sep="\n  ")
    assert reports, progress
    for start, end, latest in reports:
        assert latest["seq"] >= end["seq"] > start["seq"], (start, end, latest)
        assert latest["redeliveries_dropped"] >= 0
    settled = [latest for _, _, latest in reports if "acked" in latest]
    assert settled, reports
    for latest in settled:
        assert latest["acked_to"] > latest["acked_after"] >= 0, latest
        assert latest["acked"] >= 0
        assert latest["ack_ms"] >= 0
        assert latest["ack_delay_ms"] >= 0  # the commit log is under checkpoint_location
    # Settled ranges end at batch ends, and before the batch reported (a batch's ACKs are
    # written while the next one runs).
    ends = {end["seq"] for _, end, _ in reports} | {start["seq"] for start, _, _ in reports}
    for start, _, latest in reports:
        if "acked_to" in latest:
            assert latest["acked_to"] in ends, (latest, ends)
            assert latest["acked_to"] <= start["seq"], (start, latest)
    if dropped:
        assert max(latest["redeliveries_dropped"] for _, _, latest in reports) > 0, reports


class Driver:
    """A driver process of its own (``DRIVER``), in its own process group (its JVM and Python
    workers with it), so SIGKILL takes the whole driver down at once, as a lost driver host."""

    def __init__(self, workdir: Path, options: dict[str, str], out: Path, checkpoint: Path) -> None:
        self.workdir = workdir
        self.stop_file = workdir / "stop"
        self.log = workdir / "driver.log"
        self.cfg = {
            "options": options,
            "out": str(out),
            "checkpoint": str(checkpoint),
            "stop": str(self.stop_file),
            "log": str(workdir / "spark.log"),
        }
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.stop_file.unlink(missing_ok=True)
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", DRIVER, json.dumps(self.cfg)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=os.environ.copy(),
            )

    def kill(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def stop(self, timeout: float = 60) -> int:
        assert self.proc is not None
        self.stop_file.touch()
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(
                f"the driver did not stop within {timeout} s: {self.log.read_text()[-2000:]}"
            )

    def ensure_dead(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.kill()


def uncommitted_batch(checkpoint: Path, committed: int = 2) -> bool:
    """Whether Spark has logged the offsets of a batch that holds messages and not yet its
    commit (the batch is running), after at least ``committed`` batches."""
    offsets = {p.name for p in (checkpoint / "offsets").glob("[0-9]*")}
    commits = {p.name for p in (checkpoint / "commits").glob("[0-9]*")}
    if len(commits) < committed:
        return False
    for name in offsets - commits:
        with contextlib.suppress(OSError, ValueError, KeyError):
            last = (checkpoint / "offsets" / name).read_text().splitlines()[-1]
            if json.loads(last)["seq"] > 0:  # batch 0 is Spark's empty first one
                return True
    return False


def stop_mid_batch(query: StreamingQuery, checkpoint: Path, timeout: float = 120) -> None:
    """Stop the query (bounded wait) while a batch with messages runs: that batch is in the
    read log and not ACKed; Spark re-runs it after a restart."""
    deadline = time.monotonic() + timeout
    try:
        while not uncommitted_batch(checkpoint, committed=1):
            if query.exception() is not None:
                pytest.fail(f"the query failed: {query.exception()}")
            if time.monotonic() > deadline:
                pytest.fail(f"no batch was seen running within {timeout} s")
            time.sleep(0.02)
    finally:
        query.stop()


@pytest.mark.long
def test_a_driver_killed_mid_batch_restarts_and_every_message_is_in_the_sink_once(
    spark: SparkSession, amq_sidecar: SidecarProcess, tmp_path: Path
) -> None:
    """A driver process (own SparkSession) is killed with SIGKILL (its JVM and Python workers
    with it) while a batch is running, Spark's offset log ahead of its commit log and the read
    log holding batches not ACKed; a new driver with the same checkpoint re-runs that batch
    from the read log and goes on: 1,500 + 300 messages, each once in the Parquet sink."""
    destination = unique("/queue/restart")
    publish(amq_sidecar.address, destination, range(1500))
    checkpoint, out = tmp_path / "checkpoint", tmp_path / "out"
    options = {
        "port": str(amq_sidecar.port),
        "destination": destination,
        "checkpoint_location": str(checkpoint),
        "max_messages_per_batch": "150",
        "prefetch": "300",
    }
    first = Driver(tmp_path, options, out, checkpoint)
    first.start()
    try:
        deadline = time.monotonic() + 120
        while not uncommitted_batch(checkpoint):
            assert first.proc is not None
            assert first.proc.poll() is None, first.log.read_text()
            assert time.monotonic() < deadline, "no batch was seen running within 120 s"
            time.sleep(0.05)
        first.kill()
    finally:
        first.ensure_dead()
    before = len(sink_rows(spark, out))
    logged = list((checkpoint / "sources" / "mq-sidecar-stomp").glob("*/batch-*.log"))
    assert logged, "the read log held no batch at the kill: the restart path was not exercised"
    assert before < 1500

    second = Driver(tmp_path, options, out, checkpoint)
    second.start()
    try:
        publish(amq_sidecar.address, destination, range(1500, 1800))
        rows = wait_rows(spark, out, 1800, None, timeout=180)
        time.sleep(1.5)  # a few more triggers: nothing more may come
        rows = sink_rows(spark, out)
        assert second.stop() == 0, second.log.read_text()[-3000:]
    finally:
        second.ensure_dead()
    check_exactly_once(rows, range(1800))


def test_a_broker_killed_mid_read_fails_over_and_every_message_is_in_the_sink_once(
    spark: SparkSession, activemq_pair: ActiveMQPairFactory, tmp_path: Path
) -> None:
    """An ActiveMQ primary/backup pair behind a sidecar process; the primary is killed with
    SIGKILL while the query reads (batches of at most 200, some read and not ACKed); the backup
    takes over, the sidecar fails over and restores the subscription, and every one of 2,000
    messages sent before the kill and 1,000 after it is in the Parquet sink once."""
    primary, backup = activemq_pair()
    sidecar = SidecarProcess(
        "failover",
        tmp_path / "sidecar",
        brokers=f"failover:({primary.stomp_url},{backup.stomp_url})",
        options=FAST,
    )
    destination = unique("/queue/failover")
    checkpoint, out = tmp_path / "checkpoint", tmp_path / "out"
    with sidecar:
        publish(sidecar.address, destination, range(2000))
        query = start_query(
            spark,
            port=sidecar.port,
            destination=destination,
            checkpoint=checkpoint,
            out=out,
            max_messages_per_batch="200",
            prefetch="400",
        )
        try:
            at_kill = len(wait_rows(spark, out, 600, query, timeout=120))
            primary.kill()
            publish(sidecar.address, destination, range(2000, 3000))
            wait_rows(spark, out, 3000, query, timeout=180)
            time.sleep(1.5)  # a few more triggers: nothing more may come
            rows = sink_rows(spark, out)
        finally:
            query.stop()
        failovers = metric_total(sidecar.metrics(), "mq_sidecar_failovers_total")
    check_exactly_once(rows, range(3000))
    assert at_kill < 2000, "everything was read before the kill: no failover mid-read"
    assert failovers >= 1


def query_failure(spark: SparkSession, tmp_path: Path, options: dict[str, str]) -> str:
    """Start a query with ``options`` and return the text of its failure (raised by ``load``
    or ``start``, or ending the query); fails the test if it runs on for 60 s."""
    checkpoint = tmp_path / "checkpoint"
    settings = {"checkpoint_location": str(checkpoint), **options}
    started = time.monotonic()
    try:
        reader = spark.readStream.format("stomp")
        for key, value in settings.items():
            reader = reader.option(key, value)
        query = (
            reader.load()
            .writeStream.format("parquet")
            .option("path", str(tmp_path / "out"))
            .option("checkpointLocation", str(checkpoint))
            .start()
        )
    except Exception as exc:
        return str(exc)
    try:
        ended = query.awaitTermination(60)
    except Exception as exc:
        return str(exc)
    finally:
        query.stop()
    pytest.fail(f"the query did not fail (ended: {ended}) in {time.monotonic() - started:.0f} s")


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"destination": "/queue/x", "prefetchh": "10"}, "unknown option(s) for the stomp"),
        ({"port": "1"}, "option destination is required"),
        ({"destination": "/queue/x", "max_messages_per_batch": "0"}, "must be at least 1"),
        (
            {"destination": "/queue/x", "max_messages_per_batch": "500", "prefetch": "500"},
            "must be larger than max_messages_per_batch",
        ),
        ({"destination": "/queue/x", "timeout": "soon"}, "option timeout='soon'"),
    ],
)
def test_bad_options_fail_the_query_with_the_option_named(
    spark: SparkSession, tmp_path: Path, options: dict[str, str], expected: str
) -> None:
    """A bad option fails the query at its start, the option named."""
    assert expected in query_failure(spark, tmp_path, options)


def test_no_checkpoint_location_is_refused_with_the_reason(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Without ``checkpoint_location`` the reader cannot keep its read log (Spark does not tell
    a Python data source where the query's checkpoint is): refused, the option named."""
    text = query_failure(spark, tmp_path, {"destination": "/queue/x", "checkpoint_location": ""})
    assert "option checkpoint_location is required" in text


def test_no_sidecar_fails_the_query_naming_host_and_port(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Nothing listens at host:port: the query fails at once, naming them."""
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    text = query_failure(spark, tmp_path, {"destination": "/queue/x", "port": str(port)})
    assert f"cannot connect to the sidecar at 127.0.0.1:{port}" in text


def test_a_silent_peer_fails_the_query_within_timeout(spark: SparkSession, tmp_path: Path) -> None:
    """A peer that takes the connection and never answers CONNECT: the query fails after
    ``timeout`` seconds (2 here), never hangs."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        port = silent.getsockname()[1]
        started = time.monotonic()
        text = query_failure(
            spark, tmp_path, {"destination": "/queue/x", "port": str(port), "timeout": "2"}
        )
    assert f"no answer to CONNECT from the sidecar at 127.0.0.1:{port} within 2 s" in text
    assert time.monotonic() - started < 45


def test_a_destination_the_broker_refuses_fails_the_query_with_its_error(
    spark: SparkSession, rmq_sidecar: SidecarProcess, tmp_path: Path
) -> None:
    """RabbitMQ refuses a SUBSCRIBE to an exchange that does not exist; its ERROR, passed on by
    the sidecar, is in the query's failure."""
    destination = f"/exchange/missing-{uuid.uuid4().hex[:8]}"
    text = query_failure(
        spark, tmp_path, {"destination": destination, "port": str(rmq_sidecar.port)}
    )
    assert f"SUBSCRIBE to {destination} failed" in text
    assert "sent ERROR" in text
    assert "not_found" in text


def test_a_read_log_of_another_version_refuses_to_start(
    spark: SparkSession, amq_sidecar: SidecarProcess, tmp_path: Path
) -> None:
    """A read log written by another format version: the query refuses to start, naming both
    versions, rather than misreading it."""
    destination = unique("/queue/version")
    log = tmp_path / "checkpoint" / "sources" / "mq-sidecar-stomp" / destination.replace("/", "%2F")
    log.mkdir(parents=True)
    header = {"format": "mq-sidecar-stomp-read-log", "version": 99, "destination": destination}
    (log / "committed.log").write_text(json.dumps(header) + "\n")
    text = query_failure(
        spark, tmp_path, {"destination": destination, "port": str(amq_sidecar.port)}
    )
    assert "written by read-log format version 99" in text
    assert "reads version 1 only" in text


@pytest.mark.parametrize("id_header", ["row-id", None])
def test_rabbitmq_redeliveries_after_a_restart_need_id_header(
    spark: SparkSession, rmq_sidecar: SidecarProcess, tmp_path: Path, id_header: str | None
) -> None:
    """RabbitMQ gives a redelivery a new ``message-id`` (docs/brokers.md, "Message ids"). The
    query is stopped while a batch runs (read, logged, not ACKed), then started again with 100
    more: Spark re-runs that batch from the read log, and RabbitMQ redelivers its messages. With
    ``id_header`` naming the producer's ``row-id`` they are recognised and every message is in
    the sink once, and none is left on the queue; without it, they are in the sink twice (the
    documented bound)."""
    destination = unique("/queue/rabbit")
    options = {"max_messages_per_batch": "100", "prefetch": "200"}
    if id_header is not None:
        options["id_header"] = id_header
    rows, _ = stopped_mid_batch_then_read(
        spark, rmq_sidecar, destination, tmp_path, counts=(600, 100), options=options
    )
    if id_header is not None:
        check_exactly_once(rows, range(700))
        assert left_on_queue(rmq_sidecar.address, destination) == 0  # every message ACKed
        return
    twice = [k for k, v in Counter(row["headers"][ROW_ID] for row in rows).items() if v > 1]
    assert twice, "a RabbitMQ redelivery was recognised without id_header"
    assert any(row["redelivered"] for row in rows if row["headers"][ROW_ID] == twice[0])


def test_trigger_available_now_reads_until_quiet_and_ends(
    spark: SparkSession, amq_sidecar: SidecarProcess, tmp_path: Path
) -> None:
    """``Trigger.AvailableNow``: the query reads 300 messages in batches of 100 and ends by
    itself; run again after 100 more, it reads those and ends, each message once in the sink
    (the first run's last batch, never ACKed, comes back and is recognised)."""
    destination = unique("/queue/now")
    checkpoint, out = tmp_path / "checkpoint", tmp_path / "out"
    sizes: list[list[int]] = []
    for ids in (range(300), range(300, 400)):
        publish(amq_sidecar.address, destination, ids)
        reader = (
            spark.readStream.format("stomp")
            .option("port", str(amq_sidecar.port))
            .option("destination", destination)
            .option("checkpoint_location", str(checkpoint))
            .option("max_messages_per_batch", "100")
        )
        query = (
            reader.load()
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        try:
            assert query.awaitTermination(120), "the AvailableNow query did not end in 120 s"
            assert query.exception() is None
            sizes.append([p["numInputRows"] for p in query.recentProgress])
        finally:
            query.stop()
    check_exactly_once(sink_rows(spark, out), range(400))
    assert [sum(run) for run in sizes] == [300, 100], sizes
    assert max(max(run) for run in sizes) <= 100, sizes


def test_progress_before_any_batch_and_the_time_of_sparks_commit(tmp_path: Path) -> None:
    """Scripted, no broker: no progress before the first ``latestOffset``; Spark's commit time
    is the modification time of the highest-numbered file in ``<checkpoint>/commits/``
    (numbers compared as numbers), none without that directory."""
    from mq_sidecar_spark._read_progress import spark_committed_at
    from mq_sidecar_spark.reader import READ_SCHEMA, StompStreamReader

    reader = StompStreamReader(
        READ_SCHEMA, {"destination": "/queue/x", "checkpoint_location": str(tmp_path)}
    )
    assert reader.reportLatestOffset() is None
    assert spark_committed_at(tmp_path) is None
    commits = tmp_path / "commits"
    commits.mkdir()
    assert spark_committed_at(tmp_path) is None
    for name, when in (("9", 2_000_000_000), ("10", 1_000_000_000), (".10.crc", 3_000_000_000)):
        (commits / name).write_text("v1\n{}\n")
        os.utime(commits / name, (when, when))
    assert spark_committed_at(tmp_path) == 1_000_000_000
