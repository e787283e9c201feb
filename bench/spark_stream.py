"""The stream read's rate: a task against a plain reader of the same range, and the total rate
of a read on a Spark cluster with 1 and 2 executors, each in one run: ``python -m
bench.spark_stream [--cluster]`` (from the repository, ``PYTHONPATH=.:harness:spark``, pyarrow
importable). Issue 33 part 4. A benchmark, never a timed test; it prints the load average at its
start and end (the machine is shared).

One RabbitMQ node and one mq-sidecar process in front of it (as it is found: the compiled core
when it is built); a stream of ``--rows`` messages of ``--size`` bytes. Then, in ``--rounds``
rounds, each variant in turn (the order rotates from round to round, so that a slow spell of the
shared machine does not fall on one variant only), each reading offsets ``[0, rows)`` once.

Without ``--cluster`` (50,000 messages by default; 30-90 s on 2 shared cores):

* ``stomp.py direct``: a plain stomp.py consumer straight to the node's STOMP port, a SUBSCRIBE
  at ``offset=0`` with ``ack:client`` and ``prefetch-count`` 1,000, a cumulative ACK every 500
  messages, until the last offset: the reference;
* ``task direct``: the data source's task (:func:`mq_sidecar_spark.stream.read_range`, the
  records turned into Arrow batches as Spark gets them) straight to the node;
* ``task via sidecar``: the same through the sidecar, as an executor reads.

Rates are messages per second from the connect to the last record (one untimed task read of
100 messages first, as a Python worker that has run a task has pyarrow imported). Prints each
measurement, the medians with the CPU milliseconds per 1,000 messages of the reader's process,
the sidecar's and the broker's (``/proc/PID/stat``), and the ratios ``task via sidecar /
stomp.py direct`` (goal >= 0.9) and ``task direct / stomp.py direct``.

With ``--cluster`` (200,000 messages by default; about 4.5 minutes on 2 shared cores): the test
bed's Spark standalone cluster on 127.0.0.1 (:class:`testbed.spark_cluster.SparkCluster`, a master
and two workers of 1 core and 1 GiB, so one executor each) and a SparkSession in this process,
with the one sidecar on 127.0.0.1 as both executors' own. Each variant is a batch stream read of
the whole range, ``spark.read.format("stomp").option("stream", "true")...load().count()``, with
``minPartitions`` 1 (one task: one executor reads, the other idles) or 2 (one task on each
executor; ``maxRecordsPerPartition`` = rows, so the ranges are as asked). Rates are messages per
second over the job, Spark's scheduling included (one untimed read of the whole range first
starts both executors' Python workers); prints the medians, with the CPU milliseconds per
1,000 messages of the executors' JVMs, their Python workers, the sidecar and the broker, and
``2 executors / 1 executor``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import stomp

from mq_sidecar_spark._stream_options import parse_stream_options
from mq_sidecar_spark.stream import read_range
from testbed import RabbitMQ
from testbed.sidecar import SidecarProcess
from tests.spark.support import new_stream, publish

#: The sidecar's options: quiet, fast reconnects (as the Spark tests').
SIDECAR_OPTIONS: dict[str, object] = {"log_level": "warning", "retry_interval": 50}


def stomp_py_read(host: str, port: int, destination: str, rows: int, timeout: float) -> float:
    """Seconds a plain stomp.py consumer takes to read offsets ``[0, rows)`` (module doc)."""
    done = threading.Event()
    state = {"n": 0}

    class Listener(stomp.ConnectionListener):  # type: ignore[misc]
        def on_message(self, frame: Any) -> None:
            state["n"] += 1
            offset = int(frame.headers["x-stream-offset"])
            if state["n"] % 500 == 0:
                conn.ack(frame.headers["ack"])
            if offset >= rows - 1:
                done.set()

    started = time.perf_counter()
    conn = stomp.Connection12([(host, port)], heartbeats=(0, 0), auto_decode=False, vhost="/")
    conn.set_listener("l", Listener())
    conn.connect(wait=True)
    conn.subscribe(
        destination,
        id="bench",
        ack="client",
        headers={"x-stream-offset": "offset=0", "prefetch-count": "1000"},
    )
    finished = done.wait(timeout)
    elapsed = time.perf_counter() - started
    conn.disconnect()
    if not finished:
        raise RuntimeError(f"stomp.py read {state['n']} of {rows} in {timeout} s")
    return elapsed


def task_read(port: int, destination: str, rows: int) -> float:
    """Seconds the data source's task takes to read offsets ``[0, rows)`` through ``port``."""
    options = parse_stream_options(
        {"stream": "true", "destination": destination, "port": str(port), "vhost": "/"},
        batch=True,
    )
    started = time.perf_counter()
    count = sum(batch.num_rows for batch in read_range(options, 0, rows))
    elapsed = time.perf_counter() - started
    if count != rows:
        raise RuntimeError(f"the task read {count} of {rows}")
    return elapsed


