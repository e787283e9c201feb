"""A Spark standalone cluster of the test bed (``testbed.spark_cluster``): a master and two
workers as JVMs of their own, executors started by the workers, jobs from a SparkSession in
this process (the driver) run in those executors' Python workers.

One cluster and one session per module (module fixtures; the JVMs cost about 5 s each on 2
cores): the cluster starts in about 6 s, the session and its two executors in 15-20 s more.
The tests share it in file order, and the last one stops the cluster itself (it checks
that nothing is left running), so it must stay last. Four tests kill an executor with kill -9
(a batch write, a streaming write, a streaming read of a queue and one of a RabbitMQ stream
through the data source); the master starts a replacement, and the next test that needs both
executors waits for it.

Only one SparkContext can live in a process: the module fails at once (rather than silently
running on ``local[2]``) if another one is active, e.g. the ``spark`` fixture of
tests/pipeline/conftest.py left by an earlier module in the same pytest run.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from mq_sidecar_spark.stream import STREAM_SCHEMA
from pipeline.publish import PublishSettings, SparkProgress, register, stomp_write
from pipeline.rows import load_flights
from pipeline.verify import Reader, expected, reconcile
from testbed import ActiveMQ, RabbitMQ
from testbed.broker import proc_stat, process_alive
from testbed.spark_cluster import SparkCluster, SparkClusterError
from tests.integration.support import SidecarThread, sidecar_config, unique, wait_until
from tests.spark.support import (
    Drain,
    check_exactly_once,
    check_stream_written,
    finish,
    forget_commit,
    left_on_queue,
    new_stream,
    publish,
    sink_rows,
    start_stream_write,
    write_json_files,
)

if TYPE_CHECKING:
    from pyspark.sql import Row, SparkSession

#: Generous bound for a drain or a job on a loaded 2-core machine.
DRAIN_TIMEOUT = 120.0


def read_at_least(query: Any, count: int) -> Callable[[], bool]:
    """A condition for ``wait_until``: the streaming ``query`` read ``count`` rows (its
    progress reports' ``numInputRows``); the test fails at once if the query failed."""

    def done() -> bool:
        if query.exception() is not None:
            pytest.fail(f"the query failed: {query.exception()}")
        return sum(int(p["numInputRows"]) for p in query.recentProgress) >= count

    return done


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    """A master and two workers (1 core, 1 GiB each) on 127.0.0.1."""
    with SparkCluster(work_dir=tmp_path_factory.mktemp("spark-cluster"), workers=2) as started:
        yield started


@pytest.fixture(scope="module")
def cluster_spark(cluster: SparkCluster) -> Iterator[SparkSession]:
    """A SparkSession (the driver, in this process) on ``cluster``, with both executors up."""
    from pyspark import SparkContext

    from pipeline.spark import start_spark, stop_spark

    if SparkContext._active_spark_context is not None:
        pytest.fail(
            "another SparkContext is active in this process (one per process): run "
            "tests/pipeline/test_spark_cluster.py before the tests that use the `spark` "
            "fixture, or on its own",
            pytrace=False,
        )
    session = start_spark(
        "mq-sidecar-cluster-tests",
        master=cluster.master_url,
        conf=cluster.spark_conf(),
        log_file=cluster.work_dir / "driver.log",
    )
    try:
        assert session.sparkContext.master == cluster.master_url
        yield session
    finally:
        stop_spark(session)


@pytest.fixture(scope="module")
def producer_sidecar(activemq: ActiveMQ) -> Iterator[SidecarThread]:
    """The producing app's own sidecar (the consumer reads through ``amq_sidecar``), as each
    pod has its own."""
    with SidecarThread(sidecar_config(activemq.stomp_url)) as sidecar:
        yield sidecar


def ancestors(pid: int) -> list[int]:
    """``pid``'s parent, grandparent... up to PID 1 (at most 64 steps)."""
    chain: list[int] = []
    st = proc_stat(pid)
    while st is not None and st.ppid > 1 and len(chain) < 64:
        chain.append(st.ppid)
        st = proc_stat(st.ppid)
    return chain


def committed_files(out: Path) -> set[str]:
    """Names of the files a Parquet sink committed: those its ``_spark_metadata`` log lists
    (one JSON line per file after a version line, in each batch's log file)."""
    names: set[str] = set()
    for log in (out / "_spark_metadata").glob("[0-9]*"):
        for line in log.read_text().splitlines()[1:]:
            names.add(Path(json.loads(line)["path"].removeprefix("file:")).name)
    return names


def hidden_by_live_sessions(sidecar: SidecarThread) -> int:
    """Duplicates the sidecar hid from its live sessions (the reader's, here)."""
    return sum(s.duplicates_hidden for s in sidecar.statistics().sessions)


def test_arguments_and_state_before_start(tmp_path: Path) -> None:
    """Bad sizes are refused at once; a cluster never started has no master URL or
    configuration, and stopping it is a no-op."""
    for bad in ({"workers": 0}, {"cores_per_worker": 0}, {"memory_per_worker": "1.5g"}):
        with pytest.raises(ValueError, match="must"):
            SparkCluster(work_dir=tmp_path, **bad)
    with pytest.raises(ValueError, match="at least 512m"):
        SparkCluster(work_dir=tmp_path, memory_per_worker="256m")
    idle = SparkCluster(work_dir=tmp_path)
    with pytest.raises(SparkClusterError, match="never started"):
        idle.spark_conf()
    idle.stop()
    assert (idle.running(), idle.worker_pids(), idle.executor_pids()) == (False, [], [])


def test_a_taken_port_fails_the_start_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The master's port is taken by another socket: the master JVM exits (no silent move to
    another port, spark.port.maxRetries=0), start() raises with the master's log, and no
    process of the cluster is left."""
    import testbed.spark_cluster
    import testbed.spark_procs

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        real = testbed.spark_procs.distinct_free_ports
        monkeypatch.setattr(
            testbed.spark_cluster, "distinct_free_ports", lambda n: [port, *real(n - 1)]
        )
        cluster = SparkCluster(work_dir=tmp_path, workers=1)
        with pytest.raises(SparkClusterError, match="master exited") as failure:
            cluster.start(timeout=60.0)
    assert "Address already in use: Service 'sparkMaster' failed after 0 retries" in str(
        failure.value
    ), "the log's tail says why"
    assert cluster.processes() == []
    assert not cluster.running()


_OWNER_SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from pipeline.spark import start_spark
    from testbed.spark_cluster import SparkCluster, SparkClusterError
    work = Path(sys.argv[1])
    cluster = SparkCluster(work_dir=work, workers=1, memory_per_worker="512m")
    cluster.start()
    conf = cluster.spark_conf()
    spark = start_spark("owner", master=conf["spark.master"], conf=conf, log_file=work / "d.log")
    assert spark.sparkContext.parallelize(range(4), 1).sum() == 6
    print(json.dumps([[p.pid, p.starttime, p.role] for p in cluster.processes()]), flush=True)
    time.sleep(600)
    """
)


