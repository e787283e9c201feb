"""Batch and streaming write: ``df.write.format("stomp")`` and ``df.writeStream.format("stomp")``.

How Spark drives a Python data source writer (pyspark 4.3, ``pyspark/sql/worker/
write_into_data_source.py`` and ``python_streaming_sink_runner.py``): ``writer()`` /
``streamWriter()`` run on the driver, the writer is pickled to the executors, ``write(rows)``
runs once per partition in a task and returns a commit message, and ``commit(messages)`` (a
stream writer's ``commit(messages, batchId)``) runs on the driver once every task succeeded,
``abort`` when one failed for good.

One task (:func:`write_partition`):

* opens one STOMP connection to the sidecar (an empty partition opens none);
* sends each row with its deterministic id in ``mq-sidecar-id`` and ``row-id``
  (:mod:`mq_sidecar_spark._rows`);
* pipelines receipts: every ``receipt_every``-th SEND and the last ask a receipt, and before
  asking one more it waits until fewer than ``max_in_flight`` are outstanding, so at most
  ``receipt_every * max_in_flight`` rows are unconfirmed at any time;
* returns once the last SEND's receipt arrived. The sidecar answers an app's receipt only when
  the broker confirmed that frame and every earlier one (docs/behaviour.md, "Confirmation
  window"), so a task that returns means "every row of the partition is on the broker", even
  through a failover, where the sidecar replays what the old broker had not confirmed;
* fails on the first ERROR frame (its text in the exception), a closed connection, or a wait
  longer than ``timeout`` seconds.

A task that failed may have sent part of its partition; Spark's retry sends the whole partition
again with the same ids, and so does a re-run of the same job: a consumer behind a sidecar is
shown each id once (within its ``id_cache_size`` ids and 10 minutes; docs/spark.md).

**The batch id of a streaming write.** A stream writer's ``write()`` is not given the batch id
(only ``commit(messages, batchId)`` on the driver is). Spark's micro-batch engine sets the local
property ``streaming.sql.batchId`` on the SparkContext before it runs a batch's job, and every
task of that job carries it (``TaskContext.getLocalProperty``; measured with pyspark 4.3, the
value equals the ``batchId`` later passed to ``commit``). The executor reads it there, puts it
in every row id, and returns it in its commit message; ``commit`` checks that each message's
batch id is the one Spark commits and fails the batch otherwise. A task without the property
fails rather than guess.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage

from mq_sidecar_spark._link import Link
from mq_sidecar_spark._rows import MessageFactory
from mq_sidecar_spark.errors import StompWriteError

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

    from mq_sidecar_spark.options import WriteOptions

__all__ = [
    "BATCH_ID_PROPERTY",
    "StompCommitMessage",
    "StompStreamWriter",
    "StompWriter",
    "WriteSummary",
    "summarise",
    "write_partition",
]

#: The SparkContext local property holding the micro-batch id (module docstring).
BATCH_ID_PROPERTY = "streaming.sql.batchId"

LOG = logging.getLogger("mq_sidecar_spark")


@dataclass(frozen=True)
class StompCommitMessage(WriterCommitMessage):
    """What one successful task reports to the driver (picklable).

    Attributes:
        partition: the task's partition id.
        attempt: its attempt number (0 for the first; > 0 after a retry).
        rows: rows sent, all confirmed.
        receipts: receipts received (the confirmations the task waited for).
        seconds: wall time of the task's send loop, seconds.
        batch_id: the micro-batch id of a streaming write, None in a batch write.
    """

    partition: int
    attempt: int
    rows: int
    receipts: int
    seconds: float
    batch_id: int | None = None


@dataclass(frozen=True)
class WriteSummary:
    """The totals of a write's commit messages (:func:`summarise`)."""

    tasks: int
    failed_tasks: int
    rows: int
    receipts: int
    retried_tasks: int

    def __str__(self) -> str:
        return (
            f"{self.rows} rows confirmed by the broker in {self.tasks} task(s) "
            f"({self.receipts} receipts, {self.retried_tasks} task(s) confirmed on a retry, "
            f"{self.failed_tasks} failed)"
        )


def summarise(messages: Sequence[WriterCommitMessage | None]) -> WriteSummary:
    """Totals of ``messages`` (Spark passes None for a task that failed)."""
    ours = [m for m in messages if isinstance(m, StompCommitMessage)]
    return WriteSummary(
        tasks=len(ours),
        failed_tasks=len(messages) - len(ours),
        rows=sum(m.rows for m in ours),
        receipts=sum(m.receipts for m in ours),
        retried_tasks=sum(1 for m in ours if m.attempt > 0),
    )


def _task() -> tuple[int, int, Any]:
    """``(partition id, attempt number, TaskContext)`` of the running task."""
    from pyspark import TaskContext  # noqa: PLC0415

    context = TaskContext.get()
    if context is None:
        raise StompWriteError("the stomp writer runs only inside a Spark task")
    return context.partitionId(), context.attemptNumber(), context


