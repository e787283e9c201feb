"""The consumer side's persisted duplicate-suppression ids, measured (issue 17 part 3):
``.venv/bin/python -m bench.seen``.

Consumer sessions (trio tasks) each "show" bursts of messages as fast as they can and persist
the ``mq-sidecar-id`` of each through the group committer of a real store in a temporary
directory (``--dir`` to choose another), in one of three ways:

- ``trailing`` (what the sidecar does, :class:`proxy.outbox.service.SeenRecorder`): the
  burst's ids are queued and the session goes on at once; the recorder's task writes whatever
  is queued, one commit at a time, so a record trails its MESSAGE by one commit at most. The
  session waits only when :data:`proxy.outbox.service.SEEN_PENDING_MAX` ids are queued
  (back-pressure), so its rate is what the store sustains.
- ``before-show``: the burst waits until its ids are durable (one ``record_seen``, group
  committed with the other sessions') before it is shown.
- ``per-message``: one ``record_seen`` per message, awaited (one fsync per message for a lone
  session: what batching avoids).

Prints, per mode, sessions and burst size: messages per second, commits (fsyncs) per
message, and the wait a burst sees before it can be shown (p50/p99, ms): the latency the
choice adds to the delivery path. A benchmark, never a timed test; about 30 s.
"""

from __future__ import annotations

import argparse
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import trio

from proxy.outbox import GroupCommitter, OutboxStore, open_group_committer
from proxy.outbox.service import SeenRecorder

MODES = ("trailing", "before-show", "per-message")
SESSIONS = (1, 16)
BURSTS = (1, 16, 256)
MAX_BYTES = 1 << 30
HEADER = (
    "| mode | sessions | burst | messages/s | commits per message | wait p50 ms | wait p99 ms |"
)


@dataclass(frozen=True)
class Row:
    """One measured row."""

    mode: str
    sessions: int
    burst: int
    messages: int
    seconds: float
    commits: int
    waits: list[float]

    def line(self) -> str:
        """The row as a Markdown table line."""
        waits = sorted(self.waits) or [0.0]
        p99 = waits[min(len(waits) - 1, int(len(waits) * 0.99))]
        return (
            f"| {self.mode} | {self.sessions} | {self.burst} | "
            f"{self.messages / self.seconds:,.0f} | {self.commits / self.messages:.3f} | "
            f"{statistics.median(waits) * 1000:.2f} | {p99 * 1000:.2f} |"
        )


async def _session(
    mode: str, committer: GroupCommitter, recorder: SeenRecorder, k: int, *, burst: int, end: float
) -> tuple[int, list[float]]:
    destination = f"/queue/bench-{k % 4}"
    shown = 0
    waits: list[float] = []
    while time.perf_counter() < end:
        ids = [f"s{k}-{shown + i}" for i in range(burst)]
        started = time.perf_counter()
        if mode == "trailing":
            await recorder.add((destination, i) for i in ids)
            await trio.lowlevel.checkpoint()  # the relay writes to the app here
        elif mode == "before-show":
            await committer.record_seen(destination, ids)
        else:
            for i in ids:
                await committer.record_seen(destination, [i])
        waits.append(time.perf_counter() - started)
        shown += burst
    return shown, waits


def measure(base: Path, mode: str, sessions: int, burst: int, seconds: float) -> Row:
    """One row: ``sessions`` tasks showing bursts of ``burst`` for ``seconds``."""
    directory = Path(tempfile.mkdtemp(dir=base))

    async def main() -> Row:
        with OutboxStore.open(directory, max_bytes=MAX_BYTES) as store:
            async with open_group_committer(store) as committer:
                recorder = SeenRecorder(committer)
                results: list[tuple[int, list[float]]] = []
                started = time.perf_counter()
                end = started + seconds

                async def one(k: int) -> None:
                    results.append(
                        await _session(mode, committer, recorder, k, burst=burst, end=end)
                    )

                async with trio.open_nursery() as writer:
                    writer.start_soon(recorder.run)
                    async with trio.open_nursery() as nursery:
                        for k in range(sessions):
                            nursery.start_soon(one, k)
                    await recorder.write()  # what is still queued counts too
                    writer.cancel_scope.cancel()
                elapsed = time.perf_counter() - started
                commits = committer.statistics().commits
                shown = sum(n for n, _ in results)
                waits = [w for _, ws in results for w in ws]
                return Row(mode, sessions, burst, shown, elapsed, commits, waits)

    return trio.run(main)


def main(argv: list[str] | None = None) -> int:
    """Run every row and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=None, help="measure this directory's disk")
    parser.add_argument("--seconds", type=float, default=1.5, help="per row (default 1.5)")
    args = parser.parse_args(argv)
    print(f"SQLite {sqlite3.sqlite_version}, Python {platform.python_version()}", file=sys.stderr)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        print(HEADER)
        print("|---|---:|---:|---:|---:|---:|---:|")
        for sessions in SESSIONS:
            for burst in BURSTS:
                for mode in MODES:
                    row = measure(Path(tmp), mode, sessions, burst, args.seconds)
                    print(row.line(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
