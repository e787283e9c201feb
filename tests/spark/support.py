"""What the data source's tests share, on ``local[N]`` (tests/spark/) and on the standalone
cluster (tests/pipeline/test_spark_cluster.py). Every wait is bounded.

* Write side: :class:`Drain`, a stomp.py consumer of one destination through a sidecar. It
  subscribes (``ack:auto``) and keeps every MESSAGE's headers and body bytes, so a test can
  count what the consuming app was shown, by ``row-id`` (the sidecars never show
  ``mq-sidecar-id`` to an app, docs/behaviour.md, "Duplicate detection").
  :func:`write_json_files` and :func:`run_stream_write` (:func:`start_stream_write`, then
  :func:`finish`) run a file stream through ``writeStream.format("stomp")``,
  :func:`check_stream_written` checks what the consumer got, and :func:`forget_commit` makes
  Spark replay a batch.
* Read side: :func:`publish` puts messages with a ``row-id`` each on a queue,
  :func:`sink_rows` reads what a Parquet sink committed (:func:`wait_rows`: until it holds a
  count), :func:`check_exactly_once` checks it, and :func:`left_on_queue` counts what nobody
  ACKed. :func:`new_stream` declares a RabbitMQ stream for the stream read.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import stomp

from mq_sidecar_spark.reader import READ_SCHEMA

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery
    from pyspark.sql.types import StructType

    from testbed import RabbitMQ

__all__ = [
    "ROW_ID",
    "WAIT",
    "Drain",
    "Message",
    "check_exactly_once",
    "check_stream_written",
    "finish",
    "forget_commit",
    "left_on_queue",
    "new_stream",
    "publish",
    "run_stream_write",
    "sink_rows",
    "start_stream_write",
    "unique",
    "wait_rows",
    "write_json_files",
]

#: Generous bound of one wait on a loaded 2-core machine (no test normally waits this long).
WAIT = 60.0
#: The header holding a message's id for the consuming app (the data source's writer sets it,
#: and so does :func:`publish`).
ROW_ID = "row-id"


def unique(prefix: str = "/queue/spark") -> str:
    """A destination name no other test uses."""
    return f"{prefix}.{uuid.uuid4().hex[:10]}"


@dataclass(frozen=True)
class Message:
    """One MESSAGE as the consuming app got it."""

    headers: dict[str, str]
    body: bytes


class Drain:
    """A consumer of ``destination`` through the sidecar at ``127.0.0.1:port``.

    ``connect()`` waits for CONNECTED and the SUBSCRIBE's receipt (each within :data:`WAIT`
    seconds); ``close()`` disconnects. Use as a context manager.
    """

    def __init__(self, port: int, destination: str) -> None:
        self.destination = destination
        self._cond = threading.Condition()
        self._messages: list[Message] = []
        self._receipts: set[str] = set()
        self._connected = False
        self._errors: list[str] = []
        self._last = time.monotonic()
        self.conn = stomp.Connection12(
            [("127.0.0.1", port)], heartbeats=(0, 0), auto_decode=False, reconnect_attempts_max=1
        )
        self.conn.set_listener("drain", self)

    # stomp.py listener
    def on_connected(self, frame: Any) -> None:
        with self._cond:
            self._connected = True
            self._cond.notify_all()

    def on_message(self, frame: Any) -> None:
        headers = {str(k): str(v) for k, v in frame.headers.items()}
        with self._cond:
            self._messages.append(Message(headers, bytes(frame.body)))
            self._last = time.monotonic()
            self._cond.notify_all()

    def on_receipt(self, frame: Any) -> None:
        with self._cond:
            self._receipts.add(frame.headers.get("receipt-id", ""))
            self._cond.notify_all()

    def on_error(self, frame: Any) -> None:
        with self._cond:
            self._errors.append(f"{frame.headers.get('message')}: {frame.body!r}")
            self._cond.notify_all()

    def _wait(self, what: str, done: Any, timeout: float = WAIT) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: done() or bool(self._errors), timeout):
                raise AssertionError(f"drain of {self.destination}: no {what} in {timeout} s")
            if self._errors:
                raise AssertionError(f"drain of {self.destination}: ERROR {self._errors}")

    def connect(self) -> Drain:
        """Connect and subscribe; return self."""
        self.conn.connect(wait=False)
        self._wait("CONNECTED", lambda: self._connected)
        self.conn.subscribe(self.destination, id="drain", ack="auto", headers={"receipt": "sub"})
        self._wait("SUBSCRIBE receipt", lambda: "sub" in self._receipts)
        return self

    def wait_for(self, count: int, timeout: float = WAIT) -> list[Message]:
        """Wait until at least ``count`` messages arrived (raises AssertionError after
        ``timeout`` s); return them all."""
        self._wait(f"{count} messages", lambda: len(self._messages) >= count, timeout)
        return self.messages()

    def settle(self, quiet: float = 1.0, timeout: float = WAIT) -> list[Message]:
        """Wait until no message arrived for ``quiet`` s (at most ``timeout`` s); return all."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._cond:
                idle = time.monotonic() - self._last
            if idle >= quiet:
                break
            time.sleep(min(quiet - idle, max(0.0, deadline - time.monotonic())) + 0.01)
        return self.messages()

    def messages(self) -> list[Message]:
        with self._cond:
            return list(self._messages)

    def row_ids(self) -> Counter[str]:
        """How often each ``row-id`` was shown."""
        return Counter(m.headers.get(ROW_ID, "") for m in self.messages())

    def close(self) -> None:
        if self.conn.is_connected():
            self.conn.transport.disconnect_socket()

    def __enter__(self) -> Drain:
        return self.connect()

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- streaming write ----------------------------------------------------------------------------