def test_no_cluster_process_outlives_its_owner(tmp_path: Path) -> None:
    """SIGKILL of the process that started a cluster (with an application on it, so an
    executor and its Python workers run): the master, the worker, the executor and the
    Python processes under it all die (the guardian, the parent-death signal, and PySpark's
    daemon exiting when its executor's pipe closes)."""
    with subprocess.Popen(
        [sys.executable, "-c", _OWNER_SCRIPT, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parent.parent.parent,
    ) as owner:
        try:
            assert owner.stdout is not None
            line = owner.stdout.readline()  # bounded by pytest's timeout (the cluster's 120 s)
            assert line, f"the owner exited with {owner.wait(timeout=30)} before its report"
            seen = [(pid, starttime, role) for pid, starttime, role in json.loads(line)]
            roles = sorted({role for _, _, role in seen})
            assert roles == ["executor", "master", "python", "worker"], seen
            os.kill(owner.pid, signal.SIGKILL)
            owner.wait(timeout=30)

            def all_gone() -> bool:
                return not any(process_alive(pid, starttime) for pid, starttime, _ in seen)

            wait_until(all_gone, timeout=30.0)
        finally:
            if owner.poll() is None:
                owner.kill()
                owner.wait(timeout=30)


def test_two_alive_workers_run_tasks_in_executor_processes(
    cluster: SparkCluster, cluster_spark: SparkSession
) -> None:
    """Two ALIVE workers; a job gives the right answer, and its tasks ran in Python workers
    under executor JVMs (not in this process or the driver JVM), executors on both workers,
    with the venv's Python and this process's PYTHONPATH (the worktree's ``pipeline``)."""
    import pipeline

    state = cluster.master_state()
    assert state["url"] == cluster.master_url
    alive = [w for w in state["workers"] if w["state"] == "ALIVE"]
    assert len(alive) == 2
    assert {(w["host"], w["cores"], w["memory"]) for w in alive} == {("127.0.0.1", 1, 1024)}
    assert [app["name"] for app in state["activeapps"]] == ["mq-sidecar-cluster-tests"]

    sc = cluster_spark.sparkContext
    assert sc.parallelize(range(1000), 4).map(lambda x: x * x).sum() == sum(
        x * x for x in range(1000)
    )

    def where(_: int) -> tuple[int, str, str]:
        import os
        import sys
        import time

        import pipeline

        time.sleep(0.2)  # a task long enough for the other executor to take the next one
        return os.getpid(), sys.executable, pipeline.__file__

    tasks = sc.parallelize(range(8), 4).map(where).collect()
    executors = cluster.executor_pids()
    workers = cluster.worker_pids()
    assert len(executors) == 2, executors
    assert {pid for pid, _, _ in tasks}.isdisjoint({os.getpid(), *executors, *workers})
    used = set()
    for pid, executable, module in tasks:
        chain = ancestors(pid)
        under = [p for p in chain if p in executors]
        assert len(under) == 1, f"task pid {pid} (ancestors {chain}) is under no executor"
        executor = under[0]
        assert chain[chain.index(executor) + 1] in workers, "an executor is a worker's child"
        used.add(executor)
        assert (executable, module) == (sys.executable, pipeline.__file__)
    assert used == set(executors), "tasks ran on both workers' executors"
    gateway = sc._gateway.proc.pid  # type: ignore[union-attr]
    assert all(gateway not in ancestors(pid) for pid, _, _ in tasks), "not in the driver JVM"


def test_publish_through_a_sidecar_from_the_cluster(
    cluster_spark: SparkSession,
    producer_sidecar: SidecarThread,
    amq_sidecar: SidecarThread,
    flights_sample_csv: Path,
) -> None:
    """1,000 flights in 4 partitions published from the executors with the data source
    (``df.write.format("stomp")``, as the drill does) through the producer's sidecar into
    ActiveMQ: each arrives once, with its content, at a reader behind the consumer's
    sidecar."""
    df = load_flights(cluster_spark, flights_sample_csv).repartition(4, "row").cache()
    assert df.count() == 1000
    destination = unique("/queue/cluster")
    settings = PublishSettings(
        destination=destination,
        job="cluster",
        port=producer_sidecar.address[1],
        receipt_every=50,
        max_in_flight=4,
    )
    reader = Reader(destination, port=amq_sidecar.address[1])
    reader.start()
    progress = SparkProgress(cluster_spark, 1000, "cluster-publish")
    try:
        stomp_write(df, settings, group="cluster-publish")
        assert reader.wait_for(1000, idle=30.0, timeout=DRAIN_TIMEOUT)
        reader.settle(0.5, timeout=10.0)
    finally:
        reader.close()
    result = reconcile(expected(df, "cluster"), reader.snapshot())
    df.unpersist()
    assert result.ok, result.to_dict(10)
    assert (result.expected, result.received, result.unique) == (1000, 1000, 1000)
    assert progress.total() == 1000.0, "Spark's progress: every task of the job finished"


def test_executor_killed_mid_job_every_row_once(
    cluster: SparkCluster,
    cluster_spark: SparkSession,
    producer_sidecar: SidecarThread,
    amq_sidecar: SidecarThread,
) -> None:
    """kill -9 of an executor JVM while both executors publish a partition: the job still
    completes (Spark runs the lost task again, and the master starts a new executor), and the
    reader gets every row exactly once. The retried task re-sent the rows its first attempt
    had published with the same ``mq-sidecar-id``s, and the consumer's sidecar hid them.

    Each task runs the data source's own per-partition writer
    (``mq_sidecar_spark.writer.write_partition``, what ``df.write.format("stomp")`` runs per
    task, with the drill's id options) on its rows handed over one every 5 ms: the rows reach
    a Python worker in large batches, so only a pace set inside the writer's own loop keeps a
    partition's publish going for 4 s, long enough to kill an executor in the middle of one."""
    from pyspark.sql import functions as F

    from mq_sidecar_spark.options import parse_write_options

    rows, partitions, trigger = 800, 4, 150
    df = cluster_spark.range(0, rows * partitions, numPartitions=partitions).select(
        F.col("id").alias("row"), F.concat(F.lit("row-"), "id").alias("text")
    )
    destination = unique("/queue/cluster-kill")
    schema = df.schema
    options = parse_write_options(
        {
            "port": str(producer_sidecar.address[1]),
            "destination": destination,
            "id_columns": "row",
            "id_prefix": "kill",
            "receipt_every": "50",
            "max_in_flight": "2",
        },
        schema,
    )
    sent = cluster_spark.sparkContext.accumulator(0)
    progress = SparkProgress(cluster_spark, rows * partitions, "cluster-kill")

    def slow_publish(partition_rows: Iterator[Row]) -> None:
        import time

        from mq_sidecar_spark.writer import write_partition

        def paced() -> Iterator[Row]:
            for row in partition_rows:
                time.sleep(0.005)
                yield row

        sent.add(write_partition(paced(), schema, options, None).rows)

    before = set(cluster.executor_pids())
    assert len(before) == 2
    reader = Reader(destination, port=amq_sidecar.address[1])
    reader.start()
    outcome: list[object] = []

    def job() -> None:
        try:
            cluster_spark.sparkContext.setJobGroup("cluster-kill", "paced publish")
            df.foreachPartition(slow_publish)
            outcome.append(sent.value)
        except BaseException as exc:  # reported to the test thread
            outcome.append(exc)

    runner = threading.Thread(target=job, name="cluster-job", daemon=True)
    runner.start()
    try:

        def two_partitions_under_way() -> bool:
            per_partition: dict[int, int] = {}
            for mid in reader.snapshot().counts:  # kill/<row>: rows [p * rows, (p + 1) * rows)
                partition = int(mid.split("/")[1]) // rows
                per_partition[partition] = per_partition.get(partition, 0) + 1
            return sum(n >= trigger for n in per_partition.values()) >= 2

        # Both executors (1 core each) are each in the middle of a partition, with at least
        # `trigger` of its rows on the broker: whichever is killed, its rows are sent twice.
        wait_until(two_partitions_under_way, timeout=DRAIN_TIMEOUT)
        killed = cluster.kill_executor()
        runner.join(DRAIN_TIMEOUT)
        assert not runner.is_alive(), "the job did not finish"
        assert outcome == [rows * partitions]
        assert reader.wait_for(rows * partitions, idle=30.0, timeout=DRAIN_TIMEOUT)
        reader.settle(1.0, timeout=10.0)
        hidden = hidden_by_live_sessions(amq_sidecar)
    finally:
        reader.close()
    result = reconcile(expected(df, "kill"), reader.snapshot())
    assert result.ok, result.to_dict(10)
    assert (result.received, result.unique) == (rows * partitions, rows * partitions)
    assert killed in before
    assert not process_alive(killed)
    assert progress.retried() >= 1, "Spark ran a task again"
    assert hidden >= trigger, "the retry's copies reached the consumer's sidecar, not the app"
    wait_until(lambda: len(set(cluster.executor_pids()) - before) == 1, timeout=DRAIN_TIMEOUT)


def _hold_first_row(marks: Path) -> Callable[[Any], Any]:
    """The function of :class:`HeldTask`'s UDF (it runs in the executors' Python workers)."""
    gate, release = marks / "gate", marks / "release"

    def hold(value: Any) -> Any:
        import os
        import time

        from pyspark import TaskContext

        context = TaskContext.get()
        if context is None:
            return value
        task = (context.stageId(), context.partitionId())
        info = marks / "task-of-held"
        if info.exists():  # an attempt was held: is this one the same task run again?
            stage, partition, pid = (int(v) for v in info.read_text().split())
            if task == (stage, partition) and os.getpid() != pid:
                (marks / f"rerun-{os.getpid()}-{context.attemptNumber()}").touch()
            return value
        if context.attemptNumber() != 0 or not gate.exists() or any(marks.glob("held-*")):
            return value
        (marks / "task-of-held").write_text(f"{task[0]} {task[1]} {os.getpid()}")
        (marks / f"held-{os.getpid()}").touch()
        deadline = time.monotonic() + 120.0
        while not release.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return value

    return hold


class HeldTask:
    """Holds one running Spark task, so that a test can kill its executor while the task runs
    rather than between tasks.

    ``udf`` (a Python UDF of ``return_type`` that gives its column's value back) is put into
    the query. Once :meth:`open` was called, the first task attempt (attempt 0) to reach a row
    writes ``marks/held-<pid>`` and waits there (at most 120 s, or until :meth:`release`).
    :meth:`kill_executor` waits for that, closes the gate (the retry, and every later task,
    pass), and SIGKILLs the executor JVM the held Python worker runs under.

    Measured: what the UDF gave back before it held does not reach the next step of the task
    (the Python worker buffers its results), so a held task has handed nothing to its sink.
    """

    def __init__(self, marks: Path, return_type: Any) -> None:
        from pyspark.sql import functions as F

        marks.mkdir()
        self.marks = marks
        self.udf = F.udf(_hold_first_row(marks), return_type, useArrow=False)

    def open(self) -> None:
        """Let the next task attempt that reaches a row hold there."""
        (self.marks / "gate").touch()

    def kill_executor(
        self, cluster: SparkCluster, running: Callable[[], bool], timeout: float = DRAIN_TIMEOUT
    ) -> int:
        """Wait for the held task while ``running()`` (the query) is true, at most ``timeout``
        s, then close the gate and kill -9 the held task's executor JVM; return its PID.
        AssertionError if the query ended first."""
        wait_until(lambda: any(self.marks.glob("held-*")) or not running(), timeout=timeout)
        held = [int(p.name.removeprefix("held-")) for p in self.marks.glob("held-*")]
        assert held, "the query ended before a task was held"
        (self.marks / "gate").unlink()
        executors = cluster.executor_pids()
        under = [pid for pid in ancestors(held[0]) if pid in executors]
        assert len(under) == 1, f"the held task (pid {held[0]}) runs under no executor"
        return cluster.kill_executor(pid=under[0])

    def parquet_query(self, stream: Any, column: str, out: Path, checkpoint: Path) -> Any:
        """Start ``stream`` into Parquet at ``out`` (checkpoint ``checkpoint``, a trigger every
        200 ms) with ``column`` passed through :attr:`udf`, where a task may be held."""
        return (
            stream.withColumn(column, self.udf(column))
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(checkpoint))
            .trigger(processingTime="200 milliseconds")
            .start()
        )

    def release(self) -> None:
        """Let a held task go on (cleanup: normally its executor was killed)."""
        (self.marks / "release").touch()

    def retries(self) -> int:
        """Attempts of the held task (same stage and partition, another Python worker) that
        reached a row after it was held: each writes ``marks/rerun-<pid>-<attempt>`` (a rerun
        in a resubmitted stage attempt counts too). Counted from the attempts themselves, not
        from Spark's status store, which learns of a failed attempt from its listener bus and
        read 0 once in CI after an executor kill that Spark had recovered from."""
        return len(list(self.marks.glob("rerun-*")))


