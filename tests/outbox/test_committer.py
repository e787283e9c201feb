"""GroupCommitter: one transaction for everything queued, back-pressure under the byte bound
with the caller's deadline, cancellation before and after the writer took a request, a failed
transaction, closing.

The store is real (SQLite in tmp_path). To hold a transaction "in progress" deterministically,
the store's ``write`` is wrapped in a gate the test opens (:class:`Gate`); timing runs on
trio's autojump clock only where no thread is in flight."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest
import trio
import trio.testing

from proxy.outbox import (
    OutboxClosed,
    OutboxError,
    OutboxFull,
    OutboxFullTimeout,
    OutboxStore,
    OutboxWriteError,
    open_group_committer,
)
from proxy.outbox.records import WriteOp, WriteResult
from tests.outbox.helpers import frame

ONE = len(frame(0).frame)
GUARD = 10.0  # seconds: a bound on every test that waits on a thread (never reached)


class Gate:
    """Wraps ``store.write``: the first call waits until :meth:`open` (in its worker thread);
    every call's op count is recorded in ``calls``."""

    def __init__(self, store: OutboxStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[int] = []
        self._entered = threading.Event()
        self._open = threading.Event()
        self._write = store.write
        monkeypatch.setattr(store, "write", self.write)

    def write(self, ops: Sequence[WriteOp]) -> list[WriteResult]:
        self.calls.append(len(ops))
        if len(self.calls) == 1:
            self._entered.set()
            self._open.wait(GUARD)
        return self._write(ops)

    async def entered(self) -> None:
        """Wait until the first write is in progress (in its thread)."""
        assert await trio.to_thread.run_sync(self._entered.wait, GUARD)

    def open(self) -> None:
        self._open.set()


async def test_concurrent_appends_share_one_transaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with trio.fail_after(GUARD), OutboxStore.open(tmp_path, max_bytes=1 << 20) as store:
        gate = Gate(store, monkeypatch)
        stored: dict[int, int] = {}
        async with open_group_committer(store) as committer, trio.open_nursery() as nursery:

            async def send(i: int) -> None:
                (f,) = await committer.append(f"s{i}", [frame(i)])
                stored[i] = f.seq

            nursery.start_soon(send, 0)
            await gate.entered()  # one transaction in progress (its fsync)...
            for i in range(1, 50):
                nursery.start_soon(send, i)
            await trio.testing.wait_all_tasks_blocked()
            assert committer.statistics().queued == 49  # ...the other 49 queue behind it
            gate.open()
        stats = committer.statistics()
        assert gate.calls == [1, 49]  # 50 appends, 2 transactions, 2 fsyncs
        assert (stats.commits, stats.frames_committed, stats.frames) == (2, 50, 50)
        assert sorted(stored.values()) == list(range(1, 51))


async def test_a_full_outbox_makes_the_caller_wait_until_its_deadline(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    with OutboxStore.open(tmp_path, max_bytes=3 * ONE) as store:
        async with open_group_committer(store) as committer:
            await committer.append("a", [frame(1), frame(2), frame(3)])
            start = trio.current_time()
            with pytest.raises(OutboxFullTimeout, match="outbox_max_bytes") as caught:
                await committer.append("b", [frame(4)], deadline=start + 5.0)
            assert trio.current_time() - start == 5.0
            assert caught.value.waited == 5.0
            stats = committer.statistics()
            assert (stats.reserved_bytes, stats.room_waiters, stats.frames) == (3 * ONE, 0, 3)


async def test_a_removal_makes_room_for_a_waiting_append(tmp_path: Path) -> None:
    with trio.fail_after(GUARD), OutboxStore.open(tmp_path, max_bytes=2 * ONE) as store:
        async with open_group_committer(store) as committer, trio.open_nursery() as nursery:
            (first, _) = await committer.append("a", [frame(1), frame(2)])
            done = trio.Event()

            async def waiting() -> None:
                await committer.append("b", [frame(3)])
                done.set()

            nursery.start_soon(waiting)
            await trio.testing.wait_all_tasks_blocked()
            assert committer.statistics().room_waiters == 1
            assert not done.is_set()
            removed = await committer.remove("a", first.seq, first.seq)
            assert removed.frames == 1
            await done.wait()
        assert [f.sidecar_id for f in store.pending("b")] == ["id-3"]


async def test_an_append_larger_than_the_bound_fails_at_once(tmp_path: Path) -> None:
    with OutboxStore.open(tmp_path, max_bytes=ONE) as store:
        async with open_group_committer(store) as committer:
            with pytest.raises(OutboxFull, match="can never be stored") as caught:
                await committer.append("a", [frame(1), frame(2)])
            assert not isinstance(caught.value, OutboxFullTimeout)
            assert committer.statistics().reserved_bytes == 0


async def test_a_request_cancelled_before_the_writer_took_it_is_not_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with trio.fail_after(GUARD), OutboxStore.open(tmp_path, max_bytes=1 << 20) as store:
        gate = Gate(store, monkeypatch)
        async with open_group_committer(store) as committer, trio.open_nursery() as nursery:
            nursery.start_soon(committer.append, "a", [frame(1)])
            await gate.entered()
            scope = trio.CancelScope()

            async def cancelled_append() -> None:
                with scope:
                    await committer.append("b", [frame(2)])

            nursery.start_soon(cancelled_append)
            await trio.testing.wait_all_tasks_blocked()
            assert committer.statistics().queued == 1
            scope.cancel()
            await trio.testing.wait_all_tasks_blocked()
            stats = committer.statistics()
            assert (stats.queued, stats.reserved_bytes) == (0, ONE)  # its room given back
            gate.open()
        assert scope.cancelled_caught
        assert [b.session_key for b in store.backlog()] == ["a"]
        assert gate.calls == [1]


async def test_a_request_cancelled_after_the_writer_took_it_is_still_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with trio.fail_after(GUARD), OutboxStore.open(tmp_path, max_bytes=1 << 20) as store:
        gate = Gate(store, monkeypatch)
        scope = trio.CancelScope()
        async with open_group_committer(store) as committer:

            async def cancelled_append() -> None:
                with scope:
                    await committer.append("a", [frame(1)])

            async with trio.open_nursery() as nursery:
                nursery.start_soon(cancelled_append)
                await gate.entered()
                scope.cancel()  # the waiter leaves at once (Cancelled is not swallowed)...
            assert scope.cancelled_caught
            gate.open()
            depth = await committer.depth()  # ...and the transaction ends all the same
        assert depth.frames == 1
        assert committer.statistics().commits == 1


async def test_a_failed_transaction_fails_its_waiters_and_the_next_one_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with trio.fail_after(GUARD), OutboxStore.open(tmp_path, max_bytes=1 << 20) as store:
        real = store.write
        failures = [sqlite3.OperationalError("disk I/O error")]

        def failing(ops: Sequence[WriteOp]) -> list[WriteResult]:
            if failures:
                raise failures.pop()
            return real(ops)

        monkeypatch.setattr(store, "write", failing)
        async with open_group_committer(store) as committer:
            with pytest.raises(OutboxWriteError, match="disk I/O error") as caught:
                await committer.append("a", [frame(1)])
            assert isinstance(caught.value.__cause__, sqlite3.OperationalError)
            stats = committer.statistics()
            assert (stats.failed_commits, stats.reserved_bytes, stats.frames) == (1, 0, 0)
            await committer.append("a", [frame(2)])
        assert [f.sidecar_id for f in store.pending("a")] == ["id-2"]


async def test_closing_writes_what_is_queued_then_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with trio.fail_after(GUARD), OutboxStore.open(tmp_path, max_bytes=2 * ONE) as store:
        gate = Gate(store, monkeypatch)
        outcomes: list[str] = []
        async with trio.open_nursery() as nursery, open_group_committer(store) as committer:

            async def append(n: int) -> None:
                try:
                    await committer.append("a", [frame(n)])
                    outcomes.append(f"stored {n}")
                except OutboxClosed:
                    outcomes.append(f"closed {n}")

            nursery.start_soon(append, 1)
            await gate.entered()
            nursery.start_soon(append, 2)  # queued behind the gate
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(append, 3)  # no room: waits for it
            await trio.testing.wait_all_tasks_blocked()
            assert committer.statistics().room_waiters == 1
            gate.open()
        assert sorted(outcomes) == ["closed 3", "stored 1", "stored 2"]
        with pytest.raises(OutboxClosed):
            await committer.append("a", [frame(4)])


async def test_seen_ids_and_reads_go_through_the_committer(tmp_path: Path) -> None:
    with trio.fail_after(GUARD), OutboxStore.open(tmp_path, max_bytes=1 << 20) as store:
        async with open_group_committer(store) as committer:
            assert await committer.record_seen("/queue/a", ["x", "y"]) == 2
            await committer.append("s", [frame(1), frame(2)])
            assert await committer.seen_ids("/queue/a") == ("x", "y")
            assert [f.sidecar_id for f in await committer.pending("s", after_seq=1)] == ["id-2"]
            assert [b.frames for b in await committer.backlog()] == [2]
            assert (await committer.depth()).bytes == 2 * ONE


async def test_the_store_closes_only_after_the_read_in_progress(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session still ending may be reading in its worker thread when the sidecar closes the
    outbox: the close waits for that read (closing the connection under it crashed the
    process with a segmentation fault in CI), and a read after it raises OutboxError (closed),
    never a crash."""
    entered, release = threading.Event(), threading.Event()
    with trio.fail_after(GUARD), OutboxStore.open(tmp_path, max_bytes=1 << 20) as store:
        pending = store.pending

        def slow_pending(key: str, *, after_seq: int = 0, limit: int = 1000) -> object:
            entered.set()
            release.wait(GUARD)
            return pending(key, after_seq=after_seq, limit=limit)

        monkeypatch.setattr(store, "pending", slow_pending)
        order: list[str] = []
        async with open_group_committer(store) as committer:
            await committer.append("s", [frame(1)])

            async def read() -> None:
                frames = await committer.pending("s")
                order.append(f"read {len(frames)}")

            async def close() -> None:
                await committer.close_store()
                order.append("closed")

            async with trio.open_nursery() as nursery:
                nursery.start_soon(read)
                assert await trio.to_thread.run_sync(entered.wait, GUARD)
                nursery.start_soon(close)
                await trio.testing.wait_all_tasks_blocked()
                assert order == []  # the close waits for the worker slot
                release.set()
        assert order == ["read 1", "closed"]
        with pytest.raises(OutboxError):
            store.pending("s")
