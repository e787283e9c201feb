"""The outbox's durable store, measured: ``.venv/bin/python -m bench.outbox``.

In one run, on the disk of a temporary directory (``--dir`` to choose another, e.g. the one an
``outbox_dir`` will live on), with frames of 1 KiB:

1. **Batches**: appends per second and the latency of one durable write (p50/p99, ms) for
   batches of 1, 8, 64 and 512 frames, each batch one fsync: the SQLite store
   (:class:`proxy.outbox.OutboxStore`, WAL, ``synchronous=FULL``) against the floor, a plain
   append-only file (length + CRC32 + bytes per frame) with ``os.fsync`` per batch, and the
   same with ``os.fdatasync`` (what SQLite calls on Linux). The fsync cost per frame is a
   batch's latency divided by its frames. The three stores take turns in ``--rounds`` slices,
   so that a slow spell of a shared disk falls on all of them alike.
2. **Group commit**: 1 to 256 trio tasks (sessions) each appending one frame at a time through
   :class:`proxy.outbox.GroupCommitter`: appends per second, the latency each caller waits for
   durability (p50/p99), frames per fsync, and the wall time per frame.
3. **Disk bytes per frame**: 10,000 frames stored, the database's files (db + wal) divided by
   frames, while open and after the closing checkpoint, against the plain file.

Everything is written under a temporary directory that is removed at the end. Prints a table
(Markdown, for docs/outbox.md). About 40 s with the default ``--seconds 2``. A benchmark, never
a timed test.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import struct
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import trio

from proxy.outbox import OutboxFrame, OutboxStore, open_group_committer

FRAME_BYTES = 1024
BATCHES = (1, 8, 64, 512)
SESSIONS = (1, 16, 64, 256)
DISK_FRAMES = 10_000
MAX_BYTES = 1 << 34  # no bound in the way of a benchmark


def make_frame(n: int) -> OutboxFrame:
    """A SEND of exactly FRAME_BYTES bytes."""
    head = f"SEND\ndestination:/queue/bench\nmq-sidecar-id:b-{n}\n\n".encode()
    return OutboxFrame(
        f"b-{n}", "/queue/bench", head + b"x" * (FRAME_BYTES - len(head) - 1) + b"\0"
    )


@dataclass(frozen=True)
class Result:
    """One measured row: frames/s, latency of one durable write (ms), and per-frame cost."""

    store: str
    batch: int
    frames: int
    seconds: float
    latencies: list[float]  # seconds per durable write

    @property
    def rate(self) -> float:
        return self.frames / self.seconds

    def ms(self, q: float) -> float:
        """The q-quantile latency in ms."""
        ordered = sorted(self.latencies)
        return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    @property
    def per_frame_us(self) -> float:
        """Mean write latency per frame, µs (the fsync cost each frame pays)."""
        return 1e6 * statistics.fmean(self.latencies) / self.batch


def timed_loop(write: Callable[[list[OutboxFrame]], object], batch: int, seconds: float) -> Result:
    """Call ``write`` with batches of ``batch`` frames for ``seconds`` (at least 5 batches,
    at most 100,000)."""
    latencies: list[float] = []
    n = 0
    start = time.perf_counter()
    end = start + seconds
    for _ in range(100_000):
        frames = [make_frame(n + i) for i in range(batch)]
        t0 = time.perf_counter()
        write(frames)
        t1 = time.perf_counter()
        latencies.append(t1 - t0)
        n += batch
        if t1 >= end and len(latencies) >= 5:
            break
    return Result("", batch, n, time.perf_counter() - start, latencies)


class SqliteRunner:
    """The SQLite store, open for every round of one batch size."""

    name = "SQLite WAL, synchronous=FULL"

    def __init__(self, base: Path, batch: int) -> None:
        self.store = OutboxStore.open(base / f"sqlite-{batch}", max_bytes=MAX_BYTES)

    def write(self, frames: list[OutboxFrame]) -> None:
        self.store.append("s", frames)

    def close(self) -> None:
        self.store.close()


class FileRunner:
    """The floor: an append-only file, one ``os.write`` and one ``sync`` per batch."""

    def __init__(self, base: Path, batch: int, sync: Callable[[int], None]) -> None:
        self.name = f"append-only file + os.{sync.__name__}"
        self.sync = sync
        path = base / f"file-{sync.__name__}-{batch}.log"
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, frames: list[OutboxFrame]) -> None:
        os.write(self.fd, b"".join(_record(f.frame) for f in frames))
        self.sync(self.fd)

    def close(self) -> None:
        os.close(self.fd)


def bench_batches(base: Path, seconds: float, rounds: int) -> list[Result]:
    """Every store for every batch size, the stores interleaved in ``rounds`` slices of
    ``seconds / rounds`` each, so that a slow spell of a shared disk falls on all of them."""
    out: list[Result] = []
    for batch in BATCHES:
        runners: list[SqliteRunner | FileRunner] = [
            SqliteRunner(base, batch),
            FileRunner(base, batch, os.fsync),
            FileRunner(base, batch, os.fdatasync),
        ]
        parts: list[list[Result]] = [[] for _ in runners]
        try:
            for _ in range(rounds):
                for runner, part in zip(runners, parts, strict=True):
                    part.append(timed_loop(runner.write, batch, seconds / rounds))
        finally:
            for runner in runners:
                runner.close()
        for runner, part in zip(runners, parts, strict=True):
            out.append(
                Result(
                    runner.name,
                    batch,
                    sum(r.frames for r in part),
                    sum(r.seconds for r in part),
                    [x for r in part for x in r.latencies],
                )
            )
    return out


def _record(data: bytes) -> bytes:
    return struct.pack(">II", len(data), zlib.crc32(data)) + data


@dataclass(frozen=True)
class GroupResult:
    """Group commit through the committer with ``sessions`` concurrent appenders."""

    sessions: int
    frames: int
    commits: int
    seconds: float
    latencies: list[float]

    def ms(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def bench_group(base: Path, sessions: int, seconds: float) -> GroupResult:
    directory = base / f"group-{sessions}"
    latencies: list[float] = []

    async def main() -> GroupResult:
        with OutboxStore.open(directory, max_bytes=MAX_BYTES) as store:
            async with open_group_committer(store) as committer:
                end = trio.current_time() + seconds
                start = time.perf_counter()

                async def session(k: int) -> None:
                    for n in range(1_000_000):  # bounded; the deadline ends it first
                        t0 = time.perf_counter()
                        await committer.append(f"s{k}", [make_frame(n)])
                        latencies.append(time.perf_counter() - t0)
                        if trio.current_time() >= end:
                            return

                async with trio.open_nursery() as nursery:
                    for k in range(sessions):
                        nursery.start_soon(session, k)
                elapsed = time.perf_counter() - start
                stats = committer.statistics()
        return GroupResult(sessions, stats.frames_committed, stats.commits, elapsed, latencies)

    return trio.run(main)


@dataclass(frozen=True)
class DiskResult:
    frames: int
    open_bytes: int  # db + wal (+ shm) while open, before the closing checkpoint
    closed_bytes: int  # db alone after close (checkpointed; the WAL removed)
    file_bytes: int


def bench_disk(base: Path) -> DiskResult:
    directory = base / "disk"
    frames = [make_frame(n) for n in range(DISK_FRAMES)]
    store = OutboxStore.open(directory, max_bytes=MAX_BYTES)
    try:
        for i in range(0, DISK_FRAMES, 64):
            store.append(f"s{i % 7}", frames[i : i + 64])
        open_bytes = sum(p.stat().st_size for p in store.files if not p.name.endswith("-shm"))
    finally:
        store.close()
    closed = sum(p.stat().st_size for p in directory.glob("outbox.db*"))
    file_bytes = sum(len(_record(f.frame)) for f in frames)
    return DiskResult(DISK_FRAMES, open_bytes, closed, file_bytes)


def filesystem(path: Path) -> str:
    """The filesystem type and device ``path`` is on (from /proc/mounts), for the report."""
    best = ("", "?", "?")
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            device, mount, fstype, *_ = line.split()
            if str(path.resolve()).startswith(mount) and len(mount) > len(best[0]):
                best = (mount, fstype, device)
    except OSError:
        pass
    return f"{best[1]} on {best[2]}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.outbox", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--seconds", type=float, default=2.0, help="per measured row (default 2)")
    parser.add_argument(
        "--rounds", type=int, default=4, help="interleaved slices per row (default 4)"
    )
    parser.add_argument(
        "--dir", type=Path, default=None, help="where to write (default: a tmp dir)"
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-outbox-", dir=args.dir) as tmp:
        base = Path(tmp)
        print(
            f"# bench.outbox: {FRAME_BYTES} B frames, {args.seconds} s per row in "
            f"{args.rounds} interleaved rounds, "
            f"{filesystem(base)}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
            f"SQLite {__import__('sqlite3').sqlite_version}\n"
        )
        rows = bench_batches(base, args.seconds, args.rounds)
        print("## Batches: one durable write (one fsync) per batch\n")
        print("| store | frames/batch | frames/s | write p50 ms | write p99 ms | µs per frame |")
        print("|---|---:|---:|---:|---:|---:|")
        for r in rows:
            print(
                f"| {r.store} | {r.batch} | {r.rate:,.0f} | {r.ms(0.5):.2f} | {r.ms(0.99):.2f} "
                f"| {r.per_frame_us:,.1f} |"
            )
        print("\n## SQLite over the floor (same batch size)\n")
        print("| frames/batch | SQLite / file+fsync (rate) | SQLite / file+fdatasync (rate) |")
        print("|---:|---:|---:|")
        for i, batch in enumerate(BATCHES):
            sq, fs, fd = rows[3 * i : 3 * i + 3]
            print(f"| {batch} | {sq.rate / fs.rate:.2f} | {sq.rate / fd.rate:.2f} |")
        print("\n## Group commit: sessions appending one frame at a time through the committer\n")
        print(
            "| sessions | appends/s | wait p50 ms | wait p99 ms | frames per fsync | µs per frame |"
        )
        print("|---:|---:|---:|---:|---:|---:|")
        groups: dict[int, list[GroupResult]] = {n: [] for n in SESSIONS}
        for _ in range(args.rounds):
            for sessions in SESSIONS:
                groups[sessions].append(bench_group(base, sessions, args.seconds / args.rounds))
        for sessions, parts in groups.items():
            g = GroupResult(
                sessions,
                sum(p.frames for p in parts),
                sum(p.commits for p in parts),
                sum(p.seconds for p in parts),
                [x for p in parts for x in p.latencies],
            )
            print(
                f"| {g.sessions} | {g.frames / g.seconds:,.0f} | {g.ms(0.5):.2f} | "
                f"{g.ms(0.99):.2f} | {g.frames / max(1, g.commits):.1f} | "
                f"{1e6 * g.seconds / max(1, g.frames):,.1f} |"
            )
        d = bench_disk(base)
        print(f"\n## Disk bytes per stored frame ({d.frames:,} frames of {FRAME_BYTES} B)\n")
        print("| files | bytes per frame |")
        print("|---|---:|")
        print(f"| outbox.db + -wal, open (before closing) | {d.open_bytes / d.frames:,.0f} |")
        print(f"| outbox.db after close (checkpointed) | {d.closed_bytes / d.frames:,.0f} |")
        print(f"| append-only file (8 B header per frame) | {d.file_bytes / d.frames:,.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