@pytest.mark.long
def test_streaming_write_with_an_executor_killed_and_a_replayed_batch_every_row_once(
    cluster: SparkCluster,
    cluster_spark: SparkSession,
    producer_sidecar: SidecarThread,
    amq_sidecar: SidecarThread,
    tmp_path: Path,
) -> None:
    """A file stream of 3 files of 500 rows (one micro-batch each, repartitioned into 2 tasks,
    so both executors write) through ``writeStream.format("stomp")`` and the producer's
    sidecar, read by a consumer behind its own sidecar.

    * kill -9 of the executor JVM running a task of batch 0 (held by :class:`HeldTask`): Spark
      runs the task again on the other executor, in the same micro-batch; the retry carries
      the same batch id (the ``streaming.sql.batchId`` local property), so the same row ids,
      and the batch commits. (The held attempt had sent nothing; that a retry's copies of rows
      a killed attempt did send are hidden is
      ``test_executor_killed_mid_job_every_row_once``: the same per-partition writer.)
    * Then the last batch's commit is removed from the checkpoint (a driver that died after
      running it and before committing it) and the query restarted on it: Spark runs batch 2
      again with the same ids, and the consumer's sidecar hides the 500 copies (as
      tests/spark/test_write.py does on ``local[2,2]``).

    The consumer is shown each row once, the batch id in its id."""
    from pyspark.sql.types import LongType

    register(cluster_spark)
    batches, per_batch = 3, 500
    total = batches * per_batch
    source, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    write_json_files(source, batches=batches, per_batch=per_batch)
    destination = unique("/queue/cluster-stream")
    hold = HeldTask(tmp_path / "marks", LongType())

    settings: dict[str, Any] = {
        "source": source,
        "port": producer_sidecar.address[1],
        "destination": destination,
        "checkpoint": checkpoint,
        "id_prefix": "cluster-stream",
        "prepare": lambda rows: rows.repartition(2).withColumn("id", hold.udf("id")),
    }
    started = time.monotonic()
    with Drain(amq_sidecar.address[1], destination) as drain:
        before = hidden_by_live_sessions(amq_sidecar)
        hold.open()
        query = start_stream_write(cluster_spark, **settings)
        try:
            killed = hold.kill_executor(cluster, lambda: query.isActive)
        finally:
            hold.release()
        finish(query, DRAIN_TIMEOUT)
        first = len(drain.wait_for(total, timeout=DRAIN_TIMEOUT))
        retried = hold.retries()
        forget_commit(checkpoint, batches - 1)
        finish(start_stream_write(cluster_spark, **settings), DRAIN_TIMEOUT)
        wait_until(
            lambda: hidden_by_live_sessions(amq_sidecar) - before >= per_batch,
            timeout=DRAIN_TIMEOUT,
        )
        messages = drain.settle(1.0)
        hidden = hidden_by_live_sessions(amq_sidecar) - before
    print(
        f"\n[cluster streaming write] {total} rows in {batches} batches; executor {killed} "
        f"killed mid-task, {retried} task attempt(s) run again; batch "
        f"{batches - 1} replayed; {hidden} copies hidden, {len(messages)} rows shown; "
        f"{time.monotonic() - started:.1f} s"
    )
    assert first == total
    check_stream_written(messages, "cluster-stream", batches=batches, per_batch=per_batch)
    assert not process_alive(killed)
    assert retried >= 1, "Spark ran the killed task again"
    assert hidden == per_batch, "batch 2 ran twice with the same ids; the sidecar hid the copies"


