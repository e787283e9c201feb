"""Property tests: serialize -> parse in random chunkings gives the frame back; the parser never
fails in any other way than RemoteProtocolError, and chunking never changes what it reads."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import (
    HEARTBEAT,
    HEARTBEAT_BYTES,
    VERSIONS,
    Command,
    Event,
    Frame,
    FrameParser,
    Limits,
    LocalProtocolError,
    RemoteProtocolError,
    serialize,
)
from tests.protocol.helpers import feed, normalized

NEVER_ESCAPED = {Command.CONNECT, Command.STOMP, Command.CONNECTED}

# Characters that matter to the codec, mixed with any non-surrogate character.
chars = st.one_of(st.sampled_from(":\\\n\r\0 cnr-"), st.characters(codec="utf-8"))
texts = st.text(chars, max_size=10)
chunk_sizes = st.lists(st.integers(1, 40) | st.integers(100, 1000), min_size=1, max_size=8)
bodies = st.one_of(st.binary(max_size=80), st.binary(min_size=500, max_size=2000))


def _headers(
    names: st.SearchStrategy[str], values: st.SearchStrategy[str]
) -> st.SearchStrategy[list[tuple[str, str]]]:
    names = names.filter(lambda t: not t.startswith("\0"))
    length = st.tuples(st.just("content-length"), st.sampled_from(["", "7"]))
    return st.lists(st.tuples(names, values) | length, max_size=6)


def _strip(chars: str) -> st.SearchStrategy[str]:
    return texts.map(lambda t: "".join(c for c in t if c not in chars))


# What each mode can carry: no escaping (1.0, CONNECT-type frames), 1.1, 1.2.
HEADERS = {
    "raw": _headers(_strip(":\r\n"), _strip("\r\n")),
    "1.1": _headers(texts, texts.map(lambda t: t.rstrip("\r"))),
    "1.2": _headers(texts, texts),
}


@st.composite
def representable_frames(draw: st.DrawFn, version: str) -> Frame:
    """Frames that ``serialize(frame, version)`` accepts, built to the rules directly."""
    command = draw(st.sampled_from(list(Command)))
    mode = "raw" if version == "1.0" or command in NEVER_ESCAPED else version
    return Frame(command, tuple(draw(HEADERS[mode])), draw(bodies))


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), version=st.sampled_from(VERSIONS), chunks=chunk_sizes)
def test_roundtrip(data: st.DataObject, version: str, chunks: list[int]) -> None:
    frames = data.draw(st.lists(representable_frames(version), min_size=1, max_size=3))
    wire = b""
    expected: list[Event] = []
    for frame in frames:
        wire += serialize(frame, version) + HEARTBEAT_BYTES
        expected += [normalized(frame), HEARTBEAT]
    assert feed(FrameParser(version=version), wire, chunks) == expected
    assert feed(FrameParser(version=version), wire, [len(wire)]) == expected


@settings(max_examples=300)
@given(
    command=st.sampled_from(list(Command)),
    headers=st.lists(st.tuples(texts, texts), max_size=5),
    body=st.binary(max_size=30),
    version=st.sampled_from(VERSIONS),
    chunks=chunk_sizes,
)
def test_serialize_refuses_or_roundtrips(
    command: Command,
    headers: list[tuple[str, str]],
    body: bytes,
    version: str,
    chunks: list[int],
) -> None:
    frame = Frame(command, tuple(headers), body)
    try:
        wire = serialize(frame, version)
    except LocalProtocolError:
        return
    assert feed(FrameParser(version=version), wire, chunks) == [normalized(frame)]


def _outcome(data: bytes, version: str, chunks: list[int], limits: Limits) -> object:
    parser = FrameParser(limits, version=version)
    try:
        events = feed(parser, data, chunks)
        parser.receive_data(b"")
        return [*events, *feed(parser, b"", [1]), parser.next_event()]
    except RemoteProtocolError as exc:
        return ("error", str(exc))


wire_soup = st.lists(
    st.sampled_from(
        [
            *(b"SEND", b"MESSAGE", b"CONNECT", b"\n", b"\r\n", b"\r", b":", b"\\", b"\\n"),
            *(b"\\c", b"\0", b"a", b"content-length:", b"3", b"\xc3\xa9", b"\xff", b"x:y\n"),
            b"\n\n",
        ]
    ),
    max_size=30,
).map(b"".join)


@settings(max_examples=300)
@given(
    data=st.one_of(wire_soup, st.binary(max_size=60)),
    version=st.sampled_from(VERSIONS),
    chunks=chunk_sizes,
    limits=st.sampled_from([Limits(), Limits(40, 3, 12)]),
)
def test_chunking_never_changes_the_outcome(
    data: bytes, version: str, chunks: list[int], limits: Limits
) -> None:
    whole = _outcome(data, version, [len(data) or 1], limits)
    assert _outcome(data, version, [1], limits) == whole
    assert _outcome(data, version, chunks, limits) == whole


def _general_outcome(frame: Frame, version: str) -> object:
    from protocol._serializer import _serialize_general

    try:
        return _serialize_general(frame, version)
    except LocalProtocolError as exc:
        return ("refused", str(exc))


@st.composite
def any_frames_12(draw: st.DrawFn) -> Frame:
    """Frames with any headers (NUL, SOH, content-length repeats, lone surrogates) and bodies."""
    hostile = st.one_of(chars, st.sampled_from(["\x01", "\0", "\ud800"]), st.characters())
    text = st.text(hostile, max_size=10)
    body = draw(bodies)
    pairs = st.tuples(text, text) | st.tuples(
        st.just("content-length"), st.sampled_from(["", "7", "x", str(len(body))])
    )
    command = draw(st.sampled_from(sorted(set(Command) - NEVER_ESCAPED)))
    return Frame(command, tuple(draw(st.lists(pairs, max_size=8))), body)


@given(frame=any_frames_12())
@settings(max_examples=500)
def test_the_whole_head_serializer_agrees_with_the_general_one(frame: Frame) -> None:
    """serialize's STOMP 1.2 fast path gives the same bytes as the header-by-header path, or
    leaves the frame to it (which then refuses or serializes it)."""
    from protocol._serializer import _serialize_12

    fast = _serialize_12(frame)
    if fast is not None:
        assert fast == _general_outcome(frame, "1.2")
    try:
        got: object = serialize(frame, "1.2")
    except LocalProtocolError as exc:
        got = ("refused", str(exc))
    assert got == _general_outcome(frame, "1.2")
