"""The outbox's durable store: SQLite (the standard library's sqlite3) in ``outbox_dir``.

One database, ``outbox.db``, in WAL mode with ``synchronous=FULL``: a write transaction is
durable when COMMIT returns (SQLite fsyncs the WAL first), and one transaction costs one fsync
however many frames it holds, so the group committer (:mod:`proxy.outbox.committer`) puts many
sessions' appends into one. docs/outbox.md has the measurements behind the choice and what a
power cut can take.

Two tables: ``frames`` (one row per frame: the global ``seq``, the session key and the frame's
order in its session, its ``mq-sidecar-id``, destination, the time stored, the frame bytes and
their CRC32) and ``seen_ids`` (the consumer side's duplicate-suppression ids per destination).

Not thread-safe: one thread at a time (the committer runs every call through one worker
thread at a time). The directory's lock (:class:`proxy.outbox.lock.DirectoryLock`) is held
from :meth:`OutboxStore.open` to :meth:`OutboxStore.close`.
"""

from __future__ import annotations

import sqlite3
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import TracebackType

from proxy.outbox.errors import OutboxError, OutboxFull
from proxy.outbox.lock import DirectoryLock
from proxy.outbox.records import (
    Append,
    Expire,
    Expired,
    OutboxDepth,
    OutboxFrame,
    RecordSeen,
    RecoveryReport,
    Remove,
    Removed,
    SessionBacklog,
    StoredFrame,
    WriteOp,
    WriteResult,
)
from proxy.outbox.recovery import DB_NAME, open_database
from proxy.tracking.records import SEEN_MAX, SEEN_SECONDS

__all__ = ["OutboxStore"]

_FRAME_ROW = "seq, session_key, session_order, sidecar_id, destination, created_at, crc32, frame"


