"""The stream read's STOMP side (``stream=true``; :mod:`mq_sidecar_spark.stream` is the Spark
side and says how the two fit): the driver's probes of positions (:class:`_Probe`) and a task's
read of its range (:func:`read_range`), each on connections of its own through the sidecar
(:class:`~mq_sidecar_spark._stream_link.StreamLink`, read on the calling thread).

RabbitMQ's behaviour they rely on is docs/brokers.md's "Streams" (measured on 3.10): a stream
MESSAGE carries ``x-stream-offset``; a SUBSCRIBE names where to start and must carry a
``prefetch-count``; whole chunks arrive whatever the window; an ACK is credit.
"""

from __future__ import annotations

import importlib
import logging
import math
import time
from collections.abc import Iterator, Mapping
from typing import Any

from pyspark.sql.types import (
    BinaryType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from ._link import Delivery
from ._stream_link import StreamLink
from ._stream_options import StreamOptions
from .errors import (
    OptionError,
    StompConnectError,
    StompErrorFrame,
    StompReadError,
    StompWriteError,
)

__all__ = [
    "PROBE_PREFETCH",
    "STREAM_SCHEMA",
    "TAIL_QUIET",
    "TAIL_TRIES",
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


def _open(options: StreamOptions) -> StreamLink:
    """A connected :class:`StreamLink` to the sidecar; raises :class:`StompReadError`."""
    link = StreamLink(options)
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


def _subscribe(
    link: StreamLink, options: StreamOptions, ident: str, position: str, window: int
) -> None:
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


def _open_subscribed(options: StreamOptions, ident: str, position: str, window: int) -> StreamLink:
    """:func:`_open`, then :func:`_subscribe`; a SUBSCRIBE refused because the node's replica
    is not running yet (:data:`NO_LOCAL_REPLICA`: RabbitMQ then closes the connection) is
    tried again on a new connection, for up to ``timeout`` s. Raises what they raise."""
    deadline = time.monotonic() + options.timeout
    pause = 0.1
    while True:
        link = _open(options)
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


def _take(link: StreamLink, options: StreamOptions, limit: int, wait: float) -> list[Delivery]:
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
        link = _open_subscribed(options, ident, position, window)
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
    # A window for the whole rest of the range (within prefetch): with a window of 1 and
    # messages in chunks of one (sent one by one), a check passed one copy, and on a loaded
    # machine checks that saw nothing within tail_wait left the task at its timeout.
    window = max(1, min(options.prefetch, end - expected))
    link = _open_subscribed(options, "mq-sidecar-spark-check", f"offset={expected}", window)
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
    link = _open_subscribed(options, TASK_SUBSCRIPTION, f"offset={start}", window)
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
