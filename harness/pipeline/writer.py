"""Publish a Spark DataFrame through mq-sidecar: one stomp.py connection per partition.

``publish(df, settings)`` runs ``df.foreachPartition``: each task connects to the sidecar on
localhost (in a Kubernetes pod, the executor's own sidecar, docs/deploy.md, "Spark executors"),
sends every row of its partition as a persistent JSON message with a deterministic id
(:mod:`pipeline.rows`) in two headers, and returns only when the sidecar has confirmed all
of them, so a finished task means "on the broker" (the sidecar answers an app's receipt only
once the broker confirmed the frame, docs/behaviour.md, "Confirmation window").

Receipts are pipelined in a bounded window: every ``receipt_every``-th SEND and the last one
ask for a receipt, and at most ``max_in_flight`` receipts may be outstanding; the task waits
for a slot before sending more. Confirmation is cumulative (a RECEIPT covers every earlier
frame of the connection), so the window bounds the unconfirmed messages to
``receipt_every * max_in_flight``. An ERROR from the sidecar (e.g. ``call_timeout`` during a
failover that does not end) fails the task; Spark retries it where retries are allowed
(``spark.task.maxFailures``, ``local[N,F]``), and the retry's rows carry the same ids.

The id goes in ``mq-sidecar-id``, the header by which an app asks the sidecars for
idempotence (a retry's copy is recognised and not shown to the consumer again), and in
``row-id``, the app's own identity of the row: the sidecars use their duplicate-detection id
and never show it to a consuming app (docs/behaviour.md, "Duplicate detection"), so the
verifier reads ``row-id``.

``StreamPublisher`` is the Structured Streaming variant: a ``foreachBatch`` function that
publishes each micro-batch with the batch id in the row identity (a batch replayed after a
restart from the checkpoint gets the same ids).

With ``progress_port`` set, each task also reports how many SENDs it has handed over, in a
UDP datagram to that port on 127.0.0.1 when it starts (0) and at every receipt it asks for: the
publish timeline of the drill's baseline, where no sidecar counts the SENDs
(:mod:`pipeline.baseline`), and of the drill with the outbox.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from pipeline.rows import message_id, row_key, serialise_row

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Row
    from pyspark.sql.streaming.query import StreamingQuery

__all__ = [
    "DUPLICATE_ID_HEADER",
    "ROW_ID_HEADER",
    "PublishError",
    "StreamPublisher",
    "WriterSettings",
    "publish",
    "publish_partition",
    "start_stream",
]

#: The sidecar's duplicate-detection header (proxy.tracking.DUPLICATE_ID_HEADER); the writer
#: sets it itself so the id is deterministic (the sidecar keeps an app's value).
DUPLICATE_ID_HEADER = "mq-sidecar-id"
#: The row's identity as the consuming app sees it (the sidecars keep their id to themselves).
ROW_ID_HEADER = "row-id"


class PublishError(RuntimeError):
    """A partition could not be published: the sidecar sent an ERROR, closed the
    connection, or did not confirm within ``receipt_timeout``. Fails the Spark task."""


@dataclass(frozen=True)
class WriterSettings:
    """Where and how a DataFrame is published (picklable: it travels to the executors).

    Attributes:
        destination: STOMP destination, e.g. ``/queue/flights``.
        job: the job's name in every message id; the same job name for the same data
            means the same ids (a rerun is recognised as duplicates within the
            consumer sidecar's window of 20,000 ids / 10 minutes).
        host, port: the sidecar's STOMP listener (loopback).
        key: column whose value identifies a row within its partition; None: the row's
            ordinal in the partition (deterministic when the partition's content and
            order are, e.g. a file scan or a cached DataFrame).
        receipt_every: a receipt is requested on every N-th SEND (and the last).
        max_in_flight: receipts outstanding at most (the bounded window).
        receipt_timeout: seconds to wait for a window slot or the final receipt.
        persistent: send ``persistent:true`` (the broker stores the message).
        headers: extra headers for every SEND.
        batch_id: micro-batch id (streaming); part of the message id when set.
        progress_port: UDP port on 127.0.0.1 that gets ``"<partition>.<attempt> <sent>"``
            from each task attempt when it starts (0) and at every receipt it asks for (module
            docstring); None: no reports.
    """

    destination: str
    job: str
    host: str = "127.0.0.1"
    port: int = 61613
    key: str | None = None
    receipt_every: int = 100
    max_in_flight: int = 10
    receipt_timeout: float = 300.0
    persistent: bool = True
    headers: tuple[tuple[str, str], ...] = ()
    batch_id: int | None = None
    progress_port: int | None = None

    def __post_init__(self) -> None:
        if self.receipt_every < 1 or self.max_in_flight < 1:
            raise ValueError("receipt_every and max_in_flight must be at least 1")
        if "/" in self.job or not self.job:
            raise ValueError(f"job must be a non-empty name without '/': {self.job!r}")


def _stomp() -> Any:
    import stomp  # noqa: PLC0415 (imported on the executor, where it runs)

    return stomp


class _Confirmations:
    """stomp.py listener of one writer connection: outstanding receipts, ERROR, disconnect.

    Called on stomp.py's receiver thread; the task's thread waits on the condition.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._pending: set[str] = set()
        self.error: str | None = None
        self.disconnected = False

    # stomp.py listener interface
    def on_receipt(self, frame: Any) -> None:
        with self._cond:
            self._pending.discard(frame.headers.get("receipt-id", ""))
            self._cond.notify_all()

    def on_error(self, frame: Any) -> None:
        body = frame.body.decode(errors="replace") if isinstance(frame.body, bytes) else frame.body
        with self._cond:
            if self.error is None:
                self.error = f"{frame.headers.get('message', 'ERROR')}: {(body or '').strip()}"
            self._cond.notify_all()

    def on_disconnected(self) -> None:
        with self._cond:
            self.disconnected = True
            self._cond.notify_all()

    def wait_disconnected(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the connection to close; True if it did."""
        with self._cond:
            return self._cond.wait_for(lambda: self.disconnected, timeout)

    def expect(self, receipt: str) -> None:
        """Register ``receipt`` before the frame asking for it is sent."""
        with self._cond:
            self._pending.add(receipt)

    def wait_below(self, limit: int, timeout: float, what: str) -> None:
        """Wait until fewer than ``limit`` receipts are outstanding.

        Raises PublishError on an ERROR, a lost connection or after ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                if self.error is not None:
                    raise PublishError(f"sidecar sent ERROR {what}: {self.error}")
                if len(self._pending) < limit:
                    return
                if self.disconnected:
                    raise PublishError(
                        f"connection to the sidecar lost {what} "
                        f"({len(self._pending)} receipt(s) outstanding)"
                    )
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise PublishError(
                        f"no receipt within {timeout:.0f} s {what} "
                        f"({len(self._pending)} outstanding)"
                    )
                self._cond.wait(remaining)


class _Progress:
    """Reports a task's SENDs handed over to ``WriterSettings.progress_port`` (best effort: a
    datagram that cannot be sent is dropped; the publish never waits for it)."""

    def __init__(self, port: int | None, partition: int) -> None:
        self._address = ("127.0.0.1", port or 0)
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM) if port else None
        self._key = f"{partition}.{_attempt()}"

    def report(self, sent: int) -> None:
        if self._socket is not None:
            with contextlib.suppress(OSError):
                self._socket.sendto(f"{self._key} {sent}".encode(), self._address)

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()


def _attempt() -> int:
    """The Spark task's attempt number (0 outside a task): a retry reports apart."""
    try:
        from pyspark import TaskContext  # noqa: PLC0415
    except ImportError:
        return 0
    context = TaskContext.get()
    return context.attemptNumber() if context is not None else 0


def publish_partition(rows: Iterable[Row], settings: WriterSettings, partition: int) -> int:
    """Publish one partition's rows to ``settings.host:port`` (the sidecar; the broker itself in
    the drill's baseline); return the number sent.

    Returns once every message is confirmed (the last SEND's receipt arrived). An empty
    partition opens no connection. Raises :class:`PublishError` (see there), ``TypeError``
    for a value with no JSON form, ``ValueError`` for a null key.
    """
    iterator: Iterator[Row] = iter(rows)
    upcoming = next(iterator, None)
    if upcoming is None:
        return 0
    progress = _Progress(settings.progress_port, partition)
    progress.report(0)  # every attempt shows, also one that fails before its first receipt
    stomp = _stomp()
    conn = stomp.Connection12(
        [(settings.host, settings.port)], heartbeats=(0, 0), auto_content_length=True
    )
    confirmations = _Confirmations()
    conn.set_listener("confirmations", confirmations)
    try:
        conn.connect(wait=True)
    except BaseException:
        progress.close()
        raise
    base = {
        DUPLICATE_ID_HEADER: "",
        ROW_ID_HEADER: "",
        "content-type": "application/json",
        **({"persistent": "true"} if settings.persistent else {}),
        **dict(settings.headers),
    }
    sent = 0
    try:
        for ordinal in itertools.count():
            row = upcoming
            upcoming = next(iterator, None)
            body = serialise_row(row)
            headers = dict(base)
            row_id = message_id(
                settings.job, partition, row_key(row, settings.key, ordinal), settings.batch_id
            )
            headers[DUPLICATE_ID_HEADER] = row_id
            headers[ROW_ID_HEADER] = row_id
            sent += 1
            asks = upcoming is None or sent % settings.receipt_every == 0
            if asks:
                confirmations.wait_below(
                    settings.max_in_flight, settings.receipt_timeout, f"after {sent - 1} SENDs"
                )
                receipt = f"p{partition}-{sent}"
                confirmations.expect(receipt)
                headers["receipt"] = receipt
            conn.send(settings.destination, body, headers=headers)
            if asks:
                progress.report(sent)
            if upcoming is None:
                break
        confirmations.wait_below(1, settings.receipt_timeout, f"for the last of {sent} SENDs")
    finally:
        progress.close()
        _disconnect(conn, confirmations)
    return sent


def _disconnect(conn: Any, confirmations: _Confirmations, timeout: float = 10.0) -> None:
    """DISCONNECT (stomp.py closes the socket on its receipt); bounded: a connection that
    does not close in ``timeout`` seconds is closed by force (Python workers are reused)."""
    if conn.is_connected():
        conn.disconnect()
        if not confirmations.wait_disconnected(timeout):
            conn.transport.disconnect_socket()


def publish(df: DataFrame, settings: WriterSettings) -> int:
    """Publish every row of ``df`` (``foreachPartition``); return the rows sent.

    The count comes from an accumulator updated at the end of each successful task, which
    Spark applies once per partition even when a task was retried. Raises the Spark job's
    error (e.g. a :class:`PublishError` from the last attempt of a task).
    """
    sent = df.sparkSession.sparkContext.accumulator(0)

    def run(rows: Iterable[Row]) -> None:
        from pyspark import TaskContext  # noqa: PLC0415

        context = TaskContext.get()
        partition = context.partitionId() if context is not None else 0
        sent.add(publish_partition(rows, settings, partition))

    df.foreachPartition(run)
    return int(sent.value)


class StreamPublisher:
    """A ``foreachBatch`` function: publish each micro-batch (batch id in the message ids).

    ``on_batch(batch_df, settings)``, if given, runs after a batch was published, with the
    batch's settings (e.g. to record the expected content, :func:`pipeline.verify.expected`).
    ``sent`` is the running total. Each batch is persisted while it is used twice.
    """

    def __init__(
        self,
        settings: WriterSettings,
        on_batch: Callable[[DataFrame, WriterSettings], None] | None = None,
    ) -> None:
        self.settings = settings
        self.on_batch = on_batch
        self.sent = 0
        self.batches = 0

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        settings = replace(self.settings, batch_id=batch_id)
        batch_df.persist()
        try:
            self.sent += publish(batch_df, settings)
            if self.on_batch is not None:
                self.on_batch(batch_df, settings)
        finally:
            batch_df.unpersist()
        self.batches += 1


def start_stream(
    stream_df: DataFrame,
    publisher: StreamPublisher,
    checkpoint: str,
    *,
    available_now: bool = True,
    processing_time: str | None = None,
) -> StreamingQuery:
    """Start a streaming query that publishes ``stream_df`` through ``publisher``.

    ``checkpoint``: the query's checkpoint directory (one per query). ``available_now``:
    process what the source has now, then stop (``trigger(availableNow=True)``); otherwise
    ``processing_time`` (e.g. ``"1 second"``) or Spark's default trigger.
    """
    writer = stream_df.writeStream.foreachBatch(publisher).option("checkpointLocation", checkpoint)
    if available_now:
        writer = writer.trigger(availableNow=True)
    elif processing_time is not None:
        writer = writer.trigger(processingTime=processing_time)
    return writer.start()