def fill(broker: RabbitMQ, port: int, rows: int, size: int) -> str:
    """A new stream of ``rows`` messages of ``size`` bytes on ``broker``, published through the
    sidecar at ``port``; its destination."""
    destination = new_stream(broker)
    publish(("127.0.0.1", port), destination, range(rows), prefix="x" * (size - 6))
    return destination


@contextlib.contextmanager
def stream_bed(work: Path, rows: int, size: int) -> Iterator[tuple[RabbitMQ, SidecarProcess, str]]:
    """A RabbitMQ node and a sidecar in front of it, under ``work``, and a stream of ``rows``
    messages of ``size`` bytes (:func:`fill`): the broker, the sidecar and the destination."""
    with RabbitMQ("bench-rmq", work / "rmq") as broker:
        sidecar = SidecarProcess(
            "bench-sidecar", work, brokers=broker.stomp_url, options=SIDECAR_OPTIONS
        )
        with sidecar:
            yield broker, sidecar, fill(broker, sidecar.port, rows, size)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds process ``pid`` used so far (``/proc/PID/stat``, every
    thread; utime and stime are fields 14 and 15 of proc(5))."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load_average() -> str:
    """The 1, 5 and 15 minute load averages (``/proc/loadavg``), as ``uptime`` prints them."""
    return ", ".join(Path("/proc/loadavg").read_text().split()[:3])


def rotate(names: list[str], round_: int) -> list[str]:
    """``names`` starting at the ``round_``-th (so no variant always runs first)."""
    at = round_ % len(names)
    return names[at:] + names[:at]


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark (module doc) and print its figures and ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--rows", type=int, default=None, help="messages (50,000; with --cluster 200,000)"
    )
    parser.add_argument("--size", type=int, default=100, help="bytes per message body")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="the total rate of a batch stream read with 1 and 2 executors",
    )
    args = parser.parse_args(argv)
    print(f"load average {load_average()} (start)")
    if args.cluster:
        cluster_bench(args.rows or 200_000, args.size, args.rounds)
    else:
        task_bench(args.rows or 50_000, args.size, args.rounds)
    print(f"load average {load_average()} (end)")


def task_bench(rows: int, size: int, rounds: int) -> None:
    """The three single readers of the module doc, in rotating order, with CPU per message."""
    with (
        tempfile.TemporaryDirectory(prefix="bench-stream-") as tmp,
        stream_bed(Path(tmp), rows, size) as (broker, sidecar, destination),
    ):
        task_read(sidecar.port, destination, min(rows, 100))  # imports pyarrow: warm
        variants: dict[str, Callable[[], float]] = {
            "stomp.py direct": lambda: stomp_py_read(
                broker.host, broker.stomp_port, destination, rows, 300
            ),
            "task direct": lambda: task_read(broker.stomp_port, destination, rows),
            "task via sidecar": lambda: task_read(sidecar.port, destination, rows),
        }
        beam = broker.pid
        if beam is None:
            raise RuntimeError("the broker's beam.smp process is gone")
        rates: dict[str, list[float]] = {name: [] for name in variants}
        # CPU ms per 1,000 messages: this process (the reader), the sidecar, the broker
        cpu: dict[str, list[list[float]]] = {name: [] for name in variants}
        for round_ in range(rounds):
            for name in rotate(list(variants), round_):
                before = [time.process_time(), sidecar.cpu_seconds(), cpu_seconds(beam)]
                seconds = variants[name]()
                after = [time.process_time(), sidecar.cpu_seconds(), cpu_seconds(beam)]
                pairs = zip(after, before, strict=True)
                cpu[name].append([1e6 * (a - b) / rows for a, b in pairs])
                rates[name].append(rows / seconds)
                print(f"round {round_ + 1} {name:17} {rows / seconds:9,.0f} msg/s")
    median = {name: statistics.median(values) for name, values in rates.items()}
    print(f"\n{rows:,} messages of {size} bytes, {rounds} rounds, medians:")
    print(f"  {'':17} {'msg/s':>9}   CPU ms per 1,000 messages: reader, sidecar, broker")
    for name, value in median.items():
        reader, side, node = (statistics.median(c[k] for c in cpu[name]) for k in range(3))
        print(f"  {name:17} {value:9,.0f}   {reader:6.1f} {side:6.1f} {node:6.1f}")
    base = median["stomp.py direct"]
    print(f"  task via sidecar / stomp.py direct  {median['task via sidecar'] / base:.2f}x")
    print(f"  task direct / stomp.py direct       {median['task direct'] / base:.2f}x")


