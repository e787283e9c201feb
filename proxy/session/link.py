"""The upstream link of one session: connect by policy, and on the loss of a leg reconnect
(reattach or fail over), restore and relay again, until the session ends; ``priority_backup``
failback at a quiet point; the goodbye to the broker.

The link task is the only reader of the current leg. Each leg gets a nursery of its own for its
heart-beats, the sidecar's ACK writer, the restore and the failback watch; the leg is gone when
that nursery is.
"""

from __future__ import annotations

import trio

import protocol
from config import Broker
from protocol import Command, ConnectionClosed, Frame
from proxy.events import EventKind, SessionEvent
from proxy.failover import Attempt, ReconnectBoard, ReconnectExhausted, connect_by_policy
from proxy.session.acks import SidecarAcks
from proxy.session.broker_side import BrokerSide
from proxy.session.control import ControlChannel
from proxy.session.core import GOODBYE_TIMEOUT, SessionCore, log
from proxy.session.ending import Loss
from proxy.session.phase import Phase
from proxy.session.restore import Restorer
from proxy.upstream import (
    StreamOpener,
    Upstream,
    UpstreamRefused,
    UpstreamUnavailable,
    connect_frame,
    connect_upstream,
)
from proxy.vocabulary import ConnectOutcome, FailoverReason
from proxy.wire import TransportLost

__all__ = ["Link"]


