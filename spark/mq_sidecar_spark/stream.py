"""The stream read (``stream=true``), its Spark side: a RabbitMQ stream (``x-queue-type:stream``)
as a parallel, replayable source, for ``spark.read`` (a range) and ``spark.readStream`` (issue 33;
docs/spark.md, "Stream read").

What RabbitMQ gives over STOMP (docs/brokers.md, "Streams", measured on 3.10): every MESSAGE of a
stream carries ``x-stream-offset:<N>`` (from 0, one more per message), and a SUBSCRIBE names where
to start (``x-stream-offset: first | last | offset=<N> | timestamp=<s>``) and must carry a
``prefetch-count``; an ACK is credit, nothing is removed, and the broker keeps no consumer
position. So:

- **Offsets are the stream's**, ``{"stream": "/amq/queue/<name>", "offset": N}`` where N is the
  next offset to read (a batch is ``[start, end)``). They live in Spark's checkpoint only: the
  driver keeps no log, the broker no state, ``commit`` has nothing to do.
- **The driver never reads the records.** It only probes positions, each on a short STOMP
  connection of its own through the sidecar (closed after, so nothing stays unacknowledged):
  the earliest offset is the first MESSAGE of a SUBSCRIBE at ``first`` (``prefetch-count:1``);
  the tail is the last MESSAGE of a SUBSCRIBE at ``last``, which RabbitMQ starts at the first
  message of the stream's last chunk (its unit of storage) and delivers to the end of the
  chunk; the probe takes at most :data:`PROBE_PREFETCH` of them and ends once none came for
  :data:`TAIL_QUIET` s. Cost: one chunk's messages through the driver per probe. The tail it
  finds is never past the real one (it is an offset the broker delivered), at worst behind it
  (a slow delivery), which the next trigger picks up. An empty stream sends nothing: the
  probe waits ``tail_wait`` s for a first MESSAGE.
- **Each task reads its range on its executor** (:func:`read_range`; the probes and the task's
  read, the STOMP side, are :mod:`mq_sidecar_spark._stream_io`): a SUBSCRIBE at
  ``offset=<start>`` through the executor's sidecar (``host``/``port``) with ``ack:client`` and
  ``prefetch-count``, a cumulative ACK every half window (credit), until the message before
  ``end``; then it disconnects. The same range gives the same records, so a retried task or a
  batch re-run from the checkpoint reads what the first attempt read.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from ._stream_io import (
    PROBE_PREFETCH,
    STREAM_SCHEMA,
    TAIL_QUIET,
    TAIL_TRIES,
    _Probe,
    read_range,
)
from ._stream_options import Position, StreamOptions, parse_stream_options
from .errors import OptionError, StreamDataLossError, StreamOffsetError

__all__ = [
    "PROBE_PREFETCH",
    "STREAM_SCHEMA",
    "TAIL_QUIET",
    "TAIL_TRIES",
    "StompStreamBatchReader",
    "StompStreamSource",
    "StreamRange",
    "read_range",
]

LOG = logging.getLogger("mq_sidecar_spark")


def _resolve(probe: _Probe, position: Position, name: str, *, fail_on_data_loss: bool) -> int:
    """The stream offset ``position`` (option ``name``) means now. Raises :class:`OptionError`
    for an offset beyond the tail, :class:`StreamDataLossError` for one retention removed
    (``failOnDataLoss=true``; else the earliest offset instead)."""
    destination = probe.options.destination
    if position.kind == "latest":
        return probe.tail()
    if position.kind == "earliest":
        earliest = probe.earliest()
        return 0 if earliest is None else earliest
    if position.kind == "timestamp":
        found = probe.at_timestamp(position.value)
        return probe.tail() if found is None else found
    tail = probe.tail()
    if position.value > tail and not probe.reaches(position.value - 1):
        raise OptionError(
            f"option {name}={position.value} is beyond the tail of {destination} (its next "
            f"offset is {tail}): use latest, or an offset up to {tail}"
        )
    earliest = probe.earliest()
    if earliest is not None and position.value < earliest:
        if fail_on_data_loss:
            raise StreamDataLossError(
                f"option {name}={position.value}: offsets {position.value}-{earliest - 1} of "
                f"{destination} are no longer in the stream (its retention removed them; it "
                f"starts at {earliest}); use earliest, or failOnDataLoss=false to start there"
            )
        LOG.warning(
            "stream read of %s: %s=%d is gone (retention); starting at %d",
            destination,
            name,
            position.value,
            earliest,
        )
        return earliest
    return position.value


def probe_reaches(options: StreamOptions, offset: int) -> bool:
    """:meth:`_Probe.reaches` on a probe of its own."""
    with _Probe(options) as probe:
        return probe.reaches(offset)


class StreamRange(InputPartition):
    """One task's range ``[start, end)`` of stream offsets (picklable: three numbers)."""

    def __init__(self, index: int, start: int, end: int) -> None:
        super().__init__(index)
        self.start = start
        self.end = end

    def __repr__(self) -> str:
        return f"StreamRange({self.value}, {self.start}, {self.end})"


