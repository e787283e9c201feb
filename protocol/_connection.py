"""One side of one STOMP connection: parser, serializer and state machine, like ``h11.Connection``.

The connection checks what it receives (RemoteProtocolError, with the ERROR frame to answer)
and what it is asked to send (LocalProtocolError, nothing written). It switches the parser and
the serializer to the negotiated version and computes the heart-beat intervals the moment the
CONNECTED frame passes (STOMP 1.2 "Protocol Negotiation", "Heart-beating"). State changes
caused by frames live in :mod:`._state`.
"""

from __future__ import annotations

from ._errors import LocalProtocolError, RemoteProtocolError, UnknownCommand, remote_error
from ._events import ConnectionClosed, Event
from ._frame import CLIENT_COMMANDS, SERVER_COMMANDS, Command, Frame
from ._heartbeat import negotiate_heartbeat, parse_heartbeat
from ._limits import Limits
from ._parser import NO_RAW, FrameParser
from ._raw import RawFrame
from ._rules import check_frame, check_raw
from ._serializer import HEARTBEAT_BYTES, serialize
from ._state import Direction, Role, State, next_state
from ._versions import VERSIONS, parse_accept_version

# Everything in `__all__` gets re-exported as part of the public API of `protocol`.
__all__ = ["Connection"]

_COMMANDS = {Role.CLIENT: CLIENT_COMMANDS, Role.SERVER: SERVER_COMMANDS}
_CONNECT = (Command.CONNECT, Command.STOMP)
#: Per our role, the received commands that, once CONNECTED, need only the per-command rules
#: (:func:`check_frame`) and leave the state as it is (:data:`._state.TRANSITIONS`): the
#: frames of a running session, checked on a short path.
_ROUTINE: dict[Role, frozenset[Command]] = {
    Role.SERVER: CLIENT_COMMANDS - {Command.CONNECT, Command.STOMP, Command.DISCONNECT},
    Role.CLIENT: frozenset({Command.MESSAGE, Command.RECEIPT, Command.ERROR}),
}
#: Per our role, the commands we send that, once CONNECTED, need no check beyond the state
#: and leave it as it is: serialized on a short path in :meth:`Connection.send`.
_ROUTINE_SEND: dict[Role, frozenset[Command]] = {
    Role.CLIENT: CLIENT_COMMANDS
    - {Command.CONNECT, Command.STOMP, Command.DISCONNECT, Command.NACK},
    Role.SERVER: frozenset({Command.MESSAGE, Command.RECEIPT}),
}


