"""The sidecar's outbox at work (issue 17, docs/outbox.md): the store opened at start, its group
committer, and what the sessions share of it.

:func:`open_outbox` is entered by :meth:`proxy.app.Sidecar.serve` before it listens, when the
``outbox`` option is on: it locks and opens ``outbox_dir`` (:meth:`OutboxStore.open
<proxy.outbox.store.OutboxStore.open>`, in a worker thread: recovery reads the whole WAL), logs
the recovery report, and runs the :class:`~proxy.outbox.GroupCommitter` (its writer task) and
a depth watch in nurseries of its own for as long as the sidecar runs. A directory that cannot
be used raises :class:`~proxy._errors.OutboxUnusable` with one line saying why (``mq-sidecar
run`` exits 1 with it).

Each session's part (storing its app's SENDs, forwarding them) is
:class:`proxy.session.outbox.SessionOutbox`; this module holds what they share: the destination
patterns, the committer, a wake-up per session key, the forwarded counter, the cached depth
for ``/status`` and the gauges.
"""

from __future__ import annotations

import fnmatch
import logging
import sqlite3
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import trio

from config import Config
from proxy._errors import OutboxUnusable
from proxy.outbox import (
    GroupCommitter,
    OutboxDepth,
    OutboxError,
    OutboxStore,
    RecoveryReport,
    StoredFrame,
    open_group_committer,
)
from proxy.telemetry.metrics import Metrics
from proxy.telemetry.statistics import ForwarderStatistics, OutboxStatistics
from proxy.telemetry.vocabulary import FrameOutcome
from proxy.tracking import SessionState

__all__ = [
    "DEPTH_REFRESH",
    "EXPIRE_BATCH",
    "SEEN_PENDING_MAX",
    "ExpiryListener",
    "OutboxService",
    "SeenRecorder",
    "forward_before_exit",
    "open_outbox",
]

log = logging.getLogger("mq_sidecar.outbox")

#: Seconds between reads of the outbox's depth (oldest frame's age, sessions) for ``/status``
#: and the gauges; frames and bytes are the store's own counters, always current.
DEPTH_REFRESH = 1.0
#: Consumer-side duplicate-suppression ids waiting for their commit, at most (summed over
#: destinations): past it, handing more waits for the writer (back-pressure on the session's
#: relay). One burst of a session holds at most ``max_unacked`` of them.
SEEN_PENDING_MAX = 65_536
#: Frames one ``outbox_max_age`` sweep removes at most (one transaction); a full sweep is
#: followed by the next at once.
EXPIRE_BATCH = 4096
#: Expired frames a log line names by ``mq-sidecar-id`` at most (the count says the rest).
_EXPIRED_NAMED = 20

#: Called with the frames of one session key that expired (:meth:`OutboxService.on_expiry`).
ExpiryListener = Callable[[Sequence[StoredFrame]], None]


