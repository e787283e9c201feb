"""Opening an ``outbox_dir``: the SQLite database, its settings and schema, and recovery.

Recovery on open, in this order (issue 17: a corrupted or truncated tail after a power cut is
"detected, reported with the count of frames affected, the rest forwarded; never a crash
loop"):

1. :func:`proxy.outbox.wal.scan_wal` reads the ``-wal`` file before SQLite does, to count what
   SQLite's own WAL recovery is about to drop (it drops a torn or corrupted tail silently);
   the frames that dropped *committed* transactions held and the recovered database lacks are
   named from the dropped pages (:mod:`proxy.outbox.btree`).
2. SQLite opens the database (WAL recovery happens here) and ``PRAGMA quick_check`` checks
   its structure.
3. A database SQLite calls corrupt (``SQLITE_CORRUPT``, ``SQLITE_NOTADB``, or a quick_check
   that is not "ok") is read back as far as it can be (every frame not on a damaged page, in
   ``seq`` order), closed, and its files are renamed ``outbox-corrupt-<UTC time>.db`` (with
   ``-wal``/``-shm``); a new database gets what was read back. Any other SQLite error (disk
   full, no permission) is raised as it is: moving a sound database aside because of it would
   hide its frames, and the error is the clear exit reason.
4. Every frame's CRC32 is checked against its bytes (quick_check checks SQLite's structure,
   not the bytes of a BLOB): a frame that fails is removed and reported by name, the rest stay.
5. Duplicate-suppression ids older than their age bound are dropped, and a checkpoint
   (``TRUNCATE``) folds the WAL into the database, so a dropped tail is gone for good and the
   next power cut finds a short WAL.

So open() fails only on an error that is no corruption: it never raises because of what a
power cut left, and a restart after it finds a sound database (no crash loop).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
import zlib
from pathlib import Path
from typing import Any

from proxy.outbox.btree import frames_in_pages
from proxy.outbox.errors import OutboxError
from proxy.outbox.records import DamagedFrame, RecoveryReport
from proxy.outbox.wal import WalScan, scan_wal

__all__ = [
    "DB_NAME",
    "JOURNAL_SIZE_LIMIT",
    "SCHEMA_VERSION",
    "connect",
    "fsync_directory",
    "is_corruption",
    "open_database",
]

#: The database's file name in ``outbox_dir`` (SQLite adds ``-wal`` and ``-shm`` beside it).
DB_NAME = "outbox.db"
#: ``PRAGMA user_version`` of this schema; a higher one was written by a newer sidecar.
SCHEMA_VERSION = 1
#: Bytes the ``-wal`` file is truncated to after a checkpoint when it grew past them
#: (``PRAGMA journal_size_limit``); the WAL is checkpointed every 1000 pages (SQLite's default
#: ``wal_autocheckpoint``, about 4 MiB), so it only grows past this under a long burst.
JOURNAL_SIZE_LIMIT = 64 * 1024 * 1024

_SCHEMA = """
CREATE TABLE IF NOT EXISTS frames (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    session_key TEXT NOT NULL,
    session_order INTEGER NOT NULL,
    sidecar_id TEXT NOT NULL,
    destination TEXT NOT NULL,
    created_at REAL NOT NULL,
    crc32 INTEGER NOT NULL,
    frame BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS frames_by_session ON frames (session_key, seq);
CREATE TABLE IF NOT EXISTS seen_ids (
    id INTEGER PRIMARY KEY,
    destination TEXT NOT NULL,
    sidecar_id TEXT NOT NULL,
    seen_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS seen_by_destination ON seen_ids (destination, id);
"""
_FRAME_COLUMNS = (
    "seq, session_key, session_order, sidecar_id, destination, created_at, crc32, frame"
)
_SEEN_COLUMNS = "id, destination, sidecar_id, seen_at"


def connect(path: Path) -> sqlite3.Connection:
    """Open (or create) the database at ``path`` in WAL mode with ``synchronous=FULL`` (every
    COMMIT fsyncs the WAL before it returns), and create the schema.

    The connection is in autocommit mode (``isolation_level=None``: the store issues BEGIN
    IMMEDIATE/COMMIT itself) and may be used from any one thread at a time
    (``check_same_thread=False``; the group committer serializes its use).

    Raises:
        sqlite3.DatabaseError: the file is no database, is corrupt, or cannot be opened.
        OutboxError: the schema is from a newer sidecar (``user_version`` above ours).
    """
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if mode != "wal":
            raise OutboxError(f"{path}: SQLite refused WAL mode (journal_mode is {mode})")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute(f"PRAGMA journal_size_limit={JOURNAL_SIZE_LIMIT}")
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise OutboxError(
                f"{path}: outbox schema version {version} is newer than this sidecar's "
                f"({SCHEMA_VERSION})"
            )
        conn.execute("BEGIN IMMEDIATE")
        for statement in filter(str.strip, _SCHEMA.split(";")):
            conn.execute(statement)
        conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")  # also makes the -wal file exist
        conn.execute("COMMIT")
    except BaseException:
        conn.close()
        raise
    return conn


def is_corruption(exc: sqlite3.Error) -> bool:
    """True for SQLite's "this file is damaged" errors (``SQLITE_CORRUPT*``,
    ``SQLITE_NOTADB``), False for every other (I/O, full disk, permission, busy)."""
    name: str = getattr(exc, "sqlite_errorname", "") or ""
    return name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB"))


def fsync_directory(directory: Path) -> None:
    """fsync ``directory`` so that files created or renamed in it survive a power cut."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def open_database(
    directory: Path, *, now: float, seen_seconds: float
) -> tuple[sqlite3.Connection, RecoveryReport]:
    """Open ``directory``'s database and recover it (the module docstring's steps). The
    caller holds the directory's lock. ``now``: the wall clock (seconds since the epoch), for
    the age bound of duplicate-suppression ids (``seen_seconds``) and the moved-aside name.

    Returns the connection and the :class:`RecoveryReport` (its counts of frames, bytes,
    sessions and ids are after recovery).

    Raises:
        sqlite3.Error: an error that is no corruption (see :func:`is_corruption`).
        OSError: the directory cannot be read or written.
        OutboxError: the schema is from a newer sidecar.
    """
    db = directory / DB_NAME
    existed = db.exists()
    wal = scan_wal(Path(f"{db}-wal")) if existed else None
    conn: sqlite3.Connection | None = None
    try:
        conn = connect(db)
        integrity = tuple(str(row[0]) for row in conn.execute("PRAGMA quick_check"))
    except sqlite3.DatabaseError as exc:
        if not is_corruption(exc):
            if conn is not None:
                conn.close()
            raise
        integrity = (f"{getattr(exc, 'sqlite_errorname', 'SQLITE_ERROR')}: {exc}",)
    moved: tuple[Path, ...] = ()
    frames: list[tuple[Any, ...]] = []
    seen: list[tuple[Any, ...]] = []
    lost: int | None = 0
    if integrity != ("ok",):
        lost = None
        if conn is not None:
            frames, seen, lost = _salvage(conn)
            # a corrupt file may fail its closing checkpoint; it is moved aside anyway
            with contextlib.suppress(sqlite3.DatabaseError):
                conn.close()
        moved = _move_aside(db, now)
        conn = connect(db)
        _restore(conn, frames, seen)
    assert conn is not None
    wal_lost = _lost_in_wal(conn, wal)
    damaged = _remove_damaged(conn)
    conn.execute("DELETE FROM seen_ids WHERE seen_at < ?", (now - seen_seconds,))
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    fsync_directory(directory)
    n_frames, n_bytes, n_sessions = conn.execute(
        "SELECT COUNT(*), COALESCE(SUM(length(frame)), 0), COUNT(DISTINCT session_key) FROM frames"
    ).fetchone()
    n_seen = conn.execute("SELECT COUNT(*) FROM seen_ids").fetchone()[0]
    report = RecoveryReport(
        directory=directory,
        existed=existed,
        frames=n_frames,
        bytes=n_bytes,
        sessions=n_sessions,
        seen_ids=n_seen,
        integrity=integrity,
        wal=wal,
        wal_lost=wal_lost,
        damaged=damaged,
        moved_aside=moved,
        salvaged=len(frames),
        lost=lost,
    )
    return conn, report


