"""What the parts of one session share: its configuration, the app's leg, the session state
that outlives upstream legs, the phase, the one way a session ends (:meth:`SessionCore.end`),
and four small parts with one job each: what the app asked for (:mod:`~proxy.session.asked`),
the broker leg (:mod:`~proxy.session.leg`), flow control with the confirmation window
(:mod:`~proxy.session.flow`) and the drain (:mod:`~proxy.session.drain`).

The parts (:mod:`~proxy.session.app_side`, :mod:`~proxy.session.link`,
:mod:`~proxy.session.broker_side`, ...) each hold this object and the parts below them; none
holds the :class:`~proxy.session.Session` itself, so the package has no import cycle.
"""

from __future__ import annotations

import dataclasses
import logging
import random
from collections.abc import Sequence
from typing import TYPE_CHECKING

import trio

import protocol
from config import Broker, Config, Durations
from protocol import Command
from proxy.legs.memory import MemoryBudgetGate
from proxy.legs.stream import RECEIVE_SIZE, FrameStream
from proxy.reconnect.policy import ReconnectPolicy
from proxy.session.asked import AppRequests
from proxy.session.drain import DrainState
from proxy.session.ending import Ending
from proxy.session.flow import FlowControl
from proxy.session.leg import LegState
from proxy.session.phase import Phase, PhaseMachine
from proxy.telemetry.events import EventBus
from proxy.telemetry.metrics import Metrics
from proxy.telemetry.vocabulary import ClientErrorReason
from proxy.tracking import SessionState
from proxy.tracking.budget import ReadCharge
from proxy.tracking.window import ConfirmationWindow

if TYPE_CHECKING:
    from proxy.outbox.service import SeenRecorder
    from proxy.telemetry.tracing import SessionTracer

__all__ = ["ERROR_CLOSE_WINDOW", "GOODBYE_TIMEOUT", "SessionCore", "log"]

#: The logger of every part of a session.
log = logging.getLogger("mq_sidecar.session")
#: Bytes a broker leg's frame may exceed ``max_frame_bytes`` by, and its longest header line.
UPSTREAM_HEADROOM = 1 << 20
#: Header entries a broker leg's frame may have (at least).
UPSTREAM_MAX_HEADERS = 1 << 16
#: The app's frames read as their bytes while the session runs (the fast lane, the app
#: side's ``_fast_lane``; docs/architecture.md, "The fast lane"). Empty: every frame is parsed.
APP_FAST_LANE: frozenset[Command] = frozenset({Command.SEND})
#: Seconds allowed for a goodbye (DISCONNECT receipt, final ERROR) when a session ends.
GOODBYE_TIMEOUT = 2.0
#: Seconds after a broker's ERROR within which its closing the connection is taken as the
#: end of the session (STOMP 1.2 "ERROR": the server closes just after it), not a failure.
ERROR_CLOSE_WINDOW = 2.0


def session_policy(config: Config) -> ReconnectPolicy:
    """The reconnect policy of a session under ``config`` (also what a SIGHUP gives the live
    sessions): ``config``'s, except in outbox mode, where the outbox holds what the app sends
    while no broker is up (docs/outbox.md), so a session reconnects, and makes its first
    connection, without end."""
    policy = ReconnectPolicy.from_config(config)
    if config.outbox:
        policy = dataclasses.replace(
            policy, reconnect_attempts=-1, initial_connect_attempts=-1, reconnect_period=None
        )
    return policy


