"""FrameParser: every case fed whole, one byte at a time and with trailing data."""

from __future__ import annotations

import re

import pytest

from protocol import (
    CONNECTION_CLOSED,
    HEARTBEAT,
    NEED_DATA,
    VERSIONS,
    Command,
    Frame,
    FrameParser,
    Limits,
    LocalProtocolError,
    RemoteProtocolError,
    UnknownCommand,
)
from tests.protocol.helpers import (
    TRAILER,
    TRAILER_FRAME,
    check_error_frame,
    check_parse,
    check_parse_error,
    drain,
    feed,
)

SEND = Command.SEND
all_versions = pytest.mark.parametrize("version", VERSIONS)
escaping_versions = pytest.mark.parametrize("version", ["1.1", "1.2"])


@all_versions
@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (
            b"SEND\ndestination:/queue/a\n\nhello\x00",
            Frame(SEND, (("destination", "/queue/a"),), b"hello"),
        ),
        (b"DISCONNECT\n\n\x00", Frame(Command.DISCONNECT)),
        # CRLF line ends, in every version (one trailing CR is stripped from each line).
        (
            b"SEND\r\ndestination:/queue/a\r\n\r\nhello\x00",
            Frame(SEND, (("destination", "/queue/a"),), b"hello"),
        ),
        (b"SEND\r\na:1\nb:2\r\n\nx\x00", Frame(SEND, (("a", "1"), ("b", "2")), b"x")),
        # Only one CR is stripped.
        (b"SEND\na:1\r\r\n\n\x00", Frame(SEND, (("a", "1\r"),))),
        # Repeated headers are kept, in order.
        (
            b"MESSAGE\na:1\nb:2\na:3\n\n\x00",
            Frame(Command.MESSAGE, (("a", "1"), ("b", "2"), ("a", "3"))),
        ),
        # Split on the first colon; nothing is trimmed; empty names and values are fine.
        (b"SEND\na:b:c\n\n\x00", Frame(SEND, (("a", "b:c"),))),
        (b"SEND\n a : b \n\n\x00", Frame(SEND, ((" a ", " b "),))),
        (b"SEND\na:\n:v\n:\n\n\x00", Frame(SEND, (("a", ""), ("", "v"), ("", "")))),
        # UTF-8 names and values; a NUL inside a value is just a character.
        (
            "SEND\ndestination:/queue/caf\u00e9\n\u00fc:\u2603\n\n\x00".encode(),
            Frame(SEND, (("destination", "/queue/caf\u00e9"), ("\u00fc", "\u2603"))),
        ),
        (b"SEND\na:x\x00y\n\nbody\x00", Frame(SEND, (("a", "x\x00y"),), b"body")),
        # Bodies: LF/CR are body bytes; without content-length the body ends at the first NUL.
        (b"SEND\n\n\r\n\n\r\x00", Frame(SEND, (), b"\r\n\n\r")),
        (
            b"SEND\ncontent-length:5\n\na\x00b\x00c\x00",
            Frame(SEND, (("content-length", "5"),), b"a\x00b\x00c"),
        ),
        (b"SEND\ncontent-length:0\n\n\x00", Frame(SEND, (("content-length", "0"),))),
        (
            b"SEND\ncontent-length:007\n\n\x00\x00\x00\x00\x00\x00\x00\x00",
            Frame(SEND, (("content-length", "007"),), b"\x00" * 7),
        ),
        # The first content-length counts.
        (
            b"SEND\ncontent-length:3\ncontent-length:99\n\nabc\x00",
            Frame(SEND, (("content-length", "3"), ("content-length", "99")), b"abc"),
        ),
    ],
)
def test_frames(version: str, data: bytes, expected: Frame) -> None:
    check_parse(data, [expected], version=version)


@all_versions
def test_heartbeats_lf_and_crlf(version: str) -> None:
    check_parse(b"\n", [HEARTBEAT], version=version)
    check_parse(b"\r\n", [HEARTBEAT], version=version)
    check_parse(b"\n\r\n\n\r\n", [HEARTBEAT] * 4, version=version)
    frame = Frame(SEND, (), b"x")
    check_parse(
        b"\nSEND\n\nx\x00\n\r\nSEND\n\nx\x00", [HEARTBEAT, frame, HEARTBEAT, HEARTBEAT, frame]
    )


