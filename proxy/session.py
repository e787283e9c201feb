"""One app session: the app's STOMP connection to the sidecar, kept alive across broker failure.

The sidecar *terminates* the app's connection (DESIGN §3): toward the app it is a STOMP server,
toward the broker a STOMP client, and each leg negotiates its own version and heart-beats.
Everything that must outlive one upstream connection (subscriptions, transactions, ack ids,
identities of delivered messages) is in :class:`proxy.tracking.SessionState`, and every frame
bound for the broker sits in the :class:`proxy.window.ConfirmationWindow` until a RECEIPT
confirms it. So when the upstream leg dies the app's session stays up: the sidecar reattaches
or fails over (:mod:`proxy.failover`), restores the session and replays what the old broker
never confirmed (:mod:`proxy.replay`), and tells the app (:mod:`proxy.events`).

Task layout (STYLE §2 rule 8: every task has an owner). ``Session.run`` owns one nursery with:

- the **link task**: connects by policy, restores, relays broker → app until the leg is lost,
  then (RECONNECTING: "stop the world", Qpid draft) connects again; it is the only reader of
  the upstream leg. Each leg's heart-beat sender runs in a nursery the link task opens for it;
- the **app side**: the app reader (app → window → broker), the app heart-beat sender, the
  ``call_timeout`` watchdog, the control-channel pump and the drain watcher.

Frames reach the broker in window order: appending and sending happen under one lock, which
the link task also holds while it replays on a new leg. Whoever decides that the session is
over calls :meth:`Session._end`: the first :class:`Ending` wins; the link task then says goodbye
to the broker (bounded, shielded) and ``run`` sends the app its ERROR, if any, and closes.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import random
from dataclasses import dataclass

import trio

import protocol
from config import Broker, Config
from protocol import Command, ConnectionClosed, Frame, HeartBeat
from proxy.events import EventBus, EventKind, SessionEvent
from proxy.failover import Attempt, ReconnectExhausted, connect_by_policy
from proxy.metrics import Metrics
from proxy.policy import ReconnectPolicy
from proxy.replay import ReplayPlan, plan_replay
from proxy.statistics import SessionStatistics
from proxy.tracking import (
    DUPLICATE_ID_HEADER,
    DurableRemoval,
    FrameRejected,
    SessionError,
    SessionState,
)
from proxy.upstream import (
    StreamOpener,
    Upstream,
    UpstreamRefused,
    UpstreamUnavailable,
    connect_frame,
    connect_upstream,
    open_broker_stream,
)
from proxy.vocabulary import (
    ClientErrorReason,
    ConnectOutcome,
    FailoverReason,
    OutageOutcome,
    TransactionOutcome,
)
from proxy.window import ConfirmationWindow, Entry, frame_size
from proxy.wire import FrameStream, HeartBeatTimeout, TransportLost, send_heartbeats

__all__ = ["Ending", "Session", "SessionStatistics", "error_frame"]

log = logging.getLogger("mq_sidecar.session")

#: Versions the sidecar speaks on both legs (STOMP 1.0, 1.1, 1.2).
SUPPORTED_VERSIONS = protocol.VERSIONS
#: Seconds allowed for a goodbye (DISCONNECT receipt, final ERROR) when a session ends.
GOODBYE_TIMEOUT = 2.0
#: Seconds after a broker's ERROR within which its closing the connection is taken as the
#: end of the session (STOMP 1.2 "ERROR": the server closes just after it), not a failure.
ERROR_CLOSE_WINDOW = 2.0
#: Jitter and ``randomize`` draws of every session without an rng of its own: one generator
#: for the process (2.5 KiB of Mersenne Twister state per session otherwise).
_RNG = random.Random()
#: Artemis' duplicate detection header (Artemis "Duplicate Message Detection").
ARTEMIS_DUPLICATE_ID = "_AMQ_DUPL_ID"
#: Commands that always carry a sidecar receipt (DESIGN §3.3).
_ALWAYS_RECEIPTED = frozenset(
    {
        Command.BEGIN,
        Command.COMMIT,
        Command.ABORT,
        Command.SUBSCRIBE,
        Command.UNSUBSCRIBE,
        Command.DISCONNECT,
    }
)


def error_frame(message: str, *, receipt_id: str | None = None, detail: str = "") -> Frame:
    """An ERROR frame for the app: one-line ``message`` header, optional ``receipt-id``.

    STOMP 1.2 "ERROR": the ``message`` header is a short description, the body may hold more;
    ``receipt-id`` is set when the frame that caused it asked for a receipt.
    """
    headers: list[tuple[str, str]] = [("message", message)]
    if receipt_id is not None:
        headers.append(("receipt-id", receipt_id))
    headers.append(("content-type", "text/plain"))
    return Frame(Command.ERROR, tuple(headers), (detail or message).encode() + b"\n")


@dataclass(frozen=True, slots=True)
class Ending:
    """Why a session ends and what each side is told.

    ``app_error``: the ERROR frame the app gets before its connection closes (None: nothing,
    e.g. the app went away or already got its RECEIPT). ``disconnect_upstream``: send the broker
    a DISCONNECT (and wait for its receipt) rather than just closing the socket.
    """

    reason: str
    app_error: Frame | None = None
    disconnect_upstream: bool = True
    level: int = logging.INFO


@dataclass(frozen=True, slots=True)
class _Loss:
    """The loss of an upstream leg: when (trio seconds), which broker, why."""

    at: float
    broker: str | None
    reason: str
    kind: FailoverReason = FailoverReason.CONNECTION_LOST


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
        open_stream: opens the byte stream to a broker (TCP/TLS; a memory stream to a
            scripted broker in unit tests).

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
        open_stream: StreamOpener = open_broker_stream,
    ) -> None:
        self.config = config
        self.metrics = metrics if metrics is not None else Metrics()
        self.id = session_id
        self.bus = bus if bus is not None else EventBus()
        self.rng = rng if rng is not None else _RNG
        self._open_stream = open_stream
        self.policy = ReconnectPolicy.from_config(config)
        limits = protocol.Limits(
            max_frame_bytes=config.max_frame_bytes,
            max_headers=config.max_headers,
            max_header_line_bytes=config.max_header_line_bytes,
        )
        self.limits = limits
        self.app = FrameStream(
            stream, protocol.Connection(protocol.Role.SERVER, limits), grace=config.heartbeat_grace
        )
        self.state: SessionState | None = None
        self.window = ConfirmationWindow(
            config.confirmation_window_size, receipt_prefix=f"{session_id}-r"
        )
        self.upstream: Upstream | None = None
        self.broker_index: int | None = None
        self.phase = "handshake"
        self.failovers = 0
        self._connect: Frame | None = None
        self._ending: Ending | None = None
        self._app_scope = trio.CancelScope()
        self._link_scope = trio.CancelScope()
        self._drain_requested = False
        self._app_nursery: trio.Nursery | None = None  # while the app side runs
        self._pumping = False  # other sessions' events are relayed (_pump_events runs)
        self._send_lock = trio.Lock()
        self._link_ready = False
        self._window_event = trio.Event()
        self._window_waiters = 0
        self._acks_freed = trio.Event()
        self._disconnect_entry: Entry | None = None
        self._disconnected = trio.Event()
        self._upstream_error_at: float | None = None  # when this leg last sent an ERROR
        self._reconnect_attempts: list[Attempt] = []
        self._loss: _Loss | None = None  # the current outage, while reconnecting
        self._relay_scope = trio.CancelScope()  # per leg; cancelled to fail back
        self._failback: Upstream | None = None
        self._dup_seq = 0
        self._event_seq = 0
        self._app_broke: protocol.RemoteProtocolError | None = None  # read ahead, not yet reported
        self._cumulative_receipts = True  # False on a RabbitMQ leg (Upstream.confirms_in_order)
        self._artemis_ids = True  # SENDs carry _AMQ_DUPL_ID (Upstream.artemis_duplicate_ids)
        # The sidecar's own ACKs (auto subscriptions, hidden messages) are queued on the leg by
        # the relay, in the order it handles deliveries, and flushed by _flush_sidecar_acks.
        self._acks_held: list[Frame] = []  # ACKs of auto-acked messages until the app flush
        # Cumulative ACKs of auto subscriptions (Delivered.coalesce): the latest of each,
        # and how many messages they settle, until the app flush.
        self._acks_latest: dict[str, Frame] = {}
        self._acks_latest_count = 0
        self._ack_flush_wanted = False
        self._acks_queued = trio.Event()
        self._acks_sent = trio.Event()

    # -- public -------------------------------------------------------------------------------

    def request_drain(self) -> None:
        """Ask the session to end gracefully (SIGTERM): DISCONNECT upstream, ERROR to the app.

        A session still connecting ends as soon as it has answered its app's CONNECT.
        """
        self._drain_requested = True
        if self._app_nursery is not None:
            self._drain()

    def statistics(self) -> SessionStatistics:
        """Counters and state of this session."""
        st = self.state
        up = self.upstream
        now = trio.current_time()
        oldest = next(iter(self.window), None)
        loss = self._loss
        return SessionStatistics(
            session_id=self.id,
            state=self.phase,
            app_version=st.app_version if st else None,
            broker=up.broker.label if up else None,
            upstream_version=up.version if up else None,
            subscriptions=len(st.subscriptions) if st else 0,
            transactions=len(st.transactions) if st else 0,
            unacked=st.unacked if st else 0,
            pending_receipts=self.window.statistics().receipts_pending,
            frames_from_app=self.app.frames_in,
            frames_to_app=self.app.frames_out,
            window=self.window.statistics(),
            reconnect_attempts=len(self._reconnect_attempts) if self.phase == "reconnecting" else 0,
            failovers=self.failovers,
            duplicates_hidden=st.duplicates_hidden if st else 0,
            redeliveries_hidden=st.redeliveries_hidden if st else 0,
            reconnecting_for=now - loss.at if loss is not None else None,
            oldest_unconfirmed_age=now - oldest.enqueued_at if oldest is not None else None,
        )

    async def run(self) -> None:
        """Serve the session to its end; the app's socket is closed when this returns."""
        try:
            connect = await self._handshake_app()
            if connect is not None:
                await self._serve(connect)
        except Exception as exc:
            # The session boundary (STYLE §3): a bug here ends this session only, loudly.
            log.exception("session %s: internal error", self.id)
            self._end(
                Ending(
                    f"internal error: {type(exc).__name__}",
                    app_error=error_frame("mq-sidecar internal error; see the sidecar's log"),
                    level=logging.ERROR,
                )
            )
        finally:
            ending = self._ending
            self.phase = "closed"
            with trio.move_on_after(GOODBYE_TIMEOUT, shield=True):
                # What the relays queued before the end (the RECEIPT of the app's DISCONNECT)
                # leaves first, then the ERROR that ends the session, if any.
                with contextlib.suppress(TransportLost):
                    await self.app.flush()
                if ending is not None and ending.app_error is not None:
                    await self._send_app_quietly(ending.app_error)
                await trio.aclose_forcefully(self.app.stream)
            if ending is not None:
                log.log(ending.level, "session %s closed: %s", self.id, ending.reason)

    # -- handshake ----------------------------------------------------------------------------

    async def _handshake_app(self) -> Frame | None:
        """Read and check the app's CONNECT; None when the session already ended."""
        timeout = self.config.handshake_timeout / 1000
        try:
            with trio.fail_after(timeout):
                while True:
                    event = await self.app.receive_event()
                    if isinstance(event, Frame):
                        connect = event
                        break
                    if isinstance(event, ConnectionClosed):
                        self._end(Ending("app closed before CONNECT", disconnect_upstream=False))
                        return None
        except trio.TooSlowError:
            self.metrics.client_protocol_error(ClientErrorReason.HANDSHAKE_TIMEOUT)
            self._end(
                Ending(
                    "no CONNECT from the app in time",
                    app_error=error_frame(f"no CONNECT frame received within {timeout:g} s"),
                )
            )
            return None
        except protocol.RemoteProtocolError as exc:
            self.metrics.client_protocol_error(ClientErrorReason.MALFORMED_FRAME)
            self._end(Ending(f"bad CONNECT: {exc}", app_error=exc.error_frame))
            return None
        except TransportLost as exc:
            self._end(Ending(f"app connection lost before CONNECT: {exc}"))
            return None
        accept = connect.get("accept-version")
        version = protocol.negotiate_version(accept, SUPPORTED_VERSIONS)
        if version is None:
            self.metrics.client_protocol_error(ClientErrorReason.UNSUPPORTED_VERSION)
            supported = ",".join(SUPPORTED_VERSIONS)
            err = error_frame(
                f"unsupported STOMP version(s) {accept}; supported: {supported}"
            ).with_header("version", supported)
            self._end(Ending(f"unsupported versions {accept!r}", app_error=err))
            return None
        if self.config.client_login is not None and not self._app_credentials_ok(connect):
            self.metrics.client_protocol_error(ClientErrorReason.AUTH_FAILED)
            self._end(
                Ending(
                    "app authentication failed",
                    app_error=error_frame("access denied: bad login or passcode for mq-sidecar"),
                    level=logging.WARNING,
                )
            )
            return None
        self.state = SessionState(
            self.id,
            version,
            max_subscriptions=self.config.max_subscriptions,
            max_unacked=self.config.max_unacked,
            transparent=self.config.failover_mode == "transparent",
        )
        self._connect = connect
        return connect

    def _app_credentials_ok(self, connect: Frame) -> bool:
        expected_login = self.config.client_login or ""
        secret = self.config.client_passcode
        expected_pass = secret.reveal() if secret is not None else ""
        login_ok = hmac.compare_digest(
            (connect.get("login") or "").encode(), expected_login.encode()
        )
        pass_ok = hmac.compare_digest(
            (connect.get("passcode") or "").encode(), expected_pass.encode()
        )
        return login_ok and pass_ok

    def _upstream_connect_frame(self, app_connect: Frame, broker: Broker) -> Frame:
        """The CONNECT for ``broker`` (:func:`proxy.upstream.connect_frame`), asking for
        heart-beats at half the interval silence is judged by (FrameStream.start_heartbeats)."""
        cx, cy = self.config.upstream_heartbeat
        return connect_frame(
            broker, self.config, heart_beat=f"{cx},{(cy + 1) // 2}", app_connect=app_connect
        )

    def _app_connected_frame(self, upstream: Upstream) -> Frame:
        assert self.state is not None
        version = self.state.app_version
        server = "mq-sidecar"
        broker_server = upstream.connected.get("server")
        if broker_server:
            server = f"mq-sidecar ({broker_server})"
        headers: list[tuple[str, str]] = []
        if version != "1.0":
            sx, sy = self.config.client_heartbeat
            headers += [("version", version), ("heart-beat", f"{sx},{sy}")]
        headers += [("session", self.id), ("server", server)]
        return Frame(Command.CONNECTED, tuple(headers))

    # -- serving ------------------------------------------------------------------------------

    async def _serve(self, connect: Frame) -> None:
        async with trio.open_nursery() as nursery:
            try:
                await nursery.start(self._link_task)
            except UpstreamUnavailable as exc:
                self._end(self._unavailable_ending(exc))
                return
            except ReconnectExhausted as exc:
                self._end(self._exhausted_initial(exc))
                return
            if self._ending is not None:
                return
            assert self.upstream is not None
            try:
                await self.app.send(self._app_connected_frame(self.upstream))
            except TransportLost as exc:
                self._end(Ending(f"app connection lost: {exc}"))
                return
            self.app.start_heartbeats()
            assert self.state is not None
            log.info(
                "session %s: app (STOMP %s) relayed to %s (STOMP %s, %s)",
                self.id,
                self.state.app_version,
                self.upstream.broker.label,
                self.upstream.version,
                self.upstream.connected.get("server") or "unknown server",
            )
            nursery.start_soon(self._app_side)

    def _unavailable_ending(self, exc: UpstreamUnavailable) -> Ending:
        if isinstance(exc, UpstreamRefused):
            # The broker's own words reach the app (issue 2, "Bad input").
            message = exc.error.get("message") or "broker refused the connection"
            err = exc.error.without("receipt-id").with_header("message", message)
            return Ending(f"broker refused CONNECT: {exc}", app_error=err, level=logging.WARNING)
        return Ending(
            f"no broker available: {exc}",
            app_error=error_frame(f"mq-sidecar could not connect to a broker: {exc}"),
            level=logging.WARNING,
        )

    def _exhausted_initial(self, exc: ReconnectExhausted) -> Ending:
        if exc.last is not None:
            return self._unavailable_ending(exc.last)
        return Ending(
            f"no broker available: {exc}",
            app_error=error_frame(f"mq-sidecar could not connect to a broker: {exc}"),
            level=logging.WARNING,
        )

    def _end(self, ending: Ending) -> None:
        """End the session (first call wins): stop the app side and the link task."""
        if self._ending is None:
            self._ending = ending
            self.phase = "closing"
        self._app_scope.cancel()
        self._link_scope.cancel()

    async def _app_side(self) -> None:
        with self._app_scope:
            async with trio.open_nursery() as nursery:
                self._app_nursery = nursery
                if self._drain_requested:
                    self._drain()
                nursery.start_soon(self._app_heartbeats)
                nursery.start_soon(self._watch_call_timeouts)
                await self._relay_app()

    async def _app_heartbeats(self) -> None:
        try:
            await send_heartbeats(self.app)
        except TransportLost as exc:
            self._end(Ending(f"app connection lost: {exc}"))

    def _drain(self) -> None:
        self._end(
            Ending(
                "sidecar shutting down",
                app_error=error_frame("mq-sidecar is shutting down; reconnect to continue"),
            )
        )

    # -- window -------------------------------------------------------------------------------

    def _window_changed(self) -> None:
        """Wake the tasks waiting for the window to change (room, a new app receipt to
        watch). Called on every relayed frame, so it costs nothing when nobody waits."""
        if self._window_waiters:
            self._window_event.set()
            self._window_event = trio.Event()

    async def _window_change(self) -> None:
        """Wait for the next :meth:`_window_changed`."""
        self._window_waiters += 1
        try:
            await self._window_event.wait()
        finally:
            self._window_waiters -= 1

    async def _submit(
        self, frame: Frame, *, app_receipt: str | None, idle: bool, context: object = None
    ) -> Entry:
        """Put a frame in the confirmation window and send it if a leg is up.

        Blocks (stops reading the app: backpressure through TCP) while the window is full
        (DESIGN §3.3). The sidecar's receipt is requested as DESIGN §3.3 says: when the app
        asked for one, on BEGIN/COMMIT/ABORT/SUBSCRIBE/UNSUBSCRIBE/DISCONNECT, when the bytes
        since the last receipt pass half the window, and on the last frame of a burst.
        """
        size = frame_size(frame)
        if not self.window.has_room(size):
            self.metrics.window_full()
            await self._flush_upstream()  # the receipts that make room answer queued frames
            while not self.window.has_room(size):
                await self._window_change()
        want = (
            idle
            or frame.command in _ALWAYS_RECEIPTED
            or (frame.command is Command.SEND and not self._cumulative_receipts)
        )
        if self._send_lock.locked():  # a restore is writing the window: append after it
            async with self._send_lock:
                entry = self._append(frame, app_receipt, want, context, size)
        else:
            # _append never checkpoints, so nothing can come between the append and the
            # queueing; taking the lock would only cost a trip through the scheduler.
            entry = self._append(frame, app_receipt, want, context, size)
        upstream = self.upstream
        if upstream is not None and upstream.needs_flush:
            await self._flush_upstream()
        return entry

    def _append(
        self,
        frame: Frame,
        app_receipt: str | None,
        want_receipt: bool,
        context: object,
        size: int | None = None,
    ) -> Entry:
        """Append to the window and, when the leg is up, queue the frame on it (no I/O: the
        relay flushes at the end of the app's burst, :meth:`_relay_app`)."""
        now = trio.current_time()
        entry = self.window.append(
            frame,
            app_receipt=app_receipt,
            want_receipt=want_receipt,
            now=now,
            context=context,
            size=size,
        )
        if app_receipt is not None:
            self._window_changed()  # a receipt for the call_timeout watch (appends make no room)
        self.metrics.frame_to_broker(frame.command, len(frame.body))
        upstream = self.upstream
        if self._link_ready and upstream is not None:
            try:
                entry.sent_at = now
                upstream.queue(entry.frame)
                entry.sent = True
            except TransportLost:
                pass  # the link task sees the loss and replays the window
        return entry

    async def _flush_upstream(self) -> None:
        """Write what is queued for the broker; a failed write is left to the link task,
        which sees the loss on its read and replays the window."""
        upstream = self.upstream
        if upstream is not None:
            with contextlib.suppress(TransportLost):
                await upstream.flush()

    async def _answer_locally(self, app_receipt: str | None) -> None:
        """RECEIPT for a frame whose effect the sidecar itself guarantees."""
        if app_receipt is not None:
            await self._to_app(Frame(Command.RECEIPT, (("receipt-id", app_receipt),)))

    async def _watch_call_timeouts(self) -> None:
        """ERROR for every app receipt unconfirmed after ``call_timeout`` (Artemis
        "unblocking calls"; JEUS request-blocking-time): the app is never left waiting
        forever, and a frame that was never sent is dropped (DESIGN §3.4)."""
        timeout = self.config.call_timeout / 1000
        while True:
            entry = self.window.first_unanswered()
            if entry is None:
                await self._window_change()
                continue
            deadline = entry.enqueued_at + timeout
            if trio.current_time() < deadline:
                # Entries are in the order the app handed them over, so no later one is due
                # sooner: sleep to this deadline and look again (the entry may be answered by
                # then), rather than waking on every window change (every relayed frame).
                await trio.sleep_until(deadline)
                continue
            entry.answered = True
            state = "while reconnecting" if self.phase == "reconnecting" else "by the broker"
            if entry.sent:
                detail = "it may still be"
            elif entry.sent_before:
                # Sent to a broker that was lost before confirming it (DESIGN §3.4): stored
                # there or not, nobody knows; it is not replayed after this ERROR.
                detail = (
                    "it reached a broker that was lost before confirming it, so it may have "
                    "taken effect; it is dropped and not replayed"
                )
                if entry.frame.command is Command.COMMIT:
                    detail += " (the transaction's outcome is in doubt)"
            else:
                detail = "it was never sent and is dropped"
            await self._to_app(
                error_frame(
                    f"{entry.frame.command} not confirmed {state} within "
                    f"{self.config.call_timeout} ms",
                    receipt_id=entry.app_receipt,
                    detail=f"{entry.frame.command} {entry.label} not confirmed; {detail}",
                )
            )
            if not entry.sent:
                async with self._send_lock:
                    if not entry.sent and not entry.confirmed:
                        self.window.drop(entry)
                        self._window_changed()

    # -- upstream link ------------------------------------------------------------------------

    async def _connect_one(self, broker: Broker) -> Upstream:
        assert self._connect is not None
        return await connect_upstream(
            broker,
            self._upstream_connect_frame(self._connect, broker),
            limits=self.limits,
            grace=self.config.heartbeat_grace,
            connect_timeout=self.config.connect_timeout / 1000,
            open_stream=self._open_stream,
        )

    def _log_attempt(self, attempt: Attempt) -> None:
        self._reconnect_attempts.append(attempt)
        self.metrics.connect_attempt(attempt.broker, ConnectOutcome(attempt.outcome))
        if attempt.outcome != "connected":
            # Debug: a reconnect makes many attempts; the RECONNECTING/FAILOVER/DISCONNECT
            # events (logged once each by the app) summarise them.
            log.debug(
                "session %s: broker %s %s: %s",
                self.id,
                attempt.broker,
                attempt.outcome,
                attempt.detail,
            )

    async def _link_task(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Connect, restore, relay; on loss reconnect by policy; until the session ends.

        Raises (before ``task_status.started``) UpstreamUnavailable or ReconnectExhausted
        when the first connection fails.
        """
        try:
            with self._link_scope:
                await self._link_loop(task_status)
        finally:
            upstream, self.upstream = self.upstream, None
            self._link_ready = False
            if upstream is not None:
                with trio.move_on_after(GOODBYE_TIMEOUT, shield=True):
                    ending = self._ending
                    if ending is not None and ending.disconnect_upstream:
                        await self._disconnect_upstream(upstream)
                    await upstream.aclose()

    async def _link_loop(self, task_status: trio.TaskStatus[None]) -> None:
        assert self.state is not None
        first = True
        loss = _Loss(0.0, None, "")
        failback: Upstream | None = None
        while True:
            self._reconnect_attempts = []
            attempts: list[Attempt] = []
            if failback is not None:  # priority_backup found the first broker again
                upstream, index = failback, 0
                failback = None
            else:
                try:
                    upstream, index, attempts = await connect_by_policy(
                        self.config.brokers,
                        self.policy,
                        self.rng,
                        self._connect_one,
                        current=self.broker_index,
                        initial=first,
                        on_attempt=self._log_attempt,
                    )
                except ReconnectExhausted as exc:
                    if first:
                        raise
                    await self._exhausted(exc, loss)
                    return
            self.upstream = upstream
            self.broker_index = index
            self._cumulative_receipts = upstream.confirms_in_order
            self._artemis_ids = upstream.artemis_duplicate_ids
            self._acks_held.clear()  # ack ids of the old leg mean nothing on this one
            self._acks_latest.clear()
            self._acks_latest_count = 0
            self._ack_flush_wanted = False
            async with trio.open_nursery() as link:
                link.start_soon(upstream.keep_alive)
                link.start_soon(self._flush_sidecar_acks, upstream)
                if first:
                    self.state.new_link(
                        stable_message_ids=upstream.stable_message_ids,
                        client_ack_per_subscription=upstream.client_ack_per_subscription,
                    )
                    self._link_ready = True
                    self.phase = "running"
                    task_status.started()
                else:
                    # The restore writes while the relay reads: a broker blocked writing
                    # RECEIPTs we do not read would stop reading what we replay (deadlock).
                    link.start_soon(self._restore_quietly, upstream, attempts, loss)
                if self.policy.priority_backup and index != 0:
                    link.start_soon(self._watch_first_broker)
                self._relay_scope = trio.CancelScope()
                loss_reason, loss_kind = "relay stopped", FailoverReason.CONNECTION_LOST
                with self._relay_scope:
                    loss_reason, loss_kind = await self._relay_upstream(upstream)
                failback, self._failback = self._failback, None
                if failback is not None:
                    loss_reason, loss_kind = "failback to the first broker", FailoverReason.FAILBACK
                link.cancel_scope.cancel()
            # The leg is gone (or left for the first broker): stop the world (Qpid draft).
            self._link_ready = False
            self.upstream = None
            if failback is not None:
                with trio.move_on_after(GOODBYE_TIMEOUT, shield=True):
                    await self._disconnect_upstream(upstream)
            await upstream.aclose()
            if self._ending is not None:
                if failback is not None:
                    await failback.aclose()
                return
            first = False
            lost_from = upstream.broker.label
            loss = _Loss(trio.current_time(), lost_from, loss_reason, loss_kind)
            self._loss = loss
            self.phase = "reconnecting"
            async with self._send_lock:
                self.window.mark_all_unsent()
            log.warning("session %s: lost %s: %s; reconnecting", self.id, lost_from, loss_reason)
            await self._publish(
                SessionEvent(
                    EventKind.RECONNECTING,
                    self.id,
                    loss_reason,
                    from_broker=lost_from,
                )
            )

    def _quiet(self) -> bool:
        """A point where the session can move to another broker without anything in flight:
        no open transaction, an empty window, nothing unacknowledged (priority_backup)."""
        state = self.state
        return (
            state is not None
            and self._link_ready
            and not state.transactions
            and len(self.window) == 0
            and state.unacked == 0
            and not self._acks_held
            and not self._acks_latest
            and not self._ack_flush_wanted
        )

    async def _watch_first_broker(self) -> None:
        """``priority_backup`` (ActiveMQ priorityBackup): while on a backup, try the first
        broker every ``max_retry_interval``; once it accepts and the session is quiet, make
        that connection the session's next leg (a FAILOVER event with reason "failback")."""
        first = self.config.brokers[0]
        while True:
            await trio.sleep(self.policy.max_retry_interval)
            if not self._quiet():
                continue
            try:
                candidate = await self._connect_one(first)
            except UpstreamUnavailable:
                continue
            if not self._quiet():
                await candidate.aclose()
                continue
            log.info("session %s: first broker %s is back; failing back", self.id, first.label)
            self._failback = candidate
            self._relay_scope.cancel()
            return

    async def _restore_quietly(
        self, upstream: Upstream, attempts: list[Attempt], loss: _Loss
    ) -> None:
        try:
            await self._restore(upstream, attempts, loss)
        except TransportLost:
            return  # the relay sees the loss too and the link task reconnects

    async def _restore(self, upstream: Upstream, attempts: list[Attempt], loss: _Loss) -> None:
        """Re-create the session on a new leg and replay the window (DESIGN §3.5).

        Runs beside the relay of the new leg. The FAILOVER event is written to the app before
        anything is sent, so the app hears of the failover before a message of the new leg.
        """
        state = self.state
        assert state is not None
        replay_tx = self.config.transaction_failover == "replay"
        async with self._send_lock:
            state.new_link(
                stable_message_ids=upstream.stable_message_ids,
                client_ack_per_subscription=upstream.client_ack_per_subscription,
            )
            plan = plan_replay(state, self.window, replay_transactions=replay_tx)
            for entry in (*plan.answer, *plan.in_doubt):
                self.window.drop(entry)
            self._window_changed()
            await self._announce_failover(upstream, plan, attempts, loss)
            for frame in (*plan.subscribe, *plan.recreate):
                await self._queue_on(upstream, frame)
            for entry in (*plan.replay, *(e for e in self.window if not e.sent)):
                # plan.replay, then what the app handed over while we reconnected
                if entry.sent:
                    continue
                if not self._cumulative_receipts and entry.frame.command is Command.SEND:
                    self.window.ensure_receipt(entry)
                entry.sent_at = trio.current_time()
                await self._queue_on(upstream, entry.frame)
                entry.sent = True
            await upstream.flush()
            self._link_ready = True
            self.phase = "running"
        for entry in plan.answer:
            if not entry.answered:
                entry.answered = True
                await self._answer_locally(entry.app_receipt)
            if entry is self._disconnect_entry:
                self._disconnected.set()
        for entry in plan.in_doubt:
            if not entry.answered:
                entry.answered = True
                await self._to_app(
                    error_frame(
                        f"transaction outcome in doubt: the broker connection was lost before "
                        f"{entry.frame.command} was confirmed",
                        receipt_id=entry.app_receipt,
                    )
                )

    @staticmethod
    async def _queue_on(upstream: Upstream, frame: Frame) -> None:
        """Queue ``frame`` on ``upstream``, flushing first when the out-buffer is full."""
        if upstream.needs_flush:
            await upstream.flush()
        upstream.queue(frame)

    async def _announce_failover(
        self, upstream: Upstream, plan: ReplayPlan, attempts: list[Attempt], loss: _Loss
    ) -> None:
        state = self.state
        assert state is not None
        self.failovers += 1
        to = upstream.broker.label
        lost_from, loss_reason = loss.broker, loss.reason
        outage = trio.current_time() - loss.at
        outage_ms = round(outage * 1000)
        reattached = to == lost_from
        self._loss = None
        m = self.metrics
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
            self.id,
            "reattached" if reattached else "failed over",
            lost_from,
            to,
            outage_ms,
            len(attempts),
            plan.frames_sent,
        )
        await self._publish(
            SessionEvent(
                EventKind.FAILOVER,
                self.id,
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

    async def _exhausted(self, exc: ReconnectExhausted, loss: _Loss) -> None:
        """Reconnect failed for good: DISCONNECT event, ERROR naming every lost frame, close."""
        # Stop taking frames from the app first: one submitted while the event is written
        # would be in neither the event's nor the ERROR's list of lost frames.
        self._app_scope.cancel()
        lost = [e.label for e in self.window.drop_all()]
        self._window_changed()
        self._loss = None
        self.metrics.outage(trio.current_time() - loss.at, OutageOutcome.DISCONNECTED)
        self.metrics.frames_lost(len(lost))
        reason = f"{loss.reason}; reconnect {exc}"
        await self._publish(
            SessionEvent(
                EventKind.DISCONNECT,
                self.id,
                reason,
                from_broker=loss.broker,
                attempts=len(exc.attempts),
                frames_lost=tuple(lost),
            )
        )
        summary = f"{len(lost)} frame(s) not confirmed" + (f": {', '.join(lost)}" if lost else "")
        self._end(
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

    async def _relay_upstream(self, upstream: Upstream) -> tuple[str, FailoverReason]:
        """Relay broker → app until the leg is lost; returns why it was lost."""
        kind = FailoverReason.CONNECTION_LOST
        try:
            while True:
                event = upstream.next_buffered()
                if event is None:
                    # The burst read so far is handled: what it queued for the app leaves
                    # in one write, before we wait for the broker again.
                    await self._flush_app()
                    event = await upstream.receive_event()
                if isinstance(event, HeartBeat):
                    continue
                if isinstance(event, ConnectionClosed):
                    reason = "broker closed the connection"
                    break
                await self._on_upstream_frame(upstream, event)
        except HeartBeatTimeout as exc:
            reason, kind = f"broker silent: {exc}", FailoverReason.HEARTBEAT_TIMEOUT
        except TransportLost as exc:
            reason = f"connection lost: {exc}"
        except protocol.RemoteProtocolError as exc:
            reason, kind = f"broker sent invalid STOMP: {exc}", FailoverReason.PROTOCOL_ERROR
        error_at, self._upstream_error_at = self._upstream_error_at, None
        closed_after_error = (
            error_at is not None
            and kind is FailoverReason.CONNECTION_LOST
            and trio.current_time() - error_at < ERROR_CLOSE_WINDOW
        )
        if self._disconnect_entry is not None and self._disconnected.is_set():
            self._end(Ending("app disconnected", disconnect_upstream=False))
        elif closed_after_error:
            # DESIGN §3.2: an ERROR answering the app's own frame is an application error,
            # not a failover; the broker closes after it, and so does the session. (A broker
            # that kept the connection after a non-fatal ERROR and dies later fails over.)
            kind = FailoverReason.BROKER_ERROR
            self._end(Ending(f"{reason} after an ERROR", disconnect_upstream=False))
        return reason, kind

    async def _disconnect_upstream(self, upstream: Upstream) -> None:
        """Graceful goodbye to the broker: DISCONNECT with a receipt, wait for it (STOMP 1.2
        "Connection Lingering"). Only called by the link task, the leg's only reader."""
        assert self.state is not None
        receipt = self.state.new_internal_receipt()
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

    async def _on_upstream_frame(self, upstream: Upstream, frame: Frame) -> None:
        state = self.state
        assert state is not None
        command = frame.command
        if command is Command.MESSAGE:
            while state.unacked >= state.max_unacked:
                # Bounded: stop reading the broker until the app acknowledges (DESIGN §3.8).
                await self._flush_app()
                self._acks_freed = trio.Event()
                await self._acks_freed.wait()
            decision = state.deliver(
                frame, upstream_version=upstream.version, now=trio.current_time()
            )
            if decision.to_app is not None:
                self.metrics.frame_to_app(Command.MESSAGE, len(decision.to_app.body))
                await self._to_app(decision.to_app, flush=False)
            elif decision.hidden is not None:
                self.metrics.duplicates_suppressed()
            if decision.to_broker is None:
                pass
            elif decision.coalesce is not None:
                # An auto subscription's cumulative ACK (shown or hidden message): the last of
                # the burst goes after the app's flush and settles all of them.
                self._acks_latest[decision.coalesce] = decision.to_broker
                self._acks_latest_count += 1
                if self._acks_latest_count >= state.max_unacked:
                    await self._flush_app()
            elif decision.to_app is None:
                # A hidden message: the app never sees it, so its ACK goes on the leg now,
                # ahead of any ACK the app sends for later deliveries (a cumulative ACK of a
                # `client` subscription would otherwise cover it first: RabbitMQ then closes
                # the connection on the "unknown delivery tag").
                await self._ack_upstream(upstream, decision.to_broker)
            else:
                # The sidecar's ACK of an auto subscription's message, only after the app has
                # it: held until the app's out-buffer is written (_flush_app).
                self._acks_held.append(decision.to_broker)
                if len(self._acks_held) >= state.max_unacked:
                    await self._flush_app()
        elif command is Command.RECEIPT:
            await self._confirm(frame.get("receipt-id") or "")
        elif command is Command.ERROR:
            error_receipt = frame.get("receipt-id")
            out = frame
            if error_receipt is not None:
                confirmed = self.window.confirm(error_receipt) or []
                self._window_changed()
                answered = next((e for e in confirmed if e.receipt == error_receipt), None)
                for entry in confirmed:
                    if entry is not answered and entry.app_receipt and not entry.answered:
                        entry.answered = True
                        await self._answer_locally(entry.app_receipt)
                if answered is not None and answered.app_receipt and not answered.answered:
                    answered.answered = True
                    out = frame.with_header("receipt-id", answered.app_receipt)
                else:
                    out = frame.without("receipt-id")
            log.warning(
                "session %s: broker %s sent ERROR: %s",
                self.id,
                upstream.broker.label,
                frame.get("message"),
            )
            self._upstream_error_at = trio.current_time()
            self.metrics.frame_to_app(Command.ERROR, len(out.body))
            await self._to_app(out)
        else:  # CONNECTED twice: protocol.Connection already rejects it
            log.warning("session %s: unexpected %s from broker ignored", self.id, command)

    async def _ack_upstream(self, upstream: Upstream, ack: Frame) -> None:
        """Queue one of the sidecar's own ACKs on ``upstream`` (no I/O) and have
        :meth:`_flush_sidecar_acks` write it. The relay (the leg's reader) never writes
        itself: a broker blocked writing to us may not read (see _link_loop); when the
        out-buffer is full it waits for that flush instead, which bounds the buffer."""
        while upstream.needs_flush:
            self._want_ack_flush()
            self._acks_sent = trio.Event()
            await self._acks_sent.wait()
        try:
            upstream.queue(ack)
        except (TransportLost, protocol.LocalProtocolError):
            # The leg is lost (the redelivery will be hidden again on the next one), or the
            # app's DISCONNECT went up before this delivery arrived: nothing to acknowledge.
            return
        self._want_ack_flush()

    def _want_ack_flush(self) -> None:
        self._ack_flush_wanted = True
        self._acks_queued.set()

    async def _flush_sidecar_acks(self, upstream: Upstream) -> None:
        """Write the sidecar's own ACKs that the relay queued on the leg (:meth:`_ack_upstream`)."""
        while True:
            while not self._ack_flush_wanted:
                self._acks_queued = trio.Event()
                await self._acks_queued.wait()
            self._ack_flush_wanted = False
            try:
                await upstream.flush()
            except TransportLost:
                return  # the relay sees the loss; the redelivery will be hidden again
            finally:
                self._acks_sent.set()

    async def _confirm(self, receipt: str) -> None:
        """Apply a broker RECEIPT to the window and answer the app's receipts it covers."""
        state = self.state
        assert state is not None
        confirmed = self.window.confirm(receipt)
        if confirmed is None:
            if not state.take_internal_receipt(receipt):
                log.warning("session %s: broker sent unknown receipt-id %r", self.id, receipt)
            return
        self._window_changed()
        now = trio.current_time()
        for entry in confirmed:
            if entry.receipt == receipt and entry.sent_at:
                self.metrics.receipt_roundtrip(now - entry.sent_at)
            if entry.frame.command is Command.COMMIT:
                self.metrics.transaction(TransactionOutcome.COMMITTED)
            if entry.app_receipt is not None and not entry.answered:
                entry.answered = True
                self.metrics.frame_to_app(Command.RECEIPT, 0)
                await self._to_app(
                    Frame(Command.RECEIPT, (("receipt-id", entry.app_receipt),)), flush=False
                )
            if entry is self._disconnect_entry:
                # The app's RECEIPT must be written before the session ends: once
                # _disconnected is set the app side ends the session and cancels this relay.
                await self._flush_app()
                self._disconnected.set()

    async def _to_app(self, frame: Frame, *, flush: bool = True) -> None:
        """Write to the app; if the app is gone, end the session (and unwind the caller).

        ``flush=False`` only queues the frame (the upstream relay flushes at the end of a
        burst, :meth:`_flush_app`). An ERROR written here rejects one frame and keeps the
        session (``fatal=False``); the ERROR that ends a session is written by :meth:`run`.
        """
        try:
            self.app.queue(frame, fatal=frame.command is not Command.ERROR)
        except TransportLost as exc:
            self._end(Ending(f"app connection lost: {exc}"))
            await trio.lowlevel.checkpoint()  # raises Cancelled: _end cancelled our scope
        except protocol.LocalProtocolError:
            if self.app.conn.state in (protocol.State.ERROR, protocol.State.CLOSED):
                # The app broke the protocol (its next frame, already read ahead, or a frame
                # cut off by EOF while this relay handled a burst) or left: its connection
                # takes nothing but the ERROR that answers it, and the session ends.
                broke = self._app_broke
                if self._ending is None and broke is not None:
                    self.metrics.client_protocol_error(ClientErrorReason.MALFORMED_FRAME)
                    self._end(
                        Ending(
                            f"app protocol error: {broke}",
                            app_error=broke.error_frame,
                            level=logging.WARNING,
                        )
                    )
                elif self._ending is None:
                    self._end(Ending(f"app connection unusable ({self.app.conn.state.name})"))
                await trio.lowlevel.checkpoint()  # raises Cancelled: _end cancelled our scope
                return
            # A header the app's STOMP version cannot carry (a line break in STOMP 1.0, a
            # trailing CR in 1.1): drop those headers rather than the frame, and say so.
            assert self.state is not None
            cleaned = _representable(frame, self.state.app_version)
            if cleaned == frame:
                raise  # not a header problem: a bug, reported as an internal error
            log.warning(
                "session %s: %s header(s) not representable in STOMP %s dropped: %s",
                self.id,
                frame.command,
                self.state.app_version,
                ", ".join(sorted({k for k, _ in frame.headers} - {k for k, _ in cleaned.headers})),
            )
            await self._to_app(cleaned, flush=flush)
            return
        if flush or self.app.needs_flush:
            await self._flush_app()

    async def _flush_app(self) -> None:
        """Write what is queued for the app; then the sidecar's ACKs of the auto-acked
        messages in it may go upstream. If the app is gone, end the session (and unwind)."""
        # Only the ACKs of messages queued before this call: the flush writes those.
        held, self._acks_held = self._acks_held, []
        if self._acks_latest:
            held.extend(self._acks_latest.values())
            self._acks_latest = {}
            self._acks_latest_count = 0
        upstream = self.upstream
        try:
            await self.app.flush()
        except TransportLost as exc:
            self._end(Ending(f"app connection lost: {exc}"))
            await trio.lowlevel.checkpoint()  # raises Cancelled: _end cancelled our scope
        if held and upstream is not None and upstream is self.upstream:
            for ack in held:
                await self._ack_upstream(upstream, ack)

    async def _send_app_quietly(self, frame: Frame) -> None:
        with contextlib.suppress(TransportLost, protocol.LocalProtocolError):
            await self.app.send(frame)

    # -- control channel ----------------------------------------------------------------------

    async def _publish(self, event: SessionEvent) -> None:
        """Publish an event of this session: on the bus (SSE, other sessions) and, written
        before anything else happens on the session, to its own control subscriptions, so
        the app learns of a failover before it sees a message of the new leg."""
        self.bus.publish(event)
        await self._deliver_event(event)

    async def _deliver_event(self, event: SessionEvent) -> None:
        state = self.state
        if state is None:
            return
        for sub in state.local_subscriptions():
            if event.session_id != self.id and sub.frame.get("mq-sidecar-scope") != "all":
                continue
            self._event_seq += 1
            message = Frame(
                Command.MESSAGE,
                (
                    ("destination", sub.destination),
                    ("message-id", f"{self.id}-e{self._event_seq}"),
                    ("event", str(event.kind)),
                    ("content-type", "application/json"),
                ),
                event.to_json().encode(),
            )
            await self._to_app(state.local_delivery(sub, message))

    async def _pump_events(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Deliver other sessions' events to control subscriptions that asked for them with
        ``mq-sidecar-scope:all`` (DESIGN §3.6); this session's own are written directly.
        Started by the first such subscription (a session without one costs the bus
        nothing), subscribed to the bus before that SUBSCRIBE's receipt is answered."""
        with self.bus.subscribe() as events:
            task_status.started()
            async for event in events:
                if event.session_id != self.id:
                    await self._deliver_event(event)

    # -- app → broker -------------------------------------------------------------------------

    async def _relay_app(self) -> None:
        while True:
            # The burst read so far is handled: what it queued for the broker leaves in one
            # write, before we wait for the app again.
            await self._flush_upstream()
            try:
                event = await self.app.receive_event()
            except HeartBeatTimeout as exc:
                self.metrics.client_protocol_error(ClientErrorReason.HEARTBEAT_TIMEOUT)
                self._end(
                    Ending(
                        f"app silent: {exc}", app_error=error_frame(f"heart-beat timeout: {exc}")
                    )
                )
                return
            except TransportLost as exc:
                self._end(Ending(f"app connection lost: {exc}"))
                return
            except protocol.RemoteProtocolError as exc:
                self.metrics.client_protocol_error(ClientErrorReason.MALFORMED_FRAME)
                self._end(
                    Ending(
                        f"app protocol error: {exc}",
                        app_error=exc.error_frame,
                        level=logging.WARNING,
                    )
                )
                return
            # Handle the burst already read; the last frame of it gets a receipt (idle).
            while True:
                if isinstance(event, ConnectionClosed):
                    self._end(Ending("app closed the connection"))
                    return
                try:
                    upcoming = self.app.next_buffered()
                except protocol.RemoteProtocolError as exc:
                    upcoming = None  # reported when read again, after this frame
                    self._app_broke = exc
                if isinstance(event, Frame):
                    try:
                        done = await self._on_app_frame(event, idle=upcoming is None)
                    except FrameRejected as exc:
                        self.metrics.client_protocol_error(ClientErrorReason.INVALID_REQUEST)
                        await self._to_app(error_frame(str(exc), receipt_id=event.get("receipt")))
                        done = False
                    except SessionError as exc:
                        self.metrics.client_protocol_error(ClientErrorReason.INVALID_REQUEST)
                        self._end(
                            Ending(
                                f"app error: {exc}",
                                app_error=error_frame(str(exc), receipt_id=event.get("receipt")),
                                level=logging.WARNING,
                            )
                        )
                        return
                    if done:
                        return
                if upcoming is None:
                    break
                event = upcoming

    def _upstream_send(self, frame: Frame) -> tuple[Frame, str | None]:
        """An app SEND as it goes upstream, and the app's receipt id, in one pass over the
        headers (the hot path): every ``receipt`` entry removed (the sidecar requests its
        own), and the duplicate-detection id added (DESIGN §3.5): ``mq-sidecar-id``, kept when
        the app set one, and the same value as Artemis' ``_AMQ_DUPL_ID`` unless present or
        the leg is a broker that ignores it (:attr:`Upstream.artemis_duplicate_ids`). A frame
        replayed on a new leg keeps the headers it was made with."""
        app_receipt: str | None = None
        dup_id: str | None = None
        artemis = False
        headers: list[tuple[str, str]] = []
        for item in frame.headers:
            name = item[0]
            if name == "receipt":
                if app_receipt is None:
                    app_receipt = item[1]
                continue
            if name == DUPLICATE_ID_HEADER:
                if dup_id is None:
                    dup_id = item[1]
            elif name == ARTEMIS_DUPLICATE_ID:
                artemis = True
            headers.append(item)
        if dup_id is None:
            self._dup_seq += 1
            dup_id = f"{self.id}-{self._dup_seq}"
            headers.append((DUPLICATE_ID_HEADER, dup_id))
        if not artemis and self._artemis_ids:
            headers.append((ARTEMIS_DUPLICATE_ID, dup_id))
        return Frame.unchecked(Command.SEND, tuple(headers), frame.body), app_receipt

    async def _on_app_frame(self, frame: Frame, *, idle: bool) -> bool:
        """Handle one app frame; True when the app's DISCONNECT has been handled."""
        state = self.state
        assert state is not None
        command = frame.command
        if command is Command.SEND:
            up, app_receipt = self._upstream_send(frame)
            tx = state.transaction_of(frame)
            if tx is not None and tx.rolled_back:
                await self._answer_locally(app_receipt)  # COMMIT will fail, ABORT succeeds
                return False
            entry = await self._submit(up, app_receipt=app_receipt, idle=idle, context=tx)
            if tx is not None:
                tx.entries.append(entry)
            return False
        app_receipt = frame.get("receipt")
        bare = frame.without("receipt")
        if command is Command.SUBSCRIBE:
            if frame.get("destination") == self.config.events_destination:
                state.subscribe(frame, local=True)  # never goes upstream (DESIGN §3.6)
                if frame.get("mq-sidecar-scope") == "all" and not self._pumping:
                    assert self._app_nursery is not None
                    self._pumping = True
                    await self._app_nursery.start(self._pump_events)
                await self._answer_locally(app_receipt)
                return False
            await self._submit(state.subscribe(frame), app_receipt=app_receipt, idle=idle)
        elif command is Command.UNSUBSCRIBE:
            sub = state.unsubscribe(frame)
            if sub is not None and sub.local:
                await self._answer_locally(app_receipt)
                return False
            self._acks_freed.set()
            if sub is None:
                # No live subscription: e.g. ActiveMQ's removal of a durable subscription
                # (UNSUBSCRIBE with activemq.subscriptionName after the consumer closed).
                # The broker decides; its ERROR, if any, reaches the app.
                await self._submit(bare, app_receipt=app_receipt, idle=idle, context="passthrough")
            else:
                rest = bare.without("id", "destination")
                upstream = rest.replace(headers=(("id", sub.upstream_id), *rest.headers))
                durable = frame.get("durable") == "true"
                context = DurableRemoval(sub.frame) if durable else None
                await self._submit(upstream, app_receipt=app_receipt, idle=idle, context=context)
        elif command in (Command.ACK, Command.NACK):
            upstream_version = self.upstream.version if self.upstream else "1.2"
            if command is Command.NACK and upstream_version == "1.0":
                raise FrameRejected("NACK is not possible: the broker speaks STOMP 1.0")
            tx = state.transaction_of(frame)
            settled = state.settle(bare, upstream_version=upstream_version, now=trio.current_time())
            self._acks_freed.set()
            if settled.to_broker is None or (tx is not None and tx.rolled_back):
                await self._answer_locally(app_receipt)
                return False
            # A `client` ACK settles several messages: one ACK each, the app's receipt last.
            for frame_up in (*settled.more, settled.to_broker):
                last = frame_up is settled.to_broker
                entry = await self._submit(
                    frame_up,
                    app_receipt=app_receipt if last else None,
                    idle=idle and last,
                    context=tx,
                )
                if tx is not None:
                    tx.entries.append(entry)
        elif command is Command.BEGIN:
            state.begin(frame)
            tx = state.transactions[frame.get("transaction", "") or ""]
            tx.begin = await self._submit(bare, app_receipt=app_receipt, idle=idle, context=tx)
        elif command in (Command.COMMIT, Command.ABORT):
            tx = state.end(frame)
            if tx.rolled_back:
                if command is Command.COMMIT:
                    raise FrameRejected(
                        f"transaction '{tx.id}' rolled back: the broker connection failed over "
                        "before COMMIT (transaction_failover = rollback); its messages will be "
                        "redelivered"
                    )
                await self._answer_locally(app_receipt)
                return False
            tx.end = await self._submit(bare, app_receipt=app_receipt, idle=idle, context=tx)
        elif command is Command.DISCONNECT:
            # The sidecar's ACKs of auto-acked messages already written to the app go before
            # the DISCONNECT (after it the leg takes no frame), or the broker would redeliver
            # them to another consumer.
            await self._flush_app()
            self._disconnect_entry = await self._submit(bare, app_receipt=app_receipt, idle=True)
            await self._flush_upstream()
            with trio.move_on_after(self.config.call_timeout / 1000):
                await self._disconnected.wait()
            lost = [e.label for e in self.window if not e.confirmed]
            reason = "app disconnected"
            if lost:
                self.metrics.frames_lost(len(lost))
                reason += f"; {len(lost)} frame(s) never confirmed: {', '.join(lost)}"
            self._end(Ending(reason, disconnect_upstream=False))
            return True
        else:  # CONNECT/STOMP again: protocol.Connection rejects these before we get here
            raise SessionError(f"unexpected {command} frame")
        return False


def _representable(frame: Frame, version: str) -> Frame:
    """``frame`` without the headers STOMP ``version`` cannot carry: in 1.0 (no escaping) a
    line break anywhere or a colon in a name, in 1.1 a value ending in CR (1.1 has no ``\\r``
    escape, so it would read as a CRLF line end). STOMP 1.2 "Value Encoding"."""
    if version == "1.0":
        bad = {
            name
            for name, value in frame.headers
            if ":" in name or "\n" in name or "\r" in name or "\n" in value or "\r" in value
        }
    elif version == "1.1":
        bad = {name for name, value in frame.headers if value.endswith("\r")}
    else:
        return frame
    return frame.without(*bad)
