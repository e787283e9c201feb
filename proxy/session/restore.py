"""After a reconnect: re-create the session on the new leg (subscriptions, transactions,
temporary destinations), replay what the old broker never confirmed, and tell the app
(FAILOVER); or, when the policy gives up, tell the app what was lost (DISCONNECT).

What to replay is decided by the pure :func:`proxy.replay.plan_replay`; this module carries it
out on the leg and reports it (events, metrics, log).
"""

from __future__ import annotations

import logging

import trio

from config import TransactionFailover
from protocol import Command, Frame
from proxy.events import EventKind, SessionEvent
from proxy.failover import Attempt, ReconnectExhausted
from proxy.replay import ReplayPlan, plan_replay
from proxy.session.control import ControlChannel
from proxy.session.core import SessionCore, log
from proxy.session.ending import Ending, Loss, error_frame
from proxy.session.phase import Phase
from proxy.session.to_app import AppOutput
from proxy.upstream import Upstream
from proxy.vocabulary import OutageOutcome, TransactionOutcome
from proxy.wire import TransportLost

__all__ = ["Restorer"]


class Restorer:
    """Restores a session on a new leg, or ends it when reconnecting failed for good."""

    def __init__(self, core: SessionCore, out: AppOutput, control: ControlChannel) -> None:
        self.core = core
        self.out = out
        self.control = control

    async def restore_quietly(
        self, upstream: Upstream, attempts: list[Attempt], loss: Loss
    ) -> None:
        """:meth:`restore`; a leg lost meanwhile is left to the relay, which sees it too."""
        try:
            await self.restore(upstream, attempts, loss)
        except TransportLost:
            return

    async def restore(self, upstream: Upstream, attempts: list[Attempt], loss: Loss) -> None:
        """Re-create the session on a new leg and replay the window.

        Runs beside the relay of the new leg. The FAILOVER event is written to the app before
        anything is sent, so the app hears of the failover before a message of the new leg.
        """
        core = self.core
        state = core.state
        window = core.window
        assert state is not None
        replay_tx = core.config.transaction_failover is TransactionFailover.REPLAY
        async with core.send_lock:
            state.new_link(
                stable_message_ids=upstream.stable_message_ids,
                client_ack_per_subscription=upstream.client_ack_per_subscription,
                acks_ignore_subscription=upstream.acks_ignore_subscription,
            )
            plan = plan_replay(state, window, replay_transactions=replay_tx)
            for entry in (*plan.answer, *plan.in_doubt):
                window.drop(entry)
            core.window_changed()
            await self._announce(upstream, plan, attempts, loss)
            for frame in (*plan.subscribe, *plan.recreate):
                await _queue_on(upstream, frame)
            for entry in (*plan.replay, *(e for e in window if not e.sent)):
                # plan.replay, then what the app handed over while we reconnected
                if entry.sent:
                    continue
                if not core.cumulative_receipts and entry.frame.command is Command.SEND:
                    window.ensure_receipt(entry)
                entry.sent_at = trio.current_time()
                await _queue_on(upstream, entry.frame)
                entry.sent = True
            await upstream.flush()
            core.link_ready = True
            if core.phase is Phase.RECONNECTING:
                core.advance(Phase.RUNNING)
        for entry in plan.answer:
            if not entry.answered:
                entry.answered = True
                await self.out.answer_locally(entry.app_receipt)
            if entry is core.disconnect_entry:
                core.disconnected.set()
        for entry in plan.in_doubt:
            if not entry.answered:
                entry.answered = True
                await self.out.send(
                    error_frame(
                        f"transaction outcome in doubt: the broker connection was lost before "
                        f"{entry.frame.command} was confirmed",
                        receipt_id=entry.app_receipt,
                    )
                )

    async def _announce(
        self, upstream: Upstream, plan: ReplayPlan, attempts: list[Attempt], loss: Loss
    ) -> None:
        core = self.core
        state = core.state
        assert state is not None
        core.failovers += 1
        to = upstream.broker.label
        lost_from, loss_reason = loss.broker, loss.reason
        outage = trio.current_time() - loss.at
        outage_ms = round(outage * 1000)
        reattached = to == lost_from
        core.loss = None
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
        await self.control.publish(
            SessionEvent(
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
                    (s.destination, "re-created")
                    for s in state.subscriptions.values()
                    if "/temp-" in s.destination
                ),
            )
        )

    async def exhausted(self, exc: ReconnectExhausted, loss: Loss) -> None:
        """Reconnect failed for good: DISCONNECT event, ERROR naming every lost frame, end."""
        core = self.core
        # Stop taking frames from the app first: one submitted while the event is written
        # would be in neither the event's nor the ERROR's list of lost frames.
        core.app_scope.cancel()
        lost = [e.label for e in core.window.drop_all()]
        core.window_changed()
        core.loss = None
        core.metrics.outage(trio.current_time() - loss.at, OutageOutcome.DISCONNECTED)
        core.metrics.frames_lost(len(lost))
        reason = f"{loss.reason}; reconnect {exc}"
        await self.control.publish(
            SessionEvent(
                EventKind.DISCONNECT,
                core.id,
                reason,
                from_broker=loss.broker,
                attempts=len(exc.attempts),
                frames_lost=tuple(lost),
            )
        )
        summary = f"{len(lost)} frame(s) not confirmed" + (f": {', '.join(lost)}" if lost else "")
        core.end(
            Ending(
                f"reconnect exhausted: {reason}; {summary}",
                app_error=error_frame(
                    f"mq-sidecar lost the broker connection and could not reconnect; {summary}",
                    detail=f"{reason}\n{summary}",
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
