"""Reading the rows of the ``frames`` table out of raw SQLite b-tree pages.

Used on the pages of committed WAL transactions that SQLite's recovery drops
(:attr:`proxy.outbox.wal.WalScan.lost_pages`): their table leaf pages hold the rows those
transactions left, so the frames lost with them can be named by ``seq`` and ``mq-sidecar-id``
rather than only counted as transactions.

Format (SQLite "File Format", "B-tree Pages" and "Record Format"): a table b-tree leaf page
starts with type byte 0x0D, its cell count at bytes 3-4 and an array of 2-byte cell offsets
from byte 8. A cell is a varint payload size, a varint rowid and the payload (its first bytes
at least are on the page). The payload is a record: a varint header size, one varint serial
type per column, then the values. A ``frames`` row is recognised by its shape: 8 columns,
the first NULL (``seq`` is the rowid), text, integer, text, text.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["FrameCell", "frames_in_pages"]

_TABLE_LEAF = 0x0D
_COLUMNS = 8


@dataclass(frozen=True, slots=True)
class FrameCell:
    """A ``frames`` row as a b-tree cell names it (its bytes are not read)."""

    seq: int
    session_key: str
    session_order: int
    sidecar_id: str
    destination: str


def _varint(data: bytes, at: int) -> tuple[int, int]:
    """SQLite's varint at ``at``: (value, offset after it). Raises IndexError past the end."""
    value = 0
    for i in range(8):
        byte = data[at + i]
        value = (value << 7) | (byte & 0x7F)
        if byte < 0x80:
            return value, at + i + 1
    return (value << 8) | data[at + 8], at + 9


def _int_size(serial: int) -> int:
    return {0: 0, 1: 1, 2: 2, 3: 3, 4: 4, 5: 6, 6: 8, 7: 8, 8: 0, 9: 0}.get(serial, -1)


def _cell(page: bytes, at: int) -> FrameCell | None:
    _, at = _varint(page, at)  # payload size
    rowid, at = _varint(page, at)
    header_size, pos = _varint(page, at)
    body = at + header_size
    serials = []
    while pos < body:
        serial, pos = _varint(page, pos)
        serials.append(serial)
    if len(serials) != _COLUMNS or serials[0] != 0:
        return None
    values: list[str | int] = []
    for serial in serials[1:5]:
        if serial >= 13 and serial % 2:  # text
            n = (serial - 13) // 2
            values.append(page[body : body + n].decode("utf-8"))
        elif 1 <= serial <= 6 or serial in (8, 9):
            n = _int_size(serial)
            values.append(serial - 8 if n == 0 else int.from_bytes(page[body : body + n], "big"))
        else:
            return None
        body += n
    key, order, sidecar_id, destination = values
    if not (isinstance(key, str) and isinstance(order, int) and isinstance(sidecar_id, str)):
        return None
    if not isinstance(destination, str):
        return None
    return FrameCell(rowid, key, order, sidecar_id, destination)


def frames_in_pages(pages: Iterable[tuple[int, bytes]]) -> dict[int, FrameCell]:
    """The ``frames`` rows found on table leaf pages, by ``seq``. ``pages``: (page number,
    page bytes); page 1 (the schema) is skipped. Damaged cells are skipped, never raised."""
    found: dict[int, FrameCell] = {}
    for number, page in pages:
        if number == 1 or not page or page[0] != _TABLE_LEAF:
            continue
        count = int.from_bytes(page[3:5], "big")
        for i in range(count):
            at = int.from_bytes(page[8 + 2 * i : 10 + 2 * i], "big")
            try:
                cell = _cell(page, at)
            except (IndexError, UnicodeDecodeError):
                continue
            if cell is not None:
                found[cell.seq] = cell
    return found
