"""After a reconnect: re-create the session on the new leg (subscriptions, transactions,
temporary destinations), replay what the old broker never confirmed, and tell the app
(FAILOVER); or, when the policy gives up, tell the app what was lost (DISCONNECT).

What to replay is decided by the pure :func:`proxy.tracking.replay.plan_replay`; this module carries
it out on the leg and reports it (events, metrics, log). What the failover did beyond that is
reported too (docs/behaviour.md, "Restoring the session"): the temporary destinations it
renamed (:mod:`proxy.tracking.links`), the browsers it cut short (each also gets an ERROR, as
the Qpid client failover draft throws from a browser's enumeration), the non-durable topic
subscriptions that missed messages, and the outage as Unix times, so an app can resync.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable

import trio

import protocol
from config import TransactionFailover
from protocol import Command, ConnectionClosed, Frame
from proxy.legs.broker import Upstream
from proxy.legs.stream import TransportLost
from proxy.reconnect.walk import Attempt, ReconnectExhausted
from proxy.session.control import ControlChannel
from proxy.session.core import GOODBYE_TIMEOUT, SessionCore, log
from proxy.session.ending import SUMMARY_NAMES, Ending, Loss, error_frame, rolled_back_message
from proxy.session.ending import summary as frames_summary
from proxy.session.outcomes import after_restore, unsettled
from proxy.session.phase import Phase
from proxy.session.to_app import AppOutput
from proxy.telemetry.events import EventKind, SessionEvent, report_of_frame
from proxy.telemetry.vocabulary import FrameOutcome, OutageOutcome, OutcomeCause, TransactionOutcome
from proxy.tracking import SessionState, Transaction
from proxy.tracking.links import LinkEnd, probe_end
from proxy.tracking.replay import ReplayPlan, plan_replay
from proxy.tracking.window import Entry

__all__ = ["Restorer", "start_link"]


def start_link(state: SessionState, upstream: Upstream, app_connect: Frame | None) -> LinkEnd:
    """Move ``state`` to the leg ``upstream`` (:meth:`SessionState.new_link` with the leg's
    traits). ActiveMQ names a connection's temporary destinations after its id, which its
    CONNECTED ``session`` header gives, unless the app's CONNECT set ``client-id``, which
    ActiveMQ puts there instead (StompProtocolConverter.onStompConnect; measured)."""
    dialect = upstream.dialect
    session = upstream.connected.get("session")
    client_id = app_connect.get("client-id") if app_connect is not None else None
    by_connection = client_id is None and dialect.temp_names == "activemq"
    return state.new_link(
        stable_message_ids=dialect.stable_message_ids,
        client_ack_per_subscription=dialect.client_ack_per_subscription,
        acks_ignore_subscription=dialect.acks_ignore_subscription,
        keeps_finished_browsers=dialect.keeps_finished_browsers,
        temp_names=dialect.temp_names,
        connection_id=session if by_connection else None,
    )


class Restorer:
    """Restores a session on a new leg, or ends it when reconnecting failed for good."""

    def __init__(
        self,
        core: SessionCore,
        out: AppOutput,
        control: ControlChannel,
        *,
        not_taken: Callable[[], list[tuple[Frame, str | None]]] = list,
    ) -> None:
        self.core = core
        self.out = out
        self.control = control
        #: The frames read from the app and not in the window yet (``AppSide.not_taken``).
        self.not_taken = not_taken

    async def begin(self, upstream: Upstream) -> LinkEnd:
        """Move the session to a new leg, before its relay starts (:func:`start_link`).

        On RabbitMQ, whose names of temporary queues are random, the temporary queues the old
        leg had made are made again here and their new names learned, so that the FAILOVER
        event can give them: the sidecar's own probe (:meth:`TempNames.probe`), read here since
        nothing else is on the leg yet; bounded by ``connect_timeout``. A probe the broker
        refuses (an ERROR, the leg lost, no answer in time) is not tried again in this session
        (the names are then reported unknown); a leg lost is left to the relay, which sees it.
        """
        core = self.core
        state = core.state
        assert state is not None
        async with core.leg.send_lock:
            end = start_link(state, upstream, core.asked.connect)
        names = [name for name, _ in end.temps]
        frames = state.temps.probe(f"{core.id}-t{state.generation}", names)
        if not frames:
            return end
        done = False
        with trio.move_on_after(core.durations.connect_timeout):
            with contextlib.suppress(TransportLost, protocol.ProtocolError):
                done = await self._probe(upstream, frames)
        if not done:
            state.temps.probing = False
            log.warning(
                "session %s: no names for the temporary queues made again on %s; not asked "
                "again in this session",
                core.id,
                upstream.broker.label,
            )
        return end

    async def _probe(self, upstream: Upstream, frames: list[Frame]) -> bool:
        """Send the probe, read the leg until every name is known; whether they all are."""
        core = self.core
        assert core.state is not None
        temps = core.state.temps
        for frame in frames:
            temps.note(frame)
            await _queue_on(upstream, frame)
        await upstream.flush()
        probe_id = frames[0].get("id") or ""
        try:
            while not temps.probed():
                event = await upstream.receive_event()
                if isinstance(event, ConnectionClosed):
                    return False
                if not isinstance(event, Frame):
                    continue
                if event.command is Command.MESSAGE:
                    temps.seen(event.get("subscription") or "", event)
                elif event.command is Command.ERROR:
                    # The broker's answer to the sidecar's own frame, not for the app.
                    log.warning(
                        "session %s: broker %s refused the probe of temporary queues: %s",
                        core.id,
                        upstream.broker.label,
                        event.get("message"),
                    )
                    return False
            return True
        finally:
            # Sent with the restore's frames; the private queue goes with its consumer.
            with contextlib.suppress(TransportLost, protocol.ProtocolError):
                upstream.queue(probe_end(probe_id))

    async def restore_quietly(
        self,
        upstream: Upstream,
        attempts: list[Attempt],
        loss: Loss,
        end: LinkEnd,
        *,
        paused_since: float | None = None,
    ) -> None:
        """:meth:`restore`; a leg lost meanwhile is left to the relay, which sees it too."""
        try:
            await self.restore(upstream, attempts, loss, end, paused_since=paused_since)
        except TransportLost:
            return

    async def restore(
        self,
        upstream: Upstream,
        attempts: list[Attempt],
        loss: Loss,
        end: LinkEnd,
        *,
        paused_since: float | None = None,
    ) -> None:
        """Re-create the session on a new leg (already begun: :meth:`begin`, whose ``end`` this
        reports) and replay the window.

        Runs beside the relay of the new leg. The FAILOVER event is written to the app before
        anything is sent, so the app hears of the failover before a message of the new leg.
        ``paused_since``: when a failback started holding the app's frames (trio seconds).
        """
        core = self.core
        state = core.state
        window = core.flow.window
        assert state is not None
        replay_tx = core.config.transaction_failover is TransactionFailover.REPLAY
        async with core.leg.send_lock:
            plan = plan_replay(state, window, replay_transactions=replay_tx)
            for entry in (*plan.answer, *plan.in_doubt, *plan.refused):
                window.drop(entry)
            core.flow.window_changed()
            # plan.replay, then what the app handed over while we reconnected
            replayed = {id(e) for e in plan.replay}
            entries = [*plan.replay, *(e for e in window if not e.sent and id(e) not in replayed)]
            frames = (*plan.subscribe, *plan.recreate)
            for frame in (*frames, *(e.frame for e in entries)):
                state.temps.note(frame)  # the order the new leg names temporary destinations
            await self._announce(upstream, plan, attempts, loss, end, paused_since=paused_since)
            for frame in frames:
                await _queue_on(upstream, frame)
            await self._replay(upstream, entries)
            state.subscriptions_restored()  # live again, but those the broker had refused
            core.leg.ready = True
            if core.phase is Phase.RECONNECTING:
                core.advance(Phase.RUNNING)
        with _app_writes():  # the app hears all of it, even if this leg is lost meanwhile
            for entry in plan.answer:
                if not entry.answered:
                    entry.answered = True
                    await self.out.answer_locally(entry.app_receipt)
                if entry is core.asked.disconnect_entry:
                    core.asked.disconnected.set()
            for entry in plan.refused:
                tx = entry.context
                if not entry.answered and isinstance(tx, Transaction) and tx.rolled_back:
                    entry.answered = True
                    await self.out.send(
                        error_frame(
                            rolled_back_message(tx.id, tx.rolled_back),
                            receipt_id=entry.app_receipt,
                            outcome=FrameOutcome.ROLLED_BACK,
                        )
                    )
            for entry in plan.in_doubt:
                if not entry.answered:
                    entry.answered = True
                    await self.out.send(
                        error_frame(
                            f"transaction outcome in doubt: the broker connection was lost before "
                            f"{entry.frame.command} was confirmed",
                            receipt_id=entry.app_receipt,
                            outcome=FrameOutcome.UNKNOWN,
                        )
                    )
            await self._interrupted(end)
            await self.control.report(
                after_restore(plan, core.config.failover_mode),
                f"restored on {upstream.broker.label} after: {loss.reason}",
            )

    async def _interrupted(self, end: LinkEnd) -> None:
        """An ERROR on each browser whose browse the failover cut short (the session stays)."""
        for sub in end.interrupted:
            name = f"'{sub.app_id}'" if sub.app_id is not None else "without id"
            message = (
                f"browse interrupted by a failover: subscription {name} to {sub.destination} "
                "ended before browser:end"
            )
            await self.out.send(
                error_frame(
                    message,
                    detail=f"{message}. The new broker connection does not browse again (that "
                    "would show the messages already browsed again); SUBSCRIBE again with "
                    "browser:true to browse the queue from its head.",
                ).with_header("subscription", sub.app_id or sub.upstream_id)
            )

    async def _replay(self, upstream: Upstream, entries: list[Entry]) -> None:
        """Send the window ``entries`` on the new leg, in order (under the send lock)."""
        core = self.core
        for entry in entries:
            if entry.sent:
                continue
            if not core.leg.dialect.cumulative_receipts and entry.frame.command is Command.SEND:
                core.flow.window.ensure_receipt(entry)
            entry.sent_at = trio.current_time()
            await _queue_on(upstream, entry.frame)
            entry.sent = True
        await upstream.flush()

    async def _announce(
        self,
        upstream: Upstream,
        plan: ReplayPlan,
        attempts: list[Attempt],
        loss: Loss,
        end: LinkEnd,
        *,
        paused_since: float | None,
    ) -> None:
        core = self.core
        state = core.state
        assert state is not None
        core.leg.failovers += 1
        to = upstream.broker.label
        lost_from, loss_reason = loss.broker, loss.reason
        now = trio.current_time()
        outage = now - loss.at
        outage_ms = round(outage * 1000)
        wall = time.time()
        reattached = to == lost_from
        core.leg.loss = None
        m = core.metrics
        if reattached:
            m.reattach(to, loss.kind)
        else:
            m.failover(lost_from or "", to, loss.kind)
        m.outage(outage, OutageOutcome.REATTACHED if reattached else OutageOutcome.FAILED_OVER)
        m.frames_replayed(plan.frames_sent)
        for outcome, txs in (
            (TransactionOutcome.REPLAYED, plan.transactions_replayed),
            (TransactionOutcome.ROLLED_BACK, plan.transactions_rolled_back),
            (TransactionOutcome.IN_DOUBT, plan.transactions_in_doubt),
        ):
            if txs:
                m.transaction(outcome, len(txs))
        temps = tuple((name, old, state.temps.name_of(name)) for name, old in end.temps)
        missed = state.missing_messages()
        if end.interrupted or missed:
            log.info(
                "session %s: failover interrupted %d browse(s); %d topic subscription(s) may "
                "have missed %d ms of messages",
                core.id,
                len(end.interrupted),
                len(missed),
                outage_ms,
            )
        log.warning(
            "session %s: %s %s -> %s after %d ms, %d attempt(s); replayed %d frame(s)",
            core.id,
            "reattached" if reattached else "failed over",
            lost_from,
            to,
            outage_ms,
            len(attempts),
            plan.frames_sent,
        )
        event = SessionEvent(
            EventKind.FAILOVER,
            core.id,
            loss_reason,
            from_broker=lost_from,
            to_broker=to,
            attempts=len(attempts),
            outage_ms=outage_ms,
            reattached=reattached,
            replayed_frames=plan.frames_sent,
            transactions_replayed=tuple(plan.transactions_replayed),
            transactions_rolled_back=tuple(plan.transactions_rolled_back),
            transactions_in_doubt=tuple(plan.transactions_in_doubt),
            redeliveries_hidden=state.redeliveries_hidden,
            duplicates_hidden=state.duplicates_hidden,
            renamed_destinations=tuple(
                (old, new) for _, old, new in temps if old and new and old != new
            ),
            temp_destinations=temps,
            browsers_interrupted=tuple((s.app_id, s.destination) for s in end.interrupted),
            topics_missed=tuple((s.app_id, s.destination) for s in missed),
            outage_start=wall - outage,
            outage_end=wall,
            app_held_ms=None if paused_since is None else round((now - paused_since) * 1000),
        )
        if core.tracer is not None:
            core.tracer.failover(event)
        with _app_writes():
            await self.control.publish(event)

    async def exhausted(self, exc: ReconnectExhausted, loss: Loss) -> None:
        """Reconnect failed for good: DISCONNECT event, ERROR naming every lost frame, end."""
        core = self.core
        # Stop taking frames from the app first: one submitted while the event is written
        # would be in neither the event's nor the ERROR's list of lost frames.
        core.app_scope.cancel()
        reports = unsettled(core.flow.window.drop_all(), OutcomeCause.RECONNECT_EXHAUSTED)
        # Read before anything yields: the frames a full window held up (read from the app,
        # never sent) are lost too (the app side, cancelled, forgets the one it was waiting
        # with when it next runs).
        reports += [
            report_of_frame(frame, receipt, FrameOutcome.LOST, OutcomeCause.RECONNECT_EXHAUSTED)
            for frame, receipt in self.not_taken()
        ]
        lost = [r.label for r in reports]
        core.flow.window_changed()
        core.metrics.outage(trio.current_time() - loss.at, OutageOutcome.DISCONNECTED)
        core.metrics.frames_lost(len(lost))
        reason = f"{loss.reason}; reconnect {exc}"
        await self.control.report(reports, reason)  # before the DISCONNECT, the last event
        core.leg.loss = None
        await self.control.publish(
            SessionEvent(
                EventKind.DISCONNECT,
                core.id,
                reason,
                from_broker=loss.broker,
                attempts=len(exc.attempts),
                frames_lost=tuple(lost),
                outage_start=time.time() - (trio.current_time() - loss.at),
            )
        )
        summary = frames_summary(reports, limit=SUMMARY_NAMES)
        core.end(
            Ending(
                f"reconnect exhausted: {reason}; {summary}",
                app_error=error_frame(
                    f"mq-sidecar lost the broker connection and could not reconnect; {summary}",
                    detail=f"{reason}\n{frames_summary(reports)}",
                ),
                disconnect_upstream=False,
                level=logging.ERROR,
            )
        )


async def _queue_on(upstream: Upstream, frame: Frame) -> None:
    """Queue ``frame`` on ``upstream``, flushing first when the out-buffer is full."""
    if upstream.needs_flush:
        await upstream.flush()
    upstream.queue(frame)


def _app_writes() -> trio.CancelScope:
    """A scope for a restore's writes to the app: they finish even when the leg is lost (or
    the session ends) meanwhile, since a write cancelled half way leaves the app a partial
    frame and ends its session (proxy.legs.stream); but within ``GOODBYE_TIMEOUT`` seconds."""
    return trio.CancelScope(shield=True, deadline=trio.current_time() + GOODBYE_TIMEOUT)