def _read_all(conn: sqlite3.Connection, sql: str, out: list[tuple[Any, ...]]) -> bool:
    """Append the rows of ``sql`` to ``out`` until the first unreadable one; False if it
    stopped early."""
    try:
        for row in conn.execute(sql):
            out.append(tuple(row))
    except sqlite3.DatabaseError:
        return False
    return True


def _salvage(
    conn: sqlite3.Connection,
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], int | None]:
    """Frames and ids readable from a corrupt database, and how many frames could not be read
    (None if not even their count can be read).

    Frames are read in ``seq`` order up to the first unreadable page, then backwards from the
    end to it, then one by one for every ``seq`` the session index still names: so a damaged
    page loses the frames on it, not every frame after it."""
    found: list[tuple[Any, ...]] = []
    if not _read_all(conn, f"SELECT {_FRAME_COLUMNS} FROM frames ORDER BY seq", found):
        _read_all(conn, f"SELECT {_FRAME_COLUMNS} FROM frames ORDER BY seq DESC", found)
        named: list[tuple[Any, ...]] = []
        _read_all(conn, "SELECT seq FROM frames INDEXED BY frames_by_session", named)
        have = {row[0] for row in found}
        for (seq,) in named:
            if seq not in have:
                one: list[tuple[Any, ...]] = []
                _read_all(conn, f"SELECT {_FRAME_COLUMNS} FROM frames WHERE seq = {int(seq)}", one)
                found += one
    frames = sorted({row[0]: row for row in found}.values(), key=lambda row: int(row[0]))
    seen: list[tuple[Any, ...]] = []
    _read_all(conn, f"SELECT {_SEEN_COLUMNS} FROM seen_ids ORDER BY id", seen)
    total: int | None = None
    for sql in (
        "SELECT COUNT(*) FROM frames",
        "SELECT COUNT(*) FROM frames INDEXED BY frames_by_session",
    ):
        counted: list[tuple[Any, ...]] = []
        if _read_all(conn, sql, counted):
            total = max(total or 0, int(counted[0][0]))
    return frames, seen, None if total is None else max(0, total - len(frames))


