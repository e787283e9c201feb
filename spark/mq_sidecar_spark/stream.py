"""The stream read (``stream=true``): a RabbitMQ stream (``x-queue-type:stream``) as a parallel,
replayable source, for ``spark.read`` (a range) and ``spark.readStream`` (issue 33;
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
- **Each task reads its range on its executor** (:func:`read_range`): a SUBSCRIBE at
  ``offset=<start>`` through the executor's sidecar (``host``/``port``) with ``ack:client`` and
  ``prefetch-count``, a cumulative ACK every half window (credit), until the message before
  ``end``; then it disconnects. The same range gives the same records, so a retried task or a
  batch re-run from the checkpoint reads what the first attempt read.
"""

from __future__ import annotations

import importlib
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
from pyspark.sql.types import (
    BinaryType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from ._link import Delivery, Link
from ._stream_options import Position, StreamOptions, parse_stream_options
from .errors import (
    OptionError,
    StompConnectError,
    StompErrorFrame,
    StompReadError,
    StompWriteError,
    StreamDataLossError,
    StreamOffsetError,
)

__all__ = [
    "PROBE_PREFETCH",
    "STREAM_SCHEMA",
    "TAIL_QUIET",
    "StompStreamBatchReader",
    "StompStreamSource",
    "StreamRange",
    "read_range",
]

LOG = logging.getLogger("mq_sidecar_spark")

#: The rows of a stream read: ``destination`` (the MESSAGE's, ``/queue/<name>`` on RabbitMQ),
#: ``offset`` (its ``x-stream-offset``), ``headers`` (every header but ``ack``), ``body`` (the
#: bytes as sent), ``timestamp`` (the producer's ``timestamp`` header in ms since the epoch, as
#: a UTC timestamp; null when absent: RabbitMQ sets none).
STREAM_SCHEMA = StructType(
    [
        StructField("destination", StringType(), False),
        StructField("offset", LongType(), False),
        StructField("headers", MapType(StringType(), StringType(), True), False),
        StructField("body", BinaryType(), False),
        StructField("timestamp", TimestampType(), True),
    ]
)

#: MESSAGEs a tail probe takes at most (its ``prefetch-count``): one chunk is usually far less.
PROBE_PREFETCH = 1000
#: SUBSCRIBEs at ``last`` a tail probe makes at most on a stream that is not empty.
TAIL_TRIES = 3
#: Seconds without a MESSAGE after which a tail probe takes the chunk as complete.
TAIL_QUIET = 0.2
#: Rows per Arrow record batch a task yields (bounds a task's memory, not its range).
ROWS_PER_BATCH = 10_000
#: A task's subscription id.
TASK_SUBSCRIPTION = "mq-sidecar-spark-stream"


def _offset_of(headers: Mapping[str, str], destination: str) -> int:
    raw = headers.get("x-stream-offset")
    try:
        return int(raw) if raw is not None else -1
    except ValueError:
        return -1


def _not_a_stream(destination: str) -> OptionError:
    return OptionError(
        f"option destination={destination!r} is not a RabbitMQ stream (its messages carry no "
        "x-stream-offset; RabbitMQ refuses x-stream-offset on a classic or quorum queue): read "
        "a queue without stream=true, with spark.readStream"
    )


def _open(options: StreamOptions, inbox: int) -> Link:
    """A connected :class:`Link` to the sidecar; raises :class:`StompReadError`."""
    link = Link(
        options.host,
        options.port,
        options.login,
        options.passcode,
        options.timeout,
        vhost=options.vhost,
        inbox=inbox,
    )
    try:
        link.start()
        link.connect()
    except StompConnectError as exc:
        link.close(graceful=False)
        raise StompReadError(f"stream read of {options.destination}: {exc}") from None
    except StompWriteError as exc:
        link.close(graceful=False)
        raise StompReadError(f"stream read of {options.destination}: {exc}") from None
    return link


def _subscribe(link: Link, options: StreamOptions, ident: str, position: str, window: int) -> None:
    """SUBSCRIBE ``ident`` at ``position`` (``ack:client``, ``prefetch-count:window``); the
    broker's refusal becomes :class:`OptionError` (not a stream) or :class:`StompReadError`."""
    headers = {"x-stream-offset": position, "prefetch-count": str(window)}
    try:
        link.subscribe(options.destination, ident, headers, ack="client")
    except StompErrorFrame as exc:
        raise _refusal(options, exc) from None
    except StompWriteError as exc:
        raise StompReadError(
            f"SUBSCRIBE to {options.destination} at {position} failed: {exc}"
        ) from None


#: RabbitMQ's refusal of a stream SUBSCRIBE on a node whose replica of the stream is not running
#: (measured on 3.10: a node killed with SIGKILL and started again refused it for some seconds
#: after it had rejoined the cluster, ``PRECONDITION_FAILED - queue '...' does not have a
#: replica on the local node``). It passes, so :func:`_open_subscribed` tries again.
NO_LOCAL_REPLICA = "does not have a replica on the local node"
#: Seconds between two tries of a SUBSCRIBE refused with :data:`NO_LOCAL_REPLICA`, at most.
NO_REPLICA_RETRY = 1.0


def _open_subscribed(
    options: StreamOptions, inbox: int, ident: str, position: str, window: int
) -> Link:
    """:func:`_open`, then :func:`_subscribe`; a SUBSCRIBE refused because the node's replica
    is not running yet (:data:`NO_LOCAL_REPLICA`: RabbitMQ then closes the connection) is
    tried again on a new connection, for up to ``timeout`` s."""
    deadline = time.monotonic() + options.timeout
    pause = 0.1
    while True:
        link = _open(options, inbox)
        try:
            _subscribe(link, options, ident, position, window)
        except StompReadError as exc:
            link.close(graceful=False)
            if NO_LOCAL_REPLICA not in str(exc) or time.monotonic() + pause > deadline:
                raise
            LOG.warning("%s; trying again in %.1f s", exc, pause)
            time.sleep(pause)
            pause = min(NO_REPLICA_RETRY, pause * 2)
            continue
        except BaseException:
            link.close(graceful=False)
            raise
        return link


def _refusal(options: StreamOptions, exc: StompErrorFrame) -> Exception:
    if exc.message == "precondition_failed" and "x-stream-offset" in exc.body:
        return _not_a_stream(options.destination)
    return StompReadError(
        f"SUBSCRIBE to {options.destination} failed: the sidecar at "
        f"{options.host}:{options.port} sent ERROR {exc.message}: {exc.body}"
    )


def _take(link: Link, options: StreamOptions, limit: int, wait: float) -> list[Delivery]:
    try:
        return link.take_wait(limit, wait)
    except StompErrorFrame as exc:
        raise _refusal(options, exc) from None
    except StompWriteError as exc:
        raise StompReadError(f"stream read of {options.destination}: {exc}") from None


class _Probe:
    """The driver's probes of positions: each on a STOMP connection of its own, closed after it
    (so nothing it received stays unacknowledged in the sidecar or the broker; an UNSUBSCRIBE
    instead was answered ``ERROR Subscription not found`` by RabbitMQ 3.10 now and then, which
    closes the connection). Never reads a record for Spark. Use as a context manager."""

    def __init__(self, options: StreamOptions) -> None:
        self.options = options
        self._count = 0

    def __enter__(self) -> _Probe:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def _probe(self, position: str, window: int, whole_chunk: bool) -> tuple[int, int] | None:
        """The first and last offsets a SUBSCRIBE at ``position`` delivered (with
        ``whole_chunk``: until :data:`TAIL_QUIET` s without one, at most ``window``), or None
        when nothing came within ``tail_wait`` s."""
        self._count += 1
        ident = f"mq-sidecar-spark-probe-{self._count}"
        options = self.options
        link = _open_subscribed(options, window, ident, position, window)
        try:
            first: int | None = None
            last = -1
            seen = 0
            wait = options.tail_wait
            for _ in range(window + 1):  # each round takes at least one message or ends
                got = _take(link, options, window, wait)
                if not got:
                    break
                for headers, _body in got:
                    offset = _offset_of(headers, options.destination)
                    if offset < 0:
                        raise _not_a_stream(options.destination)
                    first = offset if first is None else first
                    last = max(last, offset)
                    seen += 1
                if (not whole_chunk and first is not None) or seen >= window:
                    break
                wait = TAIL_QUIET
        finally:
            link.close()
        return None if first is None else (first, last)

    def earliest(self) -> int | None:
        """The stream's first offset (retention may have removed those before), or None when
        the stream is empty."""
        found = self._probe("first", 1, whole_chunk=False)
        return None if found is None else found[0]

    def tail(self) -> int:
        """The offset after the stream's last message as found (never past it; 0 when empty).

        A SUBSCRIBE at ``last`` that got nothing within ``tail_wait`` is asked again (at most
        :data:`TAIL_TRIES` times in all) when one at ``first`` shows the stream is not empty: a
        slow delivery must not make ``latest`` mean offset 0. Raises :class:`StompReadError`
        when it never answers."""
        for _ in range(TAIL_TRIES):
            found = self._probe("last", PROBE_PREFETCH, whole_chunk=True)
            if found is not None:
                return found[1] + 1
            if self.earliest() is None:
                return 0
        raise StompReadError(
            f"stream read of {self.options.destination}: a SUBSCRIBE at 'last' delivered "
            f"nothing within {self.options.tail_wait:g} s (option tail_wait), {TAIL_TRIES} "
            "times, while one at 'first' did: the tail cannot be found; raise tail_wait"
        )

    def reaches(self, offset: int) -> bool:
        """Whether the stream has a message at or past ``offset`` (a SUBSCRIBE at
        ``offset=<offset>`` delivers one within ``tail_wait`` s; RabbitMQ treats an offset past
        the end as ``next``). Asked where :meth:`tail` may be short: a tail probe's own
        subscription hides copies of messages it delivered (module docstring)."""
        return self._probe(f"offset={offset}", 1, whole_chunk=False) is not None

    def at_timestamp(self, ms: int) -> int | None:
        """The first offset of the first chunk written at or after ``ms`` // 1000 s (RabbitMQ's
        ``timestamp=`` takes seconds and starts at a chunk), or None when none is."""
        found = self._probe(f"timestamp={ms // 1000}", 1, whole_chunk=False)
        return None if found is None else found[0]


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


#: Headers a RabbitMQ stream MESSAGE gets per delivery (or that the broker copies from the
#: SEND's own frame), left out when two messages' contents are compared.
_PER_DELIVERY = frozenset(
    {"ack", "message-id", "subscription", "x-stream-offset", "redelivered", "receipt"}
)


def _content_key(headers: Mapping[str, str], body: bytes) -> int:
    """A key of a message's content, its body and the headers it was sent with, for one task's
    comparisons (Python's ``hash``: cheap, and the same within the process; a BLAKE2b digest
    over sorted headers cost 16 us a message and slowed the task by a tenth, measured)."""
    sent = frozenset(item for item in headers.items() if item[0] not in _PER_DELIVERY)
    return hash((body, sent))


def _skip_hidden(options: StreamOptions, expected: int, end: int, seen: set[int]) -> int:
    """Where a task whose subscription went quiet at ``expected`` may go on: past the messages
    of ``[expected, end)`` that its sidecar hid as copies of messages the task already read.

    The sidecar hides, per subscription, a message whose ``mq-sidecar-id`` it delivered already
    (docs/behaviour.md, "Duplicate detection": a retried writer task's copies), so a range may
    end in messages the task never gets. A second subscription at ``offset=<expected>``, on a
    connection of its own, has seen nothing and shows them; each one whose content (body and
    sent headers) equals one the task read is such a copy, and is passed over. The first one
    that is not stops it (the task's subscription is only slow). Returns the new ``expected``
    (``end`` once every offset left is a copy or beyond the range)."""
    link = _open_subscribed(
        options, options.prefetch, "mq-sidecar-spark-check", f"offset={expected}", 1
    )
    try:
        at = expected
        wait = options.tail_wait
        for _ in range(end - expected + 1):
            got = _take(link, options, options.prefetch, wait)
            if not got:
                return at
            for headers, body in got:
                offset = _offset_of(headers, options.destination)
                if offset < at:
                    continue
                if offset >= end:
                    return end
                if _content_key(headers, body) not in seen:
                    return at
                at = offset + 1
            wait = TAIL_QUIET
        return at
    finally:
        link.close()


def read_range(options: StreamOptions, start: int, end: int) -> Iterator[Any]:
    """The records of offsets ``[start, end)`` as pyarrow ``RecordBatch``es of
    :data:`STREAM_SCHEMA`, read on the executor through its sidecar (module docstring).

    Offsets are not always consecutive: RabbitMQ's log gives offsets to entries that are no
    messages too (measured on 3.10: 1,000 messages took offsets 0-1004 in a stream whose small
    segments rolled over), so a task takes the messages whose offsets fall in its range, and
    ends at the first MESSAGE at or past ``end`` (the range's last offset may be no message).
    Offsets that retention removed are found on the driver, before the range is planned
    (:meth:`StompStreamSource.latestOffset`): a jump inside a range is not a loss. A range
    whose last messages the sidecar hides (copies, :func:`_skip_hidden`) ends once a check
    after :data:`TAIL_QUIET` s without a MESSAGE found only such copies left.

    Raises :class:`StompReadError` (no sidecar, an ERROR, no MESSAGE within ``timeout`` s
    while one is due).
    """
    pa: Any = importlib.import_module("pyarrow")
    from pyspark.sql.pandas.types import to_arrow_schema  # noqa: PLC0415

    schema = to_arrow_schema(STREAM_SCHEMA, timezone="UTC")
    if end <= start:
        return
    window = options.prefetch
    link = _open_subscribed(options, window, TASK_SUBSCRIPTION, f"offset={start}", window)
    try:
        expected = start
        batch = _Columns()
        seen: set[int] = set()
        unacked = 0
        last_ack: str | None = None
        idle = 0.0  # seconds waited since the last MESSAGE
        check_at = options.tail_wait  # when idle reaches it: look for hidden copies
        # Every round takes at least one MESSAGE, or waits TAIL_QUIET s (then timeout bounds
        # it); a range needs at most (end - start) MESSAGEs, plus a window below ``start``.
        rounds = end - start + window + math.ceil(options.timeout / TAIL_QUIET) + 2
        for _ in range(rounds):
            if expected >= end:
                break
            got = _take(link, options, window, TAIL_QUIET)
            if not got:
                idle += TAIL_QUIET
                if seen and idle >= check_at:
                    check_at += options.tail_wait
                    expected = _skip_hidden(options, expected, end, seen)
                if idle >= options.timeout and expected < end:
                    raise StompReadError(
                        f"stream read of {options.destination}: no MESSAGE at or after offset "
                        f"{expected} within {options.timeout:g} s (option timeout; range "
                        f"{start}-{end - 1})"
                    )
                continue
            idle, check_at = 0.0, options.tail_wait
            for headers, body in got:
                offset = _offset_of(headers, options.destination)
                if offset < 0:
                    raise _not_a_stream(options.destination)
                ack = headers.get("ack")
                if ack is not None:
                    last_ack, unacked = ack, unacked + 1
                if offset < expected:
                    continue
                if offset >= end:
                    expected = end
                    break
                seen.add(_content_key(headers, body))
                batch.add(headers, body, offset, options.destination)
                expected = offset + 1
            if last_ack is not None and unacked * 2 >= window and expected < end:
                link.ack(last_ack)  # ack:client: credit for every earlier MESSAGE too
                unacked = 0
            if len(batch.offsets) >= ROWS_PER_BATCH:
                yield batch.record_batch(pa, schema)
                batch = _Columns()
        if expected < end:
            raise StompReadError(
                f"stream read of {options.destination}: stopped at offset {expected} of range "
                f"{start}-{end - 1} (more MESSAGEs below the range than the bound)"
            )
        if batch.offsets:
            yield batch.record_batch(pa, schema)
    finally:
        link.close()


class _Columns:
    """The records a task read, column by column, until they become one Arrow record batch
    (the headers as a map column built from flat lists: building it from per-row lists of
    pairs took 27 us a row, measured)."""

    def __init__(self) -> None:
        self.destinations: list[str] = []
        self.offsets: list[int] = []
        self.map_offsets: list[int] = [0]
        self.keys: list[str] = []
        self.values: list[str] = []
        self.bodies: list[bytes] = []
        self.timestamps: list[int | None] = []

    def add(self, headers: Mapping[str, str], body: bytes, offset: int, default: str) -> None:
        """One MESSAGE (``default``: its destination when it names none)."""
        self.destinations.append(headers.get("destination", default))
        self.offsets.append(offset)
        for name, value in headers.items():
            if name != "ack":
                self.keys.append(name)
                self.values.append(value)
        self.map_offsets.append(len(self.keys))
        self.bodies.append(body)
        stamp = headers.get("timestamp")
        self.timestamps.append(int(stamp) * 1000 if stamp and stamp.isdigit() else None)

    def record_batch(self, pa: Any, schema: Any) -> Any:
        """The records as a pyarrow ``RecordBatch`` of ``schema`` (STREAM_SCHEMA's)."""
        headers_type = schema.field("headers").type
        headers = pa.MapArray.from_arrays(
            pa.array(self.map_offsets, type=pa.int32()),
            pa.array(self.keys, type=headers_type.key_type),
            pa.array(self.values, type=headers_type.item_type),
        )
        arrays = [
            pa.array(self.destinations, type=schema.field("destination").type),
            pa.array(self.offsets, type=schema.field("offset").type),
            headers.cast(headers_type),
            pa.array(self.bodies, type=schema.field("body").type),
            pa.array(self.timestamps, type=schema.field("timestamp").type),
        ]
        return pa.RecordBatch.from_arrays(arrays, schema=schema)


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
