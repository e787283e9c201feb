"""One app session: the app's STOMP connection to the sidecar, kept alive across broker failure.

The sidecar *terminates* the app's connection: toward the app it is a STOMP server, toward the
broker a STOMP client, and each leg negotiates its own version and heart-beats. Everything that
must outlive one upstream connection (subscriptions, transactions, ack ids, identities of
delivered messages) is in :class:`proxy.tracking.SessionState`, and every frame bound for the
broker sits in the :class:`proxy.tracking.window.ConfirmationWindow` until a RECEIPT confirms it. So
when the upstream leg dies the app's session stays up: the sidecar reattaches or fails over,
restores the session and replays what the old broker never confirmed, and tells the app.

Where each rule lives (``proxy/session/``; every module is named here, a test checks it):

- ``session``: this module, the parts wired together, ``run`` and ``statistics``; ``core``: the
  state the parts share, the one way to end a session; ``phase``: the phases and their
  transition table; ``ending``: endings and the sidecar's own ERROR frames; ``asked``: what the
  app asked for (its CONNECT and DISCONNECT); ``leg``: the session's hold on its broker leg;
  ``flow``: flow control (the window, its waiters, the failback hold); ``drain``: the session's
  SIGTERM drain;
- ``handshake``: the app's CONNECT and CONNECTED; ``verdict``: the broker's own answer to a frame
  before CONNECT, a bad version, an unknown command; ``app_side``: app → broker, one handler per
  command; ``sends``: an app SEND as it goes upstream (receipts, duplicate-detection ids);
  ``confirmations``: the window at work (receipts, backpressure, ``call_timeout``, and the
  rollback of a transaction that lost a frame to it);
- ``link``: connect by policy, reconnect, failback, goodbye; ``restore``: re-create and replay
  after a reconnect, or report what was lost; ``outcomes``: what became of frames not plainly
  confirmed; ``broker_side``: broker → app;
- ``acks``: the sidecar's own ACKs; ``to_app``: writing to the app; ``control``: events;
- ``outbox``: the outbox (``outbox`` on): the app's SENDs stored and answered once durable,
  forwarded into the window while a broker is up, removed from the outbox once confirmed;
  ``outbox_transactions``: transactions of such SENDs, stored at COMMIT.

Task layout (every task has an owner). :meth:`Session.run` owns one nursery with:

- the **link task** (:class:`~proxy.session.link.Link`): connects by policy, restores, relays
  broker → app until the leg is lost, then (RECONNECTING: "stop the world") connects again;
  it is the only reader of the upstream leg. Each leg's heart-beat sender and the sidecar's
  ACK writer (from the first ACK of its own it sends) run in a nursery the link task opens for
  that leg;
- the **app side**, in ``run``'s own task: the app reader (app → window → broker); in a nursery
  it opens, the app heart-beat sender (when negotiated), the ``call_timeout`` watch (while an
  app receipt is unanswered), when asked for, the control-channel pump and, with the outbox,
  the outbox's forwarder and remover (outbox → window; confirmed → removed).

An idle session (no frame unanswered, no ACK of the sidecar's written yet, no outbox) has three
tasks: ``run`` (the app reader), the link task and the upstream heart-beat sender. Tasks and
their cancel scopes are most of what an idle session costs (about 40 KiB in all, measured in
docs/results.md), so none runs before it has work.

Whoever decides that the session is over calls :meth:`SessionCore.end`: the first
:class:`Ending` wins; the link task then says goodbye to the broker (bounded, shielded) and
``run`` sends the app its ERROR, if any, and closes.
"""

from __future__ import annotations

import contextlib
import logging
import random
from typing import TYPE_CHECKING

import trio