class SessionCore:
    """The shared state of one session (see the module docstring).

    Args:
        config: the sidecar's configuration.
        stream: the accepted app connection.
        session_id: the sidecar's id for the session (logs, ``session`` header, id prefix).
        bus: where session events go.
        metrics: where counters go.
        rng: randomness for backoff jitter and ``randomize``.
        brokers: the broker list the session walks (the sidecar's
            :class:`~proxy.reconnect.brokers.BrokerTable`, which changes at run time);
            default: ``config.brokers``.

    Attributes:
        durations: ``config``'s durations in seconds (:class:`config.Durations`).
        app: the app's leg (:class:`proxy.legs.stream.FrameStream`, server role).
        state: what must outlive an upstream leg (None until the app's CONNECT is accepted).
        asked: the app's CONNECT and DISCONNECT (:class:`~proxy.session.asked.AppRequests`).
        leg: the broker leg, its broker and dialect, the outage in progress
            (:class:`~proxy.session.leg.LegState`).
        flow: the confirmation window and what waits on it
            (:class:`~proxy.session.flow.FlowControl`).
        drain: the SIGTERM drain (:class:`~proxy.session.drain.DrainState`).
        ending: the :class:`Ending` decided, once one is.
    """

    #: Every attribute is named here: no per-instance dict (about 1.2 KiB less per session;
    #: the memory of 1,000 idle sessions, docs/architecture.md).
    __slots__ = (
        "_internal_tx",
        "app",
        "app_broke",
        "app_nursery",
        "app_scope",
        "asked",
        "brokers",
        "bus",
        "config",
        "drain",
        "durations",
        "ending",
        "flow",
        "id",
        "leg",
        "limits",
        "metrics",
        "phases",
        "policy",
        "rng",
        "seen",
        "state",
        "tracer",
        "upstream_charge",
        "upstream_limits",
    )

    def __init__(
        self,
        config: Config,
        stream: trio.abc.Stream,
        session_id: str,
        *,
        bus: EventBus,
        metrics: Metrics,
        rng: random.Random,
        memory: MemoryBudgetGate | None = None,
        brokers: Sequence[Broker] | None = None,
    ) -> None:
        self.config = config
        self.brokers: Sequence[Broker] = brokers if brokers is not None else config.brokers
        self.durations: Durations = config.durations
        self.id = session_id
        self.bus = bus
        self.metrics = metrics
        self.rng = rng
        self.policy = session_policy(config)
        self.limits = protocol.Limits(
            max_frame_bytes=config.max_frame_bytes,
            max_headers=config.max_headers,
            max_header_line_bytes=config.max_header_line_bytes,
        )
        #: The broker leg's bounds: looser, since a broker adds headers to what it delivers
        #: and takes from other publishers what the sidecar's app limits would refuse
        #: (RabbitMQ has no header limits at all); a MESSAGE over the app's limits must not
        #: read as broken STOMP, which would fail the session over and get it redelivered.
        self.upstream_limits = protocol.Limits(
            max_frame_bytes=config.max_frame_bytes + UPSTREAM_HEADROOM,
            max_headers=max(config.max_headers, UPSTREAM_MAX_HEADERS),
            max_header_line_bytes=max(config.max_header_line_bytes, UPSTREAM_HEADROOM),
        )
        self.app = FrameStream(
            stream,
            # The broker judges the app's frames; the sidecar only what it owns.
            protocol.Connection(protocol.Role.SERVER, self.limits, judge_frames=False),
            grace=config.heartbeat_grace,
        )
        self.app.conn.raw_commands = APP_FAST_LANE
        self.state: SessionState | None = None
        self.phases = PhaseMachine()
        self.asked = AppRequests()
        self.leg = LegState()
        self.flow = FlowControl(
            ConfirmationWindow(
                config.confirmation_window_size,
                receipt_prefix=f"{session_id}-r",
                budget=memory.budget if memory is not None else None,
            )
        )
        #: What the broker legs' read buffers hold (a MESSAGE being read), charged to the
        #: memory budget, one for all the session's legs (proxy.session.link gives it to each).
        self.upstream_charge: ReadCharge | None = None
        if memory is not None:  # the process's max_memory_bytes (proxy.legs.memory)
            self.app.use_memory(memory)
            assert self.app.read_charge is not None
            self.app.read_charge.must_read = self.app_must_be_read
            # A frame returned is charged until it enters the window (ReadCharge.to_window).
            self.app.read_charge.position = self.app_read_position
            self.upstream_charge = memory.charge_for(RECEIVE_SIZE, broker=True)
            self.flow.window.handoff = self.app.read_charge
        self.drain = DrainState()
        self.ending: Ending | None = None
        self.app_scope = trio.CancelScope()
        self.app_nursery: trio.Nursery | None = None  # while the app side runs
        #: What the app's leg failed on in a frame read ahead, not yet reported to it.
        self.app_broke: protocol.RemoteProtocolError | None = None
        #: Outbox mode: where the ids of messages the app settled on queue subscriptions are
        #: persisted (issue 17 part 3, docs/behaviour.md "Duplicate detection").
        self.seen: SeenRecorder | None = None
        #: The session's spans (``tracing = true``; docs/operations.md, "Traces"); None when
        #: tracing is off, and then each hook of the session costs this one test.
        self.tracer: SessionTracer | None = None
        self._internal_tx = 0

    async def hand_seen(self) -> None:
        """Hand what the session state settled to persist (:attr:`SessionState.seen_out
        <proxy.tracking.SessionState.seen_out>`) to :attr:`seen`, and clear it. Waits only
        while the recorder is full (:data:`proxy.outbox.service.SEEN_PENDING_MAX`)."""
        state = self.state
        if state is None or not state.seen_out:
            return
        pairs, state.seen_out = state.seen_out, []
        if self.seen is not None:
            await self.seen.add(pairs)

    def internal_transaction(self) -> str:
        """A transaction id of the sidecar's own (``<session>-c<n>``), for frames it sends
        only to have something confirmed."""
        self._internal_tx += 1
        return f"{self.id}-c{self._internal_tx}"

    @property
    def phase(self) -> Phase:
        """The session's :class:`~proxy.session.phase.Phase`."""
        return self.phases.phase

    def advance(self, to: Phase) -> None:
        """Change phase (:meth:`PhaseMachine.advance`; raises PhaseError on a bad one)."""
        self.phases.advance(to)

    def app_must_be_read(self) -> bool:
        """Whether its app must be read whatever the memory budget says: its CONNECT is not
        read yet (the session was admitted under the budget; ``handshake_timeout`` bounds
        it), or only the app's next frames can free what this session holds: it has an open
        transaction (``max_transaction_size`` bounds what it keeps), its window holds
        frames and no receipt is pending for them (a later frame's receipt confirms them;
        RabbitMQ answers those of a transaction at its COMMIT), or the broker relay waits for
        the app's ACKs (``max_unacked``), and with it the RECEIPTs that would free the
        window."""
        state = self.state
        if state is None or state.transaction_bytes.used:
            # Its CONNECT, or the COMMIT/ABORT that frees what its open transactions keep.
            return True
        window = self.flow.window
        if len(window) and not window.receipts_pending:
            return True
        return state.unacked >= state.max_unacked

    def app_read_position(self) -> tuple[int, int]:
        """What is buffered of the app's next frame, and how many frames its leg returned."""
        return self.app.conn.frame_in_progress()[0], self.app.frames_in

    def leave_memory(self) -> None:
        """The session is over: what its window and its app leg's buffer were charged goes
        back to the process's memory budget (``max_memory_bytes``)."""
        self.flow.window.leave_budget()
        self.app.leave_memory()
        if self.upstream_charge is not None:
            self.upstream_charge.close()
        if self.state is not None:
            self.state.transaction_bytes.leave_budget()

    def end(self, ending: Ending) -> None:
        """End the session (the first call's ``ending`` wins): stop the app side and the link
        task. Never blocks; the tasks unwind at their next checkpoint."""
        if self.ending is None:
            self.ending = ending
            if self.phase is not Phase.CLOSED:
                self.advance(Phase.CLOSING)
        self.app_scope.cancel()
        self.leg.scope.cancel()

    def end_for_app_protocol_error(self, exc: protocol.RemoteProtocolError) -> None:
        """End the session because the app broke STOMP: counted as a malformed frame, the
        ERROR that ``exc`` carries answers the app, logged as a warning."""
        self.metrics.client_protocol_error(ClientErrorReason.MALFORMED_FRAME)
        self.end(
            Ending(f"app protocol error: {exc}", app_error=exc.error_frame, level=logging.WARNING)
        )

    async def frame_boundary(self) -> None:
        """The app side between two frames (called while :attr:`FlowControl.failback_hold
        <proxy.session.flow.FlowControl.failback_hold>` is set): a failback holds the app's
        next frame here until the session runs on the first broker, unless a transaction is
        open (then the app goes on to its COMMIT or ABORT)."""
        hold = self.flow.failback_hold
        if hold is not None and self.state is not None and not self.state.transactions:
            await hold.wait()
