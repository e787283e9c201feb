"""Streaming read: ``spark.readStream.format("stomp")`` as Spark 4's ``DataSourceStreamReader``,
exactly once into a Spark sink (issue 26; docs/spark.md, "Streaming read").

How Spark drives it (``pyspark.sql.datasource.DataSourceStreamReader``, PySpark 4.2+, and the
driver-side runner ``pyspark.sql.streaming.python_streaming_source_runner``): one instance lives in
a Python process of the driver for the whole query and gets ``initialOffset()``,
``latestOffset(start, limit)`` (admission control: ``limit`` is a ``ReadLimit``), ``partitions(
start, end)``, ``commit(end)`` and ``stop()``; another instance is pickled to the executors, whose
``read(partition)`` yields the rows. Spark writes ``end`` to its offset log after
``latestOffset``, runs the batch, writes its commit log, and calls ``commit(end)`` when it
constructs the next batch; a restarted query re-runs an uncommitted batch with the same
``(start, end)``.

What this reader does with that:

- **The STOMP session lives on the driver** (``commit`` runs there, and a STOMP ACK must go on the
  connection that received the message: STOMP 1.2, "ACK"). ``client-individual``, with a bounded
  prefetch window, on the data source's one connection wrapper (:class:`._link.Link`, the
  writer's too); its failures become :class:`StompReadError` here (:func:`_open_link`).
- **latestOffset** drains what was received (bounded by the ``ReadLimit`` and
  ``max_bytes_per_batch``), appends it to the durable read log (fsync) and returns
  ``{"seq": N}``; :mod:`._read_log`. An uncommitted batch already in the log that starts at
  ``start`` (a driver that died after logging it) is offered again instead.
- **partitions** gives the records ``(start, end]`` as logged: from memory for a batch this
  driver logged (kept until committed), else read back from the log (a restarted driver); the
  records travel in the ``InputPartition`` (the log is on the driver's disk, executors need not
  see it).
- **commit(end)** stores the committed messages' identities durably, then ACKs them; so does
  ``latestOffset(start)`` for everything up to ``start`` (Spark plans a batch only once the
  previous one is in its commit log, and calls ``commit`` only after planning the next). The
  ACKs are written right after the identities' fsync (:func:`_write_acks`, on the reader's
  thread: a thread of their own was measured and left out, its docstring says why).
- **Progress**: ``reportLatestOffset`` carries the received position and the ACK figures into
  each ``StreamingQueryProgress`` (docs/spark.md, "Progress of the read").
- **Redeliveries** (after a driver restart, or of a message whose ACK was lost) are recognised by
  identity (``id_header``'s value, else ``mq-sidecar-id``, else ``message-id``): one of a logged,
  uncommitted batch only lends its new ack id to the coming commit; one already committed is
  ACKed and dropped. Through a sidecar, ``mq-sidecar-id`` is never shown to the consumer
  (docs/behaviour.md, "Duplicate detection"), so there the identity is ``message-id``, stable on
  ActiveMQ and Artemis but new on every RabbitMQ delivery (docs/brokers.md, "Message ids"): on
  RabbitMQ set ``id_header`` to a header the producer sets.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from ._link import Link
from ._read_log import LogRecord, ReadLog, ReadLogError
from ._read_options import ReadOptions, parse_read_options
from ._read_progress import AckReport, spark_committed_at
from .errors import (
    StompConnectError,
    StompConnectionLost,
    StompErrorFrame,
    StompReadError,
    StompWriteError,
)

__all__ = [
    "READ_SCHEMA",
    "AckReport",
    "ReadLogError",
    "StompReadError",
    "StompReadPartition",
    "StompStreamReader",
]

#: The rows of a streaming read. ``destination``, ``message_id`` (the broker's), ``duplicate_id``
#: (``mq-sidecar-id``: null through a sidecar, which hides it), ``headers`` (every MESSAGE
#: header but ``ack``; first entry of a repeated one), ``body`` (the bytes as sent),
#: ``timestamp`` (the broker's ``timestamp`` header, ms since the epoch, as a UTC timestamp; null
#: when absent, as on RabbitMQ unless the producer set one), ``redelivered`` (the broker's
#: ``redelivered`` header).
READ_SCHEMA = StructType(
    [
        StructField("destination", StringType(), False),
        StructField("message_id", StringType(), True),
        StructField("duplicate_id", StringType(), True),
        StructField("headers", MapType(StringType(), StringType(), True), False),
        StructField("body", BinaryType(), False),
        StructField("timestamp", TimestampType(), True),
        StructField("redelivered", BooleanType(), False),
    ]
)

#: With ``Trigger.AvailableNow``, the query ends once nothing has arrived for this long (s): a
#: queue has no "now" to read up to, deliveries arrive as the broker sends them.
AVAILABLE_NOW_QUIET = 1.0

#: A partition holds at most this many records or bytes of bodies (more partitions, more tasks).
PARTITION_RECORDS = 5000
PARTITION_BYTES = 16 * 1024 * 1024

#: The subscription's id (its RECEIPT's id is this with ``-sub``).
SUBSCRIPTION_ID = "mq-sidecar-spark-read"

LOG = logging.getLogger("mq_sidecar_spark")


def _read_error(link: Link, exc: StompWriteError, waited_for: str | None) -> StompReadError:
    """The reader's error for a failure of ``link``: the broker's or sidecar's ERROR, the
    connection lost, or (``waited_for``: the frame whose answer was waited for) no answer
    within ``timeout`` seconds; else ``exc``'s own text."""
    where = link.address
    if isinstance(exc, StompErrorFrame):
        message = exc.message or "ERROR"
        text = f"{message}: {exc.body}" if exc.body else message
        return StompReadError(f"the sidecar at {where} sent ERROR {text}")
    if link.lost or isinstance(exc, StompConnectionLost):
        return StompReadError(f"the connection to the sidecar at {where} was lost")
    if waited_for is not None:
        return StompReadError(
            f"no answer to {waited_for} from the sidecar at {where} within "
            f"{link.timeout:g} s (option timeout)"
        )
    return StompReadError(str(exc))


