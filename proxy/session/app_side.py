"""App → broker: read the app's frames in bursts and handle each by its command (a table of
handlers), through the session state (subscriptions, ack ids, transactions) into the
confirmation window; the last frame of a burst asks for a receipt.

A frame the session does not track (an id or transaction it does not know, a header it needs
missing: :class:`proxy.tracking.ForBroker`) goes to the broker as the app sent it, and the
broker's answer reaches the app: the broker judges what is not the sidecar's to judge. A frame
the sidecar itself must refuse (its own limits and ids) gets an ERROR:
:class:`proxy.tracking.FrameRejected` refuses that frame and keeps the session,
:class:`proxy.tracking.SessionError` ends it.

The fast lane (docs/architecture.md, "The fast lane"): an ordinary SEND outside transactions,
while the session runs on a ready leg, is read, spliced, kept in the window and written as its
bytes (:class:`protocol.RawFrame`), by the same handler as any SEND; anything else is parsed.
Scheduling, chosen for the cost of a trip through trio's scheduler against fairness: one read
(up to ``proxy.legs.stream.RECEIVE_SIZE`` bytes) per wakeup, every complete frame of it handled
without a checkpoint of its own (a frame's awaits yield only for a full window, an out-buffer
past ``FLUSH_THRESHOLD`` or a failback's hold), one write per burst. Cancellation is seen at
the next read; other sessions wait for at most one read's worth of frames.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable

import trio

import protocol
from config import TransactionFailover
from protocol import Command, ConnectionClosed, Frame, HeartBeat, RawFrame
from proxy.legs.opening import StreamOpener
from proxy.legs.stream import HeartBeatTimeout, TransportLost
from proxy.session.confirmations import Confirmations, StaleSettlement
from proxy.session.control import SCOPE_HEADER, ControlChannel, scope_refused
from proxy.session.core import SessionCore, log
from proxy.session.ending import Ending, error_frame, rolled_back_message, summary
from proxy.session.outbox import SessionOutbox
from proxy.session.outbox_transactions import OutboxTransactions
from proxy.session.outcomes import unsettled
from proxy.session.phase import Phase
from proxy.session.sends import UpstreamSends
from proxy.session.to_app import AppOutput
from proxy.session.verdict import answer_unknown_command
from proxy.telemetry.events import report_of_frame
from proxy.telemetry.vocabulary import ClientErrorReason, FrameOutcome, OutcomeCause
from proxy.tracking import (
    PASS_THROUGH,
    STREAM_CREDIT,
    TRANSACTION_OVERHEAD,
    DurableRemoval,
    ForBroker,
    FrameRejected,
    SessionError,
    StoredInOutbox,
    Transaction,
)
from proxy.tracking.window import frame_size

__all__ = ["AppSide", "TransactionRolledBack"]

#: How many transactions aborted by the sidecar a session remembers (their later frames are
#: refused by the sidecar; an older one's go to the broker, which no longer knows it).
_ABORTED_REMEMBERED = 64


class TransactionRolledBack(FrameRejected):
    """The COMMIT of a transaction the sidecar rolled back (a failover with
    ``transaction_failover = rollback``, GigaSpaces' TransactionRolledBackException; or a frame
    of it dropped at ``call_timeout``): refused, outcome ``rolled_back``."""


#: A command handler: (frame, idle) -> True when the app's DISCONNECT has been handled.
_Handler = Callable[[Frame, bool], Awaitable[bool]]
#: One read of the app: a frame, its bytes, a heart-beat, EOF, or an unknown command's frame.
_Read = Frame | RawFrame | HeartBeat | ConnectionClosed | protocol.UnknownCommand


class AppSide:
    """Reads the app and dispatches its frames (:meth:`relay`)."""

    def __init__(
        self,
        core: SessionCore,
        out: AppOutput,
        control: ControlChannel,
        confirmations: Confirmations,
        open_stream: StreamOpener,
    ) -> None:
        self.core = core
        self.open_stream = open_stream  # to ask a broker (proxy.session.verdict)
        self.out = out
        self.control = control
        self.confirmations = confirmations
        #: The session's part of the outbox and its held transactions (``outbox`` on;
        #: :meth:`use_outbox`).
        self.outbox: SessionOutbox | None = None
        self.outbox_transactions: OutboxTransactions | None = None
        #: SENDs as they go upstream (their duplicate-detection ids).
        self.sends = UpstreamSends(core)
        #: Transactions the sidecar aborted (max_transaction_size), newest last, at most
        #: :data:`_ABORTED_REMEMBERED`: their later frames are the sidecar's to refuse.
        self._aborted: OrderedDict[str, str] = OrderedDict()
        #: The relay waits for the app's next bytes (between bursts: nothing half-handled).
        self._waiting = False
        #: Set when the drain has stopped the reading: every frame read is in the window.
        self.reading_stopped = trio.Event()
        #: Frames (and receipt ids) a read under way brought after the drain stopped: refused.
        self.after_stop: list[tuple[Frame, str | None]] = []
        #: The frame read ahead of the one being handled (None between bursts).
        self._upcoming: _Read | None = None
        self._handlers: dict[Command, _Handler] = {
            Command.SEND: self._send,
            Command.SUBSCRIBE: self._subscribe,
            Command.UNSUBSCRIBE: self._unsubscribe,
            Command.ACK: self._settle,
            Command.NACK: self._settle,
            Command.BEGIN: self._begin,
            Command.COMMIT: self._end_transaction,
            Command.ABORT: self._end_transaction,
            Command.DISCONNECT: self._disconnect,
        }

    def use_outbox(self, outbox: SessionOutbox) -> None:
        """Outbox mode: SENDs the outbox takes are stored (:mod:`proxy.session.outbox`), and
        transactions of only such SENDs are held until COMMIT
        (:mod:`proxy.session.outbox_transactions`)."""
        self.outbox = outbox
        self.outbox_transactions = OutboxTransactions(
            self.core, self.out, outbox, self.sends.parsed, self._handlers
        )

    def not_taken(self) -> list[tuple[Frame, str | None]]:
        """The frames read from the app that are not in the window, with their receipt ids
        (the drain names them at its deadline, when a full window held the burst up): the one
        waiting for room, the one read ahead of it, every complete frame left in the read
        buffer. Takes them out of the buffer: call it only when the session ends."""
        held = self.confirmations.waiting
        pending = [held] if held is not None else []
        upcoming = self._upcoming
        while isinstance(upcoming, Frame | RawFrame | HeartBeat):
            if not isinstance(upcoming, HeartBeat):
                pending.append((upcoming, upcoming.get("receipt")))
            try:
                upcoming = self.core.app.next_buffered()
            except protocol.RemoteProtocolError:
                break
        return [(f.to_frame() if isinstance(f, RawFrame) else f, r) for f, r in pending]

    def stop_reading(self) -> None:
        """Take no more frames from the app (the drain on SIGTERM): the burst being handled
        is finished (every frame read goes into the window), then :meth:`relay` returns and
        sets :attr:`reading_stopped`; a relay waiting for the app between bursts has nothing
        to finish, so the reading stops at once (:attr:`reading_stopped` set here), and what
        that wait brings later is not taken (:attr:`after_stop`, named as the session ends).
        Call after setting ``core.drain.requested``. No cancel scope around each read for this
        (3.6 us a read, a synchronous round trip's cost; one cancelled may read all the same)."""
        if self._waiting:
            self.reading_stopped.set()

    async def relay(self, *, first: Frame | None = None) -> None:
        """Relay app → broker until the app leaves or breaks the protocol (the session
        ends), the drain stops the reading (:meth:`stop_reading`; the session goes on) or the
        app side is cancelled. ``first``: a frame read before, handled first (the frame that
        opened an implicitly connected session, ``AppRequests.implicit_first``)."""
        core = self.core
        if first is not None and await self._dispatch(first, True):
            return
        while True:
            # The burst read so far is handled: what went to the outbox is stored and answered, what
            # it queued for the broker leaves in one write, before we wait for the app again.
            if self.outbox is not None and self.outbox.pending:
                await self.outbox.write()
            await self.confirmations.flush_upstream()
            if core.drain.requested:
                # Hypercorn's and Envoy's drain: no new work, what is in flight finishes.
                self.reading_stopped.set()
                return
            self._waiting = True
            try:
                event: _Read = await core.app.receive_fast_event()
            except protocol.UnknownCommand as exc:
                event = exc
            except HeartBeatTimeout as exc:
                if not self.reading_stopped.is_set():  # else the drain stopped the reading
                    core.metrics.client_protocol_error(ClientErrorReason.HEARTBEAT_TIMEOUT)
                    # Closed with no frame where the broker does so (BrokerDialect).
                    quiet = core.leg.dialect.closes_silent_clients_quietly
                    error = None if quiet else error_frame(f"heart-beat timeout: {exc}")
                    core.end(Ending(f"app silent: {exc}", app_error=error))
                return
            except TransportLost as exc:
                if not self.reading_stopped.is_set():
                    core.end(Ending(f"app connection lost: {exc}"))
                return
            except protocol.RemoteProtocolError as exc:
                if not self.reading_stopped.is_set():
                    core.end_for_app_protocol_error(exc)
                return
            finally:
                self._waiting = False
            if self.reading_stopped.is_set():
                # The drain stopped the reading during the wait (stop_reading): what the wait
                # brought is not taken but named; what the app writes after it stays unread.
                self._upcoming = event
                self.after_stop = self.not_taken()
                self._upcoming = None  # named once: not again by the drain's deadline
                return
            # Handle the burst already read; the last frame of it gets a receipt (idle).
            while True:
                if isinstance(event, ConnectionClosed):
                    core.end(Ending("app closed the connection"))
                    return
                try:
                    upcoming: _Read | None = core.app.next_buffered_fast()
                except protocol.UnknownCommand as exc:
                    upcoming = exc  # consumed by the read: handled in its turn
                except protocol.RemoteProtocolError as exc:
                    upcoming = None  # reported when read again, after this frame
                    core.app_broke = exc
                self._upcoming = upcoming
                if core.flow.failback_hold is not None:
                    await core.frame_boundary()  # a failback holds the app (session.link)
                if isinstance(event, protocol.UnknownCommand):
                    await self.confirmations.flush_upstream()
                    if await answer_unknown_command(core, event, self.out, self.open_stream):
                        return
                elif isinstance(event, Frame | RawFrame) and await self._dispatch(
                    event, upcoming is None
                ):
                    return
                if upcoming is None:
                    del event  # an idle session holds no frame of its app's (a large one...)
                    break
                event = upcoming

    async def _dispatch(self, frame: Frame | RawFrame, idle: bool) -> bool:
        """Handle one app frame; True when the session is over (DISCONNECT, or a
        :class:`SessionError` that ended it). A :class:`protocol.RawFrame` takes the fast
        lane when :meth:`_fast_lane` allows, else it is parsed and handled as any frame."""
        core = self.core
        if isinstance(frame, RawFrame):
            if self._fast_lane(frame):
                # A SEND outside transactions: nothing in _send can refuse it.
                return await self._send(frame, idle)
            frame = frame.to_frame()
        handler = self._handlers.get(frame.command)
        try:
            if handler is None:  # CONNECT/STOMP again: protocol.Connection rejects these first
                raise SessionError(f"unexpected {frame.command} frame")
            if self._aborted and frame.get("transaction") in self._aborted:
                return await self._in_aborted_transaction(frame)
            outbox = self.outbox
            if outbox is not None and outbox.pending and not self._goes_to_outbox(frame):
                await outbox.write()  # the app's frames are handled in the order it sent them
            if self.outbox_transactions is not None and self.outbox_transactions.takes(frame):
                return await self.outbox_transactions.handle(frame, idle)
            return await handler(frame, idle)
        except ForBroker as exc:
            log.debug("session %s: %s goes to the broker as it is", core.id, exc)
            await self._pass_through(frame, idle)
            return False
        except FrameRejected as exc:
            core.metrics.client_protocol_error(ClientErrorReason.INVALID_REQUEST)
            rolled_back = isinstance(exc, TransactionRolledBack)
            outcome = FrameOutcome.ROLLED_BACK if rolled_back else FrameOutcome.REFUSED
            await self._refuse(frame, str(exc), outcome)
            return False
        except SessionError as exc:
            core.metrics.client_protocol_error(ClientErrorReason.INVALID_REQUEST)
            core.end(
                Ending(
                    f"app error: {exc}",
                    app_error=error_frame(str(exc), receipt_id=frame.get("receipt")),
                    level=logging.WARNING,
                )
            )
            return True

    async def _refuse(self, frame: Frame, reason: str, outcome: FrameOutcome) -> None:
        """The sidecar's ERROR refusing one app frame (the session goes on), and its OUTCOME
        event: ``rolled_back`` for the COMMIT of a transaction a failover rolled back,
        ``refused`` for the others (a stale ack id, a limit, a NACK to a STOMP 1.0 broker)."""
        report = report_of_frame(frame, frame.get("receipt"), outcome, OutcomeCause.SIDECAR_ERROR)
        await self.out.send(
            error_frame(
                reason,
                receipt_id=report.receipt,
                outcome=outcome,
                duplicate_id=report.mq_sidecar_id,
            )
        )
        await self.control.report([report], reason)

    async def _pass_through(self, frame: Frame, idle: bool) -> None:
        """Send ``frame`` upstream as the app sent it, untracked (the window still maps the
        app's receipt id, so the broker's RECEIPT or ERROR reaches the app with it)."""
        await self.confirmations.submit(
            frame.without("receipt"),
            app_receipt=frame.get("receipt"),
            idle=idle,
            context=PASS_THROUGH,
        )

    def _fast_lane(self, frame: RawFrame) -> bool:
        """Whether a SEND read as its bytes goes on as bytes (docs/architecture.md, "The
        fast lane"): the session is RUNNING on a leg that takes frames as they come (not
        reconnecting, no restore writing the window) and the SEND names no transaction (a
        tracked transaction's frames are charged, held and re-run: the general path). What
        the SEND then goes through (:meth:`UpstreamSends.upstream`, the window, the leg) is the
        general path's code on the bytes, which writes what the general path writes."""
        core = self.core
        return (
            frame.command is Command.SEND
            and self.outbox is None  # the outbox stores Frames (docs/outbox.md)
            and core.leg.ready
            and core.phase is Phase.RUNNING
            and not frame.has("transaction")
        )

    # -- one handler per command ------------------------------------------------------------

    def _goes_to_outbox(self, frame: Frame) -> bool:
        """A SEND outside a transaction to a destination the outbox takes (docs/outbox.md).
        Transactions keep the usual path (their SENDs are not stored at COMMIT yet)."""
        outbox = self.outbox
        return (
            outbox is not None
            and frame.command is Command.SEND
            and frame.get("transaction") is None
            and outbox.takes(frame)
        )

    async def _send(self, frame: Frame | RawFrame, idle: bool) -> bool:
        state = self.core.state
        assert state is not None
        up, app_receipt = self.sends.upstream(frame)
        outbox = self.outbox
        if outbox is not None and isinstance(frame, Frame) and self._goes_to_outbox(frame):
            # Stored, answered once durable, forwarded by the outbox (not in the window now).
            # A session with an outbox takes no fast lane (_fast_lane): `up` is a Frame.
            assert isinstance(up, Frame)
            if outbox.add(up, app_receipt) or idle:
                await outbox.write()
            return False
        # A RawFrame names no transaction (_fast_lane).
        tx = None if isinstance(frame, RawFrame) else state.transaction_of(frame)
        if tx is not None and tx.rolled_back:
            await self.out.answer_locally(app_receipt)  # COMMIT will fail, ABORT succeeds
            return False
        keep = self._replay_transactions
        charge = keep or self._confirmed_at_commit
        if tx is not None and charge:
            await self._within_transaction_budget(tx, frame_size(up), idle)
        entry = await self.confirmations.submit(up, app_receipt=app_receipt, idle=idle, context=tx)
        if tx is not None:
            tx.sent(entry, keep=keep, charge=charge)
        return False

    @property
    def _confirmed_at_commit(self) -> bool:
        """The broker confirms a transaction's SENDs and ACKs only at its COMMIT (RabbitMQ,
        docs/brokers.md, "Receipts"): the window holds them until then."""
        return not self.core.leg.dialect.cumulative_receipts

    async def _in_aborted_transaction(self, frame: Frame) -> bool:
        """A frame naming a transaction the sidecar aborted: its ABORT is answered (and the
        transaction forgotten), anything else refused naming why. The broker no longer knows
        the transaction (RabbitMQ answers "Bad transaction" without the frame's receipt id,
        which would leave the frame unconfirmed in the window for good)."""
        tx = frame.get("transaction") or ""
        if frame.command is Command.ABORT:
            del self._aborted[tx]
            await self.out.answer_locally(frame.get("receipt"))
            return False
        raise FrameRejected(f"{frame.command} in transaction '{tx}': {self._aborted[tx]}")

    @property
    def _replay_transactions(self) -> bool:
        """``transaction_failover = replay``: a transaction's SENDs are kept to re-run it."""
        return self.core.config.transaction_failover is TransactionFailover.REPLAY

    async def _within_transaction_budget(self, tx: Transaction, cost: int, idle: bool) -> None:
        """Abort ``tx`` upstream and refuse the app's frame when ``cost`` more bytes would take
        the session's open transactions past ``max_transaction_size`` (bytes; what they hold
        to be re-run after a failover: docs/behaviour.md, "Transactions").

        Raises:
            FrameRejected: naming the option; the transaction is aborted (the broker forgets
                its frames, the app holds again what its ACKs settled).
        """
        state = self.core.state
        assert state is not None
        limit = self.core.config.max_transaction_size
        if state.transaction_bytes.used + cost <= limit:
            return
        held = state.transaction_bytes.used
        abort = Frame(Command.ABORT, (("transaction", tx.id),))
        state.close_transaction(abort, now=trio.current_time())
        tx.end = await self.confirmations.submit(abort, app_receipt=None, idle=idle, context=tx)
        why = (
            f"transaction '{tx.id}' aborted: its frames would take the session's open "
            f"transactions past max_transaction_size ({limit} bytes; {held} held)"
        )
        self._aborted[tx.id] = why
        if len(self._aborted) > _ABORTED_REMEMBERED:
            self._aborted.popitem(last=False)
        raise FrameRejected(why)

    async def _subscribe(self, frame: Frame, idle: bool) -> bool:
        core = self.core
        state = core.state
        assert state is not None
        if core.upstream_charge is not None:  # its broker leg may get MESSAGEs of any size
            core.upstream_charge.receives()
        app_receipt = frame.get("receipt")
        if frame.get("destination") == core.config.events_destination:
            every_session = frame.get(SCOPE_HEADER) == "all"
            if every_session and not core.asked.authenticated:
                core.metrics.client_protocol_error(ClientErrorReason.INVALID_REQUEST)
                await self.out.send(scope_refused(app_receipt))
                return False
            state.subscribe(frame, local=True)  # the control channel never goes upstream
            if every_session and not self.control.pumping:
                assert core.app_nursery is not None
                self.control.pumping = True
                await core.app_nursery.start(self.control.pump)
            await self.out.answer_locally(app_receipt)
            return False
        if core.leg.dialect.refuses_durable_without_id(frame):
            raise ForBroker("durable SUBSCRIBE without id")  # RabbitMQ refuses it
        upstream = state.subscribe(frame)
        if not core.leg.ready:  # no leg has it: restoring until a restore sends it
            state.subscriptions[upstream.get("id") or ""].health.lost(trio.current_time())
        if core.seen is not None:  # outbox mode: before the SUBSCRIBE goes upstream
            await core.seen.seed(state, upstream.get("id") or "", now=trio.current_time())
        if core.leg.dialect.subscribe_receipt_breaks(upstream.get("destination") or ""):
            # No receipt on the SUBSCRIBE itself (it can make ActiveMQ dispatch none of the
            # waiting messages): an empty transaction after it carries the receipt, which
            # confirms the SUBSCRIBE too (one connection's frames are processed in order).
            await self.confirmations.submit(
                upstream, app_receipt=app_receipt, idle=False, receipted=False
            )
            tx = core.internal_transaction()
            await self.confirmations.submit(
                Frame(Command.BEGIN, (("transaction", tx),)), app_receipt=None, idle=False
            )
            await self.confirmations.submit(
                Frame(Command.ABORT, (("transaction", tx),)), app_receipt=None, idle=idle
            )
            return False
        await self.confirmations.submit(upstream, app_receipt=app_receipt, idle=idle)
        return False

    async def _unsubscribe(self, frame: Frame, idle: bool) -> bool:
        core = self.core
        state = core.state
        assert state is not None
        if core.leg.dialect.refuses_durable_without_id(frame):
            raise ForBroker("durable UNSUBSCRIBE without id")  # RabbitMQ refuses it
        app_receipt = frame.get("receipt")
        bare = frame.without("receipt")
        sub = state.unsubscribe(frame)
        if sub is not None and sub.local:
            await self.out.answer_locally(app_receipt)
            return False
        core.flow.acks_freed.set()
        if sub is None:
            # No live subscription: e.g. ActiveMQ's removal of a durable subscription
            # (UNSUBSCRIBE with activemq.subscriptionName after the consumer closed).
            # The broker decides; its ERROR, if any, reaches the app.
            await self.confirmations.submit(
                bare, app_receipt=app_receipt, idle=idle, context=PASS_THROUGH
            )
        else:
            rest = bare.without("id", "destination")
            upstream = rest.replace(headers=(("id", sub.upstream_id), *rest.headers))
            durable = frame.get("durable") == "true"
            context = DurableRemoval(sub.frame) if durable else None
            await self.confirmations.submit(
                upstream, app_receipt=app_receipt, idle=idle, context=context
            )
        return False

    async def _settle(self, frame: Frame, idle: bool) -> bool:
        """ACK or NACK."""
        core = self.core
        state = core.state
        assert state is not None
        app_receipt = frame.get("receipt")
        bare = frame.without("receipt")
        upstream_version = core.leg.upstream.version if core.leg.upstream else "1.2"
        if frame.command is Command.NACK and upstream_version == "1.0":
            raise FrameRejected("NACK is not possible: the broker speaks STOMP 1.0")
        if (
            frame.command is Command.NACK
            and state.app_version == "1.0"
            and not core.leg.dialect.rabbitmq_stomp10_rules
        ):
            raise ForBroker("NACK from a STOMP 1.0 app")  # ActiveMQ refuses it
        tx = state.transaction_of(frame)
        generation = state.generation  # the link the ACK/NACK frames below are built for
        settled = state.settle(bare, upstream_version=upstream_version, now=trio.current_time())
        core.flow.acks_freed.set()
        await core.hand_seen()  # the ids it acknowledged, persisted in outbox mode
        if tx is not None and not tx.rolled_back:
            # The settle charged its deliveries; the ACK frames count when held until COMMIT.
            frames = (*settled.more, settled.to_broker) if settled.to_broker else settled.more
            held = sum(map(frame_size, frames)) if self._confirmed_at_commit else 0
            await self._within_transaction_budget(tx, held, idle)
        if settled.to_broker is None or (tx is not None and tx.rolled_back):
            await self.out.answer_locally(app_receipt)
            return False
        # A `client` ACK settles several messages: one ACK each, the app's receipt last.
        for frame_up in (*settled.more, settled.to_broker):
            last = frame_up is settled.to_broker
            try:
                entry = await self.confirmations.submit(
                    frame_up,
                    app_receipt=app_receipt if last else None,
                    idle=idle and last,
                    context=STREAM_CREDIT if tx is None and settled.credit else tx,
                    generation=generation,
                )
            except StaleSettlement:
                # The leg changed while this ACK waited to enter the window: settled by
                # identity when the redelivery comes, as an ACK of the old leg at a failover.
                if last:
                    await self.out.answer_locally(app_receipt)
                continue
            if tx is not None:
                # re-run from the app's state, not from its frames
                tx.sent(entry, keep=False, charge=self._confirmed_at_commit)
        return False

    async def _begin(self, frame: Frame, idle: bool) -> bool:
        state = self.core.state
        assert state is not None
        limit = self.core.config.max_transaction_size
        if state.transaction_bytes.used + TRANSACTION_OVERHEAD > limit:
            raise FrameRejected(
                f"BEGIN of transaction {frame.get('transaction')!r} refused: the session's "
                f"open transactions hold {state.transaction_bytes.used} bytes, "
                f"max_transaction_size is {limit}"
            )
        tx = state.begin_transaction(frame)
        tx.begin = await self.confirmations.submit(
            frame.without("receipt"), app_receipt=frame.get("receipt"), idle=idle, context=tx
        )
        return False

    async def _end_transaction(self, frame: Frame, idle: bool) -> bool:
        """COMMIT or ABORT."""
        state = self.core.state
        assert state is not None
        app_receipt = frame.get("receipt")
        tx = state.close_transaction(frame, now=trio.current_time())
        await self.core.hand_seen()  # a COMMIT's acknowledged ids, persisted in outbox mode
        if tx.rolled_back:
            if frame.command is Command.COMMIT:
                raise TransactionRolledBack(rolled_back_message(tx.id, tx.rolled_back))
            await self.out.answer_locally(app_receipt)
            return False
        tx.end = await self.confirmations.submit(
            frame.without("receipt"), app_receipt=app_receipt, idle=idle, context=tx
        )
        return False

    async def _disconnect(self, frame: Frame, idle: bool) -> bool:
        core = self.core
        # The sidecar's ACKs of auto-acked messages already written to the app go before
        # the DISCONNECT (after it the leg takes no frame), or the broker would redeliver
        # them to another consumer.
        await self.out.flush()
        if self.outbox is not None and await self.outbox.disconnect(frame):
            return True
        core.asked.disconnect_entry = await self.confirmations.submit(
            frame.without("receipt"), app_receipt=frame.get("receipt"), idle=True
        )
        await self.confirmations.flush_upstream()
        with trio.move_on_after(core.durations.call_timeout):
            await core.asked.disconnected.wait()
        # Frames forwarded from the outbox are not lost: it still holds them.
        lost = unsettled(
            (e for e in core.flow.window if not isinstance(e.context, StoredInOutbox)),
            OutcomeCause.APP_DISCONNECT,
        )
        reason = "app disconnected"
        core.flow.named = True
        if lost:
            core.metrics.frames_lost(len(lost))
            reason += f"; {summary(lost)}"
            await self.control.report(lost, "the app disconnected before they were confirmed")
        core.end(Ending(reason, disconnect_upstream=False))
        return True