class SeenRecorder:
    """Persists the ``mq-sidecar-id`` s of the messages the apps settled on queue subscriptions
    (issue 17 part 3, docs/behaviour.md "Duplicate detection"), so that a copy arriving after a
    restart of this sidecar is hidden: :meth:`add` queues ``(destination, id)`` pairs and
    returns at once; :meth:`run`, a task of :func:`open_outbox`'s nursery, writes everything
    queued at that moment through the group committer, one ``record_seen`` per destination,
    submitted together so that they share one transaction (one fsync) with each other and with
    the appends of that moment. So a record trails the MESSAGE (or the app's ACK) by one commit
    at most, and a burst of N messages costs one fsync, not N.

    Args:
        committer: the running group committer.

    Attributes:
        recorded: ids written since start. commits: the batches written. failed: ids a
        write error lost (logged; the in-memory sets still hide duplicates until a restart).
    """

    def __init__(self, committer: GroupCommitter) -> None:
        self.committer = committer
        self._pending: dict[str, list[str]] = {}
        self._count = 0
        self._wake = trio.Event()
        self._room = trio.Event()
        self.recorded = 0
        self.commits = 0
        self.failed = 0

    async def add(self, pairs: Iterable[tuple[str, str]]) -> None:
        """Queue ``(destination, mq-sidecar-id)`` pairs for the next commit; waits only while
        :data:`SEEN_PENDING_MAX` ids are queued already."""
        while self._count >= SEEN_PENDING_MAX:
            await self._room.wait()
        pending = self._pending
        for destination, sidecar_id in pairs:
            pending.setdefault(destination, []).append(sidecar_id)
            self._count += 1
        if self._count:
            self._wake.set()

    def queued_ids(self, destination: str) -> tuple[str, ...]:
        """The ids of ``destination`` queued and not yet taken by the writer (a SUBSCRIBE
        seeds from the store and these)."""
        return tuple(self._pending.get(destination, ()))

    async def seed(self, state: SessionState, upstream_id: str, *, now: float) -> int:
        """Seed the seen ids of ``state`` 's subscription ``upstream_id``, when it persists
        them (a queue, :attr:`Subscription.persist_seen
        <proxy.tracking.Subscription.persist_seen>`), from those persisted for its destination
        and those still queued here; called before its SUBSCRIBE goes upstream, so a copy of
        a message an app settled before a restart of this sidecar is hidden as a duplicate.
        ``now``: trio's clock (the in-memory age bound). A read error is logged, and the
        subscription starts with no ids, as without the outbox. Returns the number seeded."""
        sub = state.subscriptions.get(upstream_id)
        if sub is None or not sub.persist_seen:
            return 0
        try:
            stored = await self.committer.seen_ids(sub.destination)
        except (OutboxError, sqlite3.Error) as exc:
            log.warning("outbox: persisted seen ids of %s not read: %s", sub.destination, exc)
            stored = ()
        ids = (*stored, *self.queued_ids(sub.destination))
        return state.seed_seen(upstream_id, ids, now)

    async def run(self) -> None:
        """Write what is queued, batch after batch, until cancelled."""
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            await self.write()

    async def write(self) -> None:
        """Write everything queued now (one commit); errors are logged, never raised."""
        batch, self._pending, self._count = self._pending, {}, 0
        self._room.set()
        self._room = trio.Event()
        if batch:
            async with trio.open_nursery() as nursery:
                for destination, ids in batch.items():
                    nursery.start_soon(self._write_one, destination, ids)
            self.commits += 1

    async def _write_one(self, destination: str, ids: list[str]) -> None:
        try:
            self.recorded += await self.committer.record_seen(destination, ids)
        except (OutboxError, sqlite3.Error) as exc:
            self.failed += len(ids)
            log.warning(
                "outbox: %d seen id(s) of %s not persisted (a restart may show their copies "
                "again): %s",
                len(ids),
                destination,
                exc,
            )


