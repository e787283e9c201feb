"""The group committer: the daemon side of the outbox, where sessions wait for durability.

Sessions call ``await committer.append(session_key, frames)``; one background task, in the
nursery of :func:`open_group_committer`, takes everything queued at that moment and writes it
in one transaction (:meth:`proxy.outbox.store.OutboxStore.write`, in a worker thread through
``trio.to_thread.run_sync``), then wakes every waiter of it. While one transaction's fsync is
in progress the next requests queue up, so under load one fsync covers many frames and many
sessions (group commit); a request arriving when the writer is idle is committed at once, alone.
Removals (the broker's RECEIPT covered frames) and duplicate-suppression ids take the same
path, so every write shares the same fsyncs and the store is used by one thread at a time.

Bounds: the bytes of appends queued, in flight and stored never exceed ``max_bytes``
(``outbox_max_bytes``): an append that does not fit waits for room (back-pressure: the session
stops reading its app) until the deadline the caller gives, then raises
:class:`~proxy.outbox.errors.OutboxFullTimeout`; one larger than the bound itself raises
:class:`~proxy.outbox.errors.OutboxFull` at once. At most ``max_queued`` requests wait in the
queue (a further one waits for a place), and one transaction takes at most
``max_batch_frames`` frames (a larger single append still goes whole).

Cancellation of a waiter (trio's ``Cancelled`` is always re-raised, never swallowed):

* before the writer took its request, the request leaves the queue and its room is given
  back: nothing of it is written;
* after the writer took it, its transaction runs to its end regardless (shielded; one fsync):
  the frames may be durable, and will then be forwarded, but the waiter never learns their
  ``seq``. A cancelled append must therefore be treated like a SEND whose broker connection
  died before the RECEIPT: maybe stored. The app got no RECEIPT, and a copy it sends again
  carries its own ``mq-sidecar-id``, unless the app set the header itself.
"""

from __future__ import annotations

import math
import sqlite3
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import TypeVar

import trio

from proxy.outbox.errors import (
    OutboxClosed,
    OutboxError,
    OutboxFull,
    OutboxFullTimeout,
    OutboxWriteError,
)
from proxy.outbox.records import (
    Append,
    Expire,
    Expired,
    OutboxDepth,
    OutboxFrame,
    RecordSeen,
    Remove,
    Removed,
    SessionBacklog,
    StoredFrame,
    WriteOp,
    WriteResult,
)
from proxy.outbox.store import OutboxStore

