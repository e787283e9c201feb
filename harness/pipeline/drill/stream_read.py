"""The drill's stream consumer (``--consumer spark-stream``, issue 33 part 3): the drill's
destination is a RabbitMQ stream with a replica on each node of the cluster, and a Structured
Streaming query reads it with the data source's stream read (``format("stomp")``,
``stream=true``; docs/spark.md, "Stream read") into Parquet, in a driver process of its own
(:mod:`pipeline.stream_driver`) on the drill's standalone cluster: the driver plans offset
ranges (``minPartitions`` 2: a task per executor), and each task reads its range on its
executor through the consumer's sidecar.

:class:`StreamConsumer` is :class:`~pipeline.drill.streaming.SparkConsumer` with those
settings: its driver is killed with SIGKILL midway and started again on the same checkpoint in
the same way. What it adds is the report of the read: the micro-batches (offsets, rows, the
copies the query's deduplication dropped), the tasks of each batch and the rows each executor
read (the sink's ``task`` column: ``<executor JVM pid>:<partition>:<attempt>``), and whether
the query reached the stream's tail. There is no residual check: a stream keeps every message
whatever its readers do (nothing is "left"); the query's last end offset against the tail its
last probe found says instead that everything was read.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from typing import Any

from pipeline.drill.streaming import SparkConsumer

__all__ = ["STREAM_HEADERS", "StreamConsumer", "read_summary"]

#: The STOMP headers that declare the drill's stream (a SUBSCRIBE to ``/queue/NAME``, then
#: UNSUBSCRIBE; RabbitMQ wants a ``prefetch-count`` on every stream subscription). RabbitMQ's
#: STOMP adapter passes no ``x-initial-cluster-size``: a stream declared in a 3-node cluster
#: gets a replica on every node (checked after the declaration, ``members``).
STREAM_HEADERS = {
    "x-queue-type": "stream",
    "durable": "true",
    "auto-delete": "false",
    "prefetch-count": "1",
    "ack": "client",
}
#: The probes' wait for a first MESSAGE (``tail_wait``): an empty stream answers nothing, and on
#: the loaded machine a slow first delivery must not look like an empty stream.
TAIL_WAIT = "3s"


class StreamConsumer(SparkConsumer):
    """The stream read of ``destination`` (``/amq/queue/NAME``, a stream) through the sidecar
    at ``host:port``, ``batch_rows`` offsets per micro-batch at most
    (``maxRecordsPerTrigger``), at least ``partitions`` tasks per batch (``minPartitions``);
    ``settings`` are :class:`~pipeline.drill.streaming.SparkConsumer`'s keyword arguments
    (``host``, ``port`` and ``batch_rows`` required)."""

    def __init__(self, destination: str, *, partitions: int, **settings: Any) -> None:
        super().__init__(destination, **settings)
        host, port, batch_rows = settings["host"], settings["port"], settings["batch_rows"]
        self.cfg["stream"] = True
        self.cfg["options"] = {
            "stream": "true",
            "host": host,
            "port": port,
            "destination": destination,
            "startingOffsets": "earliest",
            "maxRecordsPerTrigger": batch_rows,
            "minPartitions": partitions,
            "tail_wait": TAIL_WAIT,
            "timeout": "120s",
        }

    def summary(self) -> dict[str, Any]:
        """The report's ``consumer`` section: that of the queue reader's query, with the
        stream read's (:func:`read_summary`) and ``batch_log``: each micro-batch's progress
        line (its last run: the driver's ``pid``, ``rows``, offsets ``start``/``end``, the tail
        found, ``latest``, ``duration_ms``, copies ``dropped``)."""
        section = super().summary()
        section["kind"] = "spark-stream"
        section["query"] = (
            "readStream.format('stomp').option('stream', 'true') -> dropDuplicates(row_id) "
            "-> Parquet"
        )
        options = self.cfg["options"]
        section["max_records_per_trigger"] = options["maxRecordsPerTrigger"]
        section["min_partitions"] = options["minPartitions"]
        section.pop("max_messages_per_batch", None)
        section.pop("prefetch", None)
        with self._lock:
            lines = dict(self.lines)
            packages = sorted({p for p in self.packages if p})
        try:
            tasks = self.sink_pairs("batch_time", "task")
        except (OSError, ValueError, KeyError) as exc:
            self.errors.append(f"the sink's task column: {exc}")
            tasks = []
        section.update(read_summary(list(lines.values()), tasks))
        keys = ("batch", "pid", "rows", "start", "end", "latest", "duration_ms", "dropped")
        section["batch_log"] = [{k: line.get(k) for k in keys} for _, line in sorted(lines.items())]
        section["package_on_executors"] = packages
        return section


def read_summary(batches: list[dict[str, Any]], tasks: list[tuple[Any, str]]) -> dict[str, Any]:
    """What the stream read did, from the driver's progress ``batches`` (one line per
    micro-batch, :func:`pipeline.stream_driver.progress_line`; a batch run again after the
    driver's restart once, its last run) and the sink's ``(batch_time, task)`` rows: the
    records read and the copies the deduplication dropped; the last batch's end offset and
    the tail found then (``read_to_tail``); the tasks per batch (how many batches had 1, 2...
    tasks) and the task attempts past the first; per executor (its JVM's pid) the rows it read,
    its tasks and its rate over the batches' time (rows per second of the summed
    ``triggerExecution`` of the batches with rows)."""
    with_rows = [b for b in batches if int(b.get("rows") or 0) > 0]
    busy = sum(int(b.get("duration_ms") or 0) for b in with_rows) / 1000
    last = max(batches, key=lambda b: int(b["batch"]), default=None)
    by_batch: dict[Any, set[str]] = defaultdict(set)
    attempts: set[str] = set()
    executors: Counter[str] = Counter()
    executor_tasks: dict[str, set[tuple[Any, str]]] = defaultdict(set)
    for batch_time, task in tasks:
        jvm, _, rest = str(task).partition(":")
        partition, _, attempt = rest.partition(":")
        by_batch[batch_time].add(partition)
        executor_tasks[jvm].add((batch_time, partition))
        executors[jvm] += 1
        if attempt not in ("0", ""):
            attempts.add(f"{batch_time}/{partition}/{attempt}")
    per_batch = Counter(len(p) for p in by_batch.values())
    rows = sum(executors.values())
    return {
        "records_read": sum(int(b.get("rows") or 0) for b in with_rows),
        "copies_dropped": sum(int(b.get("dropped") or 0) for b in batches),
        "end_offset": None if last is None else last.get("end"),
        "tail_offset": None if last is None else last.get("latest"),
        "read_to_tail": last is not None
        and last.get("end") is not None
        and last.get("end") == last.get("latest"),
        "batches_with_rows": len(by_batch),
        "tasks_per_batch": {str(k): v for k, v in sorted(per_batch.items())},
        "tasks_per_batch_median": statistics.median(len(p) for p in by_batch.values())
        if by_batch
        else None,
        "task_retries": len(attempts),
        "batch_seconds": round(busy, 3),
        "rows_per_second": round(rows / busy, 1) if busy else None,
        "executors": [
            {
                "jvm_pid": jvm,
                "rows": n,
                "share": round(n / rows, 4) if rows else None,
                "tasks": len(executor_tasks[jvm]),
                "rows_per_second": round(n / busy, 1) if busy else None,
            }
            for jvm, n in sorted(executors.items())
        ],
    }