def split_range(start: int, end: int, min_partitions: int, per_partition: int) -> list[StreamRange]:
    """``[start, end)`` in consecutive ranges of nearly equal size: at least ``min_partitions``
    (fewer only when there are fewer offsets) and at most ``per_partition`` offsets each. An
    empty range gives no partition (Spark's rule for ``partitions(start, end)``)."""
    count = end - start
    if count <= 0:
        return []
    parts = min(count, max(min_partitions, math.ceil(count / per_partition)))
    size, extra = divmod(count, parts)
    ranges: list[StreamRange] = []
    at = start
    for i in range(parts):
        stop = at + size + (1 if i < extra else 0)
        ranges.append(StreamRange(i, at, stop))
        at = stop
    return ranges


def _offset(options: StreamOptions, given: Mapping[str, Any], what: str) -> int:
    """The offset of a checkpointed ``given`` (Spark's start or end); raises
    :class:`StreamOffsetError` when it is not this stream's."""
    if "seq" in given and "offset" not in given:
        raise StreamOffsetError(
            f"the query's checkpoint holds {what} offset {dict(given)} of the queue reader "
            f"(stream=false), not of the stream {options.destination}: start a stream read "
            "with a new checkpointLocation"
        )
    stream = given.get("stream")
    if stream != options.destination:
        raise StreamOffsetError(
            f"the query's checkpoint holds {what} offset {dict(given)} of {stream!r}, not of "
            f"the stream {options.destination}: a checkpoint belongs to one stream; use a new "
            "checkpointLocation"
        )
    value = given.get("offset")
    if not isinstance(value, int) or value < 0:
        raise StreamOffsetError(f"the query's {what} offset {dict(given)} is not a stream offset")
    return value


class StompStreamBatchReader(DataSourceReader):
    """``spark.read.format("stomp").option("stream", "true")``: the range ``startingOffsets``
    (default earliest) to ``endingOffsets`` (default latest, exclusive) of a stream, resolved
    on the driver when Spark plans the read (a bad option or position raises there:
    :class:`OptionError`, :class:`StreamDataLossError`, :class:`StompReadError`), read by the
    tasks (:func:`read_range`)."""

    def __init__(self, schema: StructType, options: Mapping[str, str]) -> None:
        self.schema = schema
        self.options = parse_stream_options(options, batch=True)
        opts = self.options
        with _Probe(opts) as probe:
            self.start = _resolve(
                probe, opts.starting, "startingOffsets", fail_on_data_loss=opts.fail_on_data_loss
            )
            self.end = _resolve(probe, opts.ending, "endingOffsets", fail_on_data_loss=False)
        if self.end < self.start:
            raise OptionError(
                f"option endingOffsets resolves to {self.end}, before startingOffsets at "
                f"{self.start} of {opts.destination}"
            )

    def partitions(self) -> Sequence[InputPartition]:
        """The range in tasks (``minPartitions``, ``maxRecordsPerPartition``)."""
        opts = self.options
        return split_range(
            self.start, self.end, opts.min_partitions, opts.max_records_per_partition
        )

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """One task: :func:`read_range` of the partition's range."""
        assert isinstance(partition, StreamRange)
        return read_range(self.options, partition.start, partition.end)