from config import Config
from proxy.legs.broker import UpstreamUnavailable
from proxy.legs.memory import MemoryBudgetGate
from proxy.legs.opening import BrokerStreams, StreamOpener
from proxy.legs.stream import TransportLost
from proxy.outbox.service import OutboxService
from proxy.reconnect.board import ReconnectBoard
from proxy.reconnect.walk import ReconnectExhausted
from proxy.session.acks import SidecarAcks
from proxy.session.app_side import AppSide
from proxy.session.broker_side import BrokerSide
from proxy.session.confirmations import Confirmations
from proxy.session.control import ControlChannel
from proxy.session.core import GOODBYE_TIMEOUT, SessionCore, log
from proxy.session.ending import (
    Ending,
    Loss,
    drained,
    draining,
    error_frame,
    exhausted_initially,
    no_broker,
)
from proxy.session.handshake import accept_connect, connected_frame, local_connected_frame
from proxy.session.link import Link
from proxy.session.outbox import SessionOutbox
from proxy.session.outcomes import report_of, unsettled_outcome
from proxy.session.phase import Phase
from proxy.session.restore import Restorer
from proxy.session.to_app import AppOutput
from proxy.telemetry.events import EventBus, FrameReport, report_of_frame
from proxy.telemetry.metrics import Metrics
from proxy.telemetry.statistics import SessionStatistics
from proxy.telemetry.vocabulary import DrainResult, FrameOutcome, OutcomeCause
from proxy.tracking import Transaction
from proxy.tracking.window import Entry

if TYPE_CHECKING:  # imported only when tracing is on (proxy.app), with OpenTelemetry
    from proxy.telemetry.tracing import Tracing

__all__ = ["DRAIN_GOODBYE_MAX", "Session"]

#: Seconds the drain's report to the app (its OUTCOME event, the RECEIPTs queued) may take
#: past the deadline: a write to a local app that reads takes microseconds; one that stopped
#: reading gets its ERROR no sooner for waiting longer. With the goodbyes to the broker and to
#: the app (GOODBYE_TIMEOUT each), a session ends at most DRAIN_GOODBYE_MAX after the deadline.
DRAIN_REPORT_TIMEOUT = 0.5
#: Seconds a drained session may take past the drain's deadline, at most: the report, the
#: DISCONNECT's receipt, the app's ERROR (the chart's termination grace period covers it).
DRAIN_GOODBYE_MAX = DRAIN_REPORT_TIMEOUT + 2 * GOODBYE_TIMEOUT

#: Jitter and ``randomize`` draws of every session without an rng of its own: one generator
#: for the process (2.5 KiB of Mersenne Twister state per session otherwise).
_RNG = random.Random()