def _move_aside(db: Path, now: float) -> tuple[Path, ...]:
    """Rename ``db`` and its ``-wal``/``-shm`` to ``outbox-corrupt-<UTC time>[-n].db*``."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    for n in range(1000):
        name = f"outbox-corrupt-{stamp}{f'-{n}' if n else ''}.db"
        if not any((db.parent / f"{name}{s}").exists() for s in ("", "-wal", "-shm")):
            break
    else:
        raise OutboxError(f"{db.parent}: 1000 moved-aside databases for {stamp} already")
    moved = []
    for suffix in ("", "-wal", "-shm"):
        src = Path(f"{db}{suffix}")
        if src.exists():
            dst = db.parent / f"{name}{suffix}"
            os.replace(src, dst)
            moved.append(dst)
    fsync_directory(db.parent)
    return tuple(moved)


def _restore(
    conn: sqlite3.Connection, frames: list[tuple[Any, ...]], seen: list[tuple[Any, ...]]
) -> None:
    """Write salvaged rows, with their original ``seq`` and ids, into a new database."""
    conn.execute("BEGIN IMMEDIATE")
    conn.executemany(f"INSERT INTO frames ({_FRAME_COLUMNS}) VALUES (?,?,?,?,?,?,?,?)", frames)
    conn.executemany(f"INSERT INTO seen_ids ({_SEEN_COLUMNS}) VALUES (?,?,?,?)", seen)
    conn.execute("COMMIT")


def _lost_in_wal(conn: sqlite3.Connection, wal: WalScan | None) -> tuple[DamagedFrame, ...]:
    """The frames the dropped committed WAL transactions left in their pages and that the
    recovered database does not hold: lost with them."""
    if wal is None or not wal.lost_pages:
        return ()
    cells = frames_in_pages(wal.lost_pages)
    seqs = sorted(cells)
    present: set[int] = set()
    for i in range(0, len(seqs), 500):
        chunk = seqs[i : i + 500]
        marks = ",".join("?" * len(chunk))
        present.update(
            r[0] for r in conn.execute(f"SELECT seq FROM frames WHERE seq IN ({marks})", chunk)
        )
    reason = "in a committed WAL transaction SQLite dropped"
    return tuple(
        DamagedFrame(c.seq, c.session_key, c.session_order, c.sidecar_id, c.destination, reason)
        for c in (cells[s] for s in seqs if s not in present)
    )


def _remove_damaged(conn: sqlite3.Connection) -> tuple[DamagedFrame, ...]:
    """Remove (and name) every frame whose bytes fail their CRC32."""
    damaged: list[DamagedFrame] = []
    query = (
        "SELECT seq, session_key, session_order, sidecar_id, destination, crc32, frame "
        "FROM frames ORDER BY seq"
    )
    for seq, key, order, sidecar_id, destination, crc, frame in conn.execute(query):
        if not isinstance(frame, bytes) or zlib.crc32(frame) != crc:
            reason = "CRC32 mismatch" if isinstance(frame, bytes) else "frame is no BLOB"
            damaged.append(
                DamagedFrame(seq, str(key), order, str(sidecar_id), str(destination), reason)
            )
    if damaged:
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany("DELETE FROM frames WHERE seq = ?", [(d.seq,) for d in damaged])
        conn.execute("COMMIT")
    return tuple(damaged)
