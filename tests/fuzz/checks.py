"""Invariant checks shared by the hypothesis properties and the atheris harness.

Each ``run_*`` function feeds bytes to a sans-I/O object (:class:`protocol.FrameParser` or
:class:`protocol.Connection`) in the given chunking, drains every event after each chunk, then
signals EOF, and returns the outcome as a plain value: the events, then ``("error", message)``
if the peer's bytes broke STOMP. Anything else the protocol raises propagates (that is the bug
the fuzzers look for), and a broken invariant is an ``AssertionError``:

* only :class:`protocol.RemoteProtocolError` comes out of ``next_event`` (``receive_data`` never
  raises before EOF); its ERROR frame is well formed and sendable in every version; the error
  is sticky and the parser's buffer is emptied and stays empty, except
  :class:`protocol.UnknownCommand` from a parser or a server Connection: a whole frame,
  consumed, the state unchanged, and reading goes on (recorded as ``("unknown", command)``);
* memory is bounded whatever the input: after ``NEED_DATA`` at most ``max_frame_bytes + 1``
  unconsumed bytes are buffered, and the whole buffer (consumed bytes not compacted yet
  included) is at most ``2 * (max_frame_bytes + 2) + 64 KiB + chunk``;
* frames respect the limits (headers, size) and their role (a server reads client commands);
* a :class:`~protocol.Connection` in ERROR lets a server send exactly one ERROR frame (the one
  it answers with), and EOF ends in CLOSED or ERROR.

White box: the buffer bound reads ``FrameParser._buf`` and ``_pos`` (as ``tests/protocol``
does for its linear-time tests).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from protocol import (
    CLIENT_COMMANDS,
    NEED_DATA,
    SERVER_COMMANDS,
    VERSIONS,
    Command,
    Connection,
    ConnectionClosed,
    Frame,
    FrameParser,
    HeartBeat,
    Limits,
    LocalProtocolError,
    NeedData,
    RemoteProtocolError,
    Role,
    State,
    UnknownCommand,
    negotiate_version,
    serialize,
)

__all__ = [
    "PRELUDES",
    "Outcome",
    "buffer_bound",
    "check_error_frame",
    "check_parser_buffer",
    "handshake",
    "pieces",
    "reserialize",
    "run_connection",
    "run_parser",
    "serve_connect",
]

#: An outcome: events (frames, "HEARTBEAT", "CLOSED"), then ("error", message) if any.
Outcome = list[object]

#: Where a Connection starts before the fuzzed bytes arrive: a fresh connection, or one that
#: completed its handshake in the given version.
PRELUDES: tuple[str, ...] = ("fresh", "connected-1.0", "connected-1.1", "connected-1.2")

_COMPACT_SLACK = 65536  # FrameParser's _COMPACT_BYTES


def pieces(data: bytes, chunks: Sequence[int]) -> Iterator[bytes]:
    """``data`` cut into pieces of the given sizes, cycled (each at least 1 byte)."""
    sizes = [max(1, c) for c in chunks] or [len(data) or 1]
    pos = 0
    i = 0
    while pos < len(data):
        size = sizes[i % len(sizes)]
        yield data[pos : pos + size]
        pos += size
        i += 1


def buffer_bound(limits: Limits, chunk: int) -> int:
    """Most bytes a parser may hold right after receiving ``chunk`` bytes (see module doc)."""
    return 2 * (limits.max_frame_bytes + 2) + _COMPACT_SLACK + chunk


def check_parser_buffer(parser: FrameParser, limits: Limits, chunk: int) -> None:
    """After ``NEED_DATA``: the unconsumed bytes fit one frame, the buffer is bounded."""
    buf = parser._buf
    unconsumed = len(buf) - parser._pos
    assert unconsumed <= limits.max_frame_bytes + 1, (unconsumed, limits)
    assert len(buf) <= buffer_bound(limits, chunk), (len(buf), limits, chunk)


def check_error_frame(exc: RemoteProtocolError) -> None:
    """The ERROR frame of a RemoteProtocolError: one-line ``message``, text body, sendable."""
    frame = exc.error_frame
    assert frame.command is Command.ERROR
    message = frame.get("message")
    assert message, frame
    assert "\n" not in message, message
    assert "\r" not in message, message
    assert len(message) <= 200, message
    assert frame.get("content-type") == "text/plain"
    frame.body.decode("utf-8")
    for version in VERSIONS:
        serialize(frame, version)


def _check_frame(frame: Frame, limits: Limits) -> None:
    assert len(frame.headers) <= limits.max_headers, len(frame.headers)
    assert len(frame.body) <= limits.max_frame_bytes, len(frame.body)
    for name, value in frame.headers:
        assert isinstance(name, str)
        assert isinstance(value, str)


def reserialize(frame: Frame, version: str) -> None:
    """A frame the parser returned reads back the same after :func:`serialize`, or serialize
    refuses it only because a header holds a CR (which CONNECT-type frames, 1.0 and a 1.1
    value's end cannot carry: the codec strips one CR at every line end)."""
    try:
        wire = serialize(frame, version)
    except LocalProtocolError:
        assert any("\r" in name or "\r" in value for name, value in frame.headers), frame
        return
    parser = FrameParser(Limits(max_frame_bytes=len(wire) + 1), version=version)
    parser.receive_data(wire)
    again = parser.next_event()
    assert isinstance(again, Frame), again
    assert again.command is frame.command
    assert again.body == frame.body
    # serialize keeps only the first content-length (rewritten to the body size).
    expected = []
    seen = False
    for name, value in frame.headers:
        if name == "content-length":
            if seen:
                continue
            seen = True
            expected.append((name, str(len(frame.body))))
        else:
            expected.append((name, value))
    if not seen and b"\0" in frame.body:
        expected.append(("content-length", str(len(frame.body))))
    assert list(again.headers) == expected, (again.headers, expected)


def _error(
    target: FrameParser | Connection, exc: RemoteProtocolError, parser: FrameParser
) -> list[object]:
    check_error_frame(exc)
    again: RemoteProtocolError | None = None
    try:
        target.next_event()
    except RemoteProtocolError as raised:
        again = raised
    assert again is not None, "a RemoteProtocolError must be sticky"
    assert str(again) == str(exc)
    assert len(parser._buf) == 0, "a broken parser must drop its buffer"
    target.receive_data(b"more bytes after the error")
    assert len(parser._buf) == 0, "a broken parser must not buffer again"
    return ["error", str(exc)]


def _next_or_unknown(target: FrameParser | Connection) -> object:
    """``target.next_event()``, or ``("unknown", command)`` for an :class:`UnknownCommand` it
    consumed (its ERROR frame checked, the Connection's state unchanged)."""
    state = target.state if isinstance(target, Connection) else None
    unknown: UnknownCommand | None = None
    try:
        return target.next_event()
    except UnknownCommand as exc:
        if isinstance(target, Connection) and target.our_role is Role.CLIENT:
            raise
        unknown = exc
    check_error_frame(unknown)
    assert unknown.data.endswith(b"\0"), unknown.data
    if isinstance(target, Connection):
        assert target.state is state, (target.state, state)
    return ("unknown", unknown.command)


def run_parser(
    data: bytes,
    *,
    version: str = "1.2",
    limits: Limits = Limits(),  # noqa: B008 (immutable)
    chunks: Sequence[int] = (65536,),
    check_reserialize: bool = True,
) -> Outcome:
    """Feed ``data`` to a fresh :class:`FrameParser`, then EOF; check every invariant."""
    parser = FrameParser(limits, version=version)
    out: Outcome = []
    try:
        for piece in pieces(data, chunks):
            parser.receive_data(piece)
            while True:
                event = _next_or_unknown(parser)
                if isinstance(event, NeedData):
                    check_parser_buffer(parser, limits, len(piece))
                    break
                out.append(_event(event, limits))
                if isinstance(event, Frame) and check_reserialize:
                    reserialize(event, version)
        parser.receive_data(b"")
        while True:
            event = _next_or_unknown(parser)
            assert not isinstance(event, NeedData), "NEED_DATA after EOF"
            out.append(_event(event, limits))
            if isinstance(event, ConnectionClosed):
                assert parser.next_event() == event, "CONNECTION_CLOSED must repeat"
                return out
    except RemoteProtocolError as exc:
        out.append(_error(parser, exc, parser))
        return out


def _event(event: object, limits: Limits) -> object:
    if isinstance(event, tuple):  # ("unknown", command): _next_or_unknown
        return event
    if isinstance(event, Frame):
        _check_frame(event, limits)
        return event
    if isinstance(event, HeartBeat):
        return "HEARTBEAT"
    if isinstance(event, ConnectionClosed):
        return "CLOSED"
    raise AssertionError(f"unexpected event {event!r}")


def handshake(conn: Connection, prelude: str) -> None:
    """Bring ``conn`` to CONNECTED in the prelude's version with clean frames."""
    if prelude == "fresh":
        if conn.our_role is Role.CLIENT:
            conn.send(Frame(Command.CONNECT, (("accept-version", "1.0,1.1,1.2"), ("host", "/"))))
        return
    version = prelude.removeprefix("connected-")
    peer = Connection(conn.their_role)
    connect = Frame(Command.CONNECT, (("accept-version", version), ("host", "/")))
    connected = Frame(Command.CONNECTED, (("version", version),) if version != "1.0" else ())
    if conn.our_role is Role.SERVER:
        conn.receive_data(peer.send(connect))
        assert isinstance(conn.next_event(), Frame)
        peer.receive_data(conn.send(connected))
    else:
        peer.receive_data(conn.send(connect))
        assert isinstance(peer.next_event(), Frame)
        conn.receive_data(peer.send(connected))
        assert isinstance(conn.next_event(), Frame)
    assert conn.state is State.CONNECTED
    assert conn.version == version


def serve_connect(conn: Connection, frame: Frame) -> bool:
    """As the sidecar does: answer a CONNECT with CONNECTED in the negotiated version, or an
    ERROR when no version is common (then the connection is over: False)."""
    version = negotiate_version(frame.get("accept-version"))
    if version is None:
        conn.send(Frame(Command.ERROR, (("message", "unsupported version"),)))
        assert conn.state is State.ERROR
        return False
    headers = (("version", version),) if version != "1.0" else ()
    conn.send(Frame(Command.CONNECTED, headers))
    assert conn.state is State.CONNECTED
    assert conn.version == version
    return True


_ORDER = {State.CONNECTING: 0, State.CONNECTED: 1, State.DISCONNECTING: 2}


def run_connection(
    data: bytes,
    *,
    role: Role,
    prelude: str = "fresh",
    limits: Limits = Limits(),  # noqa: B008 (immutable)
    chunks: Sequence[int] = (65536,),
) -> Outcome:
    """Feed ``data`` to a :class:`Connection` in ``role`` after ``prelude``, then EOF.

    As a server it answers a CONNECT the way the sidecar does (:func:`serve_connect`). Checks:
    only RemoteProtocolError; frames of the peer's role; states never go back
    (CONNECTING < CONNECTED < DISCONNECTING, then CLOSED or ERROR for good); version and
    heart-beats are sane; in ERROR a server may send its one ERROR frame, then nothing.
    """
    conn = Connection(role, limits)
    handshake(conn, prelude)
    parser = conn._parser
    allowed = CLIENT_COMMANDS if role is Role.SERVER else SERVER_COMMANDS
    out: Outcome = []
    refused = False
    rank = _ORDER[conn.state]

    def check_state() -> None:
        nonlocal rank
        state = conn.state
        assert conn.version in VERSIONS
        assert all(x >= 0 for x in conn.heartbeat)
        if state in _ORDER:
            assert _ORDER[state] >= rank, (state, rank)
            rank = _ORDER[state]

    def take(event: object) -> None:
        nonlocal refused
        if isinstance(event, Frame):
            assert event.command in allowed, event.command
            _check_frame(event, limits)
            if (
                role is Role.SERVER
                and event.command in (Command.CONNECT, Command.STOMP)
                and conn.connected_frame is None
            ):
                refused = not serve_connect(conn, event)
        out.append(_event(event, limits))
        check_state()

    try:
        for piece in pieces(data, chunks):
            conn.receive_data(piece)
            while not refused:
                event = _next_or_unknown(conn)
                if event is NEED_DATA:
                    check_parser_buffer(parser, limits, len(piece))
                    break
                take(event)
            if refused:
                return [*out, "refused"]
        conn.receive_data(b"")
        while True:
            event = _next_or_unknown(conn)
            assert event is not NEED_DATA, "NEED_DATA after EOF"
            take(event)
            if isinstance(event, ConnectionClosed):
                assert conn.state in (State.CLOSED, State.ERROR), conn.state
                return out
            if refused:
                return [*out, "refused"]
    except RemoteProtocolError as exc:
        assert conn.state is State.ERROR, conn.state
        out.append(_error(conn, exc, parser))
        if role is Role.SERVER:
            conn.send(exc.error_frame)  # the one ERROR a server answers with
            try:
                conn.send(exc.error_frame)
            except LocalProtocolError:
                pass
            else:
                raise AssertionError("a second ERROR frame must be refused") from None
        return out