def test_lone_cr_waits_for_the_next_byte() -> None:
    parser = FrameParser()
    parser.receive_data(b"\r")
    assert parser.next_event() is NEED_DATA
    parser.receive_data(b"\n")
    assert parser.next_event() is HEARTBEAT
    assert parser.next_event() is NEED_DATA


def test_cr_not_followed_by_lf_starts_a_command() -> None:
    check_unknown(b"\rSEND\n\n\x00", r"unknown command '\\x0dSEND'")


@all_versions
def test_several_frames_in_one_chunk(version: str) -> None:
    data = b"SEND\na:1\n\nx\x00SEND\na:2\n\ny\x00\nBEGIN\ntransaction:t\n\n\x00"
    check_parse(
        data,
        [
            Frame(SEND, (("a", "1"),), b"x"),
            Frame(SEND, (("a", "2"),), b"y"),
            HEARTBEAT,
            Frame(Command.BEGIN, (("transaction", "t"),)),
        ],
        version=version,
    )


@all_versions
def test_stray_nuls_between_frames_are_skipped(version: str) -> None:
    """ActiveMQ 5.17 and RabbitMQ 3.10 skip a NUL where a command should start (measured):
    so does the parser, and it is no heart-beat."""
    check_parse(
        b"\x00SEND\n\nx\x00\x00\x00\r\n\x00\nBEGIN\ntransaction:t\n\n\x00\x00",
        [
            Frame(SEND, (), b"x"),
            HEARTBEAT,
            HEARTBEAT,
            Frame(Command.BEGIN, (("transaction", "t"),)),
        ],
        version=version,
    )


def test_only_nuls_are_no_event() -> None:
    parser = FrameParser()
    parser.receive_data(b"\x00" * 100)
    assert parser.next_event() is NEED_DATA
    assert parser._buf == b""  # released like heart-beats
    parser.receive_data(b"")
    assert parser.next_event() is CONNECTION_CLOSED


# -- escaping ---------------------------------------------------------------------------------

RAW_ESCAPES = b"SEND\na\\cb:c\\nd\\\\e\n\n\x00"


def test_no_unescaping_in_1_0() -> None:
    check_parse(RAW_ESCAPES, [Frame(SEND, (("a\\cb", "c\\nd\\\\e"),))], version="1.0")
    check_parse(b"SEND\na:\\t\\r\\\n\n\x00", [Frame(SEND, (("a", "\\t\\r\\"),))], version="1.0")


@escaping_versions
def test_unescaping(version: str) -> None:
    check_parse(RAW_ESCAPES, [Frame(SEND, (("a:b", "c\nd\\e"),))], version=version)
    # Escaped backslash followed by 'n' is a backslash and an 'n'.
    check_parse(
        b"SEND\na:\\\\n\\\\\\n\n\n\x00", [Frame(SEND, (("a", "\\n\\\n"),))], version=version
    )


def test_cr_escape_only_in_1_2() -> None:
    check_parse(b"SEND\na:x\\ry\n\n\x00", [Frame(SEND, (("a", "x\ry"),))], version="1.2")
    check_parse_error(b"SEND\na:x\\ry\n\n\x00", r"undefined escape sequence '\\\\r'", version="1.1")


@escaping_versions
@pytest.mark.parametrize(
    "line", [b"a:\\t", b"a:x\\", b"a\\:b", b"a:\\x41", b"a:\\C", b"\\ a:b", b"a:\\\\\\"]
)
def test_undefined_escapes_are_errors(version: str, line: bytes) -> None:
    check_parse_error(b"SEND\n" + line + b"\n\n\x00", "undefined escape sequence", version=version)


@all_versions
@pytest.mark.parametrize("command", [Command.CONNECT, Command.STOMP, Command.CONNECTED])
def test_connect_frames_are_never_unescaped(version: str, command: Command) -> None:
    data = command.encode() + b"\nlogin:a\\cb\npasscode:\\t\\\n\n\x00"
    check_parse(
        data, [Frame(command, (("login", "a\\cb"), ("passcode", "\\t\\")))], version=version
    )


def test_version_change_applies_to_frames_not_returned_yet() -> None:
    parser = FrameParser(version="1.0")
    parser.receive_data(RAW_ESCAPES + RAW_ESCAPES + RAW_ESCAPES[:10])
    assert parser.next_event() == Frame(SEND, (("a\\cb", "c\\nd\\\\e"),))
    parser.version = "1.2"
    assert parser.version == "1.2"
    assert parser.next_event() == Frame(SEND, (("a:b", "c\nd\\e"),))
    assert parser.next_event() is NEED_DATA
    parser.version = "1.0"  # applies to the frame already half read, too
    parser.receive_data(RAW_ESCAPES[10:])
    assert parser.next_event() == Frame(SEND, (("a\\cb", "c\\nd\\\\e"),))


