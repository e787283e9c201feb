"""Broker → app: the relay of one upstream leg. MESSAGEs go through the session state (ack ids
mapped, redeliveries and duplicates hidden), RECEIPTs confirm the window, an ERROR reaches the
app with the app's own receipt id. The relay is the leg's only reader; it returns why the leg
was lost, and decides whether that loss ends the session instead of failing over."""

from __future__ import annotations

from dataclasses import dataclass, field

import trio

import protocol
from protocol import Command, ConnectionClosed, Frame, HeartBeat
from proxy.legs.broker import Upstream
from proxy.legs.dialect import RetryableError
from proxy.legs.stream import HeartBeatTimeout, TransportLost
from proxy.session.acks import SidecarAcks
from proxy.session.confirmations import Confirmations
from proxy.session.core import ERROR_CLOSE_WINDOW, GOODBYE_TIMEOUT, SessionCore, log
from proxy.session.ending import Ending
from proxy.session.to_app import AppOutput
from proxy.telemetry.events import EventKind, FrameReport, SessionEvent
from proxy.telemetry.vocabulary import FailoverReason, OutcomeCause
from proxy.tracking.streams import StreamGap

__all__ = ["BrokerSide"]


@dataclass(eq=False)
class BrokerSide:
    """Relays one leg at a time (:meth:`relay`), for the link task."""

    core: SessionCore
    acks: SidecarAcks
    out: AppOutput
    confirmations: Confirmations
    #: When the current leg last sent an ERROR (trio seconds).
    _error_at: float | None = field(default=None, init=False)

    async def relay(self, upstream: Upstream) -> tuple[str, FailoverReason]:
        """Relay broker → app until the leg is lost; returns why it was lost. Ends the
        session when the loss is the app's DISCONNECT completing, or the broker closing just
        after an ERROR (an application error, not a failover)."""
        core = self.core
        state = core.state
        assert state is not None
        kind = FailoverReason.CONNECTION_LOST
        try:
            while True:
                event = upstream.next_buffered()
                if event is None:
                    # The burst read so far is handled: what it queued for the app leaves
                    # in one write, before we wait for the broker again.
                    await self.out.flush()
                    event = await upstream.receive_event()
                if isinstance(event, HeartBeat):
                    continue
                if isinstance(event, ConnectionClosed):
                    reason = "broker closed the connection"
                    break
                if event.command is Command.ERROR:
                    retry = upstream.dialect.retryable_error(event)
                    if retry is not None:
                        # Not the app's error to see: the queue is unavailable for now. The
                        # leg is given up (the broker closes it anyway) and the session
                        # reconnects with its window, the refused frame in it.
                        reason = _retry_reason(event, retry)
                        kind = FailoverReason.QUEUE_UNAVAILABLE
                        state.subscriptions_refused(event, retry.subscriptions, trio.current_time())
                        log.warning("session %s: %s; reconnecting", core.id, reason)
                        break
                await self._on_frame(upstream, event)
        except HeartBeatTimeout as exc:
            reason, kind = f"broker silent: {exc}", FailoverReason.HEARTBEAT_TIMEOUT
        except TransportLost as exc:
            reason = f"connection lost: {exc}"
        except protocol.RemoteProtocolError as exc:
            reason, kind = f"broker sent invalid STOMP: {exc}", FailoverReason.PROTOCOL_ERROR
        error_at, self._error_at = self._error_at, None
        closed_after_error = (
            error_at is not None
            and kind is FailoverReason.CONNECTION_LOST
            and trio.current_time() - error_at < ERROR_CLOSE_WINDOW
        )
        if core.asked.disconnect_entry is not None and core.asked.disconnected.is_set():
            core.end(Ending("app disconnected", disconnect_upstream=False))
        elif closed_after_error:
            # An ERROR answering the app's own frame is an application error, not a
            # failover; the broker closes after it, and so does the session. (A broker that
            # kept the connection after a non-fatal ERROR and dies later fails over.)
            kind = FailoverReason.BROKER_ERROR
            await self._name_unconfirmed(reason)
            core.end(Ending(f"{reason} after an ERROR", disconnect_upstream=False))
        return reason, kind

    async def _name_unconfirmed(self, reason: str) -> None:
        """The broker closed just after an ERROR and the session ends with it: every frame
        still unconfirmed in the window is named to the app (OUTCOME, cause
        ``broker_closed``) and counted as lost, before the end (docs/behaviour.md, "Frame
        outcomes"). Frames the outbox holds are not lost: it forwards them later."""
        with trio.move_on_after(GOODBYE_TIMEOUT):  # an app that stopped reading
            await self.confirmations.control.name_unconfirmed(
                OutcomeCause.BROKER_CLOSED,
                f"the broker closed the connection after an ERROR ({reason})",
            )

    async def _on_frame(self, upstream: Upstream, frame: Frame) -> None:
        command = frame.command
        if command is Command.MESSAGE:
            charge = self.core.upstream_charge
            if charge is not None and not charge.receiving:
                charge.receives()  # a reply to a temporary queue: no SUBSCRIBE of its own
            await self._on_message(upstream, frame)
        elif command is Command.RECEIPT:
            await self.confirmations.confirm(frame.get("receipt-id") or "")
        elif command is Command.ERROR:
            await self._on_error(upstream, frame)
        else:  # CONNECTED twice: protocol.Connection already rejects it
            log.warning("session %s: unexpected %s from broker ignored", self.core.id, command)

    async def _on_message(self, upstream: Upstream, frame: Frame) -> None:
        core = self.core
        state = core.state
        assert state is not None
        while state.unacked >= state.max_unacked and not core.drain.requested:
            # Bounded: stop reading the broker until the app acknowledges (max_unacked). The
            # event is made before the flush: the app's ACKs may all arrive while the flush
            # writes, and an event made after it would wait for one more ACK that never comes
            # (the app holds nothing to acknowledge any more): the session would stall.
            core.flow.acks_freed = trio.Event()
            await self.out.flush()
            if state.unacked >= state.max_unacked and not core.drain.requested:
                await core.flow.acks_freed.wait()
        if core.drain.requested and self._acked_by_the_app(frame):
            # Draining (SIGTERM): the app is no longer read, so it could not acknowledge
            # this; held back and not acknowledged (every subscription the sidecar tracks is
            # client-acked upstream), it goes back to the broker's queue at the DISCONNECT
            # for another consumer (STOMP 1.2 "SUBSCRIBE ack Header"). The broker is still
            # read, for the receipts the app waits for (docs/behaviour.md, "Drain").
            core.drain.messages_not_shown += 1
            return
        decision = state.deliver(frame, upstream_version=upstream.version, now=trio.current_time())
        if state.seen_out:
            # An auto subscription's message: its id is persisted once the app has it.
            self.out.seen.extend(state.seen_out)
            state.seen_out.clear()
        if state.stream_notes:
            # A stream subscription whose MESSAGE's x-stream-offset is not a number: a queue
            # from now on (docs/behaviour.md, "Streams"); logged once per subscription.
            for note in state.stream_notes:
                log.warning("session %s: %s", core.id, note)
            state.stream_notes.clear()
        if state.stream_gaps:
            await self._report_gaps(state.stream_gaps)
            state.stream_gaps.clear()
        if core.tracer is not None:
            core.tracer.message(frame, decision.to_app, decision.hidden)
        if decision.to_app is not None:
            core.metrics.frame_to_app(Command.MESSAGE, len(decision.to_app.body))
            await self.out.send(decision.to_app, flush=False)
        elif decision.hidden is not None:
            core.metrics.duplicates_suppressed()
        if decision.to_broker is None:
            return
        if decision.coalesce is not None:
            # An auto subscription's cumulative ACK (shown or hidden message): the last of
            # the burst goes after the app's flush and settles all of them.
            if self.acks.coalesce(decision.coalesce, decision.to_broker):
                await self.out.flush()
        elif decision.to_app is None:
            # A hidden message: the app never sees it, so its ACK goes on the leg now, ahead
            # of any ACK the app sends for later deliveries (a cumulative ACK of a `client`
            # subscription would otherwise cover it first: RabbitMQ then closes the
            # connection on the "unknown delivery tag").
            await self.acks.send(upstream, decision.to_broker)
        elif self.acks.defer(decision.to_broker):
            # The sidecar's ACK of an auto subscription's message goes only after the app
            # has it: held until the app's out-buffer is written (AppOutput.flush).
            await self.out.flush()

    async def _report_gaps(self, gaps: list[StreamGap]) -> None:
        """Name stream offsets a resumed leg skipped (retention removed them) to the app: a
        STREAM_GAP event (logged by the event log), written before the MESSAGE that follows
        them, and counted (docs/behaviour.md, "Streams")."""
        core = self.core
        for gap in gaps:
            core.metrics.stream_offsets_missed(gap.count)
        broker = core.leg.upstream.broker.label if core.leg.upstream is not None else None
        await self.confirmations.control.publish(
            SessionEvent(
                EventKind.STREAM_GAP,
                core.id,
                "offsets no longer in the stream (retention)",
                to_broker=broker,
                offsets_missed=tuple(
                    (g.subscription, g.destination, g.first, g.last) for g in gaps
                ),
                offsets_missed_count=sum(g.count for g in gaps),
            )
        )

    def _acked_by_the_app(self, message: Frame) -> bool:
        """Whether ``message`` belongs to a subscription of the app's that the sidecar tracks
        (so the broker waits for its ACK); not one passed through untracked, nor a reply to a
        temporary queue, which may be ``auto`` upstream (holding those back would lose them)."""
        state = self.core.state
        assert state is not None
        sub = state.subscriptions.get(message.get("subscription") or "")
        return sub is not None and not sub.local

    async def _on_error(self, upstream: Upstream, frame: Frame) -> None:
        core = self.core
        error_receipt = frame.get("receipt-id")
        out = frame
        refused: list[FrameReport] = []
        if error_receipt is not None:
            out, refused = await self.confirmations.confirm_by_error(frame, error_receipt)
        message = frame.get("message")
        log.warning("session %s: broker %s sent ERROR: %s", core.id, upstream.broker.label, message)
        self._error_at = trio.current_time()
        core.metrics.frame_to_app(Command.ERROR, len(out.body))
        await self.out.send(out)
        # The broker's ERROR reaches the app unchanged (transparency); the event names the
        # frame it refused by its mq-sidecar-id too.
        await self.confirmations.control.report(refused, f"the broker refused it: {message}")


def _retry_reason(error: Frame, retry: RetryableError) -> str:
    """One line for a retryable ERROR: the broker's message and the first line of its body."""
    body = error.body.decode("utf-8", "replace").strip().splitlines()
    detail = f": {body[0][:200]}" if body else ""
    return f"broker ERROR {error.get('message')}{detail} ({retry.meaning})"