@pytest.mark.long
def test_streaming_read_with_an_executor_killed_every_message_once(
    cluster: SparkCluster,
    cluster_spark: SparkSession,
    producer_sidecar: SidecarThread,
    amq_sidecar: SidecarThread,
    tmp_path: Path,
) -> None:
    """2,000 messages read by ``readStream.format("stomp")`` through the consumer's sidecar in
    micro-batches of at most 250 into a Parquet sink, and kill -9 of the executor JVM running
    a batch's task while it runs (:class:`HeldTask`): the query
    goes on (Spark runs the task again on the other executor) and every message is in the
    sink once, none left on the queue.

    Where the kill hurts: the STOMP session of the read (its subscription, the ACKs), the read
    log and ``latestOffset``/``partitions``/``commit`` all live on the driver
    (``mq_sidecar_spark.reader``); the records travel to the executors inside the partitions.
    So an executor kill hits only the tasks that turn a partition's records into rows and write
    them to the sink: the retry gets the same records from the same partition, the killed
    attempt's Parquet file is not in the sink's ``_spark_metadata`` log, and nothing is ACKed
    before Spark commits the batch."""
    from pyspark.sql.types import StringType

    register(cluster_spark)
    total, per_batch = 2000, 250
    destination = unique("/queue/cluster-read")
    publish(producer_sidecar.address, destination, range(total))
    checkpoint, out = tmp_path / "checkpoint", tmp_path / "out"
    hold = HeldTask(tmp_path / "marks", StringType())
    stream = (
        cluster_spark.readStream.format("stomp")
        .option("port", str(amq_sidecar.address[1]))
        .option("destination", destination)
        .option("checkpoint_location", str(checkpoint))
        .option("max_messages_per_batch", str(per_batch))
        .option("prefetch", str(2 * per_batch))
        .load()
    )
    # Both executors up (the one the previous test killed was replaced).
    wait_until(lambda: len(cluster.executor_pids()) == 2, timeout=DRAIN_TIMEOUT)
    started = time.monotonic()
    query = hold.parquet_query(stream, "message_id", out, checkpoint)

    try:
        wait_until(read_at_least(query, 2 * per_batch), timeout=DRAIN_TIMEOUT)
        hold.open()
        killed = hold.kill_executor(cluster, lambda: query.exception() is None)
        wait_until(read_at_least(query, total), timeout=DRAIN_TIMEOUT)
        time.sleep(1.5)  # a few more triggers: nothing more may come, the last batch is ACKed
        retried = hold.retries()
    finally:
        hold.release()
        query.stop()
    rows = sink_rows(cluster_spark, out)
    left = left_on_queue(amq_sidecar.address, destination)
    orphans = {p.name for p in out.glob("*.parquet")} - committed_files(out)
    print(
        f"\n[cluster streaming read] {total} messages, executor {killed} killed mid-task: "
        f"{len(rows)} rows in the sink, {retried} task attempt(s) run again, "
        f"{len(orphans)} Parquet file(s) on disk not in the sink's log, {left} left on the "
        f"queue, {time.monotonic() - started:.1f} s"
    )
    check_exactly_once(rows, range(total))
    assert left == 0, "every message was ACKed after its batch's commit"
    assert not process_alive(killed)
    assert retried >= 1, "Spark ran the killed task again"


