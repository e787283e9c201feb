"""The sidecar's outbox at work (issue 17, docs/outbox.md): the store opened at start, its group
committer, and what the sessions share of it.

:func:`open_outbox` is entered by :meth:`proxy.app.Sidecar.serve` before it listens, when the
``outbox`` option is on: it locks and opens ``outbox_dir`` (:meth:`OutboxStore.open
<proxy.outbox.store.OutboxStore.open>`, in a worker thread: recovery reads the whole WAL), logs
the recovery report, and runs the :class:`~proxy.outbox.GroupCommitter` (its writer task) and
a depth watch in nurseries of its own for as long as the sidecar runs. A directory that cannot
be used raises :class:`~proxy._errors.OutboxUnusable` with one line saying why (``mq-sidecar
run`` exits 1 with it).

Each session's part (spooling its app's SENDs, forwarding them) is
:class:`proxy.session.spool.Spool`; this module holds what they share: the destination
patterns, the committer, a wake-up per session key, the forwarded counter, the cached depth
for ``/status`` and the gauges.
"""

from __future__ import annotations

import fnmatch
import logging
import sqlite3
from collections import deque
from collections.abc import AsyncIterator
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
    open_group_committer,
)
from proxy.statistics import OutboxStatistics

__all__ = ["DEPTH_REFRESH", "OutboxService", "open_outbox"]

log = logging.getLogger("mq_sidecar.outbox")

#: Seconds between reads of the outbox's depth (oldest frame's age, sessions) for ``/status``
#: and the gauges; frames and bytes are the store's own counters, always current.
DEPTH_REFRESH = 1.0


class OutboxService:
    """What the sessions of one sidecar share of its outbox.

    Args:
        config: the sidecar's configuration (``outbox_destinations``, ``call_timeout``).
        committer: the running group committer over the opened store.

    Attributes:
        committer: where sessions append, remove and read (:class:`GroupCommitter`).
        recovery: what opening ``outbox_dir`` found (:class:`RecoveryReport`).
        forwarded_total: frames forwarded and confirmed by a broker, then removed, since start.
        max_bytes: ``outbox_max_bytes``.
        depth: the last depth read (:data:`DEPTH_REFRESH`), None before the first.
    """

    def __init__(self, config: Config, committer: GroupCommitter) -> None:
        self.config = config
        self.committer = committer
        self.recovery: RecoveryReport = committer.store.recovery
        self.forwarded_total = 0
        self.max_bytes = config.outbox_max_bytes
        self.depth: OutboxDepth | None = None
        self._patterns = config.outbox_destinations
        self._wakeups: dict[str, trio.Event] = {}
        #: Session keys whose frames no live session forwards (a previous process's, or of a
        #: session that ended), oldest first: the recovery forwarder's (proxy.orphans).
        self.orphans: deque[str] = deque()
        self._orphaned = trio.Event()

    def spools(self, destination: str | None) -> bool:
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
        """The session ``key`` ended: drop its wake-up (its frames stay in the outbox)."""
        self._wakeups.pop(key, None)

    def orphan(self, key: str) -> None:
        """Leave ``key``'s frames to the recovery forwarder (no session forwards them)."""
        if key not in self.orphans:
            self.orphans.append(key)
            self._orphaned.set()

    async def wait_orphans(self) -> None:
        """Wait until some key is left to the recovery forwarder (at once when one is)."""
        while not self.orphans:
            await self._orphaned.wait()
            self._orphaned = trio.Event()

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
            orphan_sessions=len(self.orphans),
            room_waiters=stats.room_waiters,
        )

    async def watch_depth(self) -> None:
        """Read the depth every :data:`DEPTH_REFRESH` seconds, until cancelled."""
        while True:
            try:
                self.depth = await self.committer.depth()
            except (OutboxError, sqlite3.Error) as exc:
                log.warning("outbox: cannot read its depth: %s", exc)
            await trio.sleep(DEPTH_REFRESH)


def _open_store(config: Config) -> OutboxStore:
    assert config.outbox_dir is not None
    directory = Path(config.outbox_dir)
    try:
        return OutboxStore.open(directory, max_bytes=config.outbox_max_bytes)
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
async def open_outbox(config: Config) -> AsyncIterator[OutboxService]:
    """Open ``outbox_dir`` and run the outbox for the body of the ``async with``.

    The group committer's writer and the depth watch run in this context's nurseries;
    leaving it writes what is queued, stops them and closes the store (the lock goes with it).

    Raises:
        OutboxUnusable: the directory is locked by another sidecar (naming its PID), cannot
            be created or written, or holds a database this sidecar cannot use.
    """
    store = await trio.to_thread.run_sync(partial(_open_store, config))
    try:
        log_recovery(store.recovery)
        async with open_group_committer(store) as committer:
            service = OutboxService(config, committer)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(service.watch_depth)
                try:
                    yield service
                finally:
                    nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(store.close)