class OutboxService:
    """What the sessions of one sidecar share of its outbox.

    Args:
        config: the sidecar's configuration (``outbox_destinations``, ``call_timeout``,
            ``outbox_max_age``).
        committer: the running group committer over the opened store.
        metrics: where expired frames are counted (a private registry when None).

    Attributes:
        committer: where sessions append, remove and read (:class:`GroupCommitter`).
        recovery: what opening ``outbox_dir`` found (:class:`RecoveryReport`).
        forwarded_total: frames forwarded and confirmed by a broker, then removed, since start.
        expired_total: frames dropped unforwarded since start (``outbox_max_age``).
        max_bytes: ``outbox_max_bytes``.
        depth: the last depth read (:data:`DEPTH_REFRESH`), None before the first.
    """

    def __init__(
        self, config: Config, committer: GroupCommitter, metrics: Metrics | None = None
    ) -> None:
        self.config = config
        self.committer = committer
        self.metrics = metrics if metrics is not None else Metrics()
        self.recovery: RecoveryReport = committer.store.recovery
        self.forwarded_total = 0
        self.expired_total = 0
        self._expiry_listeners: dict[str, ExpiryListener] = {}
        self.max_bytes = config.outbox_max_bytes
        self.depth: OutboxDepth | None = None
        self._patterns = config.outbox_destinations
        self._wakeups: dict[str, trio.Event] = {}
        #: Session keys whose frames no live session forwards (a previous process's, or of a
        #: session that ended), oldest first: the outbox forwarder's (proxy.outbox.forwarder).
        self.unowned: deque[str] = deque()
        self._unowned = trio.Event()
        #: When the sidecar stops forwarding the outbox before it exits (trio seconds): set
        #: on SIGTERM (:func:`forward_before_exit`); None while it runs.
        self.drain_deadline: float | None = None
        #: The outbox forwarder's progress (set by :class:`~proxy.outbox.forwarder.
        #: OutboxForwarder`), in :meth:`statistics`.
        self.forwarder_statistics: Callable[[], ForwarderStatistics] | None = None
        #: The consumer side's persisted duplicate-suppression ids (:class:`SeenRecorder`).
        self.seen = SeenRecorder(committer)

    def takes(self, destination: str | None) -> bool:
        """Whether a SEND to ``destination`` goes through the outbox: it matches one of
        ``outbox_destinations`` (:func:`fnmatch.fnmatchcase`), or the option is unset (every
        destination). A SEND without a destination never does (the broker judges it)."""
        if destination is None:
            return False
        patterns = self._patterns
        if patterns is None:
            return True
        return any(fnmatch.fnmatchcase(destination, p) for p in patterns)

    def wakeup(self, key: str) -> trio.Event:
        """The event set when ``key`` has new frames in the outbox (its forwarder waits on
        it); a fresh one after each :meth:`notify`."""
        event = self._wakeups.get(key)
        if event is None:
            event = self._wakeups[key] = trio.Event()
        return event

    def notify(self, key: str) -> None:
        """Wake the forwarder of ``key``: frames were appended for it."""
        event = self._wakeups.pop(key, None)
        if event is not None:
            event.set()

    def forget(self, key: str) -> None:
        """The session ``key`` ended: drop its wake-up and expiry listener (its frames stay
        in the outbox)."""
        self._wakeups.pop(key, None)
        self._expiry_listeners.pop(key, None)

    def on_expiry(self, key: str, listener: ExpiryListener) -> None:
        """Call ``listener`` with ``key``'s frames that expire (``outbox_max_age``) while
        the session lives (until :meth:`forget`); it names them to its app. Never blocks."""
        self._expiry_listeners[key] = listener

    async def expire(self) -> None:
        """Every :data:`DEPTH_REFRESH` seconds, drop the frames older than ``outbox_max_age``
        that no forwarder has read (:meth:`GroupCommitter.expire
        <proxy.outbox.committer.GroupCommitter.expire>`, :data:`EXPIRE_BATCH` a transaction),
        until cancelled; returns at once without the option. Each is counted
        (``mq_sidecar_outbox_expired_total``) and handed to its live session's listener,
        which names it to the app; those of no live session are logged here by
        ``mq-sidecar-id`` and counted as outcomes (``expired``). A write error is logged and
        the sweep tried again later."""
        max_age = self.config.durations.outbox_max_age
        if max_age is None:
            return
        while True:
            try:
                expired = await self.committer.expire(max_age, EXPIRE_BATCH)
            except OutboxError as exc:
                log.warning("outbox: expiry (outbox_max_age) failed: %s", exc)
                expired = None
            if expired is not None and expired.frames:
                self._expired(expired.frames)
            if expired is None or len(expired.frames) < EXPIRE_BATCH:
                await trio.sleep(DEPTH_REFRESH)

    def _expired(self, frames: Sequence[StoredFrame]) -> None:
        """Count ``frames`` and hand them out per session key (see :meth:`expire`)."""
        self.expired_total += len(frames)
        self.metrics.outbox_expired(len(frames))
        by_key: defaultdict[str, list[StoredFrame]] = defaultdict(list)
        for frame in frames:
            by_key[frame.session_key].append(frame)
        for key, group in by_key.items():
            listener = self._expiry_listeners.get(key)
            if listener is not None:
                listener(group)
                continue
            self.metrics.frame_outcome(FrameOutcome.EXPIRED, len(group))
            named = ", ".join(f.sidecar_id for f in group[:_EXPIRED_NAMED])
            more = len(group) - _EXPIRED_NAMED
            log.warning(
                "outbox: %d frame(s) of session %s not forwarded within outbox_max_age "
                "(%d ms), dropped (expired): mq-sidecar-id %s%s",
                len(group),
                key,
                self.config.outbox_max_age,
                named,
                f" and {more} more" if more > 0 else "",
            )

    def leave_unowned(self, key: str) -> None:
        """Leave ``key``'s frames to the outbox forwarder (no session forwards them)."""
        if key not in self.unowned:
            self.unowned.append(key)
            self._unowned.set()

    async def wait_unowned(self) -> None:
        """Wait until some key is left to the outbox forwarder (at once when one is)."""
        while not self.unowned:
            await self._unowned.wait()
            self._unowned = trio.Event()

    def statistics(self) -> OutboxStatistics:
        """Frames and bytes held now, the last depth read (oldest age, sessions), the
        forwarded counter and the recovery report's problems (``/status``, the gauges)."""
        stats = self.committer.statistics()
        depth = self.depth
        recovery = self.recovery
        return OutboxStatistics(
            frames=stats.frames,
            bytes=stats.bytes,
            max_bytes=stats.max_bytes,
            oldest_age_seconds=depth.oldest_age if depth is not None and stats.frames else None,
            sessions=depth.sessions if depth is not None else 0,
            forwarded_total=self.forwarded_total,
            commits=stats.commits,
            recovered_frames=recovery.frames,
            recovery_problems=tuple(recovery.problems()),
            unowned_sessions=len(self.unowned),
            seen_recorded=self.seen.recorded,
            seen_failed=self.seen.failed,
            room_waiters=stats.room_waiters,
            expired_total=self.expired_total,
            forwarder=(
                self.forwarder_statistics() if self.forwarder_statistics is not None else None
            ),
            drain_left_seconds=(
                None
                if self.drain_deadline is None
                else max(0.0, self.drain_deadline - trio.current_time())
            ),
        )

    async def watch_depth(self) -> None:
        """Read the depth every :data:`DEPTH_REFRESH` seconds, until cancelled."""
        while True:
            try:
                self.depth = await self.committer.depth()
            except (OutboxError, sqlite3.Error) as exc:
                log.warning("outbox: cannot read its depth: %s", exc)
            await trio.sleep(DEPTH_REFRESH)