@pytest.mark.long
def test_stream_read_with_an_executor_killed_every_message_once(
    cluster: SparkCluster, cluster_spark: SparkSession, rabbitmq: RabbitMQ, tmp_path: Path
) -> None:
    """2,000 messages of a RabbitMQ stream read with ``stream=true`` (issue 33 part 2) in
    micro-batches of at most 500 offsets, 2 tasks each (``minPartitions``), each task reading
    its range through the sidecar on 127.0.0.1 from an executor, into Parquet; kill -9 of the
    executor JVM running a batch's task while it runs (:class:`HeldTask`). Spark runs the task
    again on the other executor with the same range, which gives the same records: each
    message is once in the sink, none missing."""
    from pyspark.sql.types import StringType

    register(cluster_spark)
    total = 2000
    checkpoint, out = tmp_path / "checkpoint", tmp_path / "out"
    hold = HeldTask(tmp_path / "marks", StringType())
    with SidecarThread(sidecar_config(rabbitmq.stomp_url)) as sidecar:
        stream_name = new_stream(rabbitmq)
        publish(sidecar.address, stream_name, range(total))
        stream = (
            cluster_spark.readStream.format("stomp")
            .option("stream", "true")
            .option("port", str(sidecar.address[1]))
            .option("destination", stream_name)
            .option("startingOffsets", "earliest")
            .option("maxRecordsPerTrigger", "500")
            .option("minPartitions", "2")
            .option("tail_wait", "10s")
            .load()
        )
        wait_until(lambda: len(cluster.executor_pids()) == 2, timeout=DRAIN_TIMEOUT)
        started = time.monotonic()
        query = hold.parquet_query(stream, "destination", out, checkpoint)

        try:
            wait_until(read_at_least(query, 500), timeout=DRAIN_TIMEOUT)
            hold.open()
            killed = hold.kill_executor(cluster, lambda: query.exception() is None)
            wait_until(read_at_least(query, total), timeout=DRAIN_TIMEOUT)
            retried = hold.retries()
            batches = [p for p in query.recentProgress if int(p["numInputRows"]) > 0]
        finally:
            hold.release()
            query.stop()
    rows = sink_rows(cluster_spark, out, STREAM_SCHEMA)
    print(
        f"\n[cluster stream read] {total} messages in {len(batches)} batches, executor "
        f"{killed} killed mid-task: {len(rows)} rows in the sink, {retried} task attempt(s) "
        f"run again, {time.monotonic() - started:.1f} s"
    )
    check_exactly_once(rows, range(total))
    assert sorted(int(r["offset"]) for r in rows) == list(range(total))
    assert all(int(p["numInputRows"]) <= 500 for p in batches)
    assert not process_alive(killed)
    assert retried >= 1, "Spark ran the killed task again"