class Link:
    """The link task of one session (:meth:`run`) and what it needs."""

    def __init__(
        self,
        core: SessionCore,
        acks: SidecarAcks,
        control: ControlChannel,
        broker_side: BrokerSide,
        restorer: Restorer,
        *,
        open_stream: StreamOpener,
        reconnects: ReconnectBoard,
    ) -> None:
        self.core = core
        self.acks = acks
        self.control = control
        self.broker_side = broker_side
        self.restorer = restorer
        self.open_stream = open_stream
        #: The sidecar's board: reconnects are reported there, and a first connection waits
        #: there for the outcome of other sessions' reconnects (proxy.failover).
        self.reconnects = reconnects
        self._relay_scope = trio.CancelScope()  # per leg; cancelled to fail back
        self._failback: Upstream | None = None
        self._started = False  # the first connection was reported to the caller

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Connect, restore, relay; on loss reconnect by policy; until the session ends.

        Raises (before ``task_status.started``) UpstreamUnavailable or ReconnectExhausted
        when the first connection fails. A session ended while still making its first
        connection (a drain) reports started without a leg: the caller finds the ending.
        """
        core = self.core
        try:
            with core.link_scope:
                await self._loop(task_status)
            if not self._started and core.ending is not None:
                task_status.started()
        finally:
            upstream, core.upstream = core.upstream, None
            core.link_ready = False
            if upstream is not None:
                with trio.move_on_after(GOODBYE_TIMEOUT, shield=True):
                    ending = core.ending
                    if ending is not None and ending.disconnect_upstream:
                        await self.disconnect(upstream)
                    await upstream.aclose()

    def connect_frame(self, broker: Broker) -> Frame:
        """The CONNECT for ``broker`` (:func:`proxy.upstream.connect_frame`), asking for
        heart-beats at half the interval silence is judged by (FrameStream.start_heartbeats)."""
        core = self.core
        assert core.connect is not None
        cx, cy = core.config.upstream_heartbeat
        return connect_frame(
            broker, core.config, heart_beat=f"{cx},{(cy + 1) // 2}", app_connect=core.connect
        )

    async def _connect_one(self, broker: Broker) -> Upstream:
        core = self.core
        return await connect_upstream(
            broker,
            self.connect_frame(broker),
            limits=core.upstream_limits,
            grace=core.config.heartbeat_grace,
            connect_timeout=core.durations.connect_timeout,
            open_stream=self.open_stream,
        )

    def _log_attempt(self, attempt: Attempt) -> None:
        core = self.core
        core.reconnect_attempts.append(attempt)
        core.metrics.connect_attempt(attempt.broker, ConnectOutcome(attempt.outcome))
        if attempt.outcome != "connected":
            # Debug: a reconnect makes many attempts; the RECONNECTING/FAILOVER/DISCONNECT
            # events (logged once each by the app) summarise them.
            log.debug(
                "session %s: broker %s %s: %s",
                core.id,
                attempt.broker,
                attempt.outcome,
                attempt.detail,
            )

    def _identity(self, broker: Broker) -> bytes:
        """What this session's CONNECT to ``broker`` is for the brokers' refusals: sessions
        sending the same one share the broker's cool-down (proxy.failover)."""
        return self.reconnects.identity(self.connect_frame(broker))

    def _log_skip(self, broker: Broker, refusal: UpstreamRefused) -> None:
        core = self.core
        core.metrics.refusal_skip(broker.label)
        log.debug("session %s: broker %s skipped: %s", core.id, broker.label, refusal.reason)

    async def _loop(self, task_status: trio.TaskStatus[None]) -> None:
        core = self.core
        state = core.state
        assert state is not None
        first = True
        loss = Loss(0.0, None, "")
        failback: Upstream | None = None
        while True:
            core.reconnect_attempts = []
            attempts: list[Attempt] = []
            if failback is not None:  # priority_backup found the first broker again
                upstream, index = failback, 0
                failback = None
            else:
                try:
                    upstream, index, attempts = await connect_by_policy(
                        core.config.brokers,
                        core.policy,
                        core.rng,
                        self._connect_one,
                        current=core.broker_index,
                        initial=first,
                        on_attempt=self._log_attempt,
                        initial_period=core.durations.initial_connect_period,
                        board=self.reconnects,
                        identity=self._identity,
                        on_skip=self._log_skip,
                    )
                except ReconnectExhausted as exc:
                    if first:
                        raise
                    await self.restorer.exhausted(exc, loss)
                    return
            core.upstream = upstream
            core.broker_index = index
            core.cumulative_receipts = upstream.confirms_in_order
            core.artemis_ids = upstream.artemis_duplicate_ids
            core.wildcard_receipt_bug = upstream.receipt_breaks_wildcard_subscribe
            core.stomp10_rabbitmq = upstream.stomp10_rabbitmq
            core.receipts_copied = upstream.copies_receipt_into_messages
            self.acks.reset()  # ack ids of the old leg mean nothing on this one
            async with trio.open_nursery() as leg:
                leg.start_soon(upstream.keep_alive)
                leg.start_soon(self.acks.flush_loop, upstream)
                if first:
                    state.new_link(
                        stable_message_ids=upstream.stable_message_ids,
                        client_ack_per_subscription=upstream.client_ack_per_subscription,
                        acks_ignore_subscription=upstream.acks_ignore_subscription,
                    )
                    core.link_ready = True
                    if core.phase is Phase.HANDSHAKE:
                        core.advance(Phase.RUNNING)
                    self._started = True
                    task_status.started()
                else:
                    # The restore writes while the relay reads: a broker blocked writing
                    # RECEIPTs we do not read would stop reading what we replay (deadlock).
                    leg.start_soon(self.restorer.restore_quietly, upstream, attempts, loss)
                if core.policy.priority_backup and index != 0:
                    leg.start_soon(self._watch_first_broker)
                self._relay_scope = trio.CancelScope()
                loss_reason, loss_kind = "relay stopped", FailoverReason.CONNECTION_LOST
                with self._relay_scope:
                    loss_reason, loss_kind = await self.broker_side.relay(upstream)
                failback, self._failback = self._failback, None
                if failback is not None:
                    loss_reason, loss_kind = "failback to the first broker", FailoverReason.FAILBACK
                leg.cancel_scope.cancel()
            # The leg is gone (or left for the first broker): stop the world (Qpid draft).
            core.link_ready = False
            core.upstream = None
            if failback is not None:
                with trio.move_on_after(GOODBYE_TIMEOUT, shield=True):
                    await self.disconnect(upstream)
            await upstream.aclose()
            if core.ending is not None:
                if failback is not None:
                    await failback.aclose()
                return
            first = False
            lost_from = upstream.broker.label
            loss = Loss(trio.current_time(), lost_from, loss_reason, loss_kind)
            core.loss = loss
            core.advance(Phase.RECONNECTING)
            async with core.send_lock:
                core.window.mark_all_unsent()
            log.warning("session %s: lost %s: %s; reconnecting", core.id, lost_from, loss_reason)
            await self.control.publish(
                SessionEvent(
                    EventKind.RECONNECTING,
                    core.id,
                    loss_reason,
                    from_broker=lost_from,
                )
            )

    def quiet(self) -> bool:
        """A point where the session can move to another broker without anything in flight:
        no open transaction, an empty window, nothing unacknowledged (priority_backup)."""
        core = self.core
        state = core.state
        return (
            state is not None
            and core.link_ready
            and not state.transactions
            and len(core.window) == 0
            and state.unacked == 0
            and not self.acks.pending
        )

    async def _watch_first_broker(self) -> None:
        """``priority_backup`` (ActiveMQ priorityBackup): while on a backup, try the first
        broker every ``max_retry_interval``; once it accepts and the session is quiet, make
        that connection the session's next leg (a FAILOVER event with reason "failback")."""
        core = self.core
        first = core.config.brokers[0]
        while True:
            await trio.sleep(core.policy.max_retry_interval)
            if not self.quiet():
                continue
            try:
                candidate = await self._connect_one(first)
            except UpstreamUnavailable:
                continue
            if not self.quiet():
                await candidate.aclose()
                continue
            log.info("session %s: first broker %s is back; failing back", core.id, first.label)
            self._failback = candidate
            self._relay_scope.cancel()
            return

    async def disconnect(self, upstream: Upstream) -> None:
        """Graceful goodbye to the broker: DISCONNECT with a receipt, wait for it (STOMP 1.2
        "Connection Lingering"). Only called by the link task, the leg's only reader."""
        state = self.core.state
        assert state is not None
        receipt = state.new_internal_receipt()
        try:
            await upstream.send(Frame(Command.DISCONNECT, (("receipt", receipt),)))
            while True:
                event = await upstream.receive_event()
                if isinstance(event, ConnectionClosed):
                    return
                if (
                    isinstance(event, Frame)
                    and event.command is Command.RECEIPT
                    and event.get("receipt-id") == receipt
                ):
                    return
        except (TransportLost, protocol.ProtocolError):
            return
