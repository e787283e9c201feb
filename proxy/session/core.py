"""What the parts of one session share: its configuration, the app's leg, the session state
that outlives upstream legs, the confirmation window, the current leg, the phase, and the one
way a session ends (:meth:`SessionCore.end`).

The parts (:mod:`~proxy.session.app_side`, :mod:`~proxy.session.link`,
:mod:`~proxy.session.broker_side`, ...) each hold this object and the parts below them; none
holds the :class:`~proxy.session.Session` itself, so the package has no import cycle.
"""

from __future__ import annotations

import dataclasses
import logging
import random
from typing import TYPE_CHECKING

import trio

import protocol
from config import Config, Durations
from protocol import Command, Frame
from proxy.events import EventBus
from proxy.failover import Attempt
from proxy.metrics import Metrics
from proxy.policy import ReconnectPolicy
from proxy.session.ending import Ending, Loss
from proxy.session.phase import Phase, PhaseMachine
from proxy.tracking import SessionState
from proxy.upstream import Upstream
from proxy.vocabulary import ClientErrorReason
from proxy.window import ConfirmationWindow, Entry
from proxy.wire import FrameStream

if TYPE_CHECKING:
    from proxy.spool import SeenRecorder

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


class SessionCore:
    """The shared state of one session (see the module docstring).

    Args:
        config: the sidecar's configuration.
        stream: the accepted app connection.
        session_id: the sidecar's id for the session (logs, ``session`` header, id prefix).
        bus: where session events go.
        metrics: where counters go.
        rng: randomness for backoff jitter and ``randomize``.

    Attributes:
        durations: ``config``'s durations in seconds (:class:`config.Durations`).
        app: the app's leg (:class:`proxy.wire.FrameStream`, server role).
        state: what must outlive an upstream leg (None until the app's CONNECT is accepted).
        window: frames sent (or to be sent) upstream and not yet confirmed.
        upstream: the live leg, or None while connecting or reconnecting.
        link_ready: frames may be queued on ``upstream`` as the app sends them (False while a
            restore writes the window, :attr:`send_lock` held).
        ending: the :class:`Ending` decided, once one is.
    """

    #: Every attribute is named here: no per-instance dict (about 1.2 KiB less per session;
    #: the memory of 1,000 idle sessions, docs/architecture.md).
    __slots__ = (
        "_internal_tx",
        "_link_ready",
        "_link_up",
        "_window_event",
        "_window_waiters",
        "acks_freed",
        "app",
        "app_authenticated",
        "app_broke",
        "app_hold",
        "app_nursery",
        "app_scope",
        "artemis_ids",
        "broker_index",
        "bus",
        "config",
        "connect",
        "connected_locally",
        "cumulative_receipts",
        "disconnect_entry",
        "disconnected",
        "drain_deadline",
        "drain_requested",
        "durations",
        "ending",
        "failovers",
        "held_back",
        "id",
        "limits",
        "link_scope",
        "loss",
        "metrics",
        "phases",
        "policy",
        "receipts_copied",
        "reconnect_attempts",
        "rng",
        "seen",
        "send_lock",
        "state",
        "stomp10_rabbitmq",
        "upstream",
        "upstream_limits",
        "wildcard_receipt_bug",
        "window",
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
    ) -> None:
        self.config = config
        self.durations: Durations = config.durations
        self.id = session_id
        self.bus = bus
        self.metrics = metrics
        self.rng = rng
        self.policy = ReconnectPolicy.from_config(config)
        if config.outbox:
            # The outbox holds what the app sends while no broker is up (docs/outbox.md): a
            # session reconnects, and makes its first connection, without end.
            self.policy = dataclasses.replace(
                self.policy,
                reconnect_attempts=-1,
                initial_connect_attempts=-1,
                reconnect_period=None,
            )
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
        self.window = ConfirmationWindow(
            config.confirmation_window_size, receipt_prefix=f"{session_id}-r"
        )
        self.phases = PhaseMachine()
        self.connect: Frame | None = None  # the app's CONNECT, once accepted
        #: The app presented the sidecar's own ``client_login``/``client_passcode`` (False
        #: when none is configured): it may see every session's events (control channel).
        self.app_authenticated = False
        self.upstream: Upstream | None = None
        self.broker_index: int | None = None
        self._link_ready = False
        self._link_up = trio.Event()
        #: The sidecar answered the app's CONNECT itself, no broker being up (outbox mode):
        #: the first leg is then restored onto as after a reconnect.
        self.connected_locally = False
        self.failovers = 0
        self.ending: Ending | None = None
        self.app_scope = trio.CancelScope()
        self.link_scope = trio.CancelScope()
        self.app_nursery: trio.Nursery | None = None  # while the app side runs
        self.drain_requested = False
        #: When the drain's wait for receipts ends (trio seconds), once one is requested.
        self.drain_deadline: float | None = None
        #: MESSAGEs not shown to the app during the drain (back to the broker at DISCONNECT).
        self.held_back = 0
        #: Appending to the window and sending happen under this lock, which a restore also
        #: holds while it replays: frames reach the broker in window order.
        self.send_lock = trio.Lock()
        self._window_event = trio.Event()
        self._window_waiters = 0
        #: Set when the app settles messages or unsubscribes (the broker relay may wait for
        #: it when ``max_unacked`` messages are outstanding).
        self.acks_freed = trio.Event()
        #: Set while a ``priority_backup`` failback holds the app's frames (proxy.session.link;
        #: :meth:`frame_boundary`); set and cleared when the hold ends.
        self.app_hold: trio.Event | None = None
        self.disconnect_entry: Entry | None = None  # the app's DISCONNECT, once submitted
        self.disconnected = trio.Event()  # its receipt arrived
        self.reconnect_attempts: list[Attempt] = []  # of the reconnect in progress
        self.loss: Loss | None = None  # the current outage, while reconnecting
        #: What the app's leg failed on in a frame read ahead, not yet reported to it.
        self.app_broke: protocol.RemoteProtocolError | None = None
        #: One RECEIPT confirms every earlier frame (False on a RabbitMQ leg,
        #: :attr:`proxy.upstream.Upstream.confirms_in_order`).
        self.cumulative_receipts = True
        #: SENDs carry ``_AMQ_DUPL_ID`` (:attr:`proxy.upstream.Upstream.artemis_duplicate_ids`).
        self.artemis_ids = True
        #: A wildcard SUBSCRIBE is confirmed by a later frame's receipt, not its own
        #: (:attr:`proxy.upstream.Upstream.receipt_breaks_wildcard_subscribe`).
        self.wildcard_receipt_bug = False
        #: STOMP 1.0 NACK and id-less durable SUBSCRIBE as RabbitMQ takes them
        #: (:attr:`proxy.upstream.Upstream.stomp10_rabbitmq`).
        self.stomp10_rabbitmq = False
        #: The broker copies a SEND's ``receipt`` header into its MESSAGEs
        #: (:attr:`proxy.upstream.Upstream.copies_receipt_into_messages`).
        self.receipts_copied = False
        #: Outbox mode: where the ids of messages the app settled on queue subscriptions are
        #: persisted (issue 17 part 3, docs/behaviour.md "Duplicate detection").
        self.seen: SeenRecorder | None = None
        self._internal_tx = 0

    async def hand_seen(self) -> None:
        """Hand what the session state settled to persist (:attr:`SessionState.seen_out
        <proxy.tracking.SessionState.seen_out>`) to :attr:`seen`, and clear it. Waits only
        while the recorder is full (:data:`proxy.spool.SEEN_PENDING_MAX`)."""
        state = self.state
        if state is None or not state.seen_out:
            return
        pairs, state.seen_out = state.seen_out, []
        if self.seen is not None:
            await self.seen.add(pairs)

    @property
    def link_ready(self) -> bool:
        """Frames may be queued on :attr:`upstream` as the app sends them (False while
        connecting, reconnecting, or while a restore writes the window)."""
        return self._link_ready

    @link_ready.setter
    def link_ready(self, ready: bool) -> None:
        if ready and not self._link_ready:
            self._link_up.set()
        elif not ready and self._link_ready:
            self._link_up = trio.Event()
        self._link_ready = ready

    async def wait_link_ready(self) -> None:
        """Wait until :attr:`link_ready` (at once when it is)."""
        if not self._link_ready:
            await self._link_up.wait()

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

    def end(self, ending: Ending) -> None:
        """End the session (the first call's ``ending`` wins): stop the app side and the link
        task. Never blocks; the tasks unwind at their next checkpoint."""
        if self.ending is None:
            self.ending = ending
            if self.phase is not Phase.CLOSED:
                self.advance(Phase.CLOSING)
        self.app_scope.cancel()
        self.link_scope.cancel()

    def end_for_app_protocol_error(self, exc: protocol.RemoteProtocolError) -> None:
        """End the session because the app broke STOMP: counted as a malformed frame, the
        ERROR that ``exc`` carries answers the app, logged as a warning."""
        self.metrics.client_protocol_error(ClientErrorReason.MALFORMED_FRAME)
        self.end(
            Ending(f"app protocol error: {exc}", app_error=exc.error_frame, level=logging.WARNING)
        )

    def window_changed(self) -> None:
        """Wake the tasks waiting for the window to change (room, a new app receipt to
        watch). Called on every relayed frame, so it costs nothing when nobody waits."""
        if self._window_waiters:
            self._window_event.set()
            self._window_event = trio.Event()

    async def window_change(self) -> None:
        """Wait for the next :meth:`window_changed`."""
        self._window_waiters += 1
        try:
            await self._window_event.wait()
        finally:
            self._window_waiters -= 1

    async def frame_boundary(self) -> None:
        """The app side between two frames (called while :attr:`app_hold` is set): a failback
        holds the app's next frame here until the session runs on the first broker, unless a
        transaction is open (then the app goes on to its COMMIT or ABORT)."""
        hold = self.app_hold
        if hold is not None and self.state is not None and not self.state.transactions:
            await hold.wait()