@contextlib.contextmanager
def _read_errors(link: Link, waited_for: str | None = None) -> Iterator[None]:
    """Within the block, ``link``'s errors become :class:`StompReadError` (:func:`_read_error`)."""
    try:
        yield
    except StompWriteError as exc:
        raise _read_error(link, exc, waited_for) from None


def _open_link(options: ReadOptions) -> Link:
    """The query's connection: connected (CONNECTED waited for) and subscribed to
    ``options.destination`` (its RECEIPT waited for), each wait at most ``timeout`` seconds;
    the prefetch window ``options.prefetch`` is the inbox's size and both brokers' header.

    Raises :class:`StompReadError` if nothing listens at ``host:port``, the CONNECT or the
    SUBSCRIBE is refused (the ERROR's ``message`` and body in the text) or not answered in
    time, or the connection is lost; the connection is closed then.
    """
    link = Link(
        options.host,
        options.port,
        options.login,
        options.passcode,
        options.timeout,
        vhost=options.vhost,
        inbox=options.prefetch,
    )
    try:
        try:
            link.start()
        except StompConnectError:
            raise StompReadError(
                f"cannot connect to the sidecar at {link.address} (is mq-sidecar running "
                "there? options host and port)"
            ) from None
        with _read_errors(link, "CONNECT"):
            link.connect()
        headers = {
            **options.subscription_headers,
            "activemq.prefetchSize": str(options.prefetch),
            "prefetch-count": str(options.prefetch),
        }
        subscribe = f"SUBSCRIBE to {options.destination}"
        try:
            with _read_errors(link, subscribe):
                link.subscribe(options.destination, SUBSCRIPTION_ID, headers)
        except StompReadError as exc:
            raise StompReadError(f"{subscribe} failed: {exc}") from None
    except BaseException:
        link.close()
        raise
    return link


class StompReadPartition(InputPartition):
    """One task's share of a micro-batch: the records themselves, as logged (picklable)."""

    def __init__(self, records: list[LogRecord]) -> None:
        super().__init__(len(records))
        self.records = records


def _identity(headers: Mapping[str, str], id_header: str | None) -> str | None:
    if id_header is not None and headers.get(id_header):
        return f"h:{headers[id_header]}"
    if headers.get("mq-sidecar-id"):
        return f"d:{headers['mq-sidecar-id']}"
    if headers.get("message-id"):
        return f"m:{headers['message-id']}"
    return None


def _timestamp(raw: str | None) -> int | None:
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        return None


class _Pending:
    """A delivery received and not logged yet, with every live ack id of its identity."""

    __slots__ = ("acks", "body", "headers", "identity")

    def __init__(self, headers: dict[str, str], body: bytes, identity: str | None) -> None:
        self.headers = headers
        self.body = body
        self.identity = identity
        self.acks: list[str] = []


