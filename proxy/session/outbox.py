"""One session's part of the outbox (issue 17, docs/outbox.md): its app's SENDs stored on
local disk and answered once durable, then forwarded to the broker in order.

- **Storing** (:meth:`SessionOutbox.add`, :meth:`SessionOutbox.write`, called by the app
  side): an app SEND outside a transaction whose destination matches ``outbox_destinations``
  joins the session's batch, as it would go upstream (its ``mq-sidecar-id`` set), serialized as
  STOMP 1.2. The batch is appended in one transaction at the end of the app's burst, or when it
  reaches
  :data:`BATCH_FRAMES` / :data:`BATCH_BYTES`, or before any other frame of the app is handled;
  once it is durable (fsync) the app's receipts of its frames are answered, by the sidecar,
  with the app's receipt ids. The app is not read meanwhile, so a full outbox holds it
  (back-pressure); past ``call_timeout`` each frame of the batch gets an ERROR naming
  ``outbox_max_bytes`` (outcome ``refused``), and nothing of it was stored.
- **Forwarding** (:meth:`SessionOutbox.forward`, a task of the session's nursery): while the
  session has a broker, the session's frames are read from the outbox in order and put in the
  confirmation window (:class:`~proxy.tracking.StoredInOutbox` context, no app receipt: the app
  had its RECEIPT), as room allows; they go upstream with the sidecar's receipts as any SEND, and
  are replayed after a failover as any SEND.
- **Removal** (:meth:`SessionOutbox.remove_confirmed`, a task beside it): a frame the broker
  confirmed (or refused with an ERROR, which reached the app) leaves the outbox, in the order
  it was forwarded.
- **Events** (the control channel): SPOOLING when the session stores a frame while no broker
  is up (the first such frame since the last switch back), SPOOL_DRAINED once everything it
  stored has been forwarded, confirmed and removed after that: one event per switch, never
  one per frame.

The session key is the session id (its prefix is the process's own, so a later process never
takes a key of an earlier one).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import trio

import protocol
from protocol import Frame
from proxy.outbox import OutboxClosed, OutboxError, OutboxFrame, StoredFrame
from proxy.outbox.frames import STORED_VERSION, FetchSize, parse
from proxy.outbox.service import OutboxService
from proxy.session.confirmations import Confirmations
from proxy.session.control import ControlChannel
from proxy.session.core import SessionCore, log
from proxy.session.ending import Ending, error_frame
from proxy.session.to_app import AppOutput
from proxy.telemetry.events import EventKind, FrameReport, SessionEvent, report_of_frame
from proxy.telemetry.vocabulary import FrameOutcome, OutcomeCause
from proxy.tracking import DUPLICATE_ID_HEADER, StoredInOutbox
from proxy.tracking.window import frame_size

__all__ = [
    "BATCH_BYTES",
    "BATCH_FRAMES",
    "SessionOutbox",
]

#: Frames of one session appended in one transaction at most (the committer groups sessions).
BATCH_FRAMES = 256
#: Frame bytes of one batch at most (a frame larger than it goes alone).
BATCH_BYTES = 1 << 20


class SessionOutbox:
    """Storing, forwarding and removal for one session (see the module docstring).

    Args:
        core: the session's shared state; its id is the session key.
        out: writes to the app (RECEIPTs, ERRORs).
        control: the OUTCOME events of refused frames.
        confirmations: the window the forwarder feeds.
        outbox: the sidecar's :class:`~proxy.outbox.service.OutboxService`.
    """

    def __init__(
        self,
        core: SessionCore,
        out: AppOutput,
        control: ControlChannel,
        confirmations: Confirmations,
        outbox: OutboxService,
    ) -> None:
        self.core = core
        self.out = out
        self.control = control
        self.confirmations = confirmations
        self.outbox = outbox
        self.key = core.id
        #: The batch: (frame as it goes upstream, its stored form, the app's receipt id).
        self._batch: list[tuple[Frame, OutboxFrame, str | None]] = []
        self._batch_bytes = 0
        #: The highest outbox seq put in the window.
        self._fed = 0
        #: Seqs in the window, in the order forwarded, and those of them confirmed.
        self._in_window: deque[int] = deque()
        self._confirmed: set[int] = set()
        self._removable = trio.Event()
        self._removed = trio.Event()
        self._stopped = False
        #: Frames this session stored (appended), forwarded (confirmed and removed) and that
        #: expired unforwarded (``outbox_max_age``).
        self.stored = 0
        self.forwarded = 0
        self.expired = 0
        #: Reports of frames that expired, not yet named to the app (:meth:`_name_expired`).
        self._expired_reports: list[FrameReport] = []
        outbox.on_expiry(self.key, self._on_expiry)
        #: Since a SPOOLING event (trio seconds) and :attr:`forwarded` then; None: the
        #: session is not spooling (no SPOOLING, or its SPOOL_DRAINED was published).
        self.storing_since: float | None = None
        self._forwarded_when_storing_began = 0

    # -- storing (the app side) ---------------------------------------------------------------

    def takes(self, frame: Frame) -> bool:
        """Whether this SEND (outside a transaction) goes through the outbox."""
        return self.outbox.takes(frame.get("destination"))

    @property
    def pending(self) -> bool:
        """Frames wait in the batch (:meth:`write` stores them)."""
        return bool(self._batch)

    def add(self, frame: Frame, app_receipt: str | None) -> bool:
        """Add a SEND, as it goes upstream, to the batch; True when the batch is full and
        should be written now (:meth:`write`).

        Raises:
            protocol.LocalProtocolError: the frame cannot be written as STOMP 1.2 (it came
                from the app as STOMP, so this does not happen).
        """
        stored = self._stored(frame)
        self._batch.append((frame, stored, app_receipt))
        self._batch_bytes += len(stored.frame)
        return len(self._batch) >= BATCH_FRAMES or self._batch_bytes >= BATCH_BYTES

    async def write(self) -> None:
        """Append the batch in one transaction and, once it is durable, answer the app's
        receipts of its frames. A full outbox holds the caller (the app is not read) up to
        ``call_timeout``; then, or when the batch can never fit, or when the disk fails, each
        frame of it gets the sidecar's ERROR naming the cause (outcome ``refused``: nothing of
        it was stored) and the session goes on. A closed outbox (the sidecar is stopping) ends
        the session."""
        batch, self._batch, self._batch_bytes = self._batch, [], 0
        if not batch:
            return
        if len(batch) > 1 and sum(len(s.frame) for _, s, _ in batch) > self.outbox.max_bytes:
            # Together past outbox_max_bytes, though each may fit: one append each.
            for one in batch:
                self._batch = [one]
                await self.write()
            return
        core = self.core
        deadline = trio.current_time() + core.durations.call_timeout
        try:
            await self.outbox.committer.append(
                self.key, [stored for _, stored, _ in batch], deadline=deadline
            )
        except OutboxClosed as exc:
            core.end(Ending(f"outbox closed: {exc}", app_error=error_frame(str(exc))))
            return
        except OutboxError as exc:
            await self._refuse(batch, str(exc))
            return
        await self._stored_now(len(batch))
        for _, _, receipt in batch:
            if receipt is not None:
                await self.out.answer_locally(receipt)

    async def store(self, frames: Sequence[Frame]) -> None:
        """Store ``frames`` (as they go upstream) in one append, all or none; durable when
        this returns (a transaction's SENDs at its COMMIT). Waits for room up to
        ``call_timeout``.

        Raises:
            OutboxFullTimeout: no room within ``call_timeout`` (names ``outbox_max_bytes``).
            OutboxFull: more than ``outbox_max_bytes`` by themselves.
            OutboxError: the write failed (OutboxWriteError) or the outbox is closing
                (OutboxClosed); nothing was stored.
        """
        if not frames:
            return
        stored = [self._stored(frame) for frame in frames]
        deadline = trio.current_time() + self.core.durations.call_timeout
        await self.outbox.committer.append(self.key, stored, deadline=deadline)
        await self._stored_now(len(stored))

    async def _stored_now(self, count: int) -> None:
        """``count`` frames were appended: wake the forwarder, and when no broker is up and
        the session was not spooling yet, publish SPOOLING (before the app's RECEIPTs of
        them, so the app learns of the switch first)."""
        self.stored += count
        self.outbox.notify(self.key)
        core = self.core
        if self.storing_since is not None or core.leg.upstream is not None:
            return
        self.storing_since = trio.current_time()
        self._forwarded_when_storing_began = self.forwarded
        loss = core.leg.loss
        await self.control.publish(
            self._event(
                EventKind.SPOOLING,
                loss.reason if loss is not None else "no broker up",
                from_broker=loss.broker if loss is not None else None,
            )
        )

    def _event(
        self,
        kind: EventKind,
        reason: str,
        *,
        from_broker: str | None = None,
        to_broker: str | None = None,
        forwarded_frames: int | None = None,
        spooled_ms: int | None = None,
    ) -> SessionEvent:
        """A SPOOLING or SPOOL_DRAINED event with the depth fields: the session's frames in
        the outbox, the whole outbox's frames, bytes and bound."""
        stats = self.outbox.committer.statistics()
        return SessionEvent(
            kind,
            self.core.id,
            reason,
            from_broker=from_broker,
            to_broker=to_broker,
            spooled_frames=self.stored - self.forwarded,
            outbox_frames=stats.frames,
            outbox_bytes=stats.bytes,
            outbox_max_bytes=stats.max_bytes,
            forwarded_frames=forwarded_frames,
            spooled_ms=spooled_ms,
        )

    @staticmethod
    def _stored(frame: Frame) -> OutboxFrame:
        """``frame`` as the outbox stores it (:data:`STORED_VERSION` bytes)."""
        data = protocol.serialize(frame, STORED_VERSION)
        return OutboxFrame(
            frame.get(DUPLICATE_ID_HEADER) or "", frame.get("destination") or "", data
        )

    async def _refuse(
        self, batch: Sequence[tuple[Frame, OutboxFrame, str | None]], reason: str
    ) -> None:
        """The sidecar's ERROR for each frame of a batch the outbox did not store, and one
        OUTCOME event naming them all."""
        core = self.core
        log.warning("session %s: %d frame(s) not stored: %s", core.id, len(batch), reason)
        reports: list[FrameReport] = []
        for frame, _, receipt in batch:
            report = report_of_frame(
                frame, receipt, FrameOutcome.REFUSED, OutcomeCause.SIDECAR_ERROR
            )
            reports.append(report)
            await self.out.send(
                error_frame(
                    reason,
                    receipt_id=receipt,
                    detail=f"SEND {report.label} was not stored in the outbox: {reason}",
                    outcome=FrameOutcome.REFUSED,
                    duplicate_id=report.mq_sidecar_id,
                ),
                flush=False,
            )
        await self.out.flush()
        await self.control.report(reports, reason)

    @property
    def settled(self) -> int:
        """Frames this session stored that left the outbox: forwarded or expired."""
        return self.forwarded + self.expired

    async def drained(self) -> None:
        """Wait until everything this session stored was forwarded, confirmed and removed,
        or expired (the app's DISCONNECT waits for it, bounded by the caller)."""
        while self.settled < self.stored:
            await self._removed.wait()

    def stop(self) -> None:
        """Feed nothing more into the window (the app's DISCONNECT is going upstream: the
        broker would take nothing after it); what is left stays in the outbox."""
        self._stopped = True

    async def disconnect(self, frame: Frame) -> bool:
        """The app's DISCONNECT (``frame``): with a broker, what the outbox holds of this
        session goes first, within ``call_timeout``; the rest is left to the recovery
        forwarder (docs/outbox.md). With no broker and nothing but outbox frames in the
        window, the sidecar answers the DISCONNECT itself and ends the session (True): what
        the app handed over is durable. False: the DISCONNECT goes upstream as usual."""
        core = self.core
        if core.leg.ready:
            with trio.move_on_after(core.durations.call_timeout):
                await self.drained()
        self.stop()
        if core.leg.ready or not all(
            isinstance(e.context, StoredInOutbox) for e in core.flow.window
        ):
            return False
        await self.out.answer_locally(frame.get("receipt"))
        core.end(
            Ending(
                "app disconnected with no broker up; what it sent waits in the outbox",
                disconnect_upstream=False,
            )
        )
        return True

    # -- forwarding (a task of the session) ---------------------------------------------------

    async def forward(self) -> None:
        """Feed the session's outbox frames into the window, in order, while the session has
        a broker and the window has room; until cancelled (the session ends). Frames already
        in the window are not fed again: a failover replays them from there."""
        core = self.core
        committer = self.outbox.committer
        window = core.flow.window
        fetch = FetchSize(window.max_bytes)
        while not self._stopped:
            await core.leg.wait_ready()
            wakeup = self.outbox.wakeup(self.key)  # before the read: no append is missed
            stored = await committer.pending(self.key, after_seq=self._fed, limit=fetch.frames)
            fetch.update(stored)
            if not stored:
                await wakeup.wait()
                continue
            last = len(stored) - 1
            for n, item in enumerate(stored):
                if not core.leg.ready or self._stopped:
                    break  # the rest waits in the outbox for the next leg
                frame = parse(item.frame)
                size = frame_size(frame)
                while not window.has_room(size) and window.receipts_pending:
                    await core.flow.window_change()
                await self.confirmations.submit(
                    frame, app_receipt=None, idle=n == last, context=StoredInOutbox(item.seq)
                )
                self._fed = item.seq
                self._in_window.append(item.seq)
            await self.confirmations.flush_upstream()

    async def _drained_event(self) -> None:
        """SPOOL_DRAINED: the switch back from a SPOOLING."""
        core = self.core
        assert self.storing_since is not None
        since, self.storing_since = self.storing_since, None
        upstream = core.leg.upstream
        await self.control.publish(
            self._event(
                EventKind.SPOOL_DRAINED,
                "every frame the session stored reached a broker"
                + (" or expired (outbox_max_age)" if self.expired else ""),
                to_broker=upstream.broker.label if upstream is not None else None,
                forwarded_frames=self.forwarded - self._forwarded_when_storing_began,
                spooled_ms=round((trio.current_time() - since) * 1000),
            )
        )

    def confirmed(self, context: StoredInOutbox) -> None:
        """A RECEIPT (or the broker's ERROR) settled the window entry of outbox frame
        ``context.seq``: it may leave the outbox (:meth:`remove_confirmed`). Never blocks."""
        self._confirmed.add(context.seq)
        self._removable.set()

    def _on_expiry(self, frames: Sequence[StoredFrame]) -> None:
        """The outbox dropped ``frames`` of this session (``outbox_max_age``): named to the
        app by the remover task (:meth:`_name_expired`). Never blocks."""
        self.expired += len(frames)
        self._expired_reports += (
            FrameReport(
                command="SEND",
                receipt=None,  # answered when stored; the outbox keeps no app receipt id
                mq_sidecar_id=f.sidecar_id,
                seq=0,
                transaction=None,
                outcome=FrameOutcome.EXPIRED,
                cause=OutcomeCause.OUTBOX_MAX_AGE,
            )
            for f in frames
        )
        self._removable.set()

    async def _name_expired(self) -> None:
        """One OUTCOME event naming the frames that expired since the last one (outcome
        ``expired``, cause ``outbox_max_age``; logged and counted by the report)."""
        reports, self._expired_reports = self._expired_reports, []
        if not reports:
            return
        max_age = self.core.config.outbox_max_age
        await self.control.report(
            reports, f"not forwarded within outbox_max_age ({max_age} ms): dropped"
        )
        await self._settled_now()

    async def remove_confirmed(self) -> None:
        """Remove the frames settled at the head of what was forwarded, as they are settled,
        and name those that expired; until cancelled (:meth:`remove_settled`)."""
        while True:
            await self._removable.wait()
            self._removable = trio.Event()
            await self._name_expired()
            await self.remove_settled(report=True)

    async def remove_settled(self, *, report: bool = False) -> None:
        """Remove the frames settled at the head of what was forwarded, as one range (a
        frame confirmed ahead of an earlier one waits for it: the outbox removes by range).
        A removal that fails leaves them in the outbox: forwarded again after a restart (the
        consumer side suppresses the copy by its ``mq-sidecar-id``). With ``report`` (not
        when the session is closing), a session storing whose stored frames have all been
        removed publishes SPOOL_DRAINED, before a DISCONNECT waiting for it goes on."""
        first = last = count = 0
        while self._in_window and self._in_window[0] in self._confirmed:
            last = self._in_window.popleft()
            self._confirmed.discard(last)
            first = first or last
            count += 1
        if not count:
            return
        try:
            await self.outbox.committer.remove(self.key, first, last)
        except OutboxError as exc:
            log.warning("session %s: outbox removal failed: %s", self.core.id, exc)
            return
        self.forwarded += count
        self.outbox.forwarded_total += count
        self.core.metrics.outbox_forwarded(count)
        if report:
            await self._settled_now()
        else:
            self._wake_drained()

    async def _settled_now(self) -> None:
        """Frames left the outbox: a session storing whose stored frames have all left
        publishes SPOOL_DRAINED, before a DISCONNECT waiting for it goes on."""
        if self.storing_since is not None and self.settled >= self.stored:
            await self._drained_event()
        self._wake_drained()

    def _wake_drained(self) -> None:
        self._removed.set()
        self._removed = trio.Event()
