"""The streaming reader's durable read log: what a micro-batch read, kept until Spark commits it.

Why it exists (docs/spark.md, "Streaming read"): a STOMP message is ACKed only after Spark has
committed the micro-batch holding it, and a driver that dies before that must re-read exactly
the same records for the same ``(start, end]`` offsets when the query restarts (Spark's
``DataSourceStreamReader.partitions`` contract: the same offsets give the same data). The broker
cannot give them back in the same order (it redelivers them, in any order, mixed with new
messages), so the records themselves are kept here.

Layout of one log directory (one per source: ``<checkpoint_location>/sources/mq-sidecar-stomp/
<destination, quoted>``):

- ``batch-<start>-<end>.log``: the records of sequence numbers ``start + 1 .. end``, one file
  per ``latestOffset`` call that took messages. A JSON header line (format, version, start, end,
  count), then per record ``>II`` (meta length, body length), the meta JSON, the body; then a
  ``>I`` CRC-32 of everything before it. Written to a temporary name, fsynced, renamed, and
  the directory fsynced (POSIX ``rename`` is atomic: a crash leaves the old state or the new).
- ``committed.log``: a JSON header line, then one JSON line per commit ``{"end": N, "ids":
  [...]}``: the identities of the messages Spark committed, appended and fsynced before they are
  ACKed, so a redelivery after a crash between Spark's commit and the ACK is recognised. Only
  the newest ``id_cache_size`` identities are kept (rewritten atomically when it holds twice
  that). A torn last line (a crash mid-append) is ignored: its commit is redone by Spark.

A log written by another format version refuses to open (:class:`ReadLogError` naming both
versions), as does a log of another destination.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["FORMAT", "VERSION", "LogRecord", "ReadLog", "ReadLogError"]

#: The format name in every header of the log.
FORMAT = "mq-sidecar-stomp-read-log"
#: The version of the format; a log of another version refuses to open.
VERSION = 1

_LENGTHS = struct.Struct(">II")
_CRC = struct.Struct(">I")
_COMMITTED = "committed.log"
_BATCH_PREFIX = "batch-"
_BATCH_SUFFIX = ".log"


class ReadLogError(RuntimeError):
    """The read log cannot be used: another version or destination, a damaged file, or
    offsets it does not hold (the message says which and what to do)."""


@dataclass(frozen=True)
class LogRecord:
    """One message as a micro-batch read it.

    ``seq``: its sequence number in the log (1-based, contiguous). ``identity``: the id
    redeliveries are recognised by (``id_header``'s value, else ``mq-sidecar-id``, else
    ``message-id``; None when it has none). ``headers``: the MESSAGE's headers but ``ack``.
    ``timestamp_ms``: the broker's ``timestamp`` header (ms since the epoch), None if absent.
    """

    seq: int
    identity: str | None
    destination: str
    message_id: str | None
    duplicate_id: str | None
    headers: Mapping[str, str]
    body: bytes
    timestamp_ms: int | None
    redelivered: bool

    def meta(self) -> bytes:
        """The record but its body, as JSON bytes (the log's encoding)."""
        return json.dumps(
            [
                self.seq,
                self.identity,
                self.destination,
                self.message_id,
                self.duplicate_id,
                dict(self.headers),
                self.timestamp_ms,
                self.redelivered,
            ],
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_meta(cls, meta: bytes, body: bytes) -> LogRecord:
        """The inverse of :meth:`meta`; raises ``ValueError`` on a malformed record."""
        values = json.loads(meta)
        if not isinstance(values, list) or len(values) != 8:
            raise ValueError("malformed record")
        seq, identity, destination, message_id, duplicate_id, headers, ts, redelivered = values
        return cls(
            seq=int(seq),
            identity=identity,
            destination=str(destination),
            message_id=message_id,
            duplicate_id=duplicate_id,
            headers={str(k): str(v) for k, v in dict(headers).items()},
            body=body,
            timestamp_ms=None if ts is None else int(ts),
            redelivered=bool(redelivered),
        )


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` durably: temporary file, fsync, rename, fsync the directory."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    tmp.replace(path)
    _fsync_dir(path.parent)


def _header(**fields: Any) -> bytes:
    return json.dumps({"format": FORMAT, "version": VERSION, **fields}).encode() + b"\n"


def _check_header(path: Path, line: bytes, destination: str) -> dict[str, Any]:
    try:
        header = json.loads(line)
    except ValueError:
        header = None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise ReadLogError(f"{path} is not an mq_sidecar_spark read log (no {FORMAT} header)")
    if header.get("version") != VERSION:
        raise ReadLogError(
            f"{path} was written by read-log format version {header.get('version')!r}; this "
            f"mq_sidecar_spark reads version {VERSION} only. Finish the query with the version "
            "that wrote it, or start the query with a new checkpoint location"
        )
    if header.get("destination") != destination:
        raise ReadLogError(
            f"{path} is the read log of destination {header.get('destination')!r}, not "
            f"{destination!r}: each streaming query needs its own checkpoint location"
        )
    return header


class ReadLog:
    """The read log in ``directory`` (created) for ``destination``.

    ``committed_seq``: the end offset of the last batch Spark committed (0 for a new log);
    ``end_seq``: the last sequence number logged. ``id_cache_size``: how many committed
    identities are remembered (the newest). Raises :class:`ReadLogError` for a log of another
    format version or destination, or a damaged file. Not thread-safe: the driver's stream
    reader calls it from one thread.
    """

    def __init__(self, directory: Path, *, destination: str, id_cache_size: int) -> None:
        self.directory = directory
        self.destination = destination
        self.id_cache_size = id_cache_size
        directory.mkdir(parents=True, exist_ok=True)
        self.committed_seq = 0
        self._committed: OrderedDict[str, None] = OrderedDict()
        self._written_ids = 0  # ids in committed.log, for its compaction
        self._batches: dict[int, int] = {}  # start -> end of every uncommitted batch file
        self._uncommitted: dict[str, int] = {}  # identity -> seq, logged and not committed
        self._load_committed()
        for start, end in sorted(self._scan()):
            if end <= self.committed_seq:
                self._batch_path(start, end).unlink()  # committed before a crash: obsolete
                continue
            self._batches[start] = end
            for record in self._read_batch(start, end):
                if record.identity is not None:
                    self._uncommitted[record.identity] = record.seq
        self.end_seq = max(self._batches.values(), default=self.committed_seq)

    # -- committed identities ---------------------------------------------------------------

    def _load_committed(self) -> None:
        path = self.directory / _COMMITTED
        if not path.exists():
            _write_atomically(path, _header(destination=self.destination))
            return
        lines = path.read_bytes().split(b"\n")
        _check_header(path, lines[0], self.destination)
        body = lines[1:]
        for n, line in enumerate(body):
            if not line:
                continue
            try:
                entry = json.loads(line)
                end, ids = int(entry["end"]), list(entry["ids"])
            except (ValueError, KeyError, TypeError):
                if n == len(body) - 1:
                    # A torn append: that commit did not happen. Cut it off, so that the next
                    # append starts on a line of its own.
                    with path.open("r+b") as out:
                        out.truncate(sum(len(line) + 1 for line in lines[: n + 1]))
                        os.fsync(out.fileno())
                    break
                raise ReadLogError(f"{path}: line {n + 2} is damaged") from None
            self.committed_seq = max(self.committed_seq, end)
            self._remember(ids)
            self._written_ids += len(ids)

    def _remember(self, ids: Iterable[str]) -> None:
        for identity in ids:
            self._committed[identity] = None
            self._committed.move_to_end(identity)
        while len(self._committed) > self.id_cache_size:
            self._committed.popitem(last=False)

    def is_committed(self, identity: str) -> bool:
        """Whether a message of this identity was in a batch Spark committed (among the newest
        ``id_cache_size``)."""
        return identity in self._committed

    def uncommitted_seq(self, identity: str) -> int | None:
        """The sequence number of the logged, uncommitted message of this identity, or None."""
        return self._uncommitted.get(identity)

    # -- batches ----------------------------------------------------------------------------

    def _batch_path(self, start: int, end: int) -> Path:
        return self.directory / f"{_BATCH_PREFIX}{start:012d}-{end:012d}{_BATCH_SUFFIX}"

    def _scan(self) -> Iterator[tuple[int, int]]:
        for path in self.directory.glob(f"{_BATCH_PREFIX}*{_BATCH_SUFFIX}"):
            start, _, end = path.name[len(_BATCH_PREFIX) : -len(_BATCH_SUFFIX)].partition("-")
            try:
                yield int(start), int(end)
            except ValueError:
                raise ReadLogError(f"{path}: not a batch file name of this log") from None

    def append(self, records: list[LogRecord]) -> int:
        """Log ``records`` (their ``seq`` must be ``end_seq + 1 ...``) as one batch, durably
        (fsync before return); return the new ``end_seq``. Raises ``ValueError`` on a gap."""
        start = self.end_seq
        for n, record in enumerate(records, start + 1):
            if record.seq != n:
                raise ValueError(f"record seq {record.seq} where {n} was due")
        end = start + len(records)
        parts = [_header(destination=self.destination, start=start, end=end, count=len(records))]
        for record in records:
            meta = record.meta()
            parts += [_LENGTHS.pack(len(meta), len(record.body)), meta, record.body]
        data = b"".join(parts)
        _write_atomically(self._batch_path(start, end), data + _CRC.pack(zlib.crc32(data)))
        self._batches[start] = end
        for record in records:
            if record.identity is not None:
                self._uncommitted[record.identity] = record.seq
        self.end_seq = end
        return end

    def batch_end_after(self, start: int) -> int | None:
        """The end of the logged batch that starts at ``start``, or None."""
        return self._batches.get(start)

    def _read_batch(self, start: int, end: int) -> list[LogRecord]:
        path = self._batch_path(start, end)
        data = path.read_bytes()
        if (
            len(data) < _CRC.size
            or zlib.crc32(data[: -_CRC.size]) != _CRC.unpack(data[-_CRC.size :])[0]
        ):
            raise ReadLogError(f"{path}: damaged (CRC mismatch)")
        newline = data.index(b"\n")
        header = _check_header(path, data[:newline], self.destination)
        if (header.get("start"), header.get("end")) != (start, end):
            raise ReadLogError(f"{path}: its header names ({header.get('start')}, {header['end']}]")
        records: list[LogRecord] = []
        at, stop = newline + 1, len(data) - _CRC.size
        while at < stop:
            meta_len, body_len = _LENGTHS.unpack_from(data, at)
            at += _LENGTHS.size
            meta = data[at : at + meta_len]
            body = data[at + meta_len : at + meta_len + body_len]
            at += meta_len + body_len
            records.append(LogRecord.from_meta(meta, body))
        if len(records) != end - start:
            raise ReadLogError(f"{path}: {len(records)} records for ({start}, {end}]")
        return records

    def read(self, start: int, end: int) -> list[LogRecord]:
        """The records ``start + 1 .. end``, as they were logged. Raises
        :class:`ReadLogError` when the log does not hold all of them (committed and deleted
        already, or never logged: the checkpoint and this log do not belong together)."""
        if start < self.committed_seq:
            raise ReadLogError(
                f"the query asks for records after {start}, but the read log in "
                f"{self.directory} holds only those after {self.committed_seq} (committed): "
                "checkpoint_location must be the query's own checkpointLocation"
            )
        if end > self.end_seq:
            raise ReadLogError(
                f"the query asks for records up to {end}, but the read log in "
                f"{self.directory} ends at {self.end_seq}: checkpoint_location must be the "
                "query's own checkpointLocation"
            )
        records: list[LogRecord] = []
        for batch_start, batch_end in sorted(self._batches.items()):
            if batch_end <= start or batch_start >= end:
                continue
            records += [r for r in self._read_batch(batch_start, batch_end) if start < r.seq <= end]
        if len(records) != end - start:
            raise ReadLogError(f"the read log holds {len(records)} of records ({start}, {end}]")
        return records

    def commit(self, end: int) -> list[int]:
        """Spark committed everything up to ``end``: store the identities of the records
        ``committed_seq + 1 .. end`` durably (fsync), then delete their batch files; return
        their sequence numbers (the caller ACKs their live deliveries). A no-op for
        ``end <= committed_seq``."""
        if end <= self.committed_seq:
            return []
        done = [(s, e) for s, e in sorted(self._batches.items()) if e <= end]
        seqs = list(range(self.committed_seq + 1, min(end, self.end_seq) + 1))
        ids = [i for i, seq in self._uncommitted.items() if seq <= end]
        line = json.dumps({"end": end, "ids": ids}, separators=(",", ":")).encode() + b"\n"
        path = self.directory / _COMMITTED
        with path.open("ab") as out:
            out.write(line)
            out.flush()
            os.fsync(out.fileno())
        self._written_ids += len(ids)
        self.committed_seq = end
        self._remember(ids)
        for identity in ids:
            del self._uncommitted[identity]
        for start, stop in done:
            self._batch_path(start, stop).unlink(missing_ok=True)
            del self._batches[start]
        if self._written_ids > 2 * self.id_cache_size:
            self._compact()
        return seqs

    def _compact(self) -> None:
        entry = {"end": self.committed_seq, "ids": list(self._committed)}
        data = _header(destination=self.destination) + json.dumps(entry).encode() + b"\n"
        _write_atomically(self.directory / _COMMITTED, data)
        self._written_ids = len(self._committed)
