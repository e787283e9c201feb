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

It appends one JSON line per finished micro-batch to ``progress`` (``{"pid", "batch", "rows",
"wall"}``, ``wall`` Unix seconds; a line ``{"pid", "started": wall}`` once the query runs) and
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

__all__ = ["main", "run_query"]

#: Seconds between two looks at the query's progress and the stop file.
POLL = 0.1
#: Seconds the driver runs at most (a bound: the drill stops it long before).
LIFETIME = 7200.0


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
    reader = spark.readStream.format("stomp")
    for key, value in cfg["options"].items():
        reader = reader.option(key, str(value))
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
        out.write(json.dumps({"pid": pid, "started": time.time()}) + "\n")
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
                line = {"pid": pid, "batch": batch, "rows": int(p["numInputRows"])}
                out.write(json.dumps({**line, "wall": time.time()}) + "\n")
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
