"""The outbox's values: what goes in, what comes out, what one write transaction holds, and
what recovery found. Plain frozen dataclasses, no I/O."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from proxy.outbox.wal import WalScan

__all__ = [
    "Append",
    "DamagedFrame",
    "Expire",
    "Expired",
    "OutboxDepth",
    "OutboxFrame",
    "RecordSeen",
    "RecoveryReport",
    "Remove",
    "Removed",
    "SessionBacklog",
    "StoredFrame",
    "WriteOp",
    "WriteResult",
]


@dataclass(frozen=True, slots=True)
class OutboxFrame:
    """A frame to store: its ``mq-sidecar-id``, its ``destination`` and its bytes as they
    will be written to the broker (the serialized SEND, ``bytes``)."""

    sidecar_id: str
    destination: str
    frame: bytes


@dataclass(frozen=True, slots=True)
class StoredFrame:
    """A frame in the outbox.

    Attributes:
        seq: the global sequence (1-based, increasing, never reused: SQLite AUTOINCREMENT).
        session_key: the stable id the sidecar gave the app session that sent it.
        session_order: its place in that session (1-based, increasing with ``seq``).
        sidecar_id: its ``mq-sidecar-id``.
        destination: its ``destination`` header.
        created_at: when it was stored (seconds since the epoch, the store's wall clock).
        frame: its bytes.
    """

    seq: int
    session_key: str
    session_order: int
    sidecar_id: str
    destination: str
    created_at: float
    frame: bytes


@dataclass(frozen=True, slots=True)
class Append:
    """Write op: store ``frames`` for ``session_key``, in this order, all or none (the SENDs
    of one transaction enter at COMMIT as one Append). Result: ``tuple[StoredFrame, ...]``."""

    session_key: str
    frames: tuple[OutboxFrame, ...]

    @property
    def size(self) -> int:
        """Bytes counted against ``outbox_max_bytes``: the frames' bytes."""
        return sum(len(f.frame) for f in self.frames)


@dataclass(frozen=True, slots=True)
class Remove:
    """Write op: remove the frames of ``session_key`` with ``first_seq <= seq <= last_seq``
    (the broker's RECEIPT covered them). Result: :class:`Removed`."""

    session_key: str
    first_seq: int
    last_seq: int


@dataclass(frozen=True, slots=True)
class Expire:
    """Write op: remove the frames stored more than ``max_age`` seconds ago (the store's
    clock) that no reader has been handed yet (``outbox_max_age``), oldest first, at most
    ``limit`` of them. Result: :class:`Expired`."""

    max_age: float
    limit: int


@dataclass(frozen=True, slots=True)
class Expired:
    """What an :class:`Expire` took out: the ``frames`` (their bytes left empty: ``b""``),
    oldest first, and their ``bytes``."""

    frames: tuple[StoredFrame, ...]
    bytes: int


@dataclass(frozen=True, slots=True)
class RecordSeen:
    """Write op: remember ``sidecar_ids`` as seen on ``destination`` (consumer-side duplicate
    suppression). Result: ``int``, how many were recorded."""

    destination: str
    sidecar_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Removed:
    """What a :class:`Remove` took out: ``frames`` and their ``bytes``."""

    frames: int
    bytes: int


#: One operation of a write transaction.
WriteOp = Append | Remove | RecordSeen | Expire
#: What one :data:`WriteOp` returns, in the same place.
WriteResult = tuple[StoredFrame, ...] | Removed | int | Expired


@dataclass(frozen=True, slots=True)
class OutboxDepth:
    """How much the outbox holds: ``frames``, ``bytes`` (frame bytes, what
    ``outbox_max_bytes`` bounds), ``sessions`` with frames, and the oldest frame's
    ``created_at`` and age (seconds, wall clock; None when empty). "Oldest" is the frame with
    the lowest ``seq``, the first stored of those left."""

    frames: int
    bytes: int
    sessions: int
    oldest_created_at: float | None
    oldest_age: float | None


@dataclass(frozen=True, slots=True)
class SessionBacklog:
    """One session's frames in the outbox: ``frames``, ``bytes`` and its ``first_seq``
    (recovery forwards sessions in the order of their first frame)."""

    session_key: str
    frames: int
    bytes: int
    first_seq: int


@dataclass(frozen=True, slots=True)
class DamagedFrame:
    """A frame recovery removed because its bytes fail their CRC32 (or could not be read): it
    is not forwarded. Named by ``seq``, ``session_key``, ``session_order``, ``sidecar_id`` and
    ``destination`` so that an operator can match it against the app's receipts."""

    seq: int
    session_key: str
    session_order: int
    sidecar_id: str
    destination: str
    reason: str


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    """What opening an ``outbox_dir`` found (issue 17: "detected, reported with the count of
    frames affected, the rest forwarded").

    Attributes:
        directory: the ``outbox_dir``.
        existed: a database was there before this open.
        frames, bytes, sessions: what the outbox holds after recovery (to forward).
        seen_ids: duplicate-suppression ids loaded (within their count and age bounds).
        integrity: ``PRAGMA quick_check``'s lines (``("ok",)`` when fine), or the SQLite
            error that made the database unreadable.
        wal: what the ``-wal`` file held and what SQLite's own recovery dropped of it
            (:class:`proxy.outbox.wal.WalScan`), None without a ``-wal`` file.
        wal_lost: frames stored by committed WAL transactions that SQLite's recovery dropped
            (a damaged WAL, not a torn tail) and that the outbox no longer holds: lost, named
            from the dropped pages (:mod:`proxy.outbox.btree`).
        damaged: frames removed because their CRC32 failed (not forwarded).
        moved_aside: the unreadable database's files, renamed ``outbox-corrupt-<time>.db*``.
        salvaged: frames read back from a database that was then moved aside.
        lost: frames of a moved-aside database that could not be read back; None when not
            even their count could be read (0 when nothing was moved aside).
    """

    directory: Path
    existed: bool
    frames: int
    bytes: int
    sessions: int
    seen_ids: int
    integrity: tuple[str, ...]
    wal: WalScan | None
    wal_lost: tuple[DamagedFrame, ...]
    damaged: tuple[DamagedFrame, ...]
    moved_aside: tuple[Path, ...]
    salvaged: int
    lost: int | None

    @property
    def clean(self) -> bool:
        """Nothing was damaged, dropped or moved aside (an incomplete last transaction in the
        WAL, which was never confirmed, does not count)."""
        return not self.problems()

    def problems(self) -> list[str]:
        """One line per problem found, for the log and the exit report; empty when clean."""
        out: list[str] = []
        if self.integrity != ("ok",):
            out.append("integrity check failed: " + "; ".join(self.integrity[:5]))
        wal = self.wal
        if wal is not None and wal.lost_committed:
            ids = ", ".join(f.sidecar_id for f in self.wal_lost[:5])
            more = f" and {len(self.wal_lost) - 5} more" if len(self.wal_lost) > 5 else ""
            out.append(
                f"WAL damaged: {wal.transactions_discarded} committed transaction(s) "
                f"({wal.frames_discarded} WAL frames) after the damage were dropped by SQLite"
                + ("" if wal.header_valid else " (the WAL header itself is invalid)")
                + f"; {len(self.wal_lost)} frame(s) in them lost"
                + (f" (mq-sidecar-id {ids}{more})" if ids else "")
            )
        if self.damaged:
            out.append(f"{len(self.damaged)} frame(s) failed their CRC32 and were removed")
        if self.moved_aside:
            lost = "an unknown number of" if self.lost is None else str(self.lost)
            out.append(
                f"unreadable database moved aside to {self.moved_aside[0].name}: "
                f"{self.salvaged} frame(s) salvaged, {lost} frame(s) lost"
            )
        return out