def test_unknown_version() -> None:
    with pytest.raises(ValueError, match=r"2\.0"):
        FrameParser(version="2.0")
    parser = FrameParser()
    with pytest.raises(ValueError, match=r"1\.3"):
        parser.version = "1.3"
    assert parser.version == "1.0"


# -- malformed input --------------------------------------------------------------------------


@all_versions
@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"SEND\ndestination\n\n\x00", "header line without ':': 'destination'"),
        (b"SEND\na:\xff\n\n\x00", "not valid UTF-8"),
        (b"SEND\ncontent-length:abc\n\n\x00", "invalid content-length header 'abc'"),
        (b"SEND\ncontent-length:-1\n\n\x00", "invalid content-length"),
        (b"SEND\ncontent-length: 1\n\nx\x00", "invalid content-length"),
        (b"SEND\ncontent-length:1.0\n\nx\x00", "invalid content-length"),
        (b"SEND\ncontent-length:\n\n\x00", "invalid content-length"),
        (b"SEND\ncontent-length:\xd9\xa3\n\nabc\x00", "invalid content-length"),
        (b"SEND\ncontent-length:2\n\nabc\x00", "not terminated by NUL after content-length 2"),
        (b"SEND\n\x00", "unexpected NUL byte"),
        (b"SEND\na:b\n\x00", "unexpected NUL byte"),
    ],
)
def test_malformed(version: str, data: bytes, match: str) -> None:
    check_parse_error(data, match, version=version)


@all_versions
@pytest.mark.parametrize(
    "data",
    [
        b"S",
        b"SEND",
        b"SEND\n",
        b"SEND\na:b\n",
        b"SEND\na:b\r",
        b"SEND\n\nbody",
        b"SEND\ncontent-length:3\n\nab",
        b"SEND\ncontent-length:3\n\nabc",
        b"\r",
    ],
)
def test_eof_inside_a_frame(version: str, data: bytes) -> None:
    check_parse_error(data, "connection closed in the middle of a frame", version=version, eof=True)


def test_eof_at_a_frame_boundary() -> None:
    parser = FrameParser()
    parser.receive_data(b"SEND\n\nx\x00\n")
    parser.receive_data(b"")
    parser.receive_data(b"")  # EOF twice is harmless
    assert drain(parser) == [Frame(SEND, (), b"x"), HEARTBEAT, CONNECTION_CLOSED]
    assert parser.next_event() is CONNECTION_CLOSED
    assert parser.next_event() is CONNECTION_CLOSED
    with pytest.raises(LocalProtocolError, match="after EOF"):
        parser.receive_data(b"SEND")


def test_errors_are_sticky() -> None:
    parser = FrameParser()
    parser.receive_data(b"SEND\nfoo\n\n\x00SEND\n\n\x00")
    with pytest.raises(RemoteProtocolError, match="without ':'") as first:
        parser.next_event()
    parser.receive_data(b"SEND\n\n\x00")  # discarded
    with pytest.raises(RemoteProtocolError, match="without ':'") as second:
        parser.next_event()
    assert second.value.error_frame == first.value.error_frame
    assert parser._buf == b""


def check_unknown(data: bytes, match: str, version: str = "1.2") -> None:
    """``data`` is one frame with an unknown command: fed whole and one byte at a time it
    raises :class:`UnknownCommand` carrying its bytes, and the frame after it is read."""
    for sizes in ([len(data) + len(TRAILER)], [1]):
        parser = FrameParser(version=version)
        got: list[object] = []
        stream = data + TRAILER
        pos = 0
        while pos < len(stream):
            parser.receive_data(stream[pos : pos + sizes[0]])
            pos += sizes[0]
            while True:
                try:
                    event = parser.next_event()
                except UnknownCommand as exc:
                    got.append(exc)
                    continue
                if event is NEED_DATA:
                    break
                got.append(event)
        unknown, after = got
        assert isinstance(unknown, UnknownCommand)
        check_error_frame(unknown)
        assert re.search(match, str(unknown))
        assert (unknown.data, after) == (data, TRAILER_FRAME)


