"""Reading an SQLite WAL file before SQLite recovers it, to report what recovery will discard.

SQLite discards a torn WAL tail by itself: on opening a database whose ``-wal`` file outlived
its writer, it replays the file's frames up to the last *commit frame* whose salts match the
header and whose cumulative checksum is right, and ignores everything after (SQLite "File
Format", section "The Write-Ahead Log" and "WAL recovery"). It says nothing about what it
dropped. :func:`scan_wal` reads the same format to count it: frames after the valid prefix that
carry the header's salts were written in this WAL's life and are lost, and each *commit* frame
among them is a whole transaction that had been committed (with ``synchronous=FULL``, fsynced
and answered) and is lost with it: a byte flipped in the middle of the WAL, not a torn tail. An
incomplete last transaction (no commit frame, or a frame cut short) was never answered, so
losing it loses nothing confirmed. The pages the dropped committed transactions wrote are kept
(:attr:`WalScan.lost_pages`), so that recovery can name the frames they held
(:mod:`proxy.outbox.btree`).

Format (all big-endian on disk): a 32-byte header (magic 0x377f0682/0x377f0683, version,
page size, checkpoint sequence, salt-1, salt-2, checksum-1, checksum-2), then frames of a
24-byte header (page number, database size in pages for a commit frame else 0, salt-1,
salt-2, checksum-1, checksum-2) and one page. Checksums run over 32-bit words, little-endian
words for magic ...82 and big-endian for ...83, from the header's checksum onwards.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["WalScan", "scan_wal"]

_MAGIC = (0x377F0682, 0x377F0683)
_HEADER = 32
_FRAME_HEADER = 24
_MASK = 0xFFFFFFFF


@dataclass(frozen=True, slots=True)
class WalScan:
    """What a ``-wal`` file holds and what SQLite's recovery keeps of it.

    Attributes:
        size: bytes of the file.
        header_valid: False when the header is short, has a bad magic or checksum: SQLite then
            ignores the whole file (every whole frame in it counts as discarded, and may have
            been committed: :attr:`lost_committed` says so).
        page_size: bytes per page from the header (0 if it holds no sane page size).
        frames_kept: frames up to and including the last valid commit frame (replayed).
        transactions_kept: commit frames among them.
        frames_discarded: frames after that point that carry the WAL's salts (written in
            this WAL's life), the torn or uncommitted ones included.
        transactions_discarded: commit frames among the discarded ones: transactions that had
            been committed and that recovery drops (0 for a torn tail alone).
        torn_bytes: bytes of a last frame cut short (0 if the file ends on a frame boundary).
        lost_pages: the page images the dropped *committed* transactions wrote, the last one
            per page number (``(page number, bytes)``), for :mod:`proxy.outbox.btree` to find
            the rows they held.
    """

    size: int
    header_valid: bool
    page_size: int
    frames_kept: int
    transactions_kept: int
    frames_discarded: int
    transactions_discarded: int
    torn_bytes: int
    lost_pages: tuple[tuple[int, bytes], ...] = field(default=(), repr=False)

    @property
    def lost_committed(self) -> bool:
        """True when recovery drops at least one committed transaction (not only a torn
        tail): something the store had confirmed as durable is gone. Conservative: a power
        cut during the last transaction's fsync can leave its commit frame whole but its pages
        garbled, and that unconfirmed transaction counts here too."""
        return self.transactions_discarded > 0


def _checksum(data: bytes, big_endian: bool, s0: int, s1: int) -> tuple[int, int]:
    words = struct.unpack(f"{'>' if big_endian else '<'}{len(data) // 4}I", data)
    for i in range(0, len(words), 2):
        s0 = (s0 + words[i] + s1) & _MASK
        s1 = (s1 + words[i + 1] + s0) & _MASK
    return s0, s1


def scan_wal(path: Path) -> WalScan | None:
    """Scan the WAL file at ``path`` (read only, before SQLite opens the database).

    Returns None when there is no such file or it is empty. Raises OSError if it exists and
    cannot be read. Cost: one checksum pass over the file (about 0.1 ms per 4 KiB page).
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    if not data:
        return None
    size = len(data)
    if size < _HEADER:
        return WalScan(size, False, 0, 0, 0, 0, 0, size)
    magic, _version, page_size, _ckpt, salt1, salt2, c1, c2 = struct.unpack(">8I", data[:_HEADER])
    if not (512 <= page_size <= 65536 and page_size & (page_size - 1) == 0):
        return WalScan(size, False, 0, 0, 0, 0, 0, 0)
    frame_size = _FRAME_HEADER + page_size
    offsets = range(_HEADER, size - frame_size + 1, frame_size)
    big_endian = magic == _MAGIC[1]
    header_valid = magic in _MAGIC and _checksum(data[:24], big_endian, 0, 0) == (c1, c2)
    kept = kept_tx = 0
    if header_valid:
        s0, s1 = c1, c2
        for n, offset in enumerate(offsets, 1):
            head = data[offset : offset + _FRAME_HEADER]
            s0, s1 = _checksum(head[:8], big_endian, s0, s1)
            s0, s1 = _checksum(
                data[offset + _FRAME_HEADER : offset + frame_size], big_endian, s0, s1
            )
            commit, f_salt1, f_salt2, f_c1, f_c2 = struct.unpack(">5I", head[4:])
            if (f_salt1, f_salt2) != (salt1, salt2) or (s0, s1) != (f_c1, f_c2):
                break
            if commit:
                kept, kept_tx = n, kept_tx + 1
    elif offsets:  # SQLite ignores the whole file; its frames' own salts say which are its
        salt1, salt2 = struct.unpack(">2I", data[_HEADER + 8 : _HEADER + 16])
    discarded = lost_tx = 0
    group: dict[int, bytes] = {}
    lost: dict[int, bytes] = {}
    for offset in offsets[kept:]:
        page_no, commit, f_salt1, f_salt2 = struct.unpack(">4I", data[offset : offset + 16])
        if (f_salt1, f_salt2) != (salt1, salt2):
            continue  # left over from before the WAL was last reset: not this WAL's
        discarded += 1
        group[page_no] = data[offset + _FRAME_HEADER : offset + frame_size]
        if commit:  # a whole committed transaction that recovery drops
            lost_tx += 1
            lost.update(group)
            group = {}
    return WalScan(
        size=size,
        header_valid=header_valid,
        page_size=page_size,
        frames_kept=kept,
        transactions_kept=kept_tx,
        frames_discarded=discarded,
        transactions_discarded=lost_tx,
        torn_bytes=(size - _HEADER) % frame_size,
        lost_pages=tuple(sorted(lost.items())),
    )