async def forward_before_exit(outbox: OutboxService, deadline: float) -> None:
    """SIGTERM in outbox mode (docs/outbox.md, "Outbox mode in the daemon"): once every
    session has ended, every session key the outbox holds is the outbox forwarder's, and the
    sidecar waits until the outbox is empty or ``deadline`` (trio seconds: the drain's, after
    ``drain_timeout``), so that a pod deleted with a broker up leaves nothing in an
    ``emptyDir``. What is left at the deadline stays in ``outbox_dir`` for the next start
    (logged: frames, bytes). ``/readyz`` says why it is not ready meanwhile
    (:attr:`OutboxService.drain_deadline`)."""
    outbox.drain_deadline = deadline
    committer = outbox.committer
    with trio.move_on_at(deadline):
        for backlog in await committer.backlog():
            outbox.leave_unowned(backlog.session_key)
        if committer.statistics().frames:
            log.info(
                "outbox: forwarding %d frame(s) before exit (until it is empty or the drain "
                "deadline)",
                committer.statistics().frames,
            )
        while committer.statistics().frames:
            await committer.wait_freed()
    stats = committer.statistics()
    if stats.frames:
        log.warning(
            "outbox: %d frame(s), %d byte(s) not forwarded by the drain deadline "
            "(drain_timeout): they stay in %s for the next start",
            stats.frames,
            stats.bytes,
            outbox.config.outbox_dir,
        )
    else:
        log.info("outbox: empty; every frame it held was forwarded before exit")


def _open_store(config: Config) -> OutboxStore:
    assert config.outbox_dir is not None
    directory = Path(config.outbox_dir)
    try:
        return OutboxStore.open(
            directory, max_bytes=config.outbox_max_bytes, seen_max=config.id_cache_size
        )
    except (OutboxError, OSError, sqlite3.Error, ValueError) as exc:
        raise OutboxUnusable(f"outbox_dir {directory}: {exc}") from exc


def log_recovery(report: RecoveryReport) -> None:
    """One line on what opening ``outbox_dir`` found, and one warning per problem."""
    log.info(
        "outbox %s opened%s: %d frame(s), %d byte(s) of %d session(s) to forward",
        report.directory,
        "" if report.existed else " (new)",
        report.frames,
        report.bytes,
        report.sessions,
    )
    for problem in report.problems():
        log.warning("outbox recovery: %s", problem)


@asynccontextmanager
async def open_outbox(
    config: Config, metrics: Metrics | None = None
) -> AsyncIterator[OutboxService]:
    """Open ``outbox_dir`` and run the outbox for the body of the ``async with``
    (``metrics``: the sidecar's, where expired frames are counted).

    The group committer's writer, the depth watch and the expiry (``outbox_max_age``) run in
    this context's nurseries;
    leaving it writes what is queued, stops them and closes the store (the lock goes with it).

    Raises:
        OutboxUnusable: the directory is locked by another sidecar (naming its PID), cannot
            be created or written, or holds a database this sidecar cannot use.
    """
    store = await trio.to_thread.run_sync(partial(_open_store, config))
    committer: GroupCommitter | None = None
    try:
        log_recovery(store.recovery)
        async with open_group_committer(store) as committer:
            service = OutboxService(config, committer, metrics)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(service.watch_depth)
                nursery.start_soon(service.expire)
                nursery.start_soon(service.seen.run)
                try:
                    yield service
                finally:
                    nursery.cancel_scope.cancel()
            with trio.CancelScope(shield=True):
                await service.seen.write()  # what the last sessions settled (one commit)
    finally:
        if committer is not None:
            # After any read still running in the worker slot (a session that is ending).
            await committer.close_store()
        else:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(store.close)