class OutboxStore:
    """The outbox in one directory. Open with :meth:`open`; use as a context manager or call
    :meth:`close`.

    Writes go through :meth:`write` (a list of ops, one transaction, one fsync), with
    :meth:`append`, :meth:`remove`, :meth:`expire` and :meth:`record_seen` as one-op
    shorthands. Reads:
    :meth:`pending`, :meth:`backlog`, :meth:`count`, :meth:`depth`, :meth:`seen_ids`.

    Attributes:
        directory: the ``outbox_dir``.
        max_bytes: ``outbox_max_bytes``: frame bytes the outbox holds at most.
        seen_max, seen_seconds: the bounds of the duplicate-suppression ids kept per
            destination (count, and age in seconds).
        recovery: what :meth:`open` found (:class:`RecoveryReport`).
        crc_failures: frames :meth:`pending` skipped since open because their bytes no longer
            match their CRC32 (damaged on disk while running; the next open removes and
            reports them).

    Frames handed out by :meth:`pending` are *claimed*: an :class:`Expire` never takes them
    (a forwarder may have sent them to a broker; a failover replays them). The claim of a
    session key is the highest ``seq`` read of it, kept until the store closes (as the
    per-key order counters are).
    """

    def __init__(
        self,
        directory: Path,
        conn: sqlite3.Connection,
        lock: DirectoryLock,
        recovery: RecoveryReport,
        *,
        max_bytes: int,
        seen_max: int,
        seen_seconds: float,
        clock: Callable[[], float],
    ) -> None:
        """Use :meth:`open`."""
        self.directory = directory
        self.max_bytes = max_bytes
        self.seen_max = seen_max
        self.seen_seconds = seen_seconds
        self.recovery = recovery
        self.crc_failures = 0
        self._conn: sqlite3.Connection | None = conn
        self._lock = lock
        self._clock = clock
        self._frames = recovery.frames
        self._bytes = recovery.bytes
        self._orders: dict[str, int] = dict(
            conn.execute("SELECT session_key, MAX(session_order) FROM frames GROUP BY session_key")
        )
        #: Per session key, the highest seq :meth:`pending` handed out (claimed).
        self._claimed: dict[str, int] = {}
        self._seen_counts: Counter[str] = Counter(
            dict(conn.execute("SELECT destination, COUNT(*) FROM seen_ids GROUP BY destination"))
        )

    @classmethod
    def open(
        cls,
        directory: Path,
        *,
        max_bytes: int,
        seen_max: int = SEEN_MAX,
        seen_seconds: float = SEEN_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> OutboxStore:
        """Lock ``directory`` (created if missing), open its database and recover it
        (:mod:`proxy.outbox.recovery`; the result is :attr:`recovery`).

        Args:
            directory: the ``outbox_dir``.
            max_bytes: ``outbox_max_bytes`` (frame bytes, > 0). A recovered outbox may hold
                more than a smaller new bound: nothing is dropped, appends wait until it is
                under the bound again.
            seen_max: duplicate-suppression ids kept per destination, the newest (default
                :data:`proxy.tracking.records.SEEN_MAX`, the bound of the in-memory set).
            seen_seconds: ...none older than this many seconds (default
                :data:`proxy.tracking.records.SEEN_SECONDS`).
            clock: the wall clock (seconds since the epoch) for ``created_at`` and ages.

        Raises:
            OutboxLocked: another sidecar process holds the directory.
            sqlite3.Error: an SQLite error that is no corruption (full disk, permission).
            OSError: the directory cannot be created, read or written.
            OutboxError: the database is from a newer sidecar.
            ValueError: ``max_bytes`` or ``seen_max`` below 1.
        """
        if max_bytes < 1 or seen_max < 1:
            raise ValueError("outbox_max_bytes and seen_max must be at least 1")
        lock = DirectoryLock(directory)
        lock.acquire()
        try:
            conn, report = open_database(directory, now=clock(), seen_seconds=seen_seconds)
        except BaseException:
            lock.release()
            raise
        return cls(
            directory,
            conn,
            lock,
            report,
            max_bytes=max_bytes,
            seen_max=seen_max,
            seen_seconds=seen_seconds,
            clock=clock,
        )

    def __enter__(self) -> OutboxStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the database (SQLite checkpoints the WAL into it) and release the lock;
        idempotent."""
        conn, self._conn = self._conn, None
        try:
            if conn is not None:
                conn.close()
        finally:
            self._lock.release()

    @property
    def conn(self) -> sqlite3.Connection:
        """The open connection. Raises OutboxError after :meth:`close`."""
        if self._conn is None:
            raise OutboxError(f"outbox in {self.directory} is closed")
        return self._conn

    @property
    def files(self) -> tuple[Path, ...]:
        """The database's files that exist now (``outbox.db``, ``-wal``, ``-shm``)."""
        db = self.directory / DB_NAME
        paths = (db, Path(f"{db}-wal"), Path(f"{db}-shm"))
        return tuple(p for p in paths if p.exists())

    @property
    def frames(self) -> int:
        """Frames held."""
        return self._frames

    @property
    def bytes(self) -> int:
        """Frame bytes held (what ``max_bytes`` bounds)."""
        return self._bytes

    # -- writes ------------------------------------------------------------------------------

    def write(self, ops: Sequence[WriteOp]) -> list[WriteResult]:
        """Apply ``ops`` in order in one transaction (one fsync of the WAL at COMMIT): all of
        them or, on an error, none. Returns one result per op, in order: the
        ``tuple[StoredFrame, ...]`` of an :class:`Append`, the :class:`Removed` of a
        :class:`Remove`, the count of a :class:`RecordSeen`, the :class:`Expired` of an
        :class:`Expire`.

        An Append is checked against ``max_bytes`` after the ops before it (a Remove earlier
        in the list makes room for it).

        Raises:
            OutboxFull: an Append would take the outbox past ``max_bytes``; nothing written.
            sqlite3.Error, OSError: the transaction failed (disk full, I/O error); nothing
                written.
            OutboxError: the store is closed.
        """
        conn = self.conn
        now = self._clock()
        frames, size = self._frames, self._bytes
        orders: dict[str, int] = {}
        seen: Counter[str] = Counter()
        results: list[WriteResult] = []
        conn.execute("BEGIN IMMEDIATE")
        try:
            for op in ops:
                if isinstance(op, Remove):
                    removed = self._remove(conn, op)
                    frames -= removed.frames
                    size -= removed.bytes
                    results.append(removed)
                elif isinstance(op, Expire):
                    expired = self._expire(conn, op, now)
                    frames -= len(expired.frames)
                    size -= expired.bytes
                    results.append(expired)
                elif isinstance(op, Append):
                    if size + op.size > self.max_bytes:
                        raise OutboxFull(op.size, size, self.max_bytes)
                    order = orders.get(op.session_key, self._orders.get(op.session_key, 0))
                    stored = self._append(conn, op, order, now)
                    orders[op.session_key] = order + len(stored)
                    frames += len(stored)
                    size += op.size
                    results.append(stored)
                else:
                    conn.executemany(
                        "INSERT INTO seen_ids (destination, sidecar_id, seen_at) VALUES (?,?,?)",
                        [(op.destination, i, now) for i in op.sidecar_ids],
                    )
                    seen[op.destination] += len(op.sidecar_ids)
                    results.append(len(op.sidecar_ids))
            counts = self._prune_seen(conn, seen)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        self._frames, self._bytes = frames, size
        self._orders.update(orders)
        self._seen_counts.update(counts)
        return results

    @staticmethod
    def _append(
        conn: sqlite3.Connection, op: Append, order: int, now: float
    ) -> tuple[StoredFrame, ...]:
        stored = []
        for n, f in enumerate(op.frames, order + 1):
            cursor = conn.execute(
                "INSERT INTO frames (session_key, session_order, sidecar_id, destination, "
                "created_at, crc32, frame) VALUES (?,?,?,?,?,?,?)",
                (op.session_key, n, f.sidecar_id, f.destination, now, zlib.crc32(f.frame), f.frame),
            )
            seq = cursor.lastrowid
            assert seq is not None
            stored.append(
                StoredFrame(seq, op.session_key, n, f.sidecar_id, f.destination, now, f.frame)
            )
        return tuple(stored)

    @staticmethod
    def _remove(conn: sqlite3.Connection, op: Remove) -> Removed:
        where = "FROM frames WHERE seq BETWEEN ? AND ? AND session_key = ?"
        args = (op.first_seq, op.last_seq, op.session_key)
        count, size = conn.execute(
            f"SELECT COUNT(*), COALESCE(SUM(length(frame)), 0) {where}", args
        ).fetchone()
        if count:
            conn.execute(f"DELETE {where}", args)
        return Removed(count, size)

    def _expire(self, conn: sqlite3.Connection, op: Expire, now: float) -> Expired:
        """Remove the frames stored before ``now - op.max_age`` and not claimed, oldest
        first (by seq), at most ``op.limit``. The walk stops at the first frame not old
        enough: frames are stored in time order (a wall clock set back delays the expiry
        of the frames stored after it, never hastens it)."""
        cutoff = now - op.max_age
        claimed = self._claimed
        out: list[StoredFrame] = []
        size = 0
        rows = conn.execute(
            "SELECT seq, session_key, session_order, sidecar_id, destination, created_at, "
            "length(frame) FROM frames ORDER BY seq"
        )
        for seq, key, order, sidecar_id, destination, created_at, length in rows:
            if created_at >= cutoff or len(out) >= op.limit:
                break
            if seq <= claimed.get(key, 0):
                continue
            out.append(StoredFrame(seq, key, order, sidecar_id, destination, created_at, b""))
            size += length
        conn.executemany("DELETE FROM frames WHERE seq = ?", [(f.seq,) for f in out])
        return Expired(tuple(out), size)

    def _prune_seen(self, conn: sqlite3.Connection, added: Counter[str]) -> Counter[str]:
        """Bound ``seen_ids`` per destination: once a destination holds a tenth more than
        ``seen_max``, keep its newest ``seen_max`` (amortized: one DELETE per tenth).
        Returns the per-destination count changes."""
        delta: Counter[str] = Counter()
        for destination, n in added.items():
            count = self._seen_counts[destination] + n
            delta[destination] = n
            if count > self.seen_max + self.seen_max // 10:
                conn.execute(
                    "DELETE FROM seen_ids WHERE destination = ? AND id <= (SELECT id FROM "
                    "seen_ids WHERE destination = ? ORDER BY id DESC LIMIT 1 OFFSET ?)",
                    (destination, destination, self.seen_max),
                )
                delta[destination] = self.seen_max - self._seen_counts[destination]
        return delta

    def append(self, session_key: str, frames: Iterable[OutboxFrame]) -> tuple[StoredFrame, ...]:
        """Store ``frames`` for ``session_key``, all or none, in one transaction.
        Raises as :meth:`write`."""
        result = self.write([Append(session_key, tuple(frames))])[0]
        assert isinstance(result, tuple)
        return result

    def remove(self, session_key: str, first_seq: int, last_seq: int) -> Removed:
        """Remove ``session_key``'s frames with ``first_seq <= seq <= last_seq``.
        Raises as :meth:`write`."""
        result = self.write([Remove(session_key, first_seq, last_seq)])[0]
        assert isinstance(result, Removed)
        return result

    def expire(self, max_age: float, limit: int) -> Expired:
        """Remove up to ``limit`` unclaimed frames older than ``max_age`` seconds, oldest
        first (:class:`Expire`). Raises as :meth:`write`."""
        result = self.write([Expire(max_age, limit)])[0]
        assert isinstance(result, Expired)
        return result

    def record_seen(self, destination: str, sidecar_ids: Iterable[str]) -> int:
        """Remember ``sidecar_ids`` as seen on ``destination``. Raises as :meth:`write`."""
        result = self.write([RecordSeen(destination, tuple(sidecar_ids))])[0]
        assert isinstance(result, int)
        return result

    # -- reads -------------------------------------------------------------------------------

    def pending(
        self, session_key: str, *, after_seq: int = 0, limit: int = 1000
    ) -> tuple[StoredFrame, ...]:
        """Up to ``limit`` frames of ``session_key`` with ``seq > after_seq``, in session
        order, claimed (never expired: see the class). A frame whose bytes fail their CRC32
        is skipped and counted in :attr:`crc_failures` (never forwarded damaged). Raises
        OutboxError when closed, sqlite3.Error on a read error."""
        rows = self.conn.execute(
            f"SELECT {_FRAME_ROW} FROM frames WHERE session_key = ? AND seq > ? "
            "ORDER BY seq LIMIT ?",
            (session_key, after_seq, limit),
        )
        out = []
        for seq, key, order, sidecar_id, destination, created_at, crc, frame in rows:
            if zlib.crc32(frame) != crc:
                self.crc_failures += 1
                continue
            out.append(StoredFrame(seq, key, order, sidecar_id, destination, created_at, frame))
        if out and out[-1].seq > self._claimed.get(session_key, 0):
            self._claimed[session_key] = out[-1].seq
        return tuple(out)

    def backlog(self) -> tuple[SessionBacklog, ...]:
        """Every session with frames, in the order of its first frame (the order recovery
        forwards them in)."""
        rows = self.conn.execute(
            "SELECT session_key, COUNT(*), SUM(length(frame)), MIN(seq) FROM frames "
            "GROUP BY session_key ORDER BY MIN(seq)"
        )
        return tuple(SessionBacklog(k, n, b, first) for k, n, b, first in rows)

    def count(self, session_key: str) -> int:
        """Frames of ``session_key`` held (through the ``(session_key, seq)`` index)."""
        row = self.conn.execute(
            "SELECT COUNT(*) FROM frames WHERE session_key = ?", (session_key,)
        ).fetchone()
        return int(row[0])

    def depth(self) -> OutboxDepth:
        """Frames, bytes, sessions held, and the oldest frame's time and age (seconds)."""
        conn = self.conn
        row = conn.execute("SELECT created_at FROM frames ORDER BY seq LIMIT 1").fetchone()
        sessions = conn.execute("SELECT COUNT(DISTINCT session_key) FROM frames").fetchone()[0]
        oldest = None if row is None else float(row[0])
        age = None if oldest is None else max(0.0, self._clock() - oldest)
        return OutboxDepth(self._frames, self._bytes, sessions, oldest, age)

    def seen_ids(self, destination: str) -> tuple[str, ...]:
        """The duplicate-suppression ids of ``destination``, oldest first: the newest
        ``seen_max`` of them, none older than ``seen_seconds``."""
        cutoff = self._clock() - self.seen_seconds
        rows = self.conn.execute(
            "SELECT sidecar_id FROM (SELECT id, sidecar_id FROM seen_ids WHERE destination = ? "
            "AND seen_at >= ? ORDER BY id DESC LIMIT ?) ORDER BY id",
            (destination, cutoff, self.seen_max),
        )
        return tuple(r[0] for r in rows)

    def seen_destinations(self) -> tuple[str, ...]:
        """The destinations with duplicate-suppression ids, sorted."""
        rows = self.conn.execute("SELECT DISTINCT destination FROM seen_ids ORDER BY destination")
        return tuple(r[0] for r in rows)
