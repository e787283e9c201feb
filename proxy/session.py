"""One app session: the app's STOMP connection to the sidecar and its upstream leg to a broker.

The sidecar *terminates* the app's connection (DESIGN §3): toward the app it is a STOMP server,
toward the broker a STOMP client, and each leg negotiates its own version and heart-beats.
Everything that must outlive one upstream connection (subscriptions, transactions, ack ids,
receipt ids) is in :class:`proxy.tracking.SessionState`, so the upstream leg can be replaced
under a live app session.

Task layout (STYLE §2 rule 8: every task has an owner). ``Session.run`` owns one nursery with:

- the **upstream task**: ``async with open_upstream(...)`` then relays broker → app until EOF.
  It is the only reader of the upstream leg, so it also performs the upstream goodbye
  (DISCONNECT and wait for its RECEIPT) before leaving the ``async with``;
- the **app reader**: relays app → broker;
- the **app heart-beat sender** and the **drain watcher** (graceful shutdown).

Whoever decides that the session is over calls :meth:`Session._end` with an :class:`Ending`:
the first ending wins; it cancels the app-facing tasks and the upstream relay loop; the upstream
task then says goodbye to the broker (bounded, shielded) and, once the nursery is done, ``run``
sends the app its ERROR if the ending has one and closes the app's socket.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
from dataclasses import dataclass

import trio

import protocol
from config import Broker, Config
from protocol import Command, ConnectionClosed, Frame, HeartBeat
from proxy.tracking import SessionError, SessionState
from proxy.upstream import Upstream, UpstreamRefused, UpstreamUnavailable, open_upstream
from proxy.wire import FrameStream, HeartBeatTimeout, TransportLost, send_heartbeats

__all__ = ["Ending", "Session", "SessionStatistics", "error_frame"]

log = logging.getLogger("mq_sidecar.session")

#: Versions the sidecar speaks on both legs (STOMP 1.0, 1.1, 1.2).
SUPPORTED_VERSIONS = protocol.VERSIONS
#: Seconds allowed for a goodbye (DISCONNECT receipt, final ERROR) when a session ends.
GOODBYE_TIMEOUT = 2.0
#: Headers of the app's CONNECT that the sidecar sets itself on the upstream CONNECT.
_CONNECT_OWN_HEADERS = ("accept-version", "host", "heart-beat", "login", "passcode")


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
class SessionStatistics:
    """Snapshot of one session for ``/status`` and metrics."""

    session_id: str
    state: str
    app_version: str | None
    broker: str | None
    upstream_version: str | None
    subscriptions: int
    transactions: int
    unacked: int
    pending_receipts: int
    frames_from_app: int
    frames_to_app: int


class Session:
    """Relay one accepted app connection to a broker until either side ends it.

    Args:
        config: the sidecar's configuration (limits, timeouts, brokers, credentials).
        stream: the accepted app connection.
        session_id: the sidecar's id for the session (logs, ``session`` header, id prefix).

    ``run()`` never raises for anything the app or a broker does; only cancellation propagates.
    """

    def __init__(self, config: Config, stream: trio.abc.Stream, session_id: str) -> None:
        self.config = config
        self.id = session_id
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
        self.upstream: Upstream | None = None
        self.phase = "handshake"
        self._ending: Ending | None = None
        self._app_scope = trio.CancelScope()
        self._relay_scope = trio.CancelScope()
        self._drain_requested = trio.Event()
        self._disconnect_receipt: str | None = None
        self._disconnected = trio.Event()
        self._acks_freed = trio.Event()
        self._upstream_error_sent = False

    # -- public -------------------------------------------------------------------------------

    def request_drain(self) -> None:
        """Ask the session to end gracefully (SIGTERM): DISCONNECT upstream, ERROR to the app."""
        self._drain_requested.set()

    def statistics(self) -> SessionStatistics:
        """Counters and state of this session."""
        st = self.state
        up = self.upstream
        return SessionStatistics(
            session_id=self.id,
            state=self.phase,
            app_version=st.app_version if st else None,
            broker=up.broker.label if up else None,
            upstream_version=up.version if up else None,
            subscriptions=len(st.subscriptions) if st else 0,
            transactions=len(st.transactions) if st else 0,
            unacked=st.unacked if st else 0,
            pending_receipts=st.pending_receipts if st else 0,
            frames_from_app=self.app.frames_in,
            frames_to_app=self.app.frames_out,
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
            self._end(
                Ending(
                    "no CONNECT from the app in time",
                    app_error=error_frame(f"no CONNECT frame received within {timeout:g} s"),
                )
            )
            return None
        except protocol.RemoteProtocolError as exc:
            self._end(Ending(f"bad CONNECT: {exc}", app_error=exc.error_frame))
            return None
        except TransportLost as exc:
            self._end(Ending(f"app connection lost before CONNECT: {exc}"))
            return None
        accept = connect.get("accept-version")
        version = protocol.negotiate_version(accept, SUPPORTED_VERSIONS)
        if version is None:
            supported = ",".join(SUPPORTED_VERSIONS)
            err = error_frame(
                f"unsupported STOMP version(s) {accept}; supported: {supported}"
            ).with_header("version", supported)
            self._end(Ending(f"unsupported versions {accept!r}", app_error=err))
            return None
        if self.config.client_login is not None and not self._app_credentials_ok(connect):
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
        )
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
        """The CONNECT for ``broker``: own version offer, heart-beat, host and credentials.

        The app's other CONNECT headers (``client-id`` for ActiveMQ durable subscriptions...)
        pass through. Credentials: the broker's own, else the sidecar's, else the app's.
        """
        cfg = self.config
        headers: list[tuple[str, str]] = [
            ("accept-version", ",".join(SUPPORTED_VERSIONS)),
            ("host", broker.virtual_host if broker.virtual_host is not None else broker.host),
            ("heart-beat", f"{cfg.upstream_heartbeat[0]},{cfg.upstream_heartbeat[1]}"),
        ]
        login: str | None
        passcode: str | None
        if broker.login is not None:
            login, passcode = broker.login, broker.passcode.reveal() if broker.passcode else None
        elif cfg.login is not None:
            login, passcode = cfg.login, cfg.passcode.reveal() if cfg.passcode else None
        else:
            login, passcode = app_connect.get("login"), app_connect.get("passcode")
        if login is not None:
            headers.append(("login", login))
        if passcode is not None:
            headers.append(("passcode", passcode))
        headers.extend((k, v) for k, v in app_connect.headers if k not in _CONNECT_OWN_HEADERS)
        return Frame(Command.CONNECT, tuple(headers))

    def _app_connected_frame(self, app_connect: Frame, upstream: Upstream) -> Frame:
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
                await nursery.start(self._upstream_task, connect)
            except UpstreamUnavailable as exc:
                self._end(self._unavailable_ending(exc))
                return
            if self._ending is not None:
                return
            assert self.upstream is not None
            try:
                await self.app.send(self._app_connected_frame(connect, self.upstream))
            except TransportLost as exc:
                self._end(Ending(f"app connection lost: {exc}"))
                return
            self.app.start_heartbeats()
            self.phase = "running"
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

    def _end(self, ending: Ending) -> None:
        """End the session (first call wins): stop the app side and the upstream relay."""
        if self._ending is None:
            self._ending = ending
            self.phase = "closing"
        self._app_scope.cancel()
        self._relay_scope.cancel()

    async def _app_side(self) -> None:
        with self._app_scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._app_heartbeats)
                nursery.start_soon(self._watch_drain)
                await self._relay_app()

    async def _app_heartbeats(self) -> None:
        try:
            await send_heartbeats(self.app)
        except TransportLost as exc:
            self._end(Ending(f"app connection lost: {exc}", disconnect_upstream=True))

    async def _watch_drain(self) -> None:
        await self._drain_requested.wait()
        self._end(
            Ending(
                "sidecar shutting down",
                app_error=error_frame("mq-sidecar is shutting down; reconnect to continue"),
            )
        )

    # -- upstream -----------------------------------------------------------------------------

    async def _upstream_task(
        self, connect: Frame, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Connect to the first broker that accepts the session, then relay broker → app.

        Raises UpstreamUnavailable (before ``task_status.started``) when none does; the
        broker's refusal is preferred as the reason, since it carries the broker's words.
        """
        cfg = self.config
        failures: list[UpstreamUnavailable] = []
        for broker in cfg.brokers:
            try:
                async with open_upstream(
                    broker,
                    self._upstream_connect_frame(connect, broker),
                    limits=self.limits,
                    grace=cfg.heartbeat_grace,
                    connect_timeout=cfg.connect_timeout / 1000,
                ) as upstream:
                    self.upstream = upstream
                    task_status.started()
                    try:
                        await self._relay_upstream(upstream)
                    finally:
                        self.upstream = None
                return
            except UpstreamUnavailable as exc:
                log.warning(
                    "session %s: broker %s unavailable: %s", self.id, broker.label, exc.reason
                )
                failures.append(exc)
        refused = [f for f in failures if isinstance(f, UpstreamRefused)]
        raise refused[0] if refused else failures[-1]

    async def _relay_upstream(self, upstream: Upstream) -> None:
        with self._relay_scope:
            try:
                while True:
                    event = await upstream.receive_event()
                    if isinstance(event, HeartBeat):
                        continue
                    if isinstance(event, ConnectionClosed):
                        self._end(self._upstream_gone("broker closed the connection"))
                        break
                    await self._on_upstream_frame(event)
            except HeartBeatTimeout as exc:
                self._end(self._upstream_gone(f"broker silent: {exc}"))
            except TransportLost as exc:
                self._end(self._upstream_gone(f"broker connection lost: {exc}"))
            except protocol.RemoteProtocolError as exc:
                self._end(self._upstream_gone(f"broker sent invalid STOMP: {exc}"))
        ending = self._ending
        if ending is not None and ending.disconnect_upstream and self._disconnect_receipt is None:
            with trio.move_on_after(GOODBYE_TIMEOUT, shield=True):
                await self._disconnect_upstream(upstream)

    def _upstream_gone(self, reason: str) -> Ending:
        if self._disconnect_receipt is not None:
            return Ending("app disconnected", disconnect_upstream=False)
        if self._upstream_error_sent:
            return Ending(f"{reason} after an ERROR", disconnect_upstream=False)
        return Ending(
            reason,
            app_error=error_frame(f"mq-sidecar lost its broker connection: {reason}"),
            disconnect_upstream=False,
            level=logging.WARNING,
        )

    async def _disconnect_upstream(self, upstream: Upstream) -> None:
        """Graceful goodbye to the broker: DISCONNECT with a receipt, wait for it (STOMP 1.2
        "Connection Lingering"). Only called by the upstream task, the leg's only reader."""
        assert self.state is not None
        receipt = self.state.new_receipt(None)
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

    async def _on_upstream_frame(self, frame: Frame) -> None:
        state = self.state
        assert state is not None
        command = frame.command
        if command is Command.MESSAGE:
            while state.unacked >= state.max_unacked:
                # Bounded: stop reading the broker until the app acknowledges (DESIGN §3.8).
                self._acks_freed = trio.Event()
                await self._acks_freed.wait()
            await self._to_app(state.deliver(frame))
        elif command is Command.RECEIPT:
            own = frame.get("receipt-id") or ""
            known, app_receipt = state.take_receipt(own)
            if not known:
                log.warning("session %s: broker sent unknown receipt-id %r", self.id, own)
                return
            if app_receipt is not None:
                await self._to_app(Frame(Command.RECEIPT, (("receipt-id", app_receipt),)))
            if own == self._disconnect_receipt:
                self._disconnected.set()
                self._end(Ending("app disconnected", disconnect_upstream=False))
        elif command is Command.ERROR:
            error_receipt = frame.get("receipt-id")
            out = frame
            if error_receipt is not None:
                _, app_receipt = state.take_receipt(error_receipt)
                out = (
                    frame.with_header("receipt-id", app_receipt)
                    if app_receipt
                    else frame.without("receipt-id")
                )
            log.warning(
                "session %s: broker %s sent ERROR: %s",
                self.id,
                self.upstream.broker.label if self.upstream else "?",
                frame.get("message"),
            )
            self._upstream_error_sent = True
            await self._to_app(out)
        else:  # CONNECTED twice: protocol.Connection already rejects it
            log.warning("session %s: unexpected %s from broker ignored", self.id, command)

    async def _to_app(self, frame: Frame) -> None:
        """Write to the app; if the app is gone, end the session (and unwind the caller)."""
        try:
            await self.app.send(frame)
        except TransportLost as exc:
            self._end(Ending(f"app connection lost: {exc}"))
            await trio.lowlevel.checkpoint()  # raises Cancelled: _end cancelled our scope

    async def _send_app_quietly(self, frame: Frame) -> None:
        with contextlib.suppress(TransportLost, protocol.LocalProtocolError):
            await self.app.send(frame)

    # -- app → broker -------------------------------------------------------------------------

    async def _relay_app(self) -> None:
        while True:
            try:
                event = await self.app.receive_event()
            except HeartBeatTimeout as exc:
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
                self._end(
                    Ending(
                        f"app protocol error: {exc}",
                        app_error=exc.error_frame,
                        level=logging.WARNING,
                    )
                )
                return
            if isinstance(event, HeartBeat):
                continue
            if isinstance(event, ConnectionClosed):
                self._end(Ending("app closed the connection"))
                return
            try:
                done = await self._on_app_frame(event)
            except SessionError as exc:
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

    async def _to_broker(self, frame: Frame) -> None:
        upstream = self.upstream
        if upstream is None:  # the relay loop ended; the session is ending too
            await trio.lowlevel.checkpoint()
            return
        try:
            await upstream.send(frame)
        except TransportLost as exc:
            self._end(self._upstream_gone(f"broker connection lost: {exc}"))
            await trio.lowlevel.checkpoint()

    async def _on_app_frame(self, frame: Frame) -> bool:
        """Relay one app frame; True when the app's DISCONNECT has been handled."""
        state = self.state
        assert state is not None
        command = frame.command
        if command is Command.SEND:
            state.record_in_transaction(frame)
            await self._to_broker(state.map_receipt(frame))
        elif command is Command.SUBSCRIBE:
            upstream = state.subscribe(frame)
            app_receipt = frame.get("receipt")
            if app_receipt is not None:
                upstream = upstream.with_header("receipt", state.new_receipt(app_receipt))
            await self._to_broker(upstream)
        elif command is Command.UNSUBSCRIBE:
            sub = state.unsubscribe(frame)
            if sub is None:
                # No live subscription: e.g. ActiveMQ's removal of a durable subscription
                # (UNSUBSCRIBE with activemq.subscriptionName after the consumer closed).
                # The broker decides; its ERROR, if any, reaches the app.
                await self._to_broker(state.map_receipt(frame))
                return False
            rest = state.map_receipt(frame).without("id", "destination")
            self._acks_freed.set()
            await self._to_broker(rest.replace(headers=(("id", sub.upstream_id), *rest.headers)))
        elif command in (Command.ACK, Command.NACK):
            upstream_version = self.upstream.version if self.upstream else "1.2"
            if command is Command.NACK and upstream_version == "1.0":
                raise SessionError("NACK is not possible: the broker speaks STOMP 1.0")
            state.record_in_transaction(frame)
            delivery = state.settle(frame)
            self._acks_freed.set()
            await self._to_broker(
                state.upstream_ack(state.map_receipt(frame), delivery, upstream_version)
            )
        elif command is Command.BEGIN:
            state.begin(frame)
            await self._to_broker(state.map_receipt(frame))
        elif command in (Command.COMMIT, Command.ABORT):
            state.end(frame)
            await self._to_broker(state.map_receipt(frame))
        elif command is Command.DISCONNECT:
            own = state.new_receipt(frame.get("receipt"))
            self._disconnect_receipt = own
            await self._to_broker(frame.with_header("receipt", own))
            with trio.move_on_after(GOODBYE_TIMEOUT):
                await self._disconnected.wait()
            self._end(Ending("app disconnected", disconnect_upstream=False))
            return True
        else:  # CONNECT/STOMP again: protocol.Connection rejects these before we get here
            raise SessionError(f"unexpected {command} frame")
        return False