__all__ = ["CommitterStatistics", "GroupCommitter", "open_group_committer"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class CommitterStatistics:
    """Snapshot of a :class:`GroupCommitter` (trio's ``statistics()`` convention).

    Attributes:
        frames, bytes: what the store holds (committed).
        reserved_bytes: bytes stored plus those promised to queued and in-flight appends
            (never above ``max_bytes``).
        max_bytes: ``outbox_max_bytes``.
        queued: requests waiting for the writer; room_waiters: appends waiting for room.
        commits: transactions committed (one fsync each); frames_committed: frames they
            appended; failed_commits: transactions that failed (their waiters got
            :class:`~proxy.outbox.errors.OutboxWriteError`); largest_batch: most requests
            in one transaction.
    """

    frames: int
    bytes: int
    reserved_bytes: int
    max_bytes: int
    queued: int
    room_waiters: int
    commits: int
    frames_committed: int
    failed_commits: int
    largest_batch: int


@dataclass(eq=False, slots=True)
class _Request:
    op: WriteOp
    size: int  # bytes reserved for it (an Append's frame bytes, else 0)
    frames: int
    done: trio.Event = field(default_factory=trio.Event)
    taken: bool = False
    result: WriteResult | None = None
    error: BaseException | None = None


class GroupCommitter:
    """Writes to one :class:`~proxy.outbox.store.OutboxStore` from trio tasks, many requests
    per transaction. Made by :func:`open_group_committer`, which runs its writer task."""

    def __init__(
        self, store: OutboxStore, *, max_queued: int = 1024, max_batch_frames: int = 4096
    ) -> None:
        """Use :func:`open_group_committer`."""
        self.store = store
        self.max_bytes = store.max_bytes
        self.max_batch_frames = max_batch_frames
        self._queue: deque[_Request] = deque()
        self._slots = trio.Semaphore(max_queued)
        self._wakeup = trio.Event()
        self._room = trio.Event()
        self._limiter = trio.CapacityLimiter(1)
        self._reserved = store.bytes
        self._room_waiters = 0
        self._closing = False
        self._commits = self._frames_committed = self._failed = self._largest = 0

    def statistics(self) -> CommitterStatistics:
        """A snapshot of the committer (no I/O)."""
        return CommitterStatistics(
            frames=self.store.frames,
            bytes=self.store.bytes,
            reserved_bytes=self._reserved,
            max_bytes=self.max_bytes,
            queued=len(self._queue),
            room_waiters=self._room_waiters,
            commits=self._commits,
            frames_committed=self._frames_committed,
            failed_commits=self._failed,
            largest_batch=self._largest,
        )

    # -- writes ------------------------------------------------------------------------------

    async def append(
        self, session_key: str, frames: Iterable[OutboxFrame], *, deadline: float = math.inf
    ) -> tuple[StoredFrame, ...]:
        """Store ``frames`` for ``session_key``, all or none, and return them as stored once
        durable (fsynced). The SENDs of one STOMP transaction are one call (at COMMIT).

        Args:
            session_key: the stable id the sidecar gave the app session.
            frames: the frames, in the session's order.
            deadline: how long to wait for room under ``max_bytes`` at most, as a
                ``trio.current_time()`` value (the session passes now + ``call_timeout``).
                Only the wait for room is bounded by it, so that its expiry raises the error
                naming ``outbox_max_bytes``; bound the whole call with a cancel scope.

        Raises:
            OutboxFull: the frames are more bytes than ``max_bytes`` by themselves.
            OutboxFullTimeout: no room came before ``deadline``.
            OutboxWriteError: the transaction failed; nothing of it was stored.
            OutboxClosed: the committer is closing.
        """
        op = Append(session_key, tuple(frames))
        size = op.size
        if size > self.max_bytes:
            raise OutboxFull(size, self._reserved, self.max_bytes)
        await self._reserve(size, deadline)
        result = await self._submit(_Request(op, size, len(op.frames)))
        assert isinstance(result, tuple)
        return result

    async def remove(self, session_key: str, first_seq: int, last_seq: int) -> Removed:
        """Remove ``session_key``'s frames with ``first_seq <= seq <= last_seq`` (the
        broker's RECEIPT covered them), with the next transaction; their room goes to waiting
        appends. Raises OutboxWriteError, OutboxClosed."""
        result = await self._submit(_Request(Remove(session_key, first_seq, last_seq), 0, 0))
        assert isinstance(result, Removed)
        return result

    async def expire(self, max_age: float, limit: int) -> Expired:
        """Remove up to ``limit`` frames stored more than ``max_age`` seconds ago that no
        reader was handed (:class:`~proxy.outbox.records.Expire`), with the next transaction;
        their room goes to waiting appends. Raises OutboxWriteError, OutboxClosed."""
        result = await self._submit(_Request(Expire(max_age, limit), 0, 0))
        assert isinstance(result, Expired)
        return result

    async def record_seen(self, destination: str, sidecar_ids: Iterable[str]) -> int:
        """Remember ``sidecar_ids`` as seen on ``destination`` (consumer-side duplicate
        suppression), durable when this returns. Raises OutboxWriteError, OutboxClosed."""
        result = await self._submit(_Request(RecordSeen(destination, tuple(sidecar_ids)), 0, 0))
        assert isinstance(result, int)
        return result

    async def wait_freed(self) -> None:
        """Wait until frames leave the outbox (a removal, an expiry) or the committer
        closes; read :meth:`statistics` then."""
        await self._room.wait()

    async def _reserve(self, size: int, deadline: float) -> None:
        started = trio.current_time()
        while self._reserved + size > self.max_bytes:
            if self._closing:
                raise OutboxClosed("the outbox is closing")
            self._room_waiters += 1
            try:
                with trio.move_on_at(deadline) as scope:
                    await self._room.wait()
            finally:
                self._room_waiters -= 1
            if scope.cancelled_caught:
                waited = trio.current_time() - started
                raise OutboxFullTimeout(size, self._reserved, self.max_bytes, waited)
        self._reserved += size

    def _release(self, size: int) -> None:
        if size:
            self._reserved -= size
            self._room.set()
            self._room = trio.Event()

    async def _submit(self, request: _Request) -> WriteResult:
        try:
            if self._closing:
                raise OutboxClosed("the outbox is closing")
            async with self._slots:
                self._queue.append(request)
                self._wakeup.set()
                try:
                    await request.done.wait()
                except BaseException:
                    if not request.taken:
                        self._queue.remove(request)
                    raise
        except BaseException:
            if not request.taken:
                self._release(request.size)
            raise
        if request.error is not None:
            if isinstance(request.error, OutboxError):
                raise request.error
            raise OutboxWriteError(f"outbox write failed: {request.error}") from request.error
        assert request.result is not None
        return request.result

    # -- the writer --------------------------------------------------------------------------

    def _take(self) -> list[_Request]:
        batch = [self._queue.popleft()]
        frames = batch[0].frames
        while self._queue and frames + self._queue[0].frames <= self.max_batch_frames:
            request = self._queue.popleft()
            frames += request.frames
            batch.append(request)
        for request in batch:
            request.taken = True
        return batch

    async def _commit(self, batch: list[_Request]) -> None:
        ops = [r.op for r in batch]
        try:
            with trio.CancelScope(shield=True):  # the transaction ends either way: report it
                results = await trio.to_thread.run_sync(
                    self.store.write, ops, limiter=self._limiter
                )
        except (sqlite3.Error, OSError, OutboxError) as exc:
            self._failed += 1
            for r in batch:
                r.error = exc
                self._release(r.size)
                r.done.set()
            return
        self._commits += 1
        self._largest = max(self._largest, len(batch))
        freed = 0
        for r, result in zip(batch, results, strict=True):
            r.result = result
            if isinstance(result, Removed | Expired):
                freed += result.bytes
            else:
                self._frames_committed += r.frames
            r.done.set()
        self._release(freed)

    async def _run(self) -> None:
        try:
            while self._queue or not self._closing:
                if not self._queue:
                    await self._wakeup.wait()
                    self._wakeup = trio.Event()
                    continue
                await self._commit(self._take())
        finally:
            self._closing = True
            self._room.set()
            while self._queue:  # only when cancelled or crashed: no waiter is left hanging
                request = self._queue.popleft()
                request.taken = True
                self._release(request.size)
                request.error = OutboxClosed("the outbox closed before this was written")
                request.done.set()

    def _close(self) -> None:
        self._closing = True
        self._wakeup.set()
        self._room.set()

    # -- reads (in the worker thread, after any transaction in progress) ---------------------

    async def _read(self, fn: Callable[[], T]) -> T:
        return await trio.to_thread.run_sync(fn, limiter=self._limiter)

    async def close_store(self) -> None:
        """Close the store in the committer's worker slot, after the read or write in
        progress: a read of a session that is still ending runs in its own thread, and a
        connection closed under it from another thread crashes the process (sqlite3 objects
        are not safe to close while in use; seen as a segmentation fault). Reads after it
        raise :class:`OutboxError` (closed). Shielded: the store closes either way."""
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(self.store.close, limiter=self._limiter)

    async def pending(
        self, session_key: str, *, after_seq: int = 0, limit: int = 1000
    ) -> tuple[StoredFrame, ...]:
        """:meth:`OutboxStore.pending <proxy.outbox.store.OutboxStore.pending>`, off the
        trio thread."""
        return await self._read(
            partial(self.store.pending, session_key, after_seq=after_seq, limit=limit)
        )

    async def backlog(self) -> tuple[SessionBacklog, ...]:
        """:meth:`OutboxStore.backlog <proxy.outbox.store.OutboxStore.backlog>`."""
        return await self._read(self.store.backlog)

    async def count(self, session_key: str) -> int:
        """:meth:`OutboxStore.count <proxy.outbox.store.OutboxStore.count>`."""
        return await self._read(partial(self.store.count, session_key))

    async def depth(self) -> OutboxDepth:
        """:meth:`OutboxStore.depth <proxy.outbox.store.OutboxStore.depth>`."""
        return await self._read(self.store.depth)

    async def seen_ids(self, destination: str) -> tuple[str, ...]:
        """:meth:`OutboxStore.seen_ids <proxy.outbox.store.OutboxStore.seen_ids>`."""
        return await self._read(partial(self.store.seen_ids, destination))


@asynccontextmanager
async def open_group_committer(
    store: OutboxStore, *, max_queued: int = 1024, max_batch_frames: int = 4096
) -> AsyncIterator[GroupCommitter]:
    """Run a :class:`GroupCommitter` over ``store`` for the body of the ``async with``.

    Its writer task lives in this context's nursery. Leaving the context stops new requests
    (:class:`~proxy.outbox.errors.OutboxClosed`), writes what is queued, then ends the
    writer; the store stays open (its owner closes it). ``max_queued``: requests waiting at
    most; ``max_batch_frames``: frames per transaction at most.
    """
    committer = GroupCommitter(store, max_queued=max_queued, max_batch_frames=max_batch_frames)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(committer._run)
        try:
            yield committer
        finally:
            committer._close()
