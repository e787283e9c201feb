"""The stream read's options and range planning, without Spark or a broker (issue 33): what
``parse_stream_options`` accepts and refuses (each refusal names the option), and how
``split_range`` cuts a range into tasks."""

from __future__ import annotations

import time

import pytest

from mq_sidecar_spark._stream_options import (
    Position,
    StreamOptions,
    is_stream_read,
    parse_stream_options,
)
from mq_sidecar_spark.errors import OptionError
from mq_sidecar_spark.stream import split_range

STREAM = "/amq/queue/orders-log"


def parse(batch: bool = False, **options: str) -> StreamOptions:
    return parse_stream_options({"stream": "true", "destination": STREAM, **options}, batch=batch)


def test_defaults_for_a_query_and_for_a_batch_read() -> None:
    query = parse()
    batch = parse(batch=True)
    assert (query.starting, query.ending) == (Position("latest"), Position("latest"))
    assert batch.starting == Position("earliest")
    assert (query.prefetch, query.timeout, query.tail_wait) == (1000, 30.0, 1.0)
    assert query.max_trigger_delay == 900.0
    assert query.fail_on_data_loss is True


def test_positions_and_durations() -> None:
    now = int(time.time() * 1000)
    options = parse(
        startingOffsets=f"timestamp:{now - 1000}",
        maxTriggerDelay="500ms",
        timeout="2m",
        failOnDataLoss="FALSE",
        maxRecordsPerTrigger="10",
        minRecordsPerTrigger="10",
    )
    assert options.starting == Position("timestamp", now - 1000)
    assert options.max_trigger_delay == 0.5
    assert options.timeout == 120.0
    assert options.fail_on_data_loss is False
    ranged = parse(batch=True, startingOffsets="5", endingOffsets="7")
    assert (ranged.starting, ranged.ending) == (Position("offset", 5), Position("offset", 7))


@pytest.mark.parametrize(
    ("batch", "options", "expected"),
    [
        (False, {"destination": "/queue/orders"}, "option destination='/queue/orders'"),
        (False, {"destination": "/amq/queue/"}, "option destination='/amq/queue/'"),
        (False, {"startingOffsets": "-3"}, "option startingOffsets='-3'"),
        (False, {"startingOffsets": "timestamp:x"}, "timestamp:<ms> takes milliseconds"),
        (False, {"startingOffsets": "timestamp:99999999999999"}, "in the future"),
        (False, {"endingOffsets": "5"}, "option endingOffsets applies to spark.read only"),
        (False, {"maxBytesPerTrigger": "1"}, "option maxBytesPerTrigger is not supported"),
        (False, {"maxRecordsPerTrigger": "0"}, "option maxRecordsPerTrigger=0: must be at"),
        (False, {"maxRecordsPerTrigger": "x"}, "option maxRecordsPerTrigger='x': not an integer"),
        (
            False,
            {"minRecordsPerTrigger": "5", "maxRecordsPerTrigger": "4"},
            "option minRecordsPerTrigger=5 is above maxRecordsPerTrigger=4",
        ),
        (False, {"maxTriggerDelay": "soon"}, "option maxTriggerDelay='soon': not a duration"),
        (False, {"timeout": "0s"}, "option timeout='0s': must be more than 0"),
        (False, {"failOnDataLoss": "maybe"}, "option failOnDataLoss='maybe'"),
        (False, {"port": "70000"}, "option port=70000: must be 1-65535"),
        (False, {"checkpoint_location": "/x"}, "unknown option(s) for the stomp stream read"),
        (True, {"startingOffsets": "latest"}, "option startingOffsets=latest"),
        (True, {"endingOffsets": "earliest"}, "option endingOffsets=earliest"),
        (True, {"minRecordsPerTrigger": "1"}, "option minRecordsPerTrigger applies to"),
        (
            True,
            {"startingOffsets": "9", "endingOffsets": "3"},
            "option endingOffsets=3 is before startingOffsets=9",
        ),
    ],
)
def test_bad_options_name_the_option(batch: bool, options: dict[str, str], expected: str) -> None:
    with pytest.raises(OptionError) as failure:
        parse(batch=batch, **options)
    assert expected in str(failure.value)


def test_which_reads_are_stream_reads() -> None:
    assert is_stream_read({"stream": "TRUE"})
    assert not is_stream_read({"destination": "/queue/q"})
    with pytest.raises(OptionError, match="option stream='yes': must be true or false"):
        is_stream_read({"stream": "yes"})
    with pytest.raises(OptionError, match="minpartitions apply to a RabbitMQ stream read only"):
        is_stream_read({"minPartitions": "2"})


@pytest.mark.parametrize(
    ("start", "end", "min_partitions", "per_partition", "ranges"),
    [
        (0, 0, 3, 10, []),
        (5, 4, 1, 10, []),
        (0, 10, 1, 100, [(0, 10)]),
        (0, 10, 3, 100, [(0, 4), (4, 7), (7, 10)]),
        (100, 350, 1, 100, [(100, 184), (184, 267), (267, 350)]),
        (0, 2, 5, 100, [(0, 1), (1, 2)]),
    ],
)
def test_split_range(
    start: int, end: int, min_partitions: int, per_partition: int, ranges: list[tuple[int, int]]
) -> None:
    """Consecutive ranges of nearly equal size covering ``[start, end)``: at least
    ``min_partitions`` (fewer only for fewer offsets), at most ``per_partition`` offsets each."""
    parts = split_range(start, end, min_partitions, per_partition)
    assert [(p.start, p.end) for p in parts] == ranges
    assert [p.value for p in parts] == list(range(len(ranges)))
