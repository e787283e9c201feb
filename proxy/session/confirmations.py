"""The confirmation window at work: frames from the app enter the window and go upstream with
the receipts the sidecar asks for; broker RECEIPTs confirm them and answer the app's receipts;
a receipt the app waits for past ``call_timeout`` is answered with an ERROR, and the frames of
an ERROR are named in an OUTCOME event (docs/behaviour.md, "Frame outcomes").

The window itself (:class:`proxy.tracking.window.ConfirmationWindow`) is pure bookkeeping; this
module adds the I/O and the waiting (backpressure: while the window is full the app is not read).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import trio

from protocol import Command, Frame, RawFrame
from proxy.legs.stream import TransportLost
from proxy.session.control import ControlChannel
from proxy.session.core import SessionCore, log
from proxy.session.ending import error_frame, rolled_back_message
from proxy.session.outcomes import report_of
from proxy.session.phase import Phase
from proxy.session.to_app import AppOutput
from proxy.telemetry.events import FrameReport
from proxy.telemetry.vocabulary import FrameOutcome, OutcomeCause, TransactionOutcome
from proxy.tracking import StoredInOutbox, Transaction
from proxy.tracking.window import Entry, EntryContext, frame_size

__all__ = ["ALWAYS_RECEIPTED", "WATCH_RECHECK", "Confirmations", "StaleSettlement"]

#: Commands that always carry a sidecar receipt: each changes session state a restore must
#: know the outcome of (docs/behaviour.md, "Confirmation window").
ALWAYS_RECEIPTED = frozenset(
    {
        Command.BEGIN,
        Command.COMMIT,
        Command.ABORT,
        Command.SUBSCRIBE,
        Command.UNSUBSCRIBE,
        Command.DISCONNECT,
    }
)


#: Seconds the ``call_timeout`` watch sleeps at most before it looks at the window again: the
#: watch of a session gone idle ends within this (:meth:`Confirmations.watch_call_timeouts`).
#: Every wakeup of a sleep costs a cancel scope's expiry in trio; at 1.0 s, 5,000 sessions
#: with frames unconfirmed woke 5,000 times a second, and the expiries took about a fifth of
#: the process's CPU (py-spy, bench/admission.py --no-kill); at 10 s, a tenth of that.
WATCH_RECHECK = 10.0

#: Frames whose receipt RabbitMQ sends only when their transaction commits.
_DEFERRED_IN_TRANSACTION = frozenset({Command.SEND, Command.ACK, Command.NACK})


class StaleSettlement(Exception):
    """An ACK/NACK built for a leg that is gone by the time it would enter the window
    (:meth:`Confirmations.submit` with ``generation``): its ack id means nothing on the new
    leg, so it is not sent (the message it settles was remembered as settled, and its
    redelivery is settled by identity when it arrives, as for an ACK of the old leg in the
    window at the failover: :func:`proxy.tracking.replay.plan_replay`)."""


class Confirmations:
    """Submitting app frames through the window, and confirming them; ``control`` tells the
    app what became of the frames that were not plainly confirmed."""

    def __init__(self, core: SessionCore, out: AppOutput, control: ControlChannel) -> None:
        self.core = core
        self.out = out
        self.control = control
        #: The frame waiting for room in the window (as it goes upstream), with the app's
        #: receipt id: read from the app, not in the window yet (the drain names it). A
        #: RawFrame stays one (parsing it would copy a large body once more while it waits).
        self.waiting: tuple[Frame | RawFrame, str | None] | None = None
        #: Whether the ``call_timeout`` watch runs (:meth:`watch_call_timeouts`): only while
        #: an app receipt is unanswered, so an idle session holds no task for it.
        self.watching = False
        #: Told of every settled entry forwarded from the outbox (``SessionOutbox.confirmed``).
        self.on_stored: Callable[[StoredInOutbox], None] | None = None

    async def submit(
        self,
        frame: Frame | RawFrame,
        *,
        app_receipt: str | None,
        idle: bool,
        context: EntryContext | None = None,
        receipted: bool = True,
        generation: int | None = None,
    ) -> Entry:
        """Put a frame in the confirmation window and send it if a leg is up.

        Blocks (stops reading the app: backpressure through TCP) while the window is full.
        The sidecar's receipt is requested when the app asked for one, on
        :data:`ALWAYS_RECEIPTED` commands, on every SEND of a leg whose receipts do not
        confirm in order (RabbitMQ), when the bytes since the last receipt pass half the
        window, and on the last frame of a burst (``idle``). ``receipted=False``: never on this
        frame (a later frame's receipt confirms it: the wildcard SUBSCRIBE on ActiveMQ).
        """
        core = self.core
        tracer = core.tracer
        started = time.time_ns() if tracer is not None else 0
        window = core.flow.window
        size = frame_size(frame)
        if not window.has_room(size):
            core.metrics.window_full()
            self.waiting = (frame, app_receipt)
            try:
                await self.flush_upstream()  # the receipts that make room answer queued frames
                # Only a pending receipt makes room; with none, the frame goes in after what
                # the window holds and confirms it (ConfirmationWindow.receipts_pending).
                while not window.has_room(size) and window.receipts_pending:
                    await core.flow.window_change()
            finally:
                self.waiting = None
        # A SEND on a leg whose receipts overtake each other (RabbitMQ) gets a receipt of its
        # own. In a transaction RabbitMQ answers a SEND's or ACK's receipt only at COMMIT
        # (found by the differential harness: a large SEND after one waited for the window
        # forever): there the sidecar asks none (the app's own is still passed on), and the
        # COMMIT's receipt confirms them.
        deferred = (
            not core.leg.dialect.cumulative_receipts
            and isinstance(context, Transaction)
            and frame.command in _DEFERRED_IN_TRANSACTION
        )
        want: bool | None
        if deferred:
            # Never the sidecar's own (at half the window it would wait for the COMMIT the
            # app cannot send: a transaction larger than the window stalled); the app's own,
            # when it asked, is requested and passed on at COMMIT.
            want = None if app_receipt is None else True
        else:
            want = (
                idle
                or frame.command in ALWAYS_RECEIPTED
                or (frame.command is Command.SEND and not core.leg.dialect.cumulative_receipts)
            )
        if not receipted:
            want = None
        if core.leg.send_lock.locked():  # a restore is writing the window: append after it
            async with core.leg.send_lock:
                self._check_generation(generation)
                entry = self._append(frame, app_receipt, want, context, size, deferred=deferred)
        else:
            # _append never checkpoints, so nothing can come between the append and the
            # queueing; taking the lock would only cost a trip through the scheduler.
            self._check_generation(generation)
            entry = self._append(frame, app_receipt, want, context, size, deferred=deferred)
        if tracer is not None:
            tracer.submitted(entry, started)
        charge = core.app.read_charge
        if charge is not None and charge.charged:
            # The frame's bytes are the window's now: the app leg is charged what follows it.
            charge.handed(core.app.conn.frame_in_progress()[0])
        upstream = core.leg.upstream
        if upstream is not None and upstream.needs_flush:
            await self.flush_upstream()
        return entry

    def _check_generation(self, generation: int | None) -> None:
        """Raise :class:`StaleSettlement` when ``generation`` (the link an ACK/NACK was built
        for) is no longer the session's: a client ACK that settles many messages on RabbitMQ
        is one ACK each, and a restore can take the send lock between two of them (the chaos
        soak under CPU pressure: the rest, with the old leg's delivery tags, went to the new
        leg, and RabbitMQ closed it with PRECONDITION_FAILED "unknown delivery tag")."""
        state = self.core.state
        if generation is not None and state is not None and state.generation != generation:
            raise StaleSettlement(f"built for link {generation}, now {state.generation}")

    def _append(
        self,
        frame: Frame | RawFrame,
        app_receipt: str | None,
        want_receipt: bool | None,
        context: EntryContext | None,
        size: int,
        *,
        deferred: bool = False,
    ) -> Entry:
        """Append to the window and, when the leg is up, queue the frame on it (no I/O: the
        app relay flushes at the end of the app's burst)."""
        core = self.core
        now = trio.current_time()
        # RabbitMQ copies a SEND's receipt header into the MESSAGE its consumers get: there
        # the app's own receipt id goes upstream (when no pending frame uses it), as directly.
        copied = (
            app_receipt
            if frame.command is Command.SEND and core.leg.dialect.copies_receipt_into_messages
            else None
        )
        entry = core.flow.window.append(
            frame,
            app_receipt=app_receipt,
            want_receipt=want_receipt,
            now=now,
            context=context,
            size=size,
            receipt_id=copied,
            deferred=deferred,
        )
        if app_receipt is not None and not self.watching and core.app_nursery is not None:
            # A receipt to answer within call_timeout: the watch starts (it ends when no app
            # receipt is unanswered). Every app frame is read inside the app nursery.
            self.watching = True
            core.app_nursery.start_soon(self.watch_call_timeouts)
        body = frame.body_length if isinstance(frame, RawFrame) else len(frame.body)
        core.metrics.frame_to_broker(frame.command, body)
        upstream = core.leg.upstream
        if core.leg.ready and upstream is not None:
            if core.state is not None:  # the order the leg names temporary destinations
                core.state.temps.note(entry.outgoing)
            try:
                entry.sent_at = now
                upstream.queue(entry.outgoing)
                entry.sent = True
            except TransportLost:
                pass  # the link task sees the loss and replays the window
        return entry

    async def flush_upstream(self) -> None:
        """Write what is queued for the broker; a failed write is left to the link task,
        which sees the loss on its read and replays the window."""
        upstream = self.core.leg.upstream
        if upstream is not None:
            with contextlib.suppress(TransportLost):
                await upstream.flush()

    async def confirm(self, receipt: str) -> None:
        """Apply a broker RECEIPT to the window and answer the app's receipts it covers."""
        core = self.core
        state = core.state
        assert state is not None
        confirmed = core.flow.window.confirm(receipt)
        if confirmed is None:
            if not state.take_internal_receipt(receipt):
                log.warning("session %s: broker sent unknown receipt-id %r", core.id, receipt)
            else:  # maybe a restore's SUBSCRIBE of a subscription the broker had refused
                state.subscribe_confirmed(receipt)
            return
        core.flow.window_changed()
        if core.tracer is not None:
            core.tracer.confirmed(confirmed)
        now = trio.current_time()
        metrics = core.metrics
        for entry in confirmed:
            if isinstance(entry.context, StoredInOutbox) and self.on_stored is not None:
                self.on_stored(entry.context)
            if entry.receipt == receipt and entry.sent_at:
                metrics.receipt_roundtrip(now - entry.sent_at)
            if entry.command is Command.COMMIT:
                metrics.transaction(TransactionOutcome.COMMITTED)
                if isinstance(entry.context, Transaction):
                    entry.context.finished()
            if entry.app_receipt is not None and not entry.answered:
                entry.answered = True
                metrics.frame_to_app(Command.RECEIPT, 0)
                await self.out.send(_receipt(entry.app_receipt), flush=False)
            if entry is core.asked.disconnect_entry:
                # The app's RECEIPT must be written before the session ends: once
                # `disconnected` is set the app side ends the session and cancels this relay.
                await self.out.flush()
                core.asked.disconnected.set()

    async def confirm_by_error(self, error: Frame, receipt: str) -> tuple[Frame, list[FrameReport]]:
        """A broker ERROR that answers the frame carrying sidecar receipt ``receipt``: the
        entries before it are confirmed (answered locally), the one it answers is settled.
        Returns the ERROR as the app gets it (with the app's receipt id, or without one), and
        the report of the frame it refused (``refused``), for the OUTCOME event after it."""
        core = self.core
        confirmed = core.flow.window.confirm(receipt) or []
        core.flow.window_changed()
        answered = next((e for e in confirmed if e.receipt == receipt), None)
        if core.tracer is not None:  # the one refused ends with its OUTCOME
            core.tracer.confirmed(e for e in confirmed if e is not answered)
        for entry in confirmed:
            # The broker's ERROR reaches the app: the outbox is done with such a frame too.
            if isinstance(entry.context, StoredInOutbox) and self.on_stored is not None:
                self.on_stored(entry.context)
            if entry is not answered and entry.app_receipt and not entry.answered:
                entry.answered = True
                await self.out.answer_locally(entry.app_receipt)
        refused = []
        if answered is not None:
            refused.append(report_of(answered, FrameOutcome.REFUSED, OutcomeCause.BROKER_ERROR))
        if answered is not None and answered.app_receipt and not answered.answered:
            answered.answered = True
            return error.with_header("receipt-id", answered.app_receipt), refused
        return error.without("receipt-id"), refused

    async def watch_call_timeouts(self) -> None:
        """ERROR for every app receipt unconfirmed after ``call_timeout`` (Artemis
        "unblocking calls"; JEUS request-blocking-time): the app is never left waiting
        forever, and a frame that was never sent is dropped. Every frame due at once is
        answered together, and named in one OUTCOME event. Runs while an app receipt is
        unanswered (started by the append of one, in the app nursery) and ends within
        :data:`WATCH_RECHECK` seconds of the last one answered: an idle session has no task
        for it (the memory of 1,000 idle sessions, docs/architecture.md)."""
        core = self.core
        timeout = core.durations.call_timeout
        while True:
            entry = core.flow.window.first_unanswered()
            if entry is None:
                # No checkpoint between this test and the flag: an append that comes after
                # it sees the flag down and starts the watch again.
                self.watching = False
                return
            deadline = entry.enqueued_at + timeout
            now = trio.current_time()
            if now < deadline:
                # Entries are in the order the app handed them over, so no later one is due
                # sooner: sleep to this deadline and look again (the entry may be answered by
                # then), rather than waking on every window change (every relayed frame); at
                # most WATCH_RECHECK at a time, so the watch of a session gone idle ends
                # within that and the idle session holds no task for it (one wakeup a
                # second of a busy session's, against a task per idle one).
                # Not holding the entry meanwhile: once confirmed, its frame (a large body)
                # leaves memory now, not at the deadline.
                entry = None
                await trio.sleep_until(min(deadline, now + WATCH_RECHECK))
                continue
            due: list[Entry] = []
            while entry is not None and entry.enqueued_at + timeout <= trio.current_time():
                entry.answered = True
                due.append(entry)
                entry = core.flow.window.first_unanswered()
            entry = None
            await self._time_out(due)
            del due

    async def _time_out(self, due: list[Entry]) -> None:
        """Answer ``due`` (past ``call_timeout``) with an ERROR each, and one OUTCOME event.

        What was never sent is dropped first (under the send lock, so a restore cannot send
        it meanwhile): ``lost``, or ``unknown`` if a broker lost before confirming it may have
        it; what is on the live leg stays in the window: ``timed_out``, it may still be done.
        """
        core = self.core
        async with core.leg.send_lock:
            dropped = []
            for entry in due:
                if not entry.sent and not entry.confirmed and not entry.dropped:
                    core.flow.window.drop(entry)
                    dropped.append(entry)
            rest = self._roll_back_transactions_of(dropped)
            core.flow.window_changed()
        state = "while reconnecting" if core.phase is Phase.RECONNECTING else "by the broker"
        reports = []
        for entry in due:
            command = entry.command
            if entry.confirmed:
                # Its RECEIPT came while the send lock was awaited (marked answered, so the
                # confirmation wrote none): it is plainly confirmed after all.
                await self.out.answer_locally(entry.app_receipt)
                continue
            if entry.sent:
                outcome, detail = FrameOutcome.TIMED_OUT, "it may still be"
            elif entry.sent_before:
                # Sent to a broker that was lost before confirming it: stored there or not,
                # nobody knows; it is not replayed after this ERROR.
                outcome = FrameOutcome.UNKNOWN
                detail = (
                    "it reached a broker that was lost before confirming it, so it may have "
                    "taken effect; it is dropped and not replayed"
                )
                if command is Command.COMMIT:
                    detail += " (the transaction's outcome is in doubt)"
            else:
                outcome, detail = FrameOutcome.LOST, "it was never sent and is dropped"
            report = report_of(entry, outcome, OutcomeCause.CALL_TIMEOUT)
            reports.append(report)
            await self.out.send(
                error_frame(
                    f"{command} not confirmed {state} within {core.config.call_timeout} ms",
                    receipt_id=entry.app_receipt,
                    detail=f"{command} {report.label} not confirmed; {detail}",
                    outcome=outcome,
                    duplicate_id=report.mq_sidecar_id,
                ),
                flush=False,
            )
        await self.out.flush()
        await self.control.report(
            reports, f"not confirmed {state} within call_timeout ({core.config.call_timeout} ms)"
        )
        if rest:
            await self._answer_rolled_back(rest)

    def _roll_back_transactions_of(self, dropped: list[Entry]) -> list[Entry]:
        """The transactions of the ``dropped`` entries are rolled back (issue 36: a broker
        given the rest of a transaction that lost a frame commits part of it, and the app's
        COMMIT got a RECEIPT): :meth:`SessionState.roll_back
        <proxy.tracking.SessionState.roll_back>` with the reason their COMMIT's ERROR gives,
        and their other frames still unsent are taken out of the window. Returns those
        (answered by :meth:`_answer_rolled_back`). No broker has the transaction open: a
        frame unsent is dropped only while no leg is ready, and the restore re-creates no
        rolled-back transaction (:func:`proxy.tracking.replay.plan_replay`). Under the send
        lock."""
        core = self.core
        state = core.state
        window = core.flow.window
        rolled: dict[int, Transaction] = {}
        for entry in dropped:
            tx = entry.context
            if isinstance(tx, Transaction) and not tx.rolled_back and state is not None:
                state.roll_back(
                    tx,
                    f"its {entry.command} {entry.label} was not confirmed within call_timeout "
                    f"({core.config.call_timeout} ms) and was dropped, so no broker is given "
                    "the rest of it",
                )
                rolled[id(tx)] = tx
        if not rolled:
            return []
        rest = [
            e
            for e in window
            if not e.sent and isinstance(e.context, Transaction) and id(e.context) in rolled
        ]
        for entry in rest:
            window.drop(entry)
        return rest

    async def _answer_rolled_back(self, entries: list[Entry]) -> None:
        """Answer the frames of transactions rolled back at ``call_timeout``, taken out of the
        window unsent: a COMMIT gets an ERROR naming the transaction rolled back (outcome
        ``rolled_back``; ``unknown``, in doubt, for a COMMIT a lost broker may have had), and
        an OUTCOME event; the others their RECEIPT (as a SEND in a transaction a failover
        rolled back: the COMMIT fails, an ABORT succeeds)."""
        reports = []
        for entry in entries:
            tx = entry.context
            assert isinstance(tx, Transaction)
            assert tx.rolled_back is not None
            if entry.command is not Command.COMMIT:
                if not entry.answered:
                    entry.answered = True
                    await self.out.answer_locally(entry.app_receipt)
                continue
            if entry.sent_before:
                outcome = FrameOutcome.UNKNOWN
                message = (
                    f"transaction outcome in doubt: the broker connection was lost before "
                    f"COMMIT of transaction '{tx.id}' was confirmed, and {tx.rolled_back}"
                )
            else:
                outcome = FrameOutcome.ROLLED_BACK
                message = rolled_back_message(tx.id, tx.rolled_back)
            report = report_of(entry, outcome, OutcomeCause.CALL_TIMEOUT)
            reports.append(report)
            if not entry.answered:
                entry.answered = True
                await self.out.send(
                    error_frame(message, receipt_id=entry.app_receipt, outcome=outcome),
                    flush=False,
                )
        await self.out.flush()
        if reports:
            await self.control.report(reports, "a frame of the transaction was dropped")


def _receipt(receipt_id: str) -> Frame | RawFrame:
    """The app's RECEIPT for ``receipt_id``: as bytes when the id needs no escaping (the fast
    lane; the same bytes in any version), else a Frame."""
    headers = (("receipt-id", receipt_id),)
    return RawFrame.build(Command.RECEIPT, headers) or Frame(Command.RECEIPT, headers)
