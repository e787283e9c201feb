"""One app session: the app's STOMP connection to the sidecar, kept alive across broker failure.

The sidecar *terminates* the app's connection: toward the app it is a STOMP server, toward the
broker a STOMP client, and each leg negotiates its own version and heart-beats. Everything that
must outlive one upstream connection (subscriptions, transactions, ack ids, identities of
delivered messages) is in :class:`proxy.tracking.SessionState`, and every frame bound for the
broker sits in the :class:`proxy.window.ConfirmationWindow` until a RECEIPT confirms it. So
when the upstream leg dies the app's session stays up: the sidecar reattaches or fails over,
restores the session and replays what the old broker never confirmed, and tells the app.

Where each rule lives (``proxy/session/``):

- ``core``: the state the parts share, the one way to end a session; ``phase``: the phases
  and their transition table; ``ending``: endings and the sidecar's own ERROR frames;
- ``handshake``: the app's CONNECT and CONNECTED; ``app_side``: app → broker, one handler per
  command; ``confirmations``: the window at work (receipts, backpressure, ``call_timeout``);
- ``link``: connect by policy, reconnect, failback, goodbye; ``restore``: re-create and replay
  after a reconnect, or report what was lost; ``broker_side``: broker → app;
- ``acks``: the sidecar's own ACKs; ``to_app``: writing to the app; ``control``: events.

Task layout (every task has an owner). :meth:`Session.run` owns one nursery with:

- the **link task** (:class:`~proxy.session.link.Link`): connects by policy, restores, relays
  broker → app until the leg is lost, then (RECONNECTING: "stop the world") connects again;
  it is the only reader of the upstream leg. Each leg's heart-beat sender and the sidecar's
  ACK writer run in a nursery the link task opens for that leg;
- the **app side**: the app reader (app → window → broker), the app heart-beat sender, the
  ``call_timeout`` watchdog and, when asked for, the control-channel pump.

Whoever decides that the session is over calls :meth:`SessionCore.end`: the first
:class:`Ending` wins; the link task then says goodbye to the broker (bounded, shielded) and
``run`` sends the app its ERROR, if any, and closes.
"""

from __future__ import annotations

import contextlib
import logging
import random

import trio

from config import Config
from proxy.events import EventBus
from proxy.failover import ReconnectBoard, ReconnectExhausted
from proxy.metrics import Metrics
from proxy.session.acks import SidecarAcks
from proxy.session.app_side import AppSide
from proxy.session.broker_side import BrokerSide
from proxy.session.confirmations import Confirmations
from proxy.session.control import ControlChannel
from proxy.session.core import GOODBYE_TIMEOUT, SessionCore, log
from proxy.session.ending import (
    Ending,
    draining,
    error_frame,
    exhausted_initially,
    no_broker,
)
from proxy.session.handshake import accept_connect, connected_frame
from proxy.session.link import Link
from proxy.session.phase import Phase
from proxy.session.restore import Restorer
from proxy.session.to_app import AppOutput
from proxy.statistics import SessionStatistics
from proxy.upstream import BrokerStreams, StreamOpener, UpstreamUnavailable
from proxy.wire import TransportLost, send_heartbeats