class Session:
    """Serve one accepted app connection until either side ends it, through broker failure.

    Args:
        config: the sidecar's configuration (brokers, policy, limits, timeouts, credentials).
        stream: the accepted app connection.
        session_id: the sidecar's id for the session (logs, ``session`` header, id prefix).
        bus: where RECONNECTING/FAILOVER/DISCONNECT events go (the sidecar's; a private one
            when None, which still serves the in-band control channel).
        metrics: where counters go (the sidecar's; a private registry when None).
        rng: randomness for backoff jitter and ``randomize`` (seeded in tests).
        open_stream: opens the byte stream to a broker: the sidecar's
            :class:`~proxy.legs.broker.BrokerStreams` (TCP/TLS; a private one when None), a
            memory stream to a scripted broker in unit tests.
        reconnects: the sidecar's :class:`~proxy.reconnect.walk.ReconnectBoard`, shared by its
            sessions: reconnects are reported there and a first connection waits there for
            their outcome (a private one when None).
        outbox: the sidecar's outbox (``outbox`` on; :mod:`proxy.session.outbox`): the app's
            SENDs it takes are stored and forwarded, and the app's CONNECT is answered even
            when no broker is up. None: off.
        tracing: the sidecar's :class:`~proxy.telemetry.tracing.Tracing` (``tracing = true``):
            the session's frames become spans (docs/operations.md, "Traces"). None: off.
        memory: the sidecar's memory budget (``max_memory_bytes``, :mod:`proxy.legs.memory`):
            the window and the app's reads are charged to it, and the app is not read while it
            is over. None: no budget but the session's own bounds.

    ``run()`` never raises for anything the app or a broker does; only cancellation propagates.
    """

    def __init__(
        self,
        config: Config,
        stream: trio.abc.Stream,
        session_id: str,
        *,
        bus: EventBus | None = None,
        metrics: Metrics | None = None,
        rng: random.Random | None = None,
        open_stream: StreamOpener | None = None,
        reconnects: ReconnectBoard | None = None,
        outbox: OutboxService | None = None,
        tracing: Tracing | None = None,
        memory: MemoryBudgetGate | None = None,
    ) -> None:
        board = (
            reconnects
            if reconnects is not None
            else ReconnectBoard(max_connecting=config.max_connecting)
        )
        if not board.brokers:  # a board built without a list: this configuration's
            board.brokers.update(config.brokers, allow_empty=True)
        core = SessionCore(
            config,
            stream,
            session_id,
            bus=bus if bus is not None else EventBus(),
            metrics=metrics if metrics is not None else Metrics(),
            rng=rng if rng is not None else _RNG,
            memory=memory,
            brokers=board.brokers,
        )
        self.core = core
        if tracing is not None:
            core.tracer = tracing.session(session_id, core.leg, board.brokers)
        self.id = session_id
        #: The app's ``host:port`` (``/status``; None when the stream is not a socket).
        self.app_address = _peer_address(stream)
        self.acks = SidecarAcks(config.max_unacked)
        self.out = AppOutput(core, self.acks)
        self.control = ControlChannel(core, self.out)
        self.confirmations = Confirmations(core, self.out, self.control)
        opener = open_stream if open_stream is not None else BrokerStreams(config)
        self.app_side = AppSide(core, self.out, self.control, self.confirmations, opener)
        #: How the drain on SIGTERM ended (None: no drain), and how many frames were still
        #: unconfirmed at its deadline.
        self.drain_result: DrainResult | None = None
        self.drain_unconfirmed = 0
        #: The drain's ending and the frames it named, once :meth:`_drain` ended the session
        #: (its ERROR is made again if the app's later frames must be named in it too).
        self._drained: tuple[Ending, list[FrameReport]] | None = None
        self.link = Link(
            core,
            self.acks,
            self.control,
            BrokerSide(core, self.acks, self.out, self.confirmations),
            Restorer(core, self.out, self.control, not_taken=self.app_side.not_taken),
            open_stream=opener,
            reconnects=board,
        )
        self.outbox: SessionOutbox | None = None
        if outbox is not None:
            self.outbox = SessionOutbox(core, self.out, self.control, self.confirmations, outbox)
            core.seen = outbox.seen
            self.app_side.use_outbox(self.outbox)
            self.confirmations.on_stored = self.outbox.confirmed

    # -- public -------------------------------------------------------------------------------

    def request_drain(self, deadline: float | None = None) -> None:
        """Drain the session (SIGTERM; hypercorn's and Envoy's drain): take no new frames from
        the app, keep relaying what the broker sends back, wait until every frame forwarded
        is confirmed and its RECEIPT handed to the app, or until ``deadline`` (trio seconds;
        default ``drain_timeout`` from now); then DISCONNECT upstream and end with an ERROR
        naming what is still unconfirmed (docs/behaviour.md, "Drain on SIGTERM").

        A session reconnecting keeps trying until the deadline (a restore replays the window).
        A session still making its first connection (which may try for
        ``initial_connect_period``) stops trying, and one still reading its app's CONNECT ends
        once it has it: neither has taken a frame. :attr:`drain_result` says how it ended.
        """
        core = self.core
        if core.drain.requested:
            return
        core.drain.requested = True
        if self.outbox is not None:
            self.outbox.stop()  # what the outbox holds stays there for the next start
        if core.ending is not None or core.app_scope.cancel_called:
            return  # ending already (its app side may be gone): nothing left to drain
        if deadline is None:
            deadline = trio.current_time() + core.durations.drain_timeout
        core.drain.deadline = deadline
        core.flow.acks_freed.set()  # a relay waiting for the app's ACKs must read the broker again
        if core.app_nursery is not None:
            self.app_side.stop_reading()
            core.app_nursery.start_soon(self._drain)
        elif core.asked.connect is not None:
            self._drained_at_once()

    def _drained_at_once(self) -> None:
        """End a session that has forwarded nothing for its app yet (drain)."""
        core = self.core
        if core.ending is None:
            self.drain_result = DrainResult.COMPLETED
            core.metrics.drain(DrainResult.COMPLETED)
        core.end(draining())

    async def _drain(self) -> None:
        """The drain of a session whose app side runs (:meth:`request_drain`)."""
        core = self.core
        assert core.drain.deadline is not None
        with trio.move_on_at(core.drain.deadline) as waiting:
            await self.app_side.reading_stopped.wait()
            # Short-circuits at the window's head, which each receipt takes away: O(1) a wake.
            while any(not _left_open(e) for e in core.flow.window):
                await core.flow.window_change()
        # Past the deadline: what is unconfirmed is named (unknown: a broker has it, or may;
        # lost: none ever had it); frames of a transaction the app left open are rolled back
        # by the broker at the DISCONNECT (it was never committed).
        reports = [
            report_of(e, FrameOutcome.ROLLED_BACK, OutcomeCause.DRAIN)
            if _left_open(e)
            else report_of(e, unsettled_outcome(e), OutcomeCause.DRAIN_DEADLINE)
            for e in core.flow.window
        ]
        if waiting.cancelled_caught:
            # The app side was still held up (a full window): the frames it had read and
            # not put in the window yet never went anywhere.
            reports += (
                report_of_frame(frame, receipt, FrameOutcome.LOST, OutcomeCause.DRAIN_DEADLINE)
                for frame, receipt in self.app_side.not_taken()
            )
        core.flow.named = True
        late = sum(1 for r in reports if r.cause is OutcomeCause.DRAIN_DEADLINE)
        result = DrainResult.DEADLINE if late else DrainResult.COMPLETED
        self.drain_result = result
        self.drain_unconfirmed = late
        core.metrics.drain(result)
        if late:
            core.metrics.frames_lost(late)
        if core.drain.messages_not_shown:
            log.info(
                "session %s: %d message(s) held back during the drain (back to the broker's "
                "queue at the DISCONNECT)",
                core.id,
                core.drain.messages_not_shown,
            )
        # Bounded: an app that stopped reading does not hold the shutdown up.
        with trio.move_on_after(DRAIN_REPORT_TIMEOUT):
            await self.control.report(
                reports,
                f"mq-sidecar is shutting down: not confirmed within drain_timeout "
                f"({core.config.drain_timeout} ms)"
                if late
                else "mq-sidecar is shutting down with the transaction open",
            )
            # The RECEIPTs the relay queued leave now: end() cancels the relay, and a write
            # cancelled half way would leave the app's connection unusable for the ERROR.
            await self.out.flush()
        ending = drained(reports)
        self._drained = (ending, reports)
        core.end(ending)

    def live_broker(self) -> str | None:
        """The label of the broker this session's live leg goes to while it is running, else
        None (``broker`` of :meth:`statistics` when its ``state`` is ``running``, cheaply)."""
        core = self.core
        up = core.leg.upstream
        if up is None or core.phase is not Phase.RUNNING:
            return None
        return up.broker.label

    def statistics(self) -> SessionStatistics:
        """Counters and state of this session."""
        core = self.core
        st = core.state
        up = core.leg.upstream
        now = trio.current_time()
        window = core.flow.window
        oldest = next(iter(window), None)
        since = core.leg.outage_since(now, now - up.connected_at if up is not None else None)
        phase = core.phase
        window_stats = window.statistics()
        return SessionStatistics(
            session_id=core.id,
            state=str(phase),
            app_version=st.app_version if st else None,
            broker=up.broker.label if up else None,
            upstream_version=up.version if up else None,
            subscriptions=len(st.subscriptions) if st else 0,
            transactions=len(st.transactions) if st else 0,
            unacked=st.unacked if st else 0,
            pending_receipts=window_stats.receipts_pending,
            frames_from_app=core.app.frames_in,
            frames_to_app=core.app.frames_out,
            window=window_stats,
            reconnect_attempts=(
                len(core.leg.reconnect_attempts) if phase is Phase.RECONNECTING else 0
            ),
            failovers=core.leg.failovers,
            duplicates_hidden=st.duplicates_hidden if st else 0,
            redeliveries_hidden=st.redeliveries_hidden if st else 0,
            reconnecting_for=now - since if since is not None else None,
            oldest_unconfirmed_age=now - oldest.enqueued_at if oldest is not None else None,
            app_address=self.app_address,
            outbox_backlog=(
                self.outbox.stored - self.outbox.forwarded if self.outbox is not None else None
            ),
            per_subscription=st.subscription_statistics(now) if st else (),
        )

    async def run(self) -> None:
        """Serve the session to its end; the app's socket is closed when this returns."""
        core = self.core
        try:
            connect = await accept_connect(core, self.link.open_stream)
            if connect is not None:
                await self._serve()
        except Exception as exc:
            # The session boundary: a bug here ends this session only, loudly.
            log.exception("session %s: internal error", core.id)
            core.end(
                Ending(
                    f"internal error: {type(exc).__name__}",
                    app_error=error_frame("mq-sidecar internal error; see the sidecar's log"),
                    level=logging.ERROR,
                )
            )
        finally:
            ending = core.ending
            core.advance(Phase.CLOSED)
            if self.outbox is not None:
                # What a broker confirmed leaves the outbox now, not at the next start.
                with trio.move_on_after(GOODBYE_TIMEOUT, shield=True):
                    await self.outbox.remove_settled()
                self.outbox.outbox.forget(core.id)
                if self.outbox.stored > self.outbox.settled:
                    self.outbox.outbox.leave_unowned(core.id)  # the outbox forwarder takes them
            with trio.move_on_after(GOODBYE_TIMEOUT, shield=True):
                # What the relays queued before the end (the RECEIPT of the app's DISCONNECT)
                # leaves first, then what the end left unconfirmed, then the ERROR that ends
                # the session, if any.
                with contextlib.suppress(TransportLost):
                    await core.app.flush()
                    await self._name_left_unconfirmed(ending)
                    ending = await self._name_refused_after_stop(ending)
                if ending is not None and ending.app_error is not None:
                    await self.out.send_quietly(ending.app_error)
                await trio.aclose_forcefully(core.app.stream)
            if core.tracer is not None:
                core.tracer.close()
            core.leave_memory()
            if ending is not None:
                log.log(ending.level, "session %s closed: %s", core.id, ending.reason)

    async def _name_left_unconfirmed(self, ending: Ending | None) -> None:
        """Whatever ended the session, no frame leaves unnamed: what is still unconfirmed in
        the window and was not named by the way the session ended (a drain, the app's
        DISCONNECT, a broker's close after an ERROR, an exhausted reconnect) is named now
        (OUTCOME, cause ``session_ended``) and counted as lost. Frames the outbox holds are
        not lost (the outbox forwarder takes them)."""
        core = self.core
        if core.flow.named:
            return
        why = ending.reason if ending is not None else "the session ended"
        await self.control.name_unconfirmed(
            OutcomeCause.SESSION_ENDED, f"not confirmed when the session ended: {why}"
        )

    async def _name_refused_after_stop(self, ending: Ending | None) -> Ending | None:
        """The frames the app wrote after the drain stopped the reading, which a wait under
        way had read (:attr:`AppSide.after_stop <proxy.session.app_side.AppSide.after_stop>`),
        are not taken: each is named ``refused`` (cause ``drain``) in an OUTCOME event and, when
        the drain ended the session, in its final ERROR (returned: ``ending`` made again), so a
        SEND with or without a receipt never vanishes (docs/behaviour.md, "Drain on
        SIGTERM"). Called once the app side has ended: nothing more is read."""
        late = [
            report_of_frame(frame, receipt, FrameOutcome.REFUSED, OutcomeCause.DRAIN)
            for frame, receipt in self.app_side.after_stop
        ]
        if not late:
            return ending
        self.app_side.after_stop = []
        await self.control.report(
            late, "mq-sidecar is shutting down (SIGTERM) and took no more frames from the app"
        )
        if self._drained is not None and self._drained[0] is ending:
            return drained([*self._drained[1], *late])
        return ending

    # -- serving ------------------------------------------------------------------------------

    async def _serve(self) -> None:
        core = self.core
        if core.drain.requested:  # SIGTERM came while the app's CONNECT was read
            self._drained_at_once()
            return
        async with trio.open_nursery() as nursery:
            if self.outbox is not None:
                if not await self._first_leg_or_local(nursery):
                    return
            else:
                try:
                    await nursery.start(self.link.run)
                except (UpstreamUnavailable, ReconnectExhausted) as exc:
                    self._no_first_leg(exc)
                    return
            if core.ending is not None:
                return
            upstream = core.leg.upstream
            connected = (
                local_connected_frame(core) if upstream is None else connected_frame(core, upstream)
            )
            try:
                if core.asked.implicit_first is not None:
                    # The broker connects implicitly and sends no CONNECTED: neither does the
                    # sidecar; the app's connection is open all the same.
                    assert core.asked.connect is not None
                    core.app.conn.connect_implicitly(core.asked.connect, connected)
                else:
                    await core.app.send(connected)
            except TransportLost as exc:
                core.end(Ending(f"app connection lost: {exc}"))
                return
            core.app.start_heartbeats()
            assert core.state is not None
            if upstream is None:
                log.info(
                    "session %s: app (STOMP %s) connected with no broker up; its SENDs go "
                    "to the outbox",
                    core.id,
                    core.state.app_version,
                )
            else:
                log.info(
                    "session %s: app (STOMP %s) relayed to %s (STOMP %s, %s)",
                    core.id,
                    core.state.app_version,
                    upstream.broker.label,
                    upstream.version,
                    upstream.connected.get("server") or "unknown server",
                )
            # The app side runs in this task (the nursery's body), not a child of its own:
            # one task less per session (the memory of 1,000 idle sessions).
            await self._app_side()

    def _no_first_leg(self, exc: UpstreamUnavailable | ReconnectExhausted) -> None:
        """End a session whose first connection failed, with the app's ERROR."""
        if isinstance(exc, UpstreamUnavailable):
            self.core.end(no_broker(exc))
        else:
            self.core.end(exhausted_initially(exc))

    async def _first_leg_or_local(self, nursery: trio.Nursery) -> bool:
        """Outbox mode: start the link task, and wait for its first leg or for the end of a
        first round with no broker answering, whichever comes first. In the second case the
        session goes on RECONNECTING (:attr:`SessionCore.connected_locally`: the app gets
        the sidecar's own CONNECTED) while the link keeps trying without end; its first leg
        is then restored onto as after a reconnect. False when the session ended instead
        (every broker refused the login: the broker's ERROR reaches the app)."""
        core = self.core
        decided = trio.Event()
        failure: list[UpstreamUnavailable | ReconnectExhausted] = []

        async def start_link() -> None:
            try:
                await nursery.start(self.link.run)
            except (UpstreamUnavailable, ReconnectExhausted) as exc:
                failure.append(exc)
                if core.asked.connected_locally:
                    self._no_first_leg(exc)
            decided.set()

        async def watch_round() -> None:
            await self.link.first_round_failed.wait()
            decided.set()

        async with trio.open_nursery() as waiting:
            waiting.start_soon(watch_round)
            nursery.start_soon(start_link)
            await decided.wait()
            waiting.cancel_scope.cancel()
        if failure:
            self._no_first_leg(failure[0])
            return False
        if core.leg.upstream is None and core.ending is None:
            # No broker answered the first round: the app is answered by the sidecar.
            core.asked.connected_locally = True
            core.leg.loss = Loss(trio.current_time(), None, "no broker answered at CONNECT")
            core.advance(Phase.RECONNECTING)
        return core.ending is None

    async def _app_side(self) -> None:
        core = self.core
        with core.app_scope:
            async with trio.open_nursery() as nursery:
                core.app_nursery = nursery
                if core.drain.requested:  # SIGTERM came before the app side started
                    self._drained_at_once()
                nursery.start_soon(self._app_heartbeats)
                if self.outbox is not None:  # ends with the app side, as core.end() does
                    nursery.start_soon(self.outbox.forward)
                    nursery.start_soon(self.outbox.remove_confirmed)
                await self.app_side.relay(first=core.asked.implicit_first)

    async def _app_heartbeats(self) -> None:
        try:
            await self.core.app.keep_alive()
        except TransportLost as exc:
            self.core.end(Ending(f"app connection lost: {exc}"))


def _left_open(entry: Entry) -> bool:
    """Whether ``entry`` belongs to a transaction the app has not ended: its frames may be
    confirmed only at COMMIT (RabbitMQ), which the drain no longer reads, and the broker
    rolls it back at the DISCONNECT (STOMP 1.2 "BEGIN": a transaction not committed is
    "implicitly aborted if the client sends a DISCONNECT frame")."""
    tx = entry.context
    return isinstance(tx, Transaction) and tx.end is None


def _peer_address(stream: trio.abc.Stream) -> str | None:
    """``host:port`` of the peer of a socket stream (IPv6 in brackets); None for a stream
    without a socket (memory streams in tests) or one already reset."""
    sock = getattr(stream, "socket", None)
    if sock is None:
        return None
    try:
        peer = sock.getpeername()
    except OSError:
        return None
    host, port = str(peer[0]), int(peer[1])
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