@all_versions
@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"FOO\n\n\x00", "unknown command 'FOO'"),
        (b"send\n\n\x00", "unknown command 'send'"),
        (b"SEND \n\n\x00", "unknown command 'SEND '"),
        (b"\xff\xfe\n\n\x00", "unknown command"),
        (b"FROB\nreceipt:bad\na:1\n\nbody\x00", "unknown command 'FROB'"),
        (b"FROB\r\ncontent-length:3\r\n\r\na\x00b\x00", "unknown command 'FROB'"),
    ],
)
def test_an_unknown_command_is_read_whole_and_reading_goes_on(
    version: str, data: bytes, match: str
) -> None:
    """RabbitMQ answers an unknown command and reads on (measured): the parser reads the
    frame to its end within the limits, reports it (UnknownCommand, not sticky) and goes on."""
    check_unknown(data, match, version)


def test_an_unknown_command_carries_its_receipt() -> None:
    parser = FrameParser()
    parser.receive_data(b"FROB\nreceipt:bad\nreceipt:other\n\n\x00")
    with pytest.raises(UnknownCommand) as info:
        parser.next_event()
    assert (info.value.command, info.value.receipt) == ("FROB", "bad")


def test_an_unknown_command_keeps_the_limits() -> None:
    parser = FrameParser(Limits(max_frame_bytes=64))
    parser.receive_data(b"FROB\n\n" + b"x" * 100)
    with pytest.raises(RemoteProtocolError, match="frame too large") as info:
        parser.next_event()
    assert not isinstance(info.value, UnknownCommand)


# -- limits -----------------------------------------------------------------------------------


def test_header_line_limit() -> None:
    limits = Limits(max_header_line_bytes=10)
    check_parse(b"SEND\na:12345678\n\n\x00", [Frame(SEND, (("a", "12345678"),))], limits=limits)
    check_parse(
        b"SEND\r\na:12345678\r\n\r\n\x00", [Frame(SEND, (("a", "12345678"),))], limits=limits
    )
    check_parse_error(b"SEND\na:123456789\n\n\x00", "header line too long", limits=limits)


def test_header_line_limit_trips_before_the_line_ends() -> None:
    parser = FrameParser(Limits(max_header_line_bytes=10))
    parser.receive_data(b"SEND\n" + b"a:" + b"x" * 8)
    assert parser.next_event() is NEED_DATA
    parser.receive_data(b"\r")  # could still be a CRLF
    assert parser.next_event() is NEED_DATA
    parser.receive_data(b"x")
    with pytest.raises(RemoteProtocolError, match="header line too long") as info:
        parser.next_event()
    check_error_frame(info.value)


def test_command_line_counts_as_a_header_line() -> None:
    limits = Limits(max_header_line_bytes=10)
    check_parse(b"DISCONNECT\n\n\x00", [Frame(Command.DISCONNECT)], limits=limits)
    parser = FrameParser(limits)
    parser.receive_data(b"X" * 11)
    with pytest.raises(RemoteProtocolError, match="header line too long"):
        parser.next_event()


def test_header_count_limit() -> None:
    limits = Limits(max_headers=2)
    check_parse(b"SEND\na:1\na:2\n\n\x00", [Frame(SEND, (("a", "1"), ("a", "2")))], limits=limits)
    check_parse_error(
        b"SEND\na:1\na:2\na:3\n\n\x00", r"too many headers \(more than 2\)", limits=limits
    )
    parser = FrameParser(limits)
    parser.receive_data(b"SEND\na:1\na:2\na:3\n")  # no blank line yet
    with pytest.raises(RemoteProtocolError, match="too many headers"):
        parser.next_event()


def test_frame_size_limit() -> None:
    limits = Limits(max_frame_bytes=16)
    # b"SEND\n\n" is 6 bytes: 10 body bytes fit, 11 don't.
    check_parse(b"SEND\n\n" + b"x" * 10 + b"\x00", [Frame(SEND, (), b"x" * 10)], limits=limits)
    check_parse_error(b"SEND\n\n" + b"x" * 11 + b"\x00", "frame too large", limits=limits)
    check_parse(
        b"SEND\ncontent-length:0\n\n\x00",
        [Frame(SEND, (("content-length", "0"),))],
        limits=Limits(max_frame_bytes=23),
    )
    check_parse_error(
        b"SEND\ncontent-length:1\n\nx\x00", "frame too large", limits=Limits(max_frame_bytes=23)
    )
    # The head alone (11 bytes) is one byte too many.
    check_parse_error(b"SEND\na:bc\n\n\x00", "frame too large", limits=Limits(max_frame_bytes=10))


