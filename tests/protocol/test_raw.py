"""The fast lane's byte level (protocol._raw, FrameParser's raw read) against the general
parser and serializer: a RawFrame exists only where the bytes are what the general path
writes, reads as the general parser reads, and every splice equals the Frame operation it
stands for, serialized (issue 18)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import (
    HEARTBEAT,
    NEED_DATA,
    VERSIONS,
    Command,
    Connection,
    Frame,
    FrameParser,
    Limits,
    RawFrame,
    RemoteProtocolError,
    Role,
    serialize,
)
from protocol._raw import is_plain
from tests.protocol.helpers import ConnectionPair

RAW = frozenset({Command.SEND, Command.MESSAGE, Command.RECEIPT, Command.ACK})
# Bytes that matter to the codec, a few of them at head positions, mixed with any bytes.
_PIECES = (b":", b"\\", b"\n", b"\r", b"\0", b"a", b"b", b"receipt", b"content-length")
_pieces = st.sampled_from([*_PIECES, b"\xc3\xa9", b"7", b"07", b"0", b"x:y", b"\\c"])
_texts = st.lists(_pieces, max_size=5).map(b"".join)
_lines = st.lists(st.tuples(_texts, _texts).map(lambda nv: nv[0] + b":" + nv[1]), max_size=6)
_commands = st.sampled_from([b"SEND", b"MESSAGE", b"RECEIPT", b"ACK", b"SUBSCRIBE", b"SEND\r"])
_bodies = st.one_of(st.binary(max_size=20), st.sampled_from([b"", b"hello", b"a\0b"]))


@st.composite
def wires(draw: st.DrawFn) -> bytes:
    """Byte strings near a frame: a command, header lines (ordinary or not, content-length
    right, wrong or repeated), a body, a NUL, maybe a heart-beat or a second frame after."""
    lines = draw(_lines)
    body = draw(_bodies)
    if draw(st.booleans()):
        lines.insert(draw(st.integers(0, len(lines))), b"content-length:%d" % len(body))
    head = draw(_commands) + b"\n" + b"".join(line + b"\n" for line in lines) + b"\n"
    return head + body + b"\0" + draw(st.sampled_from([b"", b"\n", b"SEND\n\n\0", b"SE"]))


def _general(data: bytes, version: str, limits: Limits) -> list[object]:
    parser = FrameParser(limits, version=version)
    parser.receive_data(data)
    events: list[object] = []
    while True:
        try:
            event = parser.next_event()
        except RemoteProtocolError:
            events.append("error")
            return events
        events.append(event)
        if event is NEED_DATA:
            return events


@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow])
@given(data=wires(), version=st.sampled_from(VERSIONS), small=st.booleans())
def test_raw_reads_what_the_general_path_reads_and_writes_back_its_bytes(
    data: bytes, version: str, small: bool
) -> None:
    limits = (
        Limits(max_headers=3, max_header_line_bytes=40, max_frame_bytes=60) if small else (Limits())
    )
    expected = _general(data, version, limits)
    parser = FrameParser(limits, version=version)
    parser.receive_data(data)
    got: list[object] = []
    while True:
        try:
            event = parser.next_fast_event(RAW)
        except RemoteProtocolError:
            got.append("error")
            break
        if isinstance(event, RawFrame):
            frame = event.to_frame()
            assert event.command in RAW
            # Its bytes are what the general path writes, in every version, and its size is
            # what the window counts.
            for v in VERSIONS:
                assert serialize(frame, v) == event.data
            assert event.size == len(serialize(frame, version))
            assert event.body_length == len(frame.body)
            got.append(frame)
            continue
        got.append(event)
        if event is NEED_DATA:
            break
    assert got == expected


def _ordinary(command: Command, headers: list[tuple[str, str]], body: bytes) -> RawFrame:
    parser = FrameParser()
    parser.receive_data(serialize(Frame(command, tuple(headers), body), "1.2"))
    raw = parser.next_fast_event(frozenset({command}))
    assert isinstance(raw, RawFrame)
    return raw


_names = st.sampled_from(["receipt", "destination", "mq-sidecar-id", "a", "", "content-type"])
_values = st.sampled_from(["", "x", "1", "r-7", "a b", "é", "x:y", "back\\slash", "line\nbreak"])


@settings(max_examples=400)
@given(
    headers=st.lists(
        st.tuples(_names, _values.filter(lambda v: v in ("", "x", "1", "r-7"))), max_size=6
    ),
    name=_names,
    value=_values,
    body=st.binary(max_size=10).filter(lambda b: b"\0" not in b),
    version=st.sampled_from(VERSIONS),
)
def test_splices_equal_the_frame_operations(
    headers: list[tuple[str, str]], name: str, value: str, body: bytes, version: str
) -> None:
    raw = _ordinary(Command.SEND, headers, body)
    frame = raw.to_frame()
    assert raw.get(name) == frame.get(name)
    assert raw.has(name) == frame.has(name)
    without = raw.without(name)
    assert without.to_frame() == frame.without(name)
    assert without.data == serialize(frame.without(name), version)
    spliced = raw.spliced(name, [(name, value)])
    if spliced is None:
        assert not is_plain(value)
    else:
        assert spliced.data == serialize(frame.without(name).with_header(name, value), version)
    changed = raw.with_header(name, value)
    expected = frame.with_header(name, value)
    if isinstance(changed, RawFrame):
        assert changed.to_frame() == expected
        assert changed.data == serialize(expected, version)
    else:
        assert changed == expected


def test_unusual_heads_take_the_general_path() -> None:
    def read(data: bytes) -> object:
        parser = FrameParser()
        parser.receive_data(data)
        return parser.next_fast_event(RAW)

    assert isinstance(read(b"SEND\ndestination:/q/a\n\nhi\0"), RawFrame)
    for unusual in (
        b"SEND\ndestination:/q/a\\c\n\nhi\0",  # an escape
        b"SEND\ndestination:/q/a:b\n\nhi\0",  # a second colon
        b"SEND\r\ndestination:/q/a\n\nhi\0",  # CRLF
        b"SEND\ndestination:/q/\xc3\xa9\n\nhi\0",  # not ASCII
        b"SEND\ncontent-length:02\n\nhi\0",  # not canonical
        b"SEND\ncontent-length:2\ncontent-length:2\n\nhi\0",  # repeated
        b"SUBSCRIBE\nid:1\ndestination:/q/a\n\n\0",  # not asked for
    ):
        assert isinstance(read(unusual), Frame), unusual
    assert read(b"SEND\ndestination:/q/a\n\nhi") is NEED_DATA


def test_a_connection_gives_raw_frames_only_while_connected() -> None:
    pair = ConnectionPair()
    pair.connect(version="1.2")
    client, server = pair.client, pair.server
    server.raw_commands = frozenset({Command.SEND})
    data = client.send(Frame(Command.SEND, (("destination", "/q/a"),), b"x"))
    server.receive_data(data + b"\n")
    raw = server.next_fast_event()
    assert isinstance(raw, RawFrame)
    assert raw.data == data
    assert server.next_fast_event() is HEARTBEAT
    # next_event never gives one.
    server.receive_data(data)
    assert server.next_event() == Frame(Command.SEND, (("destination", "/q/a"),), b"x")
    # Sending it on is its bytes.
    assert client.send(raw) == data
    with pytest.raises(ValueError, match="routine"):
        server.raw_commands = frozenset({Command.CONNECT})


def test_a_judging_connection_checks_raw_frames() -> None:
    pair = ConnectionPair()
    pair.connect(version="1.2")
    client = pair.client
    client.raw_commands = frozenset({Command.RECEIPT})
    client.receive_data(b"RECEIPT\nreceipt-id:7\n\n\0RECEIPT\nfoo:1\n\n\0")
    raw = client.next_fast_event()
    assert isinstance(raw, RawFrame)
    assert raw.get("receipt-id") == "7"
    with pytest.raises(RemoteProtocolError, match="receipt-id"):
        client.next_fast_event()
    assert isinstance(Connection(Role.CLIENT).raw_commands, frozenset)


@settings(max_examples=300)
@given(
    headers=st.lists(st.tuples(_names, _values), max_size=3),
    command=st.sampled_from([Command.RECEIPT, Command.ACK, Command.MESSAGE]),
)
def test_built_frames_are_what_serialize_writes(
    headers: list[tuple[str, str]], command: Command
) -> None:
    built = RawFrame.build(command, tuple(headers))
    frame = Frame(command, tuple(headers))
    if built is None:
        assert any(v in ("é", "x:y", "back\\slash", "line\nbreak") for _, v in headers)
        return
    assert built.to_frame() == frame
    for version in VERSIONS:
        assert built.data == serialize(frame, version)