def cluster_bench(rows: int, size: int, rounds: int) -> None:
    """The total rate of a batch stream read on the test bed's Spark standalone cluster (module
    doc): the same ``rows`` read by 1 task (one executor) and by 2 (one per executor), in
    rotating order."""
    from mq_sidecar_spark import StompDataSource  # noqa: PLC0415 (pyspark: only here)
    from pipeline.spark import start_spark, stop_spark  # noqa: PLC0415
    from testbed.spark_cluster import SparkCluster  # noqa: PLC0415

    # The executors' Python workers run in the workers' directories: absolute paths only.
    entries = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    pythonpath = os.pathsep.join(str(Path(entry or ".").resolve()) for entry in entries)
    rates: dict[str, list[float]] = {"1 executor": [], "2 executors": []}
    # CPU ms per 1,000 messages, per read: by role (sidecar, broker, executor JVMs, Python)
    cpu: dict[int, list[dict[str, float]]] = {1: [], 2: []}
    with tempfile.TemporaryDirectory(prefix="bench-stream-cluster-") as tmp:
        work = Path(tmp)
        with stream_bed(work, rows, size) as (broker, sidecar, destination):
            beam = broker.pid
            if beam is None:
                raise RuntimeError("the broker's beam.smp process is gone")
            cluster = SparkCluster(
                work_dir=work / "spark", workers=2, env={"PYTHONPATH": pythonpath}
            )
            with cluster:
                started = time.perf_counter()
                spark = start_spark(
                    "bench-spark-stream",
                    master=cluster.master_url,
                    conf=cluster.spark_conf(),
                    log_file=work / "driver.log",
                )
                print(f"cluster and session up in {time.perf_counter() - started:.1f} s")
                options = {
                    "stream": "true",
                    "destination": destination,
                    "port": str(sidecar.port),
                    "vhost": "/",
                    "startingOffsets": "earliest",
                    "endingOffsets": str(rows),
                    "maxRecordsPerPartition": str(rows),
                }

                def cpu_now() -> dict[str, float]:
                    """CPU seconds so far of the sidecar, the broker, and per process of the
                    cluster's executors and Python workers (by role and PID)."""
                    now = {"sidecar": sidecar.cpu_seconds(), "broker": cpu_seconds(beam)}
                    for proc in cluster.processes():
                        if proc.role in ("executor", "python"):
                            with contextlib.suppress(OSError):  # gone meanwhile
                                now[f"{proc.role} {proc.pid}"] = cpu_seconds(proc.pid)
                    return now

                def read(tasks: int) -> float:
                    reader = spark.read.format("stomp").options(**options)
                    before = cpu_now()
                    begun = time.perf_counter()
                    count = reader.option("minPartitions", str(tasks)).load().count()
                    elapsed = time.perf_counter() - begun
                    if count != rows:
                        raise RuntimeError(f"{tasks} task(s) read {count} of {rows}")
                    used: dict[str, float] = {}
                    for key, value in cpu_now().items():
                        role = key.split()[0]
                        spent = value - before.get(key, 0.0)
                        used[role] = used.get(role, 0.0) + 1e6 * spent / rows
                    cpu[tasks].append(used)
                    return elapsed

                try:
                    spark.dataSource.register(StompDataSource)
                    read(2)  # both executors' Python workers started, pyarrow imported
                    cpu[2].clear()
                    for round_ in range(rounds):
                        for name in rotate(list(rates), round_):
                            seconds = read(1 if name == "1 executor" else 2)
                            rates[name].append(rows / seconds)
                            print(f"round {round_ + 1} {name:12} {rows / seconds:9,.0f} msg/s")
                finally:
                    stop_spark(spark)
    median = {name: statistics.median(values) for name, values in rates.items()}
    print(f"\n{rows:,} messages of {size} bytes, {rounds} rounds, medians (the job: count()):")
    roles = ("executor", "python", "sidecar", "broker")
    print(f"  {'':12} {'msg/s':>9}   CPU ms per 1,000 messages: " + ", ".join(roles))
    for name, value in median.items():
        reads = cpu[1 if name == "1 executor" else 2]
        spent = [statistics.median(used.get(role, 0.0) for used in reads) for role in roles]
        print(f"  {name:12} {value:9,.0f}   " + " ".join(f"{ms:6.1f}" for ms in spent))
    print(f"  2 executors / 1 executor  {median['2 executors'] / median['1 executor']:.2f}x")


if __name__ == "__main__":
    main()