__all__ = ["Session"]

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
            :class:`~proxy.upstream.BrokerStreams` (TCP/TLS; a private one when None), a
            memory stream to a scripted broker in unit tests.
        reconnects: the sidecar's :class:`~proxy.failover.ReconnectBoard`, shared by its
            sessions: reconnects are reported there and a first connection waits there for
            their outcome (a private one when None).

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
    ) -> None:
        core = SessionCore(
            config,
            stream,
            session_id,
            bus=bus if bus is not None else EventBus(),
            metrics=metrics if metrics is not None else Metrics(),
            rng=rng if rng is not None else _RNG,
        )
        self.core = core
        self.id = session_id
        self.acks = SidecarAcks(config.max_unacked)
        self.out = AppOutput(core, self.acks)
        self.control = ControlChannel(core, self.out)
        self.confirmations = Confirmations(core, self.out, self.control)
        self.app_side = AppSide(core, self.out, self.control, self.confirmations)
        self.link = Link(
            core,
            self.acks,
            self.control,
            BrokerSide(core, self.acks, self.out, self.confirmations),
            Restorer(core, self.out, self.control),
            open_stream=open_stream if open_stream is not None else BrokerStreams(config),
            reconnects=reconnects if reconnects is not None else ReconnectBoard(),
        )

    # -- public -------------------------------------------------------------------------------

    def request_drain(self) -> None:
        """Ask the session to end gracefully (SIGTERM): DISCONNECT upstream, ERROR to the app.

        A session still making its first connection (which may try for
        ``initial_connect_period``) stops trying; one still reading its app's CONNECT ends
        once it has it. Either way the app gets the drain's ERROR.
        """
        core = self.core
        core.drain_requested = True
        if core.app_nursery is not None or core.connect is not None:
            core.end(draining())

    def statistics(self) -> SessionStatistics:
        """Counters and state of this session."""
        core = self.core
        st = core.state
        up = core.upstream
        now = trio.current_time()
        window = core.window
        oldest = next(iter(window), None)
        loss = core.loss
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
            reconnect_attempts=(len(core.reconnect_attempts) if phase is Phase.RECONNECTING else 0),
            failovers=core.failovers,
            duplicates_hidden=st.duplicates_hidden if st else 0,
            redeliveries_hidden=st.redeliveries_hidden if st else 0,
            reconnecting_for=now - loss.at if loss is not None else None,
            oldest_unconfirmed_age=now - oldest.enqueued_at if oldest is not None else None,
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
            with trio.move_on_after(GOODBYE_TIMEOUT, shield=True):
                # What the relays queued before the end (the RECEIPT of the app's DISCONNECT)
                # leaves first, then the ERROR that ends the session, if any.
                with contextlib.suppress(TransportLost):
                    await core.app.flush()
                if ending is not None and ending.app_error is not None:
                    await self.out.send_quietly(ending.app_error)
                await trio.aclose_forcefully(core.app.stream)
            if ending is not None:
                log.log(ending.level, "session %s closed: %s", core.id, ending.reason)

    # -- serving ------------------------------------------------------------------------------

    async def _serve(self) -> None:
        core = self.core
        if core.drain_requested:  # SIGTERM came while the app's CONNECT was read
            core.end(draining())
            return
        async with trio.open_nursery() as nursery:
            try:
                await nursery.start(self.link.run)
            except UpstreamUnavailable as exc:
                core.end(no_broker(exc))
                return
            except ReconnectExhausted as exc:
                core.end(exhausted_initially(exc))
                return
            if core.ending is not None:
                return
            upstream = core.upstream
            assert upstream is not None
            try:
                await core.app.send(connected_frame(core, upstream))
            except TransportLost as exc:
                core.end(Ending(f"app connection lost: {exc}"))
                return
            core.app.start_heartbeats()
            assert core.state is not None
            log.info(
                "session %s: app (STOMP %s) relayed to %s (STOMP %s, %s)",
                core.id,
                core.state.app_version,
                upstream.broker.label,
                upstream.version,
                upstream.connected.get("server") or "unknown server",
            )
            nursery.start_soon(self._app_side)

    async def _app_side(self) -> None:
        core = self.core
        with core.app_scope:
            async with trio.open_nursery() as nursery:
                core.app_nursery = nursery
                if core.drain_requested:
                    core.end(draining())
                nursery.start_soon(self._app_heartbeats)
                nursery.start_soon(self.confirmations.watch_call_timeouts)
                await self.app_side.relay()

    async def _app_heartbeats(self) -> None:
        try:
            await send_heartbeats(self.core.app)
        except TransportLost as exc:
            self.core.end(Ending(f"app connection lost: {exc}"))
