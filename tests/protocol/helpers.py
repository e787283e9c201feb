"""Shared helpers for the protocol tests (h11's ``tests/helpers.py`` and ``test_io.tr()``).

No mocks: a :class:`FrameParser` or a pair of :class:`Connection` objects, fed real bytes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import pytest

from protocol import (
    NEED_DATA,
    Command,
    Connection,
    ConnectionClosed,
    Event,
    Frame,
    FrameParser,
    Limits,
    NeedData,
    RemoteProtocolError,
    Role,
    serialize,
)

#: A complete frame that parses the same in every version; appended to check that a case
#: consumes exactly its own bytes.
TRAILER = b"DISCONNECT\n\n\x00"
TRAILER_FRAME = Frame(Command.DISCONNECT)


def drain(parser: FrameParser | Connection) -> list[Event]:
    """Every event available now, without the final NEED_DATA (stops after CONNECTION_CLOSED)."""
    out: list[Event] = []
    while True:
        event = parser.next_event()
        if isinstance(event, NeedData):
            return out
        out.append(event)
        if isinstance(event, ConnectionClosed):
            return out


def feed(parser: FrameParser | Connection, data: bytes, chunks: Iterable[int]) -> list[Event]:
    """Feed ``data`` in pieces of the given sizes (cycled), draining after each piece."""
    out: list[Event] = []
    pos = 0
    sizes = _cycle(chunks)
    while pos < len(data):
        size = next(sizes)
        parser.receive_data(data[pos : pos + size])
        pos += size
        out += drain(parser)
    return out


def _cycle(sizes: Iterable[int]) -> Iterator[int]:
    items = [max(1, s) for s in sizes] or [1]
    while True:
        yield from items


def check_parse(
    data: bytes,
    expected: list[Event],
    *,
    version: str = "1.0",
    limits: Limits | None = None,
) -> None:
    """Assert that ``data`` parses to ``expected`` fed whole, one byte at a time, and followed
    by trailing data (which must come out as one more frame, untouched)."""
    lim = limits or Limits()
    whole = FrameParser(lim, version=version)
    whole.receive_data(data)
    assert drain(whole) == expected
    assert whole.next_event() is NEED_DATA

    bytewise = FrameParser(lim, version=version)
    assert feed(bytewise, data, [1]) == expected

    trailing = FrameParser(lim, version=version)
    trailing.receive_data(data + TRAILER)
    assert drain(trailing) == [*expected, TRAILER_FRAME]


def check_parse_error(
    data: bytes,
    match: str,
    *,
    version: str = "1.0",
    limits: Limits | None = None,
    eof: bool = False,
) -> None:
    """Assert that ``data`` (then EOF when ``eof``) raises RemoteProtocolError matching
    ``match``, fed whole and one byte at a time; and that the parser stays broken."""
    lim = limits or Limits()
    for sizes in ([len(data) or 1], [1]):
        parser = FrameParser(lim, version=version)
        with pytest.raises(RemoteProtocolError, match=match) as info:
            _feed_then_eof(parser, data, sizes, eof=eof)
        check_error_frame(info.value)
        with pytest.raises(RemoteProtocolError, match=match):
            parser.next_event()


def _feed_then_eof(parser: FrameParser, data: bytes, sizes: list[int], *, eof: bool) -> None:
    feed(parser, data, sizes)
    if eof:
        parser.receive_data(b"")
        drain(parser)


def check_error_frame(exc: RemoteProtocolError) -> None:
    """Every RemoteProtocolError carries an ERROR frame with a one-line message header."""
    frame = exc.error_frame
    assert frame.command is Command.ERROR
    message = frame.get("message")
    assert message
    assert "\n" not in message
    assert "\r" not in message
    assert frame.get("content-type") == "text/plain"
    assert frame.body.decode("utf-8")
    for version in ("1.0", "1.1", "1.2"):
        serialize(frame, version)  # sendable in any version


def normalized(frame: Frame) -> Frame:
    """``frame`` as it reads back after :func:`serialize` (content-length normalisation)."""
    headers: list[tuple[str, str]] = []
    seen = False
    for name, value in frame.headers:
        if name == "content-length":
            if seen:
                continue
            seen = True
            headers.append((name, str(len(frame.body))))
        else:
            headers.append((name, value))
    if not seen and b"\0" in frame.body:
        headers.append(("content-length", str(len(frame.body))))
    return Frame(frame.command, tuple(headers), frame.body)


class ConnectionPair:
    """A CLIENT and a SERVER :class:`Connection` joined by an in-memory wire.

    What one side sends, the other receives: :meth:`send` returns the receiver's events.
    """

    def __init__(self, limits: Limits | None = None) -> None:
        self.client = Connection(Role.CLIENT, limits or Limits())
        self.server = Connection(Role.SERVER, limits or Limits())

    def peer(self, conn: Connection) -> Connection:
        return self.server if conn is self.client else self.client

    def send(self, sender: Connection, frame: Frame, *, fatal: bool = True) -> list[Event]:
        """Send ``frame`` from ``sender``; the peer must receive exactly that frame."""
        data = sender.send(frame, fatal=fatal)
        events = self.deliver(sender, data)
        assert events == [normalized(frame)]
        return events

    def deliver(self, sender: Connection, data: bytes) -> list[Event]:
        receiver = self.peer(sender)
        receiver.receive_data(data)
        return drain(receiver)

    def connect(
        self,
        version: str = "1.2",
        *,
        accept_version: str | None = "1.0,1.1,1.2",
        client_heartbeat: str | None = None,
        server_heartbeat: str | None = None,
    ) -> None:
        """Run the CONNECT/CONNECTED exchange."""
        connect: list[tuple[str, str]] = [("host", "broker")]
        if accept_version is not None:
            connect.append(("accept-version", accept_version))
        if client_heartbeat is not None:
            connect.append(("heart-beat", client_heartbeat))
        self.send(self.client, Frame(Command.CONNECT, tuple(connect)))
        connected: list[tuple[str, str]] = []
        if version != "1.0":
            connected.append(("version", version))
        if server_heartbeat is not None:
            connected.append(("heart-beat", server_heartbeat))
        self.send(self.server, Frame(Command.CONNECTED, tuple(connected)))
