"""The upstream link of one session: connect by policy, and on the loss of a leg reconnect
(reattach or fail over), restore and relay again, until the session ends; a move to another
broker at a quiet point, holding the app briefly: the ``priority_backup`` failback, and the
move off an evacuated broker (:mod:`proxy.reconnect.evacuations`); the goodbye to the broker.

The link task is the only reader of the current leg. Each leg gets a nursery of its own for its
heart-beats, the sidecar's ACK writer, the restore, the failback watch and the evacuation watch;
the leg is gone when that nursery is.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass

import trio

import protocol
from config import Broker
from protocol import Command, ConnectionClosed, Frame
from proxy.legs.broker import Upstream, UpstreamRefused, UpstreamUnavailable, connect_upstream
from proxy.legs.connect_frame import connect_frame, upstream_heart_beat
from proxy.legs.opening import StreamOpener
from proxy.legs.stream import TransportLost
from proxy.reconnect.board import ReconnectBoard
from proxy.reconnect.brokers import first_in_force, in_force_count, walk_order
from proxy.reconnect.walk import Attempt, ReconnectExhausted, attempt_outcome, connect_by_policy
from proxy.session.acks import SidecarAcks
from proxy.session.broker_side import BrokerSide
from proxy.session.control import ControlChannel
from proxy.session.core import GOODBYE_TIMEOUT, SessionCore, log
from proxy.session.ending import Loss
from proxy.session.phase import Phase
from proxy.session.restore import Restorer, start_link
from proxy.telemetry.events import EventKind, SessionEvent
from proxy.telemetry.vocabulary import ConnectOutcome, FailoverReason
from proxy.tracking.links import LinkEnd

__all__ = ["FAILBACK_HOLD", "Link"]

#: Seconds a failback may hold the app's frames while the backup confirms what it was sent;
#: past it the move is given up (and tried again ``max_retry_interval`` later).
FAILBACK_HOLD = 2.0
#: Seconds between looks at the session while a failback waits for its moment.
_FAILBACK_POLL = 0.005


@dataclass(frozen=True, slots=True)
class _Move:
    """A leg the session moves to at a quiet point: the next leg of :meth:`Link._loop`, in
    place of a reconnect (a failback, a move off an evacuated broker)."""

    upstream: Upstream
    index: int
    reason: str
    kind: FailoverReason
    attempts: tuple[Attempt, ...] = ()


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
        #: there for the outcome of other sessions' reconnects (proxy.reconnect.walk).
        self.reconnects = reconnects
        self._relay_scope = trio.CancelScope()  # per leg; cancelled to move
        self._move: _Move | None = None
        self._moving = trio.Lock()  # one move at a time (failback, evacuation)
        self._paused_since: float | None = None  # a failback holds the app (trio seconds)
        self._started = False  # the first connection was reported to the caller
        #: Set once a whole first round failed (every broker tried or skipped, none answered):
        #: in outbox mode the session then answers its app's CONNECT itself.
        self.first_round_failed = trio.Event()
        self._first_failures = 0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Connect, restore, relay; on loss reconnect by policy; until the session ends.

        Raises (before ``task_status.started``) UpstreamUnavailable or ReconnectExhausted
        when the first connection fails. A session ended while still making its first
        connection (a drain) reports started without a leg: the caller finds the ending.
        """
        core = self.core
        try:
            with core.leg.scope:
                await self._loop(task_status)
            if not self._started and core.ending is not None:
                task_status.started()
        finally:
            self._release_app()
            upstream, core.leg.upstream = core.leg.upstream, None
            core.leg.ready = False
            if upstream is not None:
                with trio.move_on_after(GOODBYE_TIMEOUT, shield=True):
                    ending = core.ending
                    if ending is not None and ending.disconnect_upstream:
                        await self.disconnect(upstream)
                    await upstream.aclose()

    def connect_frame(self, broker: Broker) -> Frame:
        """The CONNECT for ``broker`` (:func:`proxy.legs.connect_frame.connect_frame`), its
        ``heart-beat`` by :func:`~proxy.legs.connect_frame.upstream_heart_beat`."""
        core = self.core
        assert core.asked.connect is not None
        return connect_frame(
            broker,
            core.config,
            heart_beat=upstream_heart_beat(core.config),
            app_connect=core.asked.connect,
        )

    async def _connect_one(self, broker: Broker) -> Upstream:
        """One connection attempt to ``broker``, in one of its ``max_connecting`` slots
        (:meth:`ReconnectBoard.connect_slot`; ``connect_timeout`` runs once it holds one)."""
        core = self.core
        async with self.reconnects.connect_slot(broker.label):
            upstream = await connect_upstream(
                broker,
                self.connect_frame(broker),
                limits=core.upstream_limits,
                grace=core.config.heartbeat_grace,
                connect_timeout=core.durations.connect_timeout,
                open_stream=self.open_stream,
            )
        charge = core.upstream_charge
        if charge is not None:  # the MESSAGE being read counts against max_memory_bytes
            memory = core.app.memory
            assert memory is not None
            upstream.wire.use_memory(memory, charge, wait=False)
        return upstream

    def _first_failure(self) -> None:
        """One broker of a first connection did not answer (or was skipped)."""
        if not self._started:
            self._first_failures += 1
            if self._first_failures >= in_force_count(self.core.brokers):
                self.first_round_failed.set()

    def _log_attempt(self, attempt: Attempt) -> None:
        core = self.core
        core.leg.reconnect_attempts.append(attempt)
        core.metrics.connect_attempt(attempt.broker, ConnectOutcome(attempt.outcome))
        if attempt.outcome != "connected":
            self._first_failure()
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
        sending the same one share the broker's cool-down (proxy.reconnect.walk)."""
        return self.reconnects.identity(self.connect_frame(broker))

    def _log_skip(self, broker: Broker, refusal: UpstreamRefused) -> None:
        core = self.core
        self._first_failure()
        core.metrics.refusal_skip(broker.label)
        log.debug("session %s: broker %s skipped: %s", core.id, broker.label, refusal.reason)

    async def _loop(self, task_status: trio.TaskStatus[None]) -> None:
        core = self.core
        state = core.state
        assert state is not None
        first = True
        loss = Loss(0.0, None, "")
        move: _Move | None = None
        end = LinkEnd()
        while True:
            core.leg.reconnect_attempts = []
            attempts: list[Attempt] = []
            if core.leg.unstable and move is None and not await self._pace(loss):
                return
            if move is not None:  # a failback, or the move off an evacuated broker
                upstream, index, attempts = move.upstream, move.index, list(move.attempts)
                move = None
            else:
                try:
                    upstream, index, attempts = await connect_by_policy(
                        core.brokers,
                        core.policy,
                        core.rng,
                        self._connect_one,
                        current=core.leg.broker_index,
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
            core.leg.upstream = upstream
            core.leg.broker_index = index
            core.leg.dialect = upstream.dialect
            self.acks.reset()  # ack ids of the old leg mean nothing on this one
            # A first leg of a session whose CONNECT the sidecar answered itself (outbox mode)
            # is restored onto as after a reconnect: the app may have subscribed meanwhile.
            local = first and core.asked.connected_locally
            if local:
                first = False
                assert core.leg.loss is not None
                loss = core.leg.loss
            if not first:
                end = await self.restorer.begin(upstream)
            async with trio.open_nursery() as leg:
                leg.start_soon(upstream.keep_alive)
                self.acks.attach(leg, upstream)
                if local:
                    self._started = True
                    task_status.started()
                if first:
                    start_link(state, upstream, core.asked.connect)
                    core.leg.ready = True
                    if core.phase is Phase.HANDSHAKE:
                        core.advance(Phase.RUNNING)
                    self._started = True
                    task_status.started()
                else:
                    # The restore writes while the relay reads: a broker blocked writing
                    # RECEIPTs we do not read would stop reading what we replay (deadlock).
                    leg.start_soon(self._restore, upstream, attempts, loss, end)
                if core.policy.priority_backup and index != first_in_force(core.brokers):
                    leg.start_soon(self._watch_first_broker)
                leg.start_soon(self._watch_evacuation, index)
                self._relay_scope = trio.CancelScope()
                loss_reason, loss_kind = "relay stopped", FailoverReason.CONNECTION_LOST
                with self._relay_scope:
                    loss_reason, loss_kind = await self.broker_side.relay(upstream)
                move, self._move = self._move, None
                if move is not None:
                    loss_reason, loss_kind = move.reason, move.kind
                leg.cancel_scope.cancel()
            # The leg is gone (or left for another broker): stop the world (Qpid draft).
            core.leg.ready = False
            core.leg.upstream = None
            if move is not None:
                with trio.move_on_after(GOODBYE_TIMEOUT, shield=True):
                    await self.disconnect(upstream)
            await upstream.aclose()
            if core.ending is not None:
                if move is not None:
                    await move.upstream.aclose()
                return
            core.leg.note_loss(
                trio.current_time(),
                lived=trio.current_time() - upstream.connected_at,
                retryable=loss_kind is FailoverReason.QUEUE_UNAVAILABLE,
                replay_unconfirmed=not first
                and any(e.sent_before and not e.confirmed for e in core.flow.window),
            )
            state.subscriptions_lost(trio.current_time())  # restoring, for /status
            first = False
            lost_from = upstream.broker.label
            loss = Loss(trio.current_time(), lost_from, loss_reason, loss_kind)
            core.leg.loss = loss
            core.advance(Phase.RECONNECTING)
            async with core.leg.send_lock:
                core.flow.window.mark_all_unsent()
            log.warning("session %s: lost %s: %s; reconnecting", core.id, lost_from, loss_reason)
            await self.control.publish(
                SessionEvent(
                    EventKind.RECONNECTING,
                    core.id,
                    loss_reason,
                    from_broker=lost_from,
                    outage_start=time.time(),
                )
            )

    async def _pace(self, loss: Loss) -> bool:
        """Before reconnecting after an unstable leg (:meth:`LegState.note_loss
        <proxy.session.leg.LegState.note_loss>`): wait the policy's jittered backoff for the
        number of unstable legs in a row, so a session does not replay into a queue that
        cannot take it (a quorum queue electing its leader, a classic queue whose home node is
        down) ten times a second. False when ``reconnect_period`` has passed since the first
        of them: the session then gives up as an exhausted reconnect does (DISCONNECT, every
        frame named)."""
        core = self.core
        since = core.leg.unstable_since
        assert since is not None
        period = core.policy.reconnect_period
        now = trio.current_time()
        if period is not None and now - since >= period:
            index = core.leg.broker_index
            broker = core.brokers[index if index is not None else 0]
            exc = ReconnectExhausted(
                [], core.leg.unstable, now - since, UpstreamUnavailable(broker, loss.reason)
            )
            await self.restorer.exhausted(exc, loss)
            return False
        pause = core.policy.delay(core.leg.unstable, core.rng)
        log.info(
            "session %s: leg %d in a row lost before its replay was confirmed (%s); "
            "reconnecting in %.3f s",
            core.id,
            core.leg.unstable,
            loss.reason,
            pause,
        )
        await trio.sleep(pause)
        return True

    async def _restore(
        self, upstream: Upstream, attempts: list[Attempt], loss: Loss, end: LinkEnd
    ) -> None:
        """Restore the session on the new leg; then a failback's hold of the app ends."""
        try:
            await self.restorer.restore_quietly(
                upstream, attempts, loss, end, paused_since=self._paused_since
            )
        finally:
            self._release_app()

    async def _watch_first_broker(self) -> None:
        """``priority_backup`` (ActiveMQ priorityBackup): while on a backup, try the first
        broker every ``max_retry_interval`` (not while it is evacuated); once it accepts, move
        there at a quiet point (:meth:`_move_to`), and that connection becomes the session's
        next leg (RECONNECTING and FAILOVER events with reason "failback to the first
        broker"). A session that keeps sending moves too: its app is held for the time the
        backup takes to confirm what it was sent, at most :data:`FAILBACK_HOLD`."""
        core = self.core
        first_index = first_in_force(core.brokers)
        first = core.brokers[first_index]
        key = (first_index, self._identity(first))

        def wanted() -> bool:
            return self.reconnects.evacuated(first.label) is None

        while True:
            await trio.sleep(core.policy.max_retry_interval)
            if not wanted():
                continue
            try:  # a first broker that refuses the login is skipped for its cool-down
                candidate = await self.reconnects.attempt_alone(
                    key, lambda: self._connect_one(first), core.policy
                )
            except UpstreamUnavailable:
                continue
            move = _Move(
                candidate, first_index, "failback to the first broker", FailoverReason.FAILBACK
            )
            if await self._move_to(move, wanted):
                return

    async def _watch_evacuation(self, index: int) -> None:
        """While on broker ``index``: once it is evacuated (:meth:`ReconnectBoard.evacuate
        <proxy.reconnect.board.ReconnectBoard.evacuate>`), connect to another broker not
        evacuated (in the policy's order, under the refusal rules) and move there at a quiet
        point, as a failback does (:meth:`_move_to`): RECONNECTING and FAILOVER events with
        reason ``evacuated`` and the evacuation's words. When no other broker answers, or
        the window does not drain in time, it tries again ``max_retry_interval`` later, for
        as long as the evacuation holds."""
        core = self.core
        label = core.brokers[index].label
        while True:
            evacuation = await self.reconnects.wait_evacuated(label)
            move = await self._other_broker(index, f"broker {label} evacuated: {evacuation.reason}")
            if move is not None:
                target = core.brokers[move.index].label
                wanted = functools.partial(self._evacuation_holds, label, target)
                if await self._move_to(move, wanted):
                    return
            await trio.sleep(core.policy.max_retry_interval)

    def _evacuation_holds(self, label: str, target: str) -> bool:
        """Whether a move off ``label`` to ``target`` is still wanted: ``label`` still
        evacuated, ``target`` not."""
        board = self.reconnects
        return board.evacuated(label) is not None and board.evacuated(target) is None

    async def _other_broker(self, index: int, reason: str) -> _Move | None:
        """One pass over the brokers but ``index`` and the evacuated ones, in the policy's
        order, each under the sidecar's refusal rules (:meth:`ReconnectBoard.attempt_alone
        <proxy.reconnect.board.ReconnectBoard.attempt_alone>`): the first that accepts, as a
        move with ``reason``, or None when none does."""
        core = self.core
        brokers = core.brokers
        attempts: list[Attempt] = []
        for other in walk_order(brokers, core.policy, index, core.rng):
            if other == index:
                continue
            broker = brokers[other]
            if self.reconnects.evacuated(broker.label) is not None:
                continue
            key = (other, self._identity(broker))
            try:
                candidate = await self.reconnects.attempt_alone(
                    key, functools.partial(self._connect_one, broker), core.policy
                )
            except UpstreamUnavailable as exc:
                attempt = Attempt(broker.label, attempt_outcome(exc), exc.reason)
                attempts.append(attempt)
                core.metrics.connect_attempt(broker.label, ConnectOutcome(attempt.outcome))
                continue
            server = candidate.connected.get("server") or ""
            attempts.append(Attempt(broker.label, "connected", server))
            core.metrics.connect_attempt(broker.label, ConnectOutcome.CONNECTED)
            return _Move(candidate, other, reason, FailoverReason.EVACUATED, tuple(attempts))
        log.warning(
            "session %s: %s; no other broker answered (%s), trying again in %g s",
            core.id,
            reason,
            "; ".join(f"{a.broker}: {a.outcome}" for a in attempts) or "none left",
            core.policy.max_retry_interval,
        )
        return None

    async def _move_to(self, move: _Move, wanted: Callable[[], bool]) -> bool:
        """Move the session to ``move``'s leg at a quiet point: hold the app
        (:meth:`_hold_app`); if the window drained and the move is still ``wanted`` (an
        evacuation not restored meanwhile), it becomes the session's next leg and the current
        one ends (:meth:`_leave_leg`): True. Else the new leg gets its goodbye and the app
        goes on: False. One move at a time: a second one waits for the first, then finds the
        session moved (its leg's nursery cancels it) or not."""
        core = self.core
        held = moving = False
        try:
            async with self._moving:
                if self._move is None:  # else the session is leaving for another move
                    held = await self._hold_app()
                    moving = held and wanted()
            if moving:
                log.info(
                    "session %s: moving to %s: %s",
                    core.id,
                    core.brokers[move.index].label,
                    move.reason,
                )
                self._move = move
                await self._leave_leg()
        finally:
            if not moving:  # goodbye to the new leg; tried again later
                if held:
                    self._release_app()
                with trio.move_on_after(GOODBYE_TIMEOUT, shield=True):
                    await self.disconnect(move.upstream)
                await move.upstream.aclose()
        return moving

    async def _leave_leg(self) -> None:
        """End the current leg for a move (a failback, an evacuation): a DISCONNECT, after
        which the broker answers and closes, and the relay ends with it, having handed the app
        every frame it had begun (cancelling it in the middle of a write to the app would end
        the app's session: proxy.legs.stream). A broker that does not close within
        ``GOODBYE_TIMEOUT`` is cut."""
        core = self.core
        upstream, state = core.leg.upstream, core.state
        if upstream is not None and state is not None:
            goodbye = Frame(Command.DISCONNECT, (("receipt", state.new_internal_receipt()),))
            try:
                upstream.queue(goodbye)
                await upstream.flush()
            except (TransportLost, protocol.ProtocolError):
                pass  # the relay sees the loss
            with trio.move_on_after(GOODBYE_TIMEOUT):
                await trio.sleep_forever()  # the relay ends, and the leg's nursery with it
        self._relay_scope.cancel()

    async def _hold_app(self) -> bool:
        """Bring the session to a point where it can move: hold the app's next frame (outside
        any transaction: :meth:`SessionCore.frame_boundary`) until the backup has confirmed
        everything in the window and the sidecar's own ACKs are out. First, for up to
        ``max_retry_interval``, wait for a moment when the app holds nothing unacknowledged
        (its ACKs of the backup's deliveries would not reach the backup after the move).

        Returns True with the app held (the restore on the first broker releases it), or
        False, the app released, when the window did not drain within :data:`FAILBACK_HOLD`
        (a transaction left open, a backup that stopped confirming)."""
        core = self.core
        state = core.state
        assert state is not None
        with trio.move_on_after(core.policy.max_retry_interval):
            while state.unacked or state.transactions:
                await self._session_changes()
        self._paused_since = trio.current_time()
        core.flow.failback_hold = trio.Event()
        with trio.move_on_after(FAILBACK_HOLD):
            while not (
                core.leg.ready
                and not state.transactions
                and len(core.flow.window) == 0
                and not self.acks.pending
            ):
                await self._session_changes()
            return True
        log.info(
            "session %s: failback given up: %d frame(s) unconfirmed after %.1f s",
            core.id,
            len(core.flow.window),
            FAILBACK_HOLD,
        )
        self._release_app()
        return False

    async def _session_changes(self) -> None:
        """Wait for the window to change (a receipt, an app frame), or a moment: what a
        failback waits for (transactions, deliveries, the sidecar's ACKs) signals nothing."""
        with trio.move_on_after(_FAILBACK_POLL):
            await self.core.flow.window_change()

    def _release_app(self) -> None:
        """End a failback's hold of the app, if any."""
        hold, self.core.flow.failback_hold = self.core.flow.failback_hold, None
        self._paused_since = None
        if hold is not None:
            hold.set()

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
