"""Drain a destination through mq-sidecar and reconcile it against the source DataFrame.

The :class:`Reader` is the consuming app of ``mq-sidecar drill --consumer stomp``: a stomp.py
connection to a sidecar, one subscription, every MESSAGE recorded by its ``row-id`` and a digest
of its body, then acknowledged (``client-individual`` by default: the ACK follows the
recording). It counts what the *app* received, independently of the sidecar: the sidecar hides
duplicates and redeliveries it recognises (docs/behaviour.md, "Duplicate detection"), and
anything that still reaches the app twice is counted here as a duplicate.

:func:`expected` computes the id and body digest of every row of the source DataFrame as
the publish sends them (:mod:`pipeline.publish`); :func:`reconcile` compares the two by id
and content.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from pipeline.publish import row_id
from pipeline.rows import ROW_COLUMN, body_digest, serialise_row

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Row

__all__ = [
    "ROW_ID_HEADER",
    "ConsumingApp",
    "ReadError",
    "Reader",
    "Received",
    "Reconciliation",
    "expected",
    "reconcile",
]

#: The row's id as the consuming app sees it (the data source sends it beside
#: ``mq-sidecar-id``, which the sidecars keep to themselves).
ROW_ID_HEADER = "row-id"


class ReadError(RuntimeError):
    """The reader could not subscribe, or the sidecar sent it an ERROR."""


def expected(df: DataFrame, job: str) -> dict[str, bytes]:
    """``{row id: body digest}`` of every row of ``df`` as the drill's publish sends it
    (:func:`pipeline.publish.row_id` of the job ``job`` and the row's :data:`ROW_COLUMN`; the
    body as :func:`pipeline.rows.serialise_row` writes it). Raises ``ValueError`` when two
    rows get the same id (the row column is not unique)."""

    def digests(rows: Iterable[Row]) -> Iterator[tuple[str, bytes]]:
        for row in rows:
            yield row_id(job, row[ROW_COLUMN]), body_digest(serialise_row(row))

    pairs = df.rdd.mapPartitions(digests).collect()
    result = dict(pairs)
    if len(result) != len(pairs):
        raise ValueError(
            f"{len(pairs) - len(result)} row(s) share an id: {ROW_COLUMN!r} is not unique"
        )
    return result


@dataclass
class Received:
    """What an app received: per row id the copies and the first body digest.

    ``conflicts``: ids whose copies had different bodies. ``anonymous``: messages without a
    ``row-id``. ``arrivals``: monotonic time of every message (timeline).
    """

    counts: dict[str, int] = field(default_factory=dict)
    digests: dict[str, bytes] = field(default_factory=dict)
    conflicts: set[str] = field(default_factory=set)
    anonymous: int = 0
    arrivals: list[float] = field(default_factory=list)

    @property
    def total(self) -> int:
        """Every message received, duplicates included."""
        return len(self.arrivals)

    def record(self, mid: str | None, digest: bytes, now: float) -> None:
        """Count one message."""
        self.arrivals.append(now)
        if mid is None:
            self.anonymous += 1
            return
        seen = self.counts.get(mid, 0)
        self.counts[mid] = seen + 1
        if seen == 0:
            self.digests[mid] = digest
        elif self.digests[mid] != digest:
            self.conflicts.add(mid)

    def merge(self, other: Received) -> None:
        """Add ``other``'s messages (e.g. a second session's) to these."""
        for mid, count in other.counts.items():
            seen = self.counts.get(mid, 0)
            self.counts[mid] = seen + count
            if seen == 0:
                self.digests[mid] = other.digests[mid]
            elif self.digests[mid] != other.digests[mid]:
                self.conflicts.add(mid)
        self.conflicts |= other.conflicts
        self.anonymous += other.anonymous
        self.arrivals.extend(other.arrivals)


class ConsumingApp(Protocol):
    """What the drill needs of its consuming app: :class:`Reader` (stomp.py) or
    :class:`pipeline.drill.streaming.SparkConsumer` (a Structured Streaming query). ``unique``:
    distinct rows received so far; ``destination``, ``host``, ``port``: where it reads (the
    residual check reads there after it)."""

    destination: str
    host: str
    port: int

    @property
    def unique(self) -> int:
        """Distinct row ids received so far."""
        ...

    def wait_for(self, count: int, *, idle: float, timeout: float) -> bool:
        """Wait (seconds) until ``count`` distinct ids arrived; False after ``idle`` seconds
        without progress or ``timeout``."""
        ...

    def settle(self, quiet: float, *, timeout: float) -> None:
        """Wait until nothing arrived for ``quiet`` seconds (at most ``timeout``)."""
        ...

    def snapshot(self) -> Received:
        """What was received so far."""
        ...

    def close(self, timeout: float = 30.0) -> None:
        """Stop reading (within ``timeout`` seconds)."""
        ...


class Reader:
    """A consuming app: drains ``destination`` through the sidecar at ``host:port``.

    ``ack``: the subscription's ack mode (``client-individual``: each message is ACKed after
    it was recorded; ``auto``: the sidecar acknowledges it once written to the app).
    ``start()`` connects and subscribes (waits for the RECEIPT); ``close()`` disconnects
    gracefully (the sidecar confirms the DISCONNECT only after every ACK before it).
    Messages are handled on stomp.py's receiver thread; the counters are safe to read from
    any thread.
    """

    def __init__(
        self,
        destination: str,
        *,
        host: str = "127.0.0.1",
        port: int = 61613,
        ack: str = "client-individual",
        subscription: str = "reader",
        timeout: float = 60.0,
    ) -> None:
        import stomp  # noqa: PLC0415

        self.destination = destination
        self.host, self.port = host, port
        self.ack = ack
        self.subscription = subscription
        self.timeout = timeout
        self.received = Received()
        self._lock = threading.Lock()
        self._subscribed = threading.Event()
        self._closed = threading.Event()
        self.errors: list[str] = []
        self.last_at: float | None = None
        self.conn: Any = stomp.Connection12([(host, port)], heartbeats=(0, 0), auto_decode=False)
        self.conn.set_listener("reader", self)

    # -- stomp.py listener --------------------------------------------------------------------

    def on_message(self, frame: Any) -> None:
        """stomp.py's MESSAGE: record its row id, body digest and arrival (monotonic s), then
        ACK it unless the subscription is ``auto``."""
        headers = frame.headers
        body = frame.body if isinstance(frame.body, bytes) else str(frame.body).encode()
        now = time.monotonic()
        with self._lock:
            self.received.record(headers.get(ROW_ID_HEADER), body_digest(body), now)
            self.last_at = now
        if self.ack != "auto":
            self.conn.ack(headers["ack"])

    def on_receipt(self, frame: Any) -> None:
        """stomp.py's RECEIPT: the one for the SUBSCRIBE means subscribed."""
        if frame.headers.get("receipt-id") == f"{self.subscription}-sub":
            self._subscribed.set()

    def on_error(self, frame: Any) -> None:
        """stomp.py's ERROR: its ``message`` goes to ``errors`` (and ends a wait for the
        SUBSCRIBE's RECEIPT)."""
        message = frame.headers.get("message", "ERROR")
        self.errors.append(str(message))
        self._subscribed.set()

    def on_disconnected(self) -> None:
        """stomp.py's end of the connection: :meth:`close` stops waiting."""
        self._closed.set()

    # -- control ------------------------------------------------------------------------------

    def start(self) -> None:
        """Connect and subscribe; raises :class:`ReadError` if the sidecar refuses."""
        self.conn.connect(wait=True)
        self.conn.subscribe(
            self.destination,
            id=self.subscription,
            ack=self.ack,
            headers={"receipt": f"{self.subscription}-sub"},
        )
        if not self._subscribed.wait(self.timeout) or self.errors:
            raise ReadError(f"SUBSCRIBE to {self.destination} failed: {self.errors or 'timeout'}")

    @property
    def unique(self) -> int:
        """Distinct ids received so far."""
        return len(self.received.counts)

    @property
    def total(self) -> int:
        """Messages received so far, duplicates included."""
        return self.received.total

    def wait_for(self, count: int, *, idle: float, timeout: float) -> bool:
        """Wait until ``count`` distinct ids arrived; True if they did.

        Gives up (False) when nothing arrived for ``idle`` seconds or after ``timeout``.
        """
        deadline = time.monotonic() + timeout
        started = time.monotonic()
        while self.unique < count:
            now = time.monotonic()
            last = self.last_at if self.last_at is not None else started
            if now >= deadline or now - max(last, started) >= idle:
                return False
            time.sleep(0.05)
        return True

    def settle(self, quiet: float, *, timeout: float) -> None:
        """Wait until no message arrived for ``quiet`` seconds (late duplicates), at most
        ``timeout`` seconds."""
        started = time.monotonic()
        while True:
            now = time.monotonic()
            last = max(self.last_at or started, started)
            if now - last >= quiet or now - started >= timeout:
                return
            time.sleep(min(0.05, quiet))

    def snapshot(self) -> Received:
        """A copy of what was received so far."""
        with self._lock:
            r = self.received
            return Received(
                dict(r.counts), dict(r.digests), set(r.conflicts), r.anonymous, list(r.arrivals)
            )

    def close(self, timeout: float = 30.0) -> None:
        """DISCONNECT and wait (at most ``timeout`` seconds) for the connection to close."""
        if self.conn.is_connected():
            self.conn.disconnect()
            if not self._closed.wait(timeout):
                self.conn.transport.disconnect_socket()