def write_partition(
    rows: Iterator[Any], schema: StructType, options: WriteOptions, batch_id: int | None
) -> StompCommitMessage:
    """Send one partition's ``rows`` and wait until all are confirmed (module docstring).

    Returns the task's :class:`StompCommitMessage`. Raises the errors of
    :mod:`mq_sidecar_spark.errors`, their message prefixed with the destination, the partition,
    the attempt and the rows sent so far.
    """
    partition, attempt, _ = _task()
    started = time.monotonic()
    upcoming = next(rows, None)
    if upcoming is None:
        return StompCommitMessage(partition, attempt, 0, 0, 0.0, batch_id)
    factory = MessageFactory(schema, options, partition, batch_id)
    link = Link(options.host, options.port, options.login, options.passcode, options.timeout)
    sent = 0
    confirmed = False
    try:
        link.open()
        for ordinal in itertools.count():
            row: Any = upcoming
            upcoming = next(rows, None)
            _, body, headers = factory.message(row, ordinal)
            sent += 1
            last = upcoming is None
            receipt = None
            if last or sent % options.receipt_every == 0:
                link.wait_below(options.max_in_flight, f"after {sent - 1} SENDs")
                receipt = f"p{partition}.{attempt}-{sent}"
            link.send(options.destination, body, headers, receipt)
            if last:
                break
        link.wait_below(1, f"for the last of {sent} SENDs")
        confirmed = True
    except StompWriteError as exc:
        batch = f", micro-batch {batch_id}" if batch_id is not None else ""
        exc.args = (
            f"stomp write to {options.destination} (partition {partition}, attempt {attempt}"
            f"{batch}; {sent} row(s) handed over, not all confirmed): {exc}",
        )
        raise
    finally:
        link.close(graceful=confirmed)
    return StompCommitMessage(
        partition, attempt, sent, link.receipts, time.monotonic() - started, batch_id
    )


class StompWriter(DataSourceWriter):
    """The batch writer (``df.write.format("stomp")...mode("append").save()``).

    Args:
        schema: the DataFrame's schema (Spark passes it to ``StompDataSource.writer``).
        options: the checked options.
    """

    def __init__(self, schema: StructType, options: WriteOptions) -> None:
        self.schema = schema
        self.options = options

    def write(self, iterator: Iterator[Any]) -> StompCommitMessage:
        """One task: :func:`write_partition` (runs on an executor)."""
        return write_partition(iterator, self.schema, self.options, None)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Every task returned: log the totals (logger ``mq_sidecar_spark``, INFO)."""
        LOG.info("stomp write to %s: %s", self.options.destination, summarise(messages))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """A task failed for good: log what was confirmed (WARNING). Those rows are on the
        broker; running the job again sends them again with the same ids."""
        LOG.warning(
            "stomp write to %s failed: %s; a re-run sends the same ids",
            self.options.destination,
            summarise(messages),
        )


def _batch_id() -> int:
    """The running task's micro-batch id (module docstring). Raises StompWriteError when
    the task carries none."""
    _, _, context = _task()
    value = context.getLocalProperty(BATCH_ID_PROPERTY)
    if value is None:
        raise StompWriteError(
            f"the task carries no micro-batch id (local property {BATCH_ID_PROPERTY}): "
            "the stomp stream writer needs Spark's micro-batch engine (continuous "
            "processing is not supported)"
        )
    return int(value)


class StompStreamWriter(DataSourceStreamWriter):
    """The streaming writer (``df.writeStream.format("stomp")...start()``): a batch write
    per micro-batch, the batch id in every row id (module docstring).

    Args:
        schema: the stream's schema.
        options: the checked options.
    """

    def __init__(self, schema: StructType, options: WriteOptions) -> None:
        self.schema = schema
        self.options = options

    def write(self, iterator: Iterator[Any]) -> StompCommitMessage:
        """One task of a micro-batch (runs on an executor)."""
        return write_partition(iterator, self.schema, self.options, _batch_id())

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Every task of micro-batch ``batchId`` returned: check that each wrote that batch
        (raises StompWriteError otherwise, failing the batch) and log the totals."""
        wrong = sorted(
            {m.batch_id for m in messages if isinstance(m, StompCommitMessage)} - {batchId},
            key=str,
        )
        if wrong:
            raise StompWriteError(
                f"micro-batch {batchId}: tasks wrote with batch id(s) {wrong} "
                f"(local property {BATCH_ID_PROPERTY}); the row ids would not be replayable"
            )
        LOG.info(
            "stomp write to %s, micro-batch %d: %s",
            self.options.destination,
            batchId,
            summarise(messages),
        )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """A task of micro-batch ``batchId`` failed for good: log what was confirmed."""
        LOG.warning(
            "stomp write to %s, micro-batch %d failed: %s; the restarted query replays it "
            "with the same ids",
            self.options.destination,
            batchId,
            summarise(messages),
        )