def test_frame_size_limit_trips_before_the_nul() -> None:
    parser = FrameParser(Limits(max_frame_bytes=100))
    parser.receive_data(b"SEND\n\n")
    for _ in range(94):
        parser.receive_data(b"x")
        assert parser.next_event() is NEED_DATA
    parser.receive_data(b"x")
    with pytest.raises(RemoteProtocolError, match="frame too large"):
        parser.next_event()


def test_content_length_announcing_too_much_trips_at_once() -> None:
    parser = FrameParser(Limits(max_frame_bytes=1000))
    parser.receive_data(b"SEND\ncontent-length:1000\n\n")
    with pytest.raises(RemoteProtocolError, match="frame too large") as info:
        parser.next_event()
    check_error_frame(info.value)


def test_frame_size_limit_covers_the_headers() -> None:
    parser = FrameParser(Limits(max_frame_bytes=30))
    parser.receive_data(b"SEND\n" + b"a:1\n" * 7)
    with pytest.raises(RemoteProtocolError, match="frame too large"):
        parser.next_event()
    check_parse_error(b"SEND\n" + b"a:1\n" * 6 + b"b" * 5, "frame too large", limits=Limits(30))


def test_garbage_without_newlines_is_bounded() -> None:
    parser = FrameParser(Limits(max_header_line_bytes=1024))
    with pytest.raises(RemoteProtocolError, match="header line too long"):
        feed(parser, b"\xab" * 100_000, [4096])
    assert len(parser._buf) == 0


# -- linear time ------------------------------------------------------------------------------


def test_body_search_never_rescans() -> None:
    """The NUL search resumes where the previous one stopped (white box)."""
    parser = FrameParser()
    parser.receive_data(b"SEND\ndestination:/q\n\n")
    assert parser.next_event() is NEED_DATA
    for i in range(1, 200):
        parser.receive_data(b"x")
        assert parser.next_event() is NEED_DATA
        assert parser._scan == len(parser._buf)  # next search starts at the new byte
        assert i == len(parser._buf) - parser._body_start
    parser.receive_data(b"\x00")
    assert parser.next_event() == Frame(SEND, (("destination", "/q"),), b"x" * 199)


def test_head_search_never_rescans() -> None:
    parser = FrameParser()
    parser.receive_data(b"SEND\n")
    for _ in range(300):
        parser.receive_data(b"a:b")
        assert parser.next_event() is NEED_DATA
        assert parser._scan == len(parser._buf)
        parser.receive_data(b"\n")
        assert parser.next_event() is NEED_DATA
        assert parser._head_scan >= len(parser._buf) - 2


@pytest.mark.timeout(30)
def test_one_mib_body_one_byte_at_a_time() -> None:
    body = bytes(range(1, 256)) * 4112  # no NUL: the body ends at the NUL search
    body = body[: 1 << 20]
    data = b"SEND\ndestination:/q\n\n" + body + b"\x00"
    parser = FrameParser()
    events = feed(parser, data, [1])
    assert events == [Frame(SEND, (("destination", "/q"),), body)]


@pytest.mark.parametrize("chunks", [[1, 7, 4096], [65536], [3, 1000, 1, 1, 50_000]])
def test_one_mib_binary_body_with_content_length(chunks: list[int]) -> None:
    body = bytes(range(256)) * 4096  # 1 MiB, NUL bytes included
    head = b"MESSAGE\ndestination:/q\nmessage-id:1\ncontent-length:%d\n\n" % len(body)
    data = (head + body + b"\x00\n") * 2
    frame = Frame(
        Command.MESSAGE,
        (("destination", "/q"), ("message-id", "1"), ("content-length", str(len(body)))),
        body,
    )
    assert feed(FrameParser(), data, chunks) == [frame, HEARTBEAT, frame, HEARTBEAT]


def test_many_small_frames_in_one_buffer() -> None:
    one = b"MESSAGE\ndestination:/q\nmessage-id:ID\\c1\n\nhello\x00\n"
    parser = FrameParser(version="1.2")
    parser.receive_data(one * 20_000)
    events = drain(parser)
    assert len(events) == 40_000
    assert events[-2] == Frame(
        Command.MESSAGE, (("destination", "/q"), ("message-id", "ID:1")), b"hello"
    )