def _write_acks(session: Link, acks: list[str]) -> None:
    """Write ``acks`` to ``session``, on the reader's thread (in :meth:`StompStreamReader.commit`
    and ``latestOffset``). Raises :class:`StompReadError`: the session failed under a write.

    Writing them on a thread of their own while Spark runs the next batch was measured (issue
    33: the reader's calls fell from 275-291 to 212-223 us a message, the whole query's rate
    did not change beyond the machine's noise) and left out: one run of 33 of that driver side
    stalled with nothing pending, unexplained, and :class:`~mq_sidecar_spark._link.Link` is
    written for one thread."""
    try:
        for ack in acks:
            session.ack(ack)
    except StompWriteError as exc:
        raise _read_error(session, exc, None) from None


class StompStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The streaming reader of ``StompDataSource`` (see module docstring).

    ``schema``: the query's schema (``READ_SCHEMA``, which ``StompDataSource.schema`` returns);
    ``options``: the user's options (case-insensitive names; docs/spark.md). Raises
    :class:`~mq_sidecar_spark.errors.OptionError` at once for a bad option;
    :class:`StompReadError` (no sidecar at ``host:port``, an ERROR from the sidecar or broker, a
    lost connection) and
    :class:`ReadLogError` (a log of another version or destination, offsets the log does not
    hold) from the driver calls, which fail the query with that message.
    """

    def __init__(self, schema: StructType, options: Mapping[str, str]) -> None:
        self.schema = schema
        self.options: ReadOptions = parse_read_options(options)
        self._log: ReadLog | None = None
        self._session: Link | None = None
        self._pending: list[_Pending] = []
        self._pending_by_id: dict[str, _Pending] = {}
        self._acks: dict[int, list[str]] = {}  # logged seq -> live ack ids
        self._logged: dict[int, list[LogRecord]] = {}  # start -> records logged by this run
        self._available_now = False
        self.dropped = 0  # redeliveries recognised and not emitted again
        self.last_ack: AckReport | None = None

    # The instance is pickled to the executors for read(): only the options travel.
    def __getstate__(self) -> dict[str, Any]:
        return {"schema": self.schema, "options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.schema = state["schema"]
        self.options = state["options"]
        self._log = None
        self._session = None
        self._pending, self._pending_by_id, self._acks = [], {}, {}
        self._logged = {}
        self._available_now = False
        self.dropped = 0
        self.last_ack = None

    # -- driver side ----------------------------------------------------------------------------

    def _start(self) -> ReadLog:
        if self._log is None:
            self._log = ReadLog(
                self.options.log_directory,
                destination=self.options.destination,
                id_cache_size=self.options.id_cache_size,
            )
        if self._session is None:
            self._session = _open_link(self.options)
        return self._log

    def _receive(self, log: ReadLog, session: Link) -> None:
        """Sort what arrived: committed copies are ACKed and dropped, copies of logged messages
        lend their ack id to the commit, the rest waits to be logged. Raises
        :class:`StompReadError` once the session failed."""
        with _read_errors(session):
            self._sort(log, session)

    def _sort(self, log: ReadLog, session: Link) -> None:
        """:meth:`_receive`'s work; raises the connection's own errors."""
        session.check()
        room = max(0, self.options.prefetch * 2 - len(self._pending))
        for headers, body in session.take(room):
            ack = headers.pop("ack", None)
            identity = _identity(headers, self.options.id_header)
            if identity is not None:
                if log.is_committed(identity):
                    if ack is not None:
                        session.ack(ack)
                    self.dropped += 1
                    continue
                seq = log.uncommitted_seq(identity)
                if seq is not None:
                    if ack is not None:
                        self._acks.setdefault(seq, []).append(ack)
                    self.dropped += 1
                    continue
                held = self._pending_by_id.get(identity)
                if held is not None:
                    if ack is not None:
                        held.acks.append(ack)
                    self.dropped += 1
                    continue
            pending = _Pending(headers, body, identity)
            if ack is not None:
                pending.acks.append(ack)
            self._pending.append(pending)
            if identity is not None:
                self._pending_by_id[identity] = pending

    def initialOffset(self) -> dict[str, int]:
        """``{"seq": committed}``: a new query starts after what its read log committed (0 for a
        new log)."""
        log = self._start()
        return {"seq": log.committed_seq}

    def prepareForTriggerAvailableNow(self) -> None:
        """``Trigger.AvailableNow`` (Spark's ``SupportsTriggerAvailableNow``): batches go on
        while messages keep arriving, and the query ends once none has arrived for
        ``AVAILABLE_NOW_QUIET`` seconds (``latestOffset`` waits that long before it reports no
        new data). Without this, the first ``latestOffset``, right after the SUBSCRIBE, would find
        nothing yet and the query would end at once (measured)."""
        self._available_now = True

    def getDefaultReadLimit(self) -> ReadLimit:
        """``ReadMaxRows(max_messages_per_batch)`` (Spark ``ReadLimit``, PySpark 4.2+)."""
        return ReadMaxRows(self.options.max_messages_per_batch)

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        """The end of the next batch: ``start`` if nothing arrived; else the records taken
        (at most ``limit``'s rows or bytes, and ``max_bytes_per_batch`` unless ``limit`` is
        ``ReadAllAvailable``; at least one) are logged durably first. A logged, uncommitted batch
        starting at ``start`` is returned again instead. Everything up to ``start`` is settled
        first, as by ``commit``: Spark calls this only once the batch ending at ``start`` is in
        its commit log."""
        log = self._start()
        session = self._session
        assert session is not None
        self._receive(log, session)
        begin = self._seq(start, "start")
        if log.committed_seq < begin <= log.end_seq:
            # Spark plans a batch only after the previous one is in its commit log
            # (MicroBatchExecution runs one batch at a time: runBatch, commit log, then the next
            # constructNextBatch), so everything up to ``start`` is committed. Its own commit()
            # comes only after the next batch is planned, and never if no data comes: without
            # this, the window of a restarted query could stay full of redeliveries of committed
            # batches, and no batch would ever free it (measured: a restarted driver stalled).
            self._settle(log, session, begin)
        logged = log.batch_end_after(begin)
        if logged is not None:
            return {"seq": logged}
        if self._available_now and not self._pending:
            deadline = time.monotonic() + AVAILABLE_NOW_QUIET
            while not self._pending and time.monotonic() < deadline:
                time.sleep(0.05)
                self._receive(log, session)
        if begin != log.end_seq:
            raise ReadLogError(
                f"the query's offset {begin} does not match the read log in "
                f"{log.directory} (it ends at {log.end_seq}, committed {log.committed_seq}): "
                "checkpoint_location must be the query's own checkpointLocation"
            )
        max_rows = len(self._pending)
        max_bytes = self.options.max_bytes_per_batch
        if isinstance(limit, ReadMaxRows):
            max_rows = min(max_rows, limit.max_rows)
        elif isinstance(limit, ReadMaxBytes):
            max_bytes = min(max_bytes, limit.max_bytes)
        elif isinstance(limit, ReadAllAvailable):
            max_bytes = 1 << 62
        taken = 0
        size = 0
        while taken < max_rows:
            size += len(self._pending[taken].body)
            if taken > 0 and size > max_bytes:
                break
            taken += 1
        if taken == 0:
            return {"seq": begin}
        batch, self._pending = self._pending[:taken], self._pending[taken:]
        records: list[LogRecord] = []
        for seq, item in enumerate(batch, begin + 1):
            h = item.headers
            records.append(
                LogRecord(
                    seq=seq,
                    identity=item.identity,
                    destination=h.get("destination", self.options.destination),
                    message_id=h.get("message-id"),
                    duplicate_id=h.get("mq-sidecar-id"),
                    headers=h,
                    body=item.body,
                    timestamp_ms=_timestamp(h.get("timestamp")),
                    redelivered=h.get("redelivered", "false").lower() == "true",
                )
            )
        end = log.append(records)
        self._logged[begin] = records
        for seq, item in enumerate(batch, begin + 1):
            self._acks[seq] = item.acks
            if item.identity is not None:
                self._pending_by_id.pop(item.identity, None)
        return {"seq": end}

    def _seq(self, given: Mapping[str, Any], what: str) -> int:
        """The read log position of a checkpointed offset (Spark's start or end). Raises
        :class:`ReadLogError` for an offset of the stream read (``stream=true``): the query's
        checkpoint is not a queue read's."""
        if "seq" not in given:
            raise ReadLogError(
                f"the query's checkpoint holds {what} offset {dict(given)}, not a queue read's "
                f"({{'seq': N}}): it was written by a stream read (stream=true) or another "
                f"source; read {self.options.destination} with a new checkpointLocation"
            )
        return int(given["seq"])

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        """The records ``(start, end]`` as logged, in partitions of at most
        ``PARTITION_RECORDS`` records or ``PARTITION_BYTES`` of bodies. A batch this run logged
        is still in memory (kept until committed); any other (a restarted driver's) is read
        back from the read log."""
        log = self._start()
        begin, stop = self._seq(start, "start"), self._seq(end, "end")
        records = self._logged.get(begin)
        if records is None or not records or records[-1].seq != stop:
            records = log.read(begin, stop)
        parts: list[InputPartition] = []
        chunk: list[LogRecord] = []
        size = 0
        for record in records:
            if chunk and (
                len(chunk) >= PARTITION_RECORDS or size + len(record.body) > PARTITION_BYTES
            ):
                parts.append(StompReadPartition(chunk))
                chunk, size = [], 0
            chunk.append(record)
            size += len(record.body)
        if chunk:
            parts.append(StompReadPartition(chunk))
        return parts

    def commit(self, end: dict[str, int]) -> None:
        """Spark committed everything up to ``end``: their identities are stored (fsync), then
        each live delivery of them is ACKed; the rest is ACKed when redelivered."""
        log = self._start()
        upto = self._seq(end, "end")
        if upto <= log.committed_seq:
            return  # settled by latestOffset already (the usual case): the session is not used
        session = self._session
        assert session is not None
        self._receive(log, session)
        self._settle(log, session, upto)

    def _settle(self, log: ReadLog, session: Link, end: int) -> None:
        """Everything up to ``end`` is committed by Spark: store the identities (fsync), then
        ACK every live delivery of them (:func:`_write_acks`). Once all are written, the range
        is reported (:attr:`last_ack`, and on the logger ``mq_sidecar_spark`` at INFO). Raises
        :class:`StompReadError` when a write failed."""
        first = log.committed_seq
        if end <= first:
            return
        began = time.time()
        committed_at = spark_committed_at(self.options.checkpoint_location)
        acks = [ack for seq in log.commit(end) for ack in self._acks.pop(seq, ())]
        for start in [start for start in self._logged if start < end]:
            del self._logged[start]

        _write_acks(session, acks)
        at = time.time()
        delay = None if committed_at is None else max(0, round((at - committed_at) * 1000))
        report = AckReport(first, end, len(acks), round((at - began) * 1000), delay)
        self.last_ack = report
        LOG.info(
            "stomp read of %s: %s; %d redeliveries dropped",
            self.options.destination,
            report,
            self.dropped,
        )

    def reportLatestOffset(self) -> dict[str, Any] | None:
        """The progress of the read, shown as the source's ``latestOffset`` in each
        ``StreamingQueryProgress`` (Spark calls this right after ``latestOffset``, and only
        reports it: its offset log holds ``endOffset``; docs/spark.md, "Progress of the read").

        ``seq``: the position of the last message received (logged, or waiting for a batch):
        ``seq - startOffset.seq`` were received and not committed when the batch was planned,
        ``seq - endOffset.seq`` wait for a later batch. ``redeliveries_dropped``: redeliveries
        recognised and not emitted again since the query (re)started. Of the last range whose
        ACKs are all written, ``(acked_after, acked_to]``: ``acked`` (ACKs written), ``ack_ms``
        (its identities stored, then its ACKs written) and, when Spark's commit log is under
        ``checkpoint_location``, ``ack_delay_ms`` (from Spark's commit of the range's last
        batch to its last ACK written). A batch's ACKs are written while the next one runs, so
        the range is the batch before the one reported, or the one before it while those ACKs
        are still being written. None before the first ``latestOffset``."""
        log = self._log
        if log is None:
            return None
        progress: dict[str, Any] = {
            "seq": log.end_seq + len(self._pending),
            "redeliveries_dropped": self.dropped,
        }
        if self.last_ack is not None:
            progress |= self.last_ack.progress()
        return progress

    def stop(self) -> None:
        """Close the STOMP session (nothing more is ACKed: the broker redelivers what was not
        committed, and the next run recognises it)."""
        session, self._session = self._session, None
        if session is not None:
            session.close()

    # -- executor side --------------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """The rows of one partition as one pyarrow ``RecordBatch`` of ``READ_SCHEMA`` (Spark
        takes record batches from ``read`` and checks their schema against the one it expects,
        ``to_arrow_schema(schema, timezone="UTC")``). Measured: 67 us per row through Spark's
        tuple conversion, 7 us per row this way (docs/spark.md, "Streaming read")."""
        # pyarrow: on the executors only (Spark's Python data sources need it there anyway);
        # imported by name, as it ships no type information.
        pa: Any = importlib.import_module("pyarrow")
        from pyspark.sql.pandas.types import to_arrow_schema  # noqa: PLC0415

        assert isinstance(partition, StompReadPartition)
        records = partition.records
        schema = to_arrow_schema(self.schema, timezone="UTC")
        columns = [
            [r.destination for r in records],
            [r.message_id for r in records],
            [r.duplicate_id for r in records],
            [list(r.headers.items()) for r in records],
            [r.body for r in records],
            [None if r.timestamp_ms is None else r.timestamp_ms * 1000 for r in records],
            [r.redelivered for r in records],
        ]
        arrays = [
            pa.array(values, type=field.type) for values, field in zip(columns, schema, strict=True)
        ]
        yield pa.RecordBatch.from_arrays(arrays, schema=schema)