class Connection:
    """One side of one STOMP connection (sans-I/O): bytes in, events out, frames in, bytes out.

    Args:
        our_role: :attr:`Role.SERVER` to answer a CONNECT, :attr:`Role.CLIENT` to send one.
        limits: size bounds for received frames.
        judge_frames: apply the per-command rules to received frames (required headers, no
            body where none is allowed, no NACK in 1.0) and refuse a frame before CONNECT.
            False for a relay that leaves that judgement to the server behind it (mq-sidecar's
            app leg: the broker's own ERROR reaches the app): such frames are returned as
            events, and a frame before CONNECT leaves the state CONNECTING. Framing, limits
            and the order of CONNECT/CONNECTED/DISCONNECT are always enforced.

    Attributes (read-only):
        our_role, their_role: the two :class:`Role` values.
        state: the :class:`State`.
        version: the negotiated STOMP version; ``"1.0"`` until the CONNECTED frame passes. It is
            the ``version`` header of that CONNECTED frame (absent means ``"1.0"``).
        heartbeat: negotiated ``(send_ms, receive_ms)`` from our point of view (see
            :func:`negotiate_heartbeat`); ``(0, 0)`` before CONNECTED.
        connect_frame: the CONNECT/STOMP frame (received as SERVER, sent as CLIENT), or None.
        connected_frame: the CONNECTED frame (sent as SERVER, received as CLIENT), or None.

    Usage: feed bytes with :meth:`receive_data`, drain :meth:`next_event` until ``NEED_DATA``;
    turn frames into bytes with :meth:`send`. A write that fails must be reported with
    :meth:`send_failed`.
    """

    __slots__ = (
        "_connect_frame",
        "_connected_frame",
        "_error_sent",
        "_heartbeat",
        "_judge",
        "_our_role",
        "_parser",
        "_raw",
        "_receive_error",
        "_send_failed",
        "_state",
        "_version",
    )

    def __init__(
        self,
        our_role: Role,
        limits: Limits = Limits(),  # noqa: B008
        *,
        judge_frames: bool = True,
    ) -> None:
        if not isinstance(our_role, Role):
            raise TypeError(f"our_role must be a Role, not {our_role!r}")
        self._our_role = our_role
        self._judge = judge_frames
        self._parser = FrameParser(limits, version="1.0")
        self._raw = NO_RAW
        self._state = State.CONNECTING
        self._version = "1.0"
        self._heartbeat = (0, 0)
        self._connect_frame: Frame | None = None
        self._connected_frame: Frame | None = None
        self._receive_error: RemoteProtocolError | None = None
        self._error_sent = False
        self._send_failed = False

    @property
    def our_role(self) -> Role:
        """The role we play."""
        return self._our_role

    @property
    def their_role(self) -> Role:
        """The role the peer plays."""
        return Role.SERVER if self._our_role is Role.CLIENT else Role.CLIENT

    @property
    def state(self) -> State:
        """The connection's :class:`State`."""
        return self._state

    @property
    def version(self) -> str:
        """The negotiated STOMP version (``"1.0"`` until CONNECTED)."""
        return self._version

    @property
    def heartbeat(self) -> tuple[int, int]:
        """Negotiated ``(send_interval_ms, receive_interval_ms)``; ``(0, 0)`` before CONNECTED."""
        return self._heartbeat

    @property
    def connect_frame(self) -> Frame | None:
        """The CONNECT or STOMP frame (received in SERVER role, sent in CLIENT role)."""
        return self._connect_frame

    @property
    def connected_frame(self) -> Frame | None:
        """The CONNECTED frame (sent in SERVER role, received in CLIENT role)."""
        return self._connected_frame

    @property
    def raw_commands(self) -> frozenset[Command]:
        """Received commands that :meth:`next_event` returns as a :class:`RawFrame` (their
        bytes, ``protocol._raw``) while the state is CONNECTED and the frame is ordinary: the
        fast lane of a relay. Empty by default.

        Raises:
            ValueError: (on assignment) a command that is not a routine frame of the peer's
                once connected (one that needs no state change: SEND, ACK, NACK... from a
                client; MESSAGE, RECEIPT, ERROR from a server).
        """
        return self._raw

    @raw_commands.setter
    def raw_commands(self, commands: frozenset[Command]) -> None:
        odd = commands - _ROUTINE[self._our_role]
        if odd:
            raise ValueError(f"not routine frames of the peer: {sorted(odd)}")
        self._raw = frozenset(commands)

    # -- receiving ------------------------------------------------------------------------------

    def receive_data(self, data: bytes) -> None:
        """Feed bytes read from the peer; ``b""`` means EOF. Parsing happens in next_event().

        After a RemoteProtocolError the data is discarded (nothing is buffered any more).

        Raises:
            LocalProtocolError: non-empty data after EOF.
        """
        self._parser.receive_data(data)

    def frame_in_progress(self) -> tuple[int, int]:
        """``(buffered, total)`` bytes of the frame being received (the parser's
        :meth:`~protocol._parser.FrameParser.frame_in_progress`): what is buffered, and the
        whole frame's size once its ``content-length`` is known (-1 until then, or without
        one)."""
        return self._parser.frame_in_progress()

    def next_event(self) -> Event:
        """Return the next :class:`Frame`, ``HEARTBEAT``, ``NEED_DATA`` or ``CONNECTION_CLOSED``.

        Received frames are checked against the peer's role, the connection's progress and the
        negotiated version's per-command rules (see :mod:`protocol._rules`). An ERROR frame
        received in CLIENT role is returned as an event; it sets the state to ERROR only in
        answer to CONNECT (after CONNECTED the broker may keep the connection). EOF at a
        frame boundary sets the state to CLOSED (unless it is ERROR).

        Raises:
            UnknownCommand: (SERVER role) a frame whose command STOMP does not define, read
                whole and consumed; the state is unchanged, and the next call reads on after it
                (the caller answers it, and may close). In CLIENT role it is fatal, as below.
            RemoteProtocolError: the peer broke the protocol; the state becomes ERROR and every
                later call raises the same error. Its ``error_frame`` is the ERROR to answer with
                (in SERVER role, :meth:`send` still accepts that one ERROR frame).
        """
        event = self._next(NO_RAW)
        assert not isinstance(event, RawFrame)
        return event

    def next_fast_event(self) -> Event | RawFrame:
        """:meth:`next_event`, with the frames of :attr:`raw_commands` as :class:`RawFrame`
        while the state is CONNECTED (checked as :meth:`next_event` checks them).

        Raises:
            RemoteProtocolError: as :meth:`next_event`.
        """
        return self._next(self._raw if self._state is State.CONNECTED else NO_RAW)

    def _next(self, raw: frozenset[Command]) -> Event | RawFrame:
        if self._receive_error is not None:
            err = self._receive_error
            raise RemoteProtocolError(str(err), error_frame=err.error_frame)
        try:
            event = self._parser.next_fast_event(raw)
            if isinstance(event, RawFrame):
                if self._judge:
                    check_raw(event, self._version)
            elif isinstance(event, Frame):
                self._process_received(event)
            elif isinstance(event, ConnectionClosed) and self._state is not State.ERROR:
                self._state = State.CLOSED
        except RemoteProtocolError as exc:
            if isinstance(exc, UnknownCommand) and self._our_role is Role.SERVER:
                raise  # consumed; the server decides whether to read on (UnknownCommand)
            self._receive_error = exc
            self._state = State.ERROR
            self._parser._break(exc)  # drop the buffer; later data is discarded
            raise
        return event

    def _process_received(self, frame: Frame) -> None:
        command = frame.command
        if self._state is State.CONNECTED and command in _ROUTINE[self._our_role]:
            if self._judge:
                check_frame(frame, self._version)
            return
        their_role = self.their_role
        if command not in _COMMANDS[their_role]:
            raise remote_error(
                f"{command} frame not allowed from a {their_role.value.lower()}",
                f"{command} is a {self._our_role.value.lower()} frame (STOMP 1.2 "
                "'Client Frames' / 'Server Frames').",
            )
        if self._our_role is Role.SERVER:
            if self._connect_frame is None:
                if command not in _CONNECT:
                    if not self._judge:
                        return  # the caller answers it; still waiting for CONNECT
                    raise remote_error(
                        f"expected CONNECT or STOMP frame, got {command}",
                        "A STOMP session starts with a CONNECT (or STOMP) frame "
                        "(STOMP 1.2 'Connecting').",
                    )
            elif command in _CONNECT:
                raise remote_error(f"unexpected second {command} frame", "Already connected.")
            elif self._connected_frame is None:
                raise remote_error(
                    f"{command} frame received before the CONNECTED frame was sent",
                    "Wait for CONNECTED before sending other frames (STOMP 1.2 'Connecting').",
                )
        elif self._connected_frame is None:
            if command not in (Command.CONNECTED, Command.ERROR):
                raise remote_error(
                    f"expected CONNECTED or ERROR frame, got {command}",
                    "A server answers CONNECT with CONNECTED or ERROR (STOMP 1.2 'Connecting').",
                )
            if command is Command.CONNECTED and self._connect_frame is None:
                raise remote_error(
                    "CONNECTED frame received before CONNECT was sent", "Nothing was asked."
                )
        elif command is Command.CONNECTED:
            raise remote_error("unexpected second CONNECTED frame", "Already connected.")
        if self._judge:
            check_frame(frame, self._version)
        if command in _CONNECT:
            self._heartbeat_of(frame, remote=True)
            self._connect_frame = frame
        elif command is Command.DISCONNECT:
            # What a client writes after its DISCONNECT is never read (FrameParser.discard_rest).
            self._parser.discard_rest()
        elif command is Command.CONNECTED:
            connect = self._connect_frame
            assert connect is not None
            version = self._chosen_version(frame, connect, remote=True)
            remote = self._heartbeat_of(frame, remote=True)
            local = self._heartbeat_of(connect, remote=False)
            self._connected(frame, version, local, remote)
        self._state = next_state(self._our_role, self._state, Direction.RECEIVED, command)

    # -- sending --------------------------------------------------------------------------------

    def send(self, frame: Frame | RawFrame, *, fatal: bool = True) -> bytes:
        """Serialize ``frame`` in the negotiated version and update the state machine.

        A :class:`RawFrame` is its own bytes (what :func:`serialize` makes of it in any
        version) where the frame needs no check beyond the state; elsewhere it goes the
        general way, as :meth:`RawFrame.to_frame`.

        Sending CONNECT (CLIENT) or CONNECTED (SERVER) records it; sending CONNECTED switches the
        parser and serializer to its ``version`` header (absent means 1.0) and negotiates the
        heart-beats. DISCONNECT (CLIENT) -> DISCONNECTING; ERROR (SERVER) -> ERROR.

        ``fatal=False`` (SERVER role, ERROR frames only, while the connection is open) sends an
        ERROR that rejects one frame and leaves the state unchanged (before CONNECT: the answer to a
        frame that came first, as brokers give it, keeping the connection). STOMP 1.2 "ERROR" says a
        server closes the connection after an ERROR; mq-sidecar deliberately keeps the session for
        per-frame failures (a stale ack id, a COMMIT rolled back by a failover, a receipt not
        confirmed within ``call_timeout``), as JEUS raises per-message exceptions, and clients such
        as stomp.py carry on after such an ERROR.

        Returns:
            The bytes to write to the peer.

        Raises:
            LocalProtocolError: nothing was serialized and the state is unchanged, because:
                our role may not send this command; the state is CLOSED or ERROR (except that a
                SERVER may send one ERROR frame after a protocol error, to answer it); CONNECTED
                was already sent or no CONNECT was received; a CLIENT sends anything but CONNECT
                before CONNECTED arrived, a second CONNECT, or anything after DISCONNECT; a
                SERVER sends MESSAGE/RECEIPT before CONNECTED; NACK in STOMP 1.0; an invalid
                ``heart-beat`` header or a ``version`` the client did not offer; a header the
                version cannot carry (see :func:`serialize`).
            TypeError: ``frame`` is not a Frame.
        """
        if isinstance(frame, RawFrame):
            if (
                fatal
                and self._state is State.CONNECTED
                and frame.command in _ROUTINE_SEND[self._our_role]
            ):
                return frame.data
            frame = frame.to_frame()
        if not isinstance(frame, Frame):
            raise TypeError(f"send() takes a Frame, not {type(frame).__name__}")
        command = frame.command
        role = self._our_role
        if fatal and self._state is State.CONNECTED and command in _ROUTINE_SEND[role]:
            return serialize(frame, self._version)
        if not fatal:
            if role is not Role.SERVER or command is not Command.ERROR:
                raise LocalProtocolError("only a server's ERROR frame can be sent with fatal=False")
            open_states = (State.CONNECTING, State.CONNECTED, State.DISCONNECTING)
            if self._state not in open_states:
                raise LocalProtocolError(
                    f"a non-fatal ERROR needs an open connection, the state is {self._state.name}"
                )
            return serialize(frame, self._version)
        if command not in _COMMANDS[role]:
            raise LocalProtocolError(f"a {role.value.lower()} cannot send a {command} frame")
        self._check_can_send(command)
        if role is Role.CLIENT:
            if command in _CONNECT:
                if self._connect_frame is not None:
                    raise LocalProtocolError(f"cannot send {command}: CONNECT was already sent")
                self._heartbeat_of(frame, remote=False)
                data = serialize(frame, self._version)
                self._connect_frame = frame
                return data
            if self._connected_frame is None:
                raise LocalProtocolError(f"cannot send {command} before CONNECTED was received")
            if self._state is State.DISCONNECTING:
                raise LocalProtocolError(f"cannot send {command} after DISCONNECT")
            if command is Command.NACK and self._version == "1.0":
                raise LocalProtocolError("NACK is not supported in STOMP 1.0")
            data = serialize(frame, self._version)
        elif command is Command.CONNECTED:
            connect = self._connect_frame
            if connect is None:
                raise LocalProtocolError("cannot send CONNECTED before a CONNECT was received")
            if self._connected_frame is not None:
                raise LocalProtocolError("cannot send CONNECTED twice")
            version = self._chosen_version(frame, connect, remote=False)
            local = self._heartbeat_of(frame, remote=False)
            remote = self._heartbeat_of(connect, remote=True)
            data = serialize(frame, self._version)
            self._connected(frame, version, local, remote)
        elif command is Command.ERROR:
            data = serialize(frame, self._version)
            self._error_sent = True
        else:
            if self._connected_frame is None:
                raise LocalProtocolError(f"cannot send {command} before CONNECTED was sent")
            data = serialize(frame, self._version)
        self._state = next_state(role, self._state, Direction.SENT, command)
        return data

    def _check_can_send(self, command: Command) -> None:
        state = self._state
        if state is State.CLOSED:
            raise LocalProtocolError(f"cannot send {command}: the connection is CLOSED")
        if state is State.ERROR and not (
            command is Command.ERROR and not self._error_sent and not self._send_failed
        ):
            raise LocalProtocolError(f"cannot send {command}: the connection is in state ERROR")

    def connect_implicitly(self, connect: Frame, connected: Frame) -> None:
        """SERVER role, before CONNECT: open the session as if ``connect`` had been received
        and ``connected`` sent, writing nothing (a server that connects implicitly: RabbitMQ's
        ``stomp.implicit_connect`` takes a first frame that is not a CONNECT as an empty
        CONNECT and answers no CONNECTED; measured with RabbitMQ 3.10).

        Raises:
            LocalProtocolError: not a SERVER still waiting for CONNECT, or frames that are not
                a CONNECT and its CONNECTED (as :meth:`send` would refuse them).
        """
        if self._our_role is not Role.SERVER or self._connect_frame is not None:
            raise LocalProtocolError("only a server waiting for CONNECT can connect implicitly")
        if connect.command not in _CONNECT or connected.command is not Command.CONNECTED:
            raise LocalProtocolError("an implicit connect takes a CONNECT and a CONNECTED frame")
        self._heartbeat_of(connect, remote=False)
        self._connect_frame = connect
        self._state = next_state(Role.SERVER, self._state, Direction.RECEIVED, connect.command)
        self.send(connected)  # the bytes are not written: the app gets no CONNECTED

    def send_heartbeat(self) -> bytes:
        """Return :data:`HEARTBEAT_BYTES` (one EOL) to write (STOMP 1.2 "Heart-beating").

        Raises:
            LocalProtocolError: the state is not CONNECTED or DISCONNECTING.
        """
        if self._state not in (State.CONNECTED, State.DISCONNECTING):
            raise LocalProtocolError(f"cannot send a heart-beat in state {self._state.name}")
        return HEARTBEAT_BYTES

    def send_failed(self) -> None:
        """Report that writing bytes from :meth:`send` failed; the state becomes ERROR for good."""
        self._send_failed = True
        self._state = State.ERROR

    # -- negotiation ----------------------------------------------------------------------------

    def _connected(
        self, frame: Frame, version: str, local: tuple[int, int], remote: tuple[int, int]
    ) -> None:
        self._connected_frame = frame
        self._version = version
        self._parser.version = version
        self._heartbeat = negotiate_heartbeat(local, remote)

    @staticmethod
    def _heartbeat_of(frame: Frame, *, remote: bool) -> tuple[int, int]:
        try:
            return parse_heartbeat(frame.get("heart-beat"))
        except ValueError as exc:
            message = f"invalid heart-beat header in {frame.command} frame: {exc}"
            if remote:
                raise remote_error(
                    message, "heart-beat is 'cx,cy' in ms (STOMP 1.2 'Heart-beating')."
                ) from None
            raise LocalProtocolError(message) from None

    @staticmethod
    def _chosen_version(connected: Frame, connect: Frame, *, remote: bool) -> str:
        version = connected.get("version") or "1.0"
        accept = connect.get("accept-version")
        if version not in VERSIONS or version not in parse_accept_version(accept):
            message = (
                f"CONNECTED chose STOMP version {version!r}, which is not supported or was "
                f"not offered by the CONNECT (accept-version {accept!r})"
            )
            if remote:
                raise remote_error(message, "STOMP 1.2 'Protocol Negotiation'.")
            raise LocalProtocolError(message)
        return version
