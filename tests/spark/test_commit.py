"""The driver's side of a write: commit messages and their totals (issue 26). Plain Python on
the real classes (no Spark session): the writers' ``commit``/``abort`` run on the driver with
what the tasks returned (pyspark ``DataSourceWriter.commit``)."""

from __future__ import annotations

import logging
import pickle

import pytest

from mq_sidecar_spark import StompCommitMessage, StompStreamWriter, StompWriteError, StompWriter
from mq_sidecar_spark.options import parse_write_options
from mq_sidecar_spark.writer import summarise


def _writers() -> tuple[StompWriter, StompStreamWriter]:
    from pyspark.sql.types import LongType, StructField, StructType

    schema = StructType([StructField("id", LongType())])
    options = parse_write_options({"destination": "/queue/c"}, schema)
    return StompWriter(schema, options), StompStreamWriter(schema, options)


def test_summary_counts_rows_receipts_retries_and_failures() -> None:
    messages = [
        StompCommitMessage(0, 0, 120, 2, 0.5),
        StompCommitMessage(1, 1, 80, 1, 0.4),
        None,
    ]
    summary = summarise(messages)
    assert (summary.tasks, summary.failed_tasks, summary.rows) == (2, 1, 200)
    assert (summary.receipts, summary.retried_tasks) == (3, 1)
    assert str(summary).startswith("200 rows confirmed by the broker in 2 task(s)")


def test_commit_message_survives_pickling() -> None:
    message = StompCommitMessage(3, 0, 10, 1, 0.1, batch_id=7)
    assert pickle.loads(pickle.dumps(message)) == message


def test_batch_commit_logs_the_totals(caplog: pytest.LogCaptureFixture) -> None:
    writer, _ = _writers()
    with caplog.at_level(logging.INFO, logger="mq_sidecar_spark"):
        writer.commit([StompCommitMessage(0, 0, 5, 1, 0.1)])
    assert "stomp write to /queue/c: 5 rows confirmed by the broker in 1 task(s)" in caplog.text


def test_stream_commit_refuses_messages_of_another_batch() -> None:
    """Each task reports the batch id it put in its row ids; a mismatch with the batch Spark
    commits would make a replay send other ids, so the commit fails."""
    _, stream = _writers()
    stream.commit([StompCommitMessage(0, 0, 5, 1, 0.1, batch_id=4)], 4)
    with pytest.raises(
        StompWriteError, match=r"micro-batch 5: tasks wrote with batch id\(s\) \[4\]"
    ):
        stream.commit([StompCommitMessage(0, 0, 5, 1, 0.1, batch_id=4)], 5)