class StompStreamSource(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("stomp").option("stream", "true")`` (module docstring).

    Spark's calls on the driver (``pyspark.sql.datasource.DataSourceStreamReader``, PySpark
    4.2+): ``initialOffset`` resolves ``startingOffsets``; ``latestOffset(start, limit)`` probes
    the tail and applies admission control (``limit``: the default of
    :meth:`getDefaultReadLimit`, or ``ReadAllAvailable`` where the trigger wants everything;
    ``maxRecordsPerTrigger`` caps a batch's offsets, ``minRecordsPerTrigger`` holds a batch
    back until ``maxTriggerDelay`` passed since the last one); ``partitions`` splits
    ``[start, end)``. ``commit`` keeps nothing: the offsets
    are in Spark's checkpoint. Checkpointed offsets of another stream or of the queue reader
    raise :class:`StreamOffsetError`; retention past ``start`` raises
    :class:`StreamDataLossError` (``failOnDataLoss=true``) or is logged and skipped.
    """

    def __init__(self, schema: StructType, options: Mapping[str, str]) -> None:
        self.schema = schema
        self.options = parse_stream_options(options, batch=False)
        self._target: int | None = None  # Trigger.AvailableNow: the tail seen at its start
        self._tail: int | None = None
        self._last_batch = time.monotonic()
        self.gaps = 0  # offsets skipped as lost (failOnDataLoss=false)

    def __getstate__(self) -> dict[str, Any]:
        return {"schema": self.schema, "options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.schema = state["schema"]
        self.options = state["options"]
        self._target, self._tail = None, None
        self._last_batch = time.monotonic()
        self.gaps = 0

    def _at(self, offset: int) -> dict[str, Any]:
        return {"stream": self.options.destination, "offset": offset}

    def initialOffset(self) -> dict[str, Any]:
        """Where a new query starts (``startingOffsets``; a restarted query continues from its
        checkpoint instead)."""
        opts = self.options
        with _Probe(opts) as probe:
            start = _resolve(
                probe, opts.starting, "startingOffsets", fail_on_data_loss=opts.fail_on_data_loss
            )
        return self._at(start)

    def getDefaultReadLimit(self) -> ReadLimit:
        """``ReadMaxRows(maxRecordsPerTrigger)`` when set, else ``ReadMinRows(
        minRecordsPerTrigger)`` when that is set, else ``ReadAllAvailable``. Spark gives the
        default back to :meth:`latestOffset`, or ``ReadAllAvailable`` where its trigger wants
        everything (``pyspark.sql.datasource``): then ``minRecordsPerTrigger`` does not hold a
        batch back."""
        opts = self.options
        if opts.max_records_per_trigger is not None:
            return ReadMaxRows(opts.max_records_per_trigger)
        if opts.min_records_per_trigger is not None:
            return ReadMinRows(opts.min_records_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        """``Trigger.AvailableNow``: the tail now is where the query ends (in as many batches
        as the read limit makes)."""
        with _Probe(self.options) as probe:
            self._target = probe.tail()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        """The end of the next batch (module and class docstrings)."""
        opts = self.options
        begin = _offset(opts, start, "start")
        with _Probe(opts) as probe:
            # Trigger.AvailableNow reads to the tail found at its start: no probe of it again
            # (a short one must not end the query early).
            tail = probe.tail() if self._target is None else self._target
            earliest = probe.earliest() if tail > begin else None
        self._tail = tail
        if tail < begin and not probe_reaches(opts, begin - 1):
            if opts.fail_on_data_loss:
                raise StreamOffsetError(
                    f"the query's checkpoint is at offset {begin} of {opts.destination}, but "
                    f"the stream shows no message at or past offset {begin - 1} (its tail as "
                    f"found: {tail}): it was deleted and declared again, the checkpoint is of "
                    "another stream of that name, or retention removed every message (seen "
                    "on RabbitMQ 3.10 with one segment left); use a new checkpointLocation, or "
                    "failOnDataLoss=false to wait for new messages"
                )
            return self._at(begin)
        if earliest is not None and earliest > begin:
            if opts.fail_on_data_loss:
                raise StreamDataLossError(
                    f"stream read of {opts.destination}: offsets {begin}-{earliest - 1} that "
                    f"the query's checkpoint expects are no longer in the stream (retention; it "
                    f"starts at {earliest}); option failOnDataLoss=false skips them"
                )
            LOG.warning(
                "stream read of %s: offsets %d-%d gone (retention), skipped",
                opts.destination,
                begin,
                earliest - 1,
            )
            self.gaps += earliest - begin
            first = earliest
        else:
            first = begin
        if tail < begin:
            return self._at(begin)  # the probe's tail was short (hidden copies): nothing new
        target = tail if self._target is None else min(tail, self._target)
        end = max(first, target)
        if isinstance(limit, ReadMaxRows):
            end = min(end, first + limit.max_rows)
        wanted = opts.min_records_per_trigger
        if isinstance(limit, ReadMinRows):
            wanted = limit.min_rows
        if (
            wanted is not None
            and self._target is None
            and not isinstance(limit, ReadAllAvailable)
            and end - first < wanted
            and time.monotonic() - self._last_batch < opts.max_trigger_delay
        ):
            return self._at(begin)
        if end == first and first == begin:
            return self._at(begin)
        self._last_batch = time.monotonic()
        return self._at(end)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        """The tail found by the last ``latestOffset`` (the query's progress shows it as the
        source's ``latestOffset``), or None before one."""
        return None if self._tail is None else self._at(self._tail)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        """``[start, end)`` in tasks (``minPartitions``, ``maxRecordsPerPartition``)."""
        opts = self.options
        first = _offset(opts, start, "start")
        last = _offset(opts, end, "end")
        return split_range(first, last, opts.min_partitions, opts.max_records_per_partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to keep: Spark's checkpoint holds the offsets; the broker no position."""
        _offset(self.options, end, "end")

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """One task: :func:`read_range` of the partition's range."""
        assert isinstance(partition, StreamRange)
        return read_range(self.options, partition.start, partition.end)