def test_stop_leaves_no_process_of_the_cluster(
    cluster: SparkCluster, cluster_spark: SparkSession
) -> None:
    """stop() with an application connected ends the master, the workers, the executors and
    the Python workers under them: none of the PIDs seen before is alive afterwards, and no
    process carries the cluster's marker. (Last in the module: it stops the shared cluster.)"""
    wait_until(lambda: len(cluster.executor_pids()) == 2, timeout=DRAIN_TIMEOUT)
    assert cluster_spark.sparkContext.parallelize(range(4), 2).map(lambda x: x + 1).sum() == 10
    seen = cluster.processes()
    roles = [p.role for p in seen]
    assert roles.count("master") == 1
    assert roles.count("worker") == 2
    assert roles.count("executor") == 2
    assert roles.count("python") >= 2, "PySpark daemons and workers under the executors"
    print(f"the cluster started in {cluster.start_seconds:.1f} s")
    for p in sorted(seen, key=lambda p: p.pid):
        print(f"{p.role:9} pid {p.pid:7} rss {p.rss_kib / 1024:7.1f} MiB")
    started = time.monotonic()
    cluster.stop()
    print(f"stop took {time.monotonic() - started:.1f} s")
    assert [p.pid for p in seen if process_alive(p.pid, p.starttime)] == []
    assert cluster.processes() == []
    assert (cluster.worker_pids(), cluster.executor_pids(), cluster.running()) == ([], [], False)