@dataclass(frozen=True)
class Reconciliation:
    """The comparison of what was sent (expected) with what the app received.

    ``received``: messages the app got, duplicates included. ``missing``: expected ids never
    received (lost). ``duplicated``: id -> extra copies the app got. ``mismatched``: ids
    whose received body differs from the source row. ``unexpected``: ids received that the
    source does not have (leftovers, another job); ``anonymous``: messages without an id.
    """

    expected: int
    received: int
    unique: int
    missing: tuple[str, ...]
    duplicated: Mapping[str, int]
    mismatched: tuple[str, ...]
    unexpected: tuple[str, ...]
    anonymous: int

    @property
    def lost(self) -> int:
        """Rows never received."""
        return len(self.missing)

    @property
    def duplicates(self) -> int:
        """Extra copies received."""
        return sum(self.duplicated.values())

    @property
    def ok(self) -> bool:
        """Every row received exactly once with its content, nothing else."""
        return not (
            self.missing or self.duplicated or self.mismatched or self.unexpected or self.anonymous
        )

    def to_dict(self, limit: int = 100) -> dict[str, object]:
        """JSON-able summary; id lists are cut to ``limit`` entries (counts are complete)."""
        return {
            "expected": self.expected,
            "received": self.received,
            "unique": self.unique,
            "lost": self.lost,
            "duplicates": self.duplicates,
            "mismatched": len(self.mismatched),
            "unexpected": len(self.unexpected),
            "anonymous": self.anonymous,
            "missing_ids": list(self.missing[:limit]),
            "duplicated_ids": dict(list(self.duplicated.items())[:limit]),
            "mismatched_ids": list(self.mismatched[:limit]),
            "unexpected_ids": list(self.unexpected[:limit]),
        }


def _natural(mid: str) -> tuple[object, ...]:
    """Sort key: numeric parts as numbers (``job/1/10`` after ``job/1/9``)."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in mid.split("/"))


def reconcile(source: Mapping[str, bytes], received: Received) -> Reconciliation:
    """Compare ``source`` (:func:`expected`) with what the app ``received``, by id and
    content digest. Id lists are sorted (numerically within each part)."""
    counts = received.counts
    missing = sorted((mid for mid in source if mid not in counts), key=_natural)
    duplicated = {
        mid: n - 1 for mid, n in sorted(counts.items(), key=lambda kv: _natural(kv[0])) if n > 1
    }
    mismatched = sorted(
        (
            mid
            for mid, digest in received.digests.items()
            if mid in source and (source[mid] != digest or mid in received.conflicts)
        ),
        key=_natural,
    )
    unexpected = sorted((mid for mid in counts if mid not in source), key=_natural)
    return Reconciliation(
        expected=len(source),
        received=received.total,
        unique=sum(1 for mid in counts if mid in source),
        missing=tuple(missing),
        duplicated=duplicated,
        mismatched=tuple(mismatched),
        unexpected=tuple(unexpected),
        anonymous=received.anonymous,
    )