def write_json_files(directory: Path, batches: int, per_batch: int) -> None:
    """``batches`` JSON-lines files in ``directory`` (created), ``per_batch`` rows each:
    ``{"id": n, "v": "x<i>"}`` with ids ``0 .. batches * per_batch - 1`` in file order."""
    directory.mkdir()
    for b in range(batches):
        lines = [json.dumps({"id": b * per_batch + i, "v": f"x{i}"}) for i in range(per_batch)]
        (directory / f"part-{b}.json").write_text("\n".join(lines) + "\n")


def start_stream_write(
    spark: SparkSession,
    *,
    source: Path,
    port: int,
    destination: str,
    checkpoint: Path,
    id_prefix: str,
    prepare: Callable[[DataFrame], DataFrame] | None = None,
) -> StreamingQuery:
    """Start a file stream of :func:`write_json_files`' files, one file per micro-batch
    (``maxFilesPerTrigger=1``, ``Trigger.AvailableNow``, so it ends by itself), through
    ``writeStream.format("stomp")`` to ``destination`` at ``127.0.0.1:port``
    (``id_columns=id``). ``prepare``: applied to the stream before the sink (e.g. a
    repartition), else one task per file. Call it from the thread that registered the data
    source (docs/spark.md, "Install")."""
    stream = spark.readStream.schema("id long, v string").option("maxFilesPerTrigger", 1)
    rows = stream.json(str(source))
    if prepare is not None:
        rows = prepare(rows)
    return (
        rows.writeStream.format("stomp")
        .option("port", str(port))
        .option("destination", destination)
        .option("id_columns", "id")
        .option("id_prefix", id_prefix)
        .option("timeout", "30")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )


def finish(query: StreamingQuery, timeout: float = WAIT) -> str:
    """Wait (at most ``timeout`` s) for ``query`` to end by itself, without an error, and stop
    it; return its run id (its Spark job group)."""
    try:
        assert query.awaitTermination(int(timeout)), "the query did not finish"
        assert query.exception() is None
    finally:
        query.stop()
    return str(query.runId)


def run_stream_write(spark: SparkSession, **settings: Any) -> str:
    """:func:`start_stream_write` with ``settings``, then :func:`finish`; return the run id."""
    return finish(start_stream_write(spark, **settings))


