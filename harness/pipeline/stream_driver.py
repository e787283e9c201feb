"""The driver of the drill's streaming consumer (``mq-sidecar drill --consumer spark``), run as a
process of its own: ``python -m pipeline.stream_driver SETTINGS_JSON``.

It starts a SparkSession (``master`` and ``conf`` of the settings; its JVM's output in ``log``),
registers the ``stomp`` data source and runs one Structured Streaming query:
``spark.readStream.format("stomp")`` from ``destination`` at ``host:port`` (the consumer's
sidecar), with the read log under ``checkpoint`` (``checkpoint_location``) and the row's id
as the message identity (``id_header=row-id``, the header the data source's writer sets), into
a Parquet sink at ``out`` with the same checkpoint. The sink's columns: ``row_id`` (the
``row-id`` header), ``message_id``, ``redelivered``, ``body`` (bytes) and ``batch_time`` (the
micro-batch's ``current_timestamp()``: when Spark ran the batch that wrote the row).

With ``"stream": true`` in the settings (``mq-sidecar drill --consumer spark-stream``) the
source is the stream read instead (``options`` carry ``stream=true``; :func:`stream_rows`): the
columns are ``row_id``, ``offset`` (the record's stream offset), ``body``, ``batch_time`` and
``task`` (``<executor JVM pid>:<partition>:<attempt>`` of the task that read the record, from
:func:`task_label`), deduplicated by ``row_id`` in the query (``dropDuplicates``, its state in
the checkpoint): a copy RabbitMQ stored (a sidecar's replay, a retried writer task) is its own
record at its own offset, and the stream read keeps those whose original is in another range
(docs/spark.md, "Exactly once, and a retried writer's copies").

It appends one JSON line per finished micro-batch to ``progress`` (``{"pid", "batch", "rows",
"wall", "duration_ms", "start", "end", "latest", "dropped"}``, ``wall`` Unix seconds, the
offsets the source's (None for the queue reader), ``dropped`` the copies the deduplication
dropped; a line ``{"pid", "started": wall, "package": path}`` once the query runs, ``package``
where the executors imported ``mq_sidecar_spark`` from) and
runs until the file ``stop`` exists (then it stops the query and the session and exits 0),
the query fails (exit 3, the failure on stderr) or it is killed. It is started in a session of
its own, so that one SIGKILL of its process group takes the JVM and the Python workers down
with it, as the loss of a driver host would.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["main", "progress_line", "run_query", "stream_rows", "task_label"]

#: Seconds between two looks at the query's progress and the stop file.
POLL = 0.1
#: Seconds the driver runs at most (a bound: the drill stops it long before).
LIFETIME = 7200.0


#: The executor JVM's pid, found once per Python worker (:func:`task_label`).
_JVM: list[str] = []


def task_label(offset: int | None = None) -> str:
    """The ``task`` column of the stream read (a Python UDF's body, run on the executor for each
    record; ``offset`` only ties it to the row): ``<executor JVM pid>:<partition>:<attempt>``.
    The Python worker is forked by PySpark's daemon, whose parent is the executor's JVM. (A
    plain UDF, not a pandas UDF: PySpark 4.3 warns that it does not fully support the
    pandas 3 some set-ups have.)"""
    from pyspark import TaskContext  # noqa: PLC0415 (executor side)

    if not _JVM:
        try:
            stat = Path(f"/proc/{os.getppid()}/stat").read_text()
            _JVM.append(stat.rpartition(")")[2].split()[1])
        except (OSError, IndexError):
            _JVM.append("?")
    ctx = TaskContext.get()
    if ctx is None:
        return f"{_JVM[0]}:?:?"
    return f"{_JVM[0]}:{ctx.partitionId()}:{ctx.attemptNumber()}"


def stream_rows(reader: Any) -> Any:
    """The stream read's columns (module docstring) from ``reader`` (the loaded stream),
    deduplicated by ``row_id``."""
    from pyspark.sql import functions as F  # noqa: PLC0415

    task = F.udf(task_label, "string")
    return reader.select(
        F.col("headers").getItem("row-id").alias("row_id"),
        "offset",
        "body",
        F.current_timestamp().alias("batch_time"),
        task(F.col("offset")).alias("task"),
    ).dropDuplicates(["row_id"])


def progress_line(pid: int, progress: dict[str, Any]) -> dict[str, Any]:
    """The progress file's line for one micro-batch's ``progress`` (its JSON form)."""
    source = (progress.get("sources") or [{}])[0]

    def offset(key: str) -> int | None:
        value = source.get(key)
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                return None
        return int(value["offset"]) if isinstance(value, dict) and "offset" in value else None

    dropped = sum(
        int((op.get("customMetrics") or {}).get("numDroppedDuplicateRows") or 0)
        for op in progress.get("stateOperators") or []
    )
    return {
        "pid": pid,
        "batch": int(progress["batchId"]),
        "rows": int(progress["numInputRows"]),
        "wall": time.time(),
        "duration_ms": int((progress.get("durationMs") or {}).get("triggerExecution") or 0),
        "start": offset("startOffset"),
        "end": offset("endOffset"),
        "latest": offset("latestOffset"),
        "dropped": dropped,
    }


def _package_on_executors(spark: Any) -> str:
    """Where one task imports ``mq_sidecar_spark`` from (the drill checks it runs its own)."""

    def where(_: Any) -> str:
        import mq_sidecar_spark  # noqa: PLC0415

        return str(mq_sidecar_spark.__file__)

    try:
        return str(spark.sparkContext.parallelize([0], 1).map(where).collect()[0])
    except Exception as exc:  # reported, not fatal: the query itself says more if it fails
        return f"unknown ({type(exc).__name__})"


def run_query(cfg: dict[str, Any]) -> int:
    """Run the query of ``cfg`` (module docstring) until told to stop; return the exit
    status (0 stopped, 3 the query failed)."""
    from pyspark.sql import functions as F  # noqa: PLC0415

    from mq_sidecar_spark import StompDataSource  # noqa: PLC0415
    from pipeline.spark import start_spark, stop_spark  # noqa: PLC0415

    spark = start_spark(
        "mq-sidecar-drill-consumer",
        master=cfg["master"],
        conf=cfg.get("conf") or {},
        log_file=Path(cfg["log"]),
    )
    spark.dataSource.register(StompDataSource)
    package = _package_on_executors(spark) if cfg.get("stream") else None
    reader = spark.readStream.format("stomp")
    for key, value in cfg["options"].items():
        reader = reader.option(key, str(value))
    if cfg.get("stream"):
        stream = stream_rows(reader.load())
    else:
        stream = reader.load().select(
            F.col("headers").getItem("row-id").alias("row_id"),
            "message_id",
            "redelivered",
            "body",
            F.current_timestamp().alias("batch_time"),
        )
    query = (
        stream.writeStream.format("parquet")
        .option("path", cfg["out"])
        .option("checkpointLocation", cfg["checkpoint"])
        .trigger(processingTime=cfg.get("trigger", "200 milliseconds"))
        .start()
    )
    progress = Path(cfg["progress"])
    stop = Path(cfg["stop"])
    pid = os.getpid()
    reported: set[int] = set()
    with progress.open("a") as out:
        started = {"pid": pid, "started": time.time(), "package": package}
        out.write(json.dumps(started) + "\n")
        out.flush()
        deadline = time.monotonic() + LIFETIME
        while not stop.exists() and time.monotonic() < deadline:
            if query.exception() is not None:
                break
            for p in query.recentProgress:
                batch = int(p["batchId"])
                if batch in reported:
                    continue
                reported.add(batch)
                raw = p.json
                line = progress_line(pid, json.loads(raw() if callable(raw) else raw))
                out.write(json.dumps(line) + "\n")
                out.flush()
            time.sleep(POLL)
    failure = query.exception()
    query.stop()
    stop_spark(spark)
    if failure is not None:
        print(f"QUERY FAILED: {failure}", file=sys.stderr, flush=True)
        return 3
    return 0


def main() -> None:
    """``python -m pipeline.stream_driver SETTINGS_JSON`` (module docstring)."""
    sys.exit(run_query(json.loads(sys.argv[1])))


if __name__ == "__main__":
    main()