def check_stream_written(
    messages: list[Message], id_prefix: str, *, batches: int, per_batch: int
) -> None:
    """What a consumer was shown of :func:`run_stream_write`'s query: each of the
    ``batches * per_batch`` rows exactly once, its ``row-id`` ``<id_prefix>/b<batch>/<id>``,
    and each micro-batch holding the rows of exactly one file (which file goes first is Spark's
    choice)."""
    ids = Counter(m.headers[ROW_ID] for m in messages)
    assert set(ids.values()) == {1}, [i for i, n in ids.items() if n > 1][:5]
    by_id = {m.headers[ROW_ID]: json.loads(m.body) for m in messages}
    assert all(i == f"{id_prefix}/{i.split('/')[1]}/{body['id']}" for i, body in by_id.items())
    assert sorted(body["id"] for body in by_id.values()) == list(range(batches * per_batch))
    files_by_batch: dict[str, set[int]] = {}
    for i, body in by_id.items():
        files_by_batch.setdefault(i.split("/")[1], set()).add(body["id"] // per_batch)
    assert sorted(files_by_batch) == [f"b{b}" for b in range(batches)], sorted(files_by_batch)
    assert all(len(files) == 1 for files in files_by_batch.values()), files_by_batch


def forget_commit(checkpoint: Path, batch: int) -> None:
    """Remove micro-batch ``batch``'s entry from the query's commit log, as if the driver had
    died after running it and before committing it: a restart on ``checkpoint`` runs it
    again, with the same offsets."""
    for name in (str(batch), f".{batch}.crc"):
        (checkpoint / "commits" / name).unlink(missing_ok=True)


# -- streaming read -----------------------------------------------------------------------------


def publish(address: tuple[str, int], destination: str, ids: range, prefix: str = "m") -> None:
    """SEND one persistent message per id (``row-id`` header, body ``<prefix><id>``), with a
    receipt on the last (the sidecar confirms in order); bounded by 60 s."""
    done = threading.Event()

    class Listener(stomp.ConnectionListener):  # type: ignore[misc]
        def on_receipt(self, frame: Any) -> None:
            if frame.headers.get("receipt-id") == "last":
                done.set()

    conn = stomp.Connection12([address], heartbeats=(0, 0), auto_decode=False)
    conn.set_listener("l", Listener())
    conn.connect(wait=True)
    try:
        for n in ids:
            headers = {ROW_ID: str(n), "persistent": "true"}
            if n == ids[-1]:
                headers["receipt"] = "last"
            conn.send(destination, f"{prefix}{n}".encode(), headers=headers)
        assert done.wait(60), "the last SEND was not confirmed within 60 s"
    finally:
        conn.disconnect()


def new_stream(broker: RabbitMQ, name: str | None = None) -> str:
    """Declare a new stream on ``broker`` (a SUBSCRIBE to ``/queue/<name>`` with
    ``x-queue-type:stream``, straight to the node; ``name``: a new one by default) and return
    ``/amq/queue/<name>``."""
    name = name or f"spark_stream_{uuid.uuid4().hex[:10]}"
    done = threading.Event()

    class Listener(stomp.ConnectionListener):  # type: ignore[misc]
        def on_receipt(self, frame: Any) -> None:
            done.set()

    conn = stomp.Connection12([(broker.host, broker.stomp_port)], heartbeats=(0, 0), vhost="/")
    conn.set_listener("l", Listener())
    conn.connect(wait=True)
    try:
        headers = {
            "x-queue-type": "stream",
            "durable": "true",
            "auto-delete": "false",
            "prefetch-count": "1",
            "receipt": "declared",
        }
        conn.subscribe(f"/queue/{name}", id="declare", ack="client-individual", headers=headers)
        assert done.wait(WAIT), "the stream's declaration was not confirmed"
    finally:
        conn.disconnect()
    return f"/amq/queue/{name}"


def left_on_queue(address: tuple[str, int], destination: str, quiet: float = 1.5) -> int:
    """Consume (``ack:auto``) what is left on ``destination`` until nothing came for ``quiet``
    s (at most 30 s); return how many messages."""
    got: list[int] = []

    class Listener(stomp.ConnectionListener):  # type: ignore[misc]
        def on_message(self, frame: Any) -> None:
            got.append(1)

    conn = stomp.Connection12([address], heartbeats=(0, 0), auto_decode=False)
    conn.set_listener("l", Listener())
    conn.connect(wait=True)
    conn.subscribe(destination, id="drain", ack="auto")
    last, seen = time.monotonic(), 0
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and time.monotonic() - last < quiet:
        time.sleep(0.1)
        if len(got) != seen:
            seen, last = len(got), time.monotonic()
    conn.disconnect()
    return len(got)


def sink_rows(spark: SparkSession, out: Path, schema: StructType = READ_SCHEMA) -> list[Any]:
    """Every row the Parquet sink committed (its ``_spark_metadata`` log: committed files only),
    read with ``schema`` (the queue reader's by default)."""
    if not (out / "_spark_metadata").exists():
        return []
    return spark.read.schema(schema).parquet(str(out)).collect()


def wait_rows(
    spark: SparkSession,
    out: Path,
    count: int,
    query: StreamingQuery | None,
    timeout: float,
    *,
    schema: StructType = READ_SCHEMA,
) -> list[Any]:
    """Wait (bounded) until the sink holds ``count`` rows; fails on a query exception."""
    deadline = time.monotonic() + timeout
    rows: list[Any] = []
    while time.monotonic() < deadline:
        if query is not None and query.exception() is not None:
            raise AssertionError(f"the query failed: {query.exception()}")
        rows = sink_rows(spark, out, schema)
        if len(rows) >= count:
            return rows
        time.sleep(0.5)
    raise AssertionError(f"{len(rows)} of {count} rows in the sink after {timeout} s")


def check_exactly_once(rows: list[Any], ids: range, prefix: str = "m") -> None:
    """Each id of ``ids`` is in the sink's ``rows`` exactly once (by ``row-id``), with the body
    :func:`publish` gave it; nothing else is there."""
    counts = Counter(row["headers"][ROW_ID] for row in rows)
    missing = [n for n in ids if counts[str(n)] == 0]
    twice = {k: v for k, v in counts.items() if v > 1}
    assert not missing, f"{len(missing)} messages missing, e.g. {missing[:5]}"
    assert not twice, f"{len(twice)} messages emitted twice or more, e.g. {list(twice.items())[:5]}"
    assert len(rows) == len(ids)
    for row in rows:
        assert row["body"] == f"{prefix}{row['headers'][ROW_ID]}".encode()
