"""serialize(), escape_header() and unescape_header()."""

from __future__ import annotations

import pytest

from protocol import (
    HEARTBEAT_BYTES,
    VERSIONS,
    Command,
    Frame,
    LocalProtocolError,
    RemoteProtocolError,
    escape_header,
    serialize,
    unescape_header,
)
from tests.protocol.helpers import check_error_frame, check_parse

SEND = Command.SEND
all_versions = pytest.mark.parametrize("version", VERSIONS)


@all_versions
def test_layout(version: str) -> None:
    frame = Frame(SEND, (("destination", "/queue/a"), ("x", "1"), ("x", "2")), b"hello")
    assert serialize(frame, version) == b"SEND\ndestination:/queue/a\nx:1\nx:2\n\nhello\x00"
    assert serialize(Frame(Command.DISCONNECT), version) == b"DISCONNECT\n\n\x00"
    assert HEARTBEAT_BYTES == b"\n"


def test_utf8() -> None:
    frame = Frame(SEND, (("d\u00e9st", "\u2603"),), "\u00e9".encode())
    assert serialize(frame, "1.2") == "SEND\nd\u00e9st:\u2603\n\n\u00e9\x00".encode()


def test_unencodable_text() -> None:
    with pytest.raises(LocalProtocolError, match="UTF-8"):
        serialize(Frame(SEND, (("a", "\ud800"),)), "1.2")


def test_unknown_version() -> None:
    with pytest.raises(ValueError, match=r"0\.9"):
        serialize(Frame(SEND), "0.9")


# -- content-length ---------------------------------------------------------------------------


@all_versions
def test_content_length_added_only_for_nul_bodies(version: str) -> None:
    assert serialize(Frame(SEND, (), b"abc"), version) == b"SEND\n\nabc\x00"
    assert serialize(Frame(SEND, (), b"a\x00c"), version) == b"SEND\ncontent-length:3\n\na\x00c\x00"


@all_versions
def test_content_length_rewritten_in_place(version: str) -> None:
    frame = Frame(
        SEND,
        (("a", "1"), ("content-length", "999"), ("b", "2"), ("content-length", "5")),
        b"xy",
    )
    assert serialize(frame, version) == b"SEND\na:1\ncontent-length:2\nb:2\n\nxy\x00"
    empty = Frame(SEND, (("content-length", "x"),))
    assert serialize(empty, version) == b"SEND\ncontent-length:0\n\n\x00"


# -- escaping ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "v11", "v12"),
    [
        ("plain", "plain", "plain"),
        ("a:b", "a\\cb", "a\\cb"),
        ("a\nb", "a\\nb", "a\\nb"),
        ("a\\b", "a\\\\b", "a\\\\b"),
        ("a\rb", "a\rb", "a\\rb"),
        ("\\n", "\\\\n", "\\\\n"),
        ("\\:\n\r", "\\\\\\c\\n\r", "\\\\\\c\\n\\r"),
    ],
)
def test_escape_table(text: str, v11: str, v12: str) -> None:
    assert escape_header(text, "1.0") == text
    assert escape_header(text, "1.1") == v11
    assert escape_header(text, "1.2") == v12
    assert unescape_header(v11, "1.1") == text
    assert unescape_header(v12, "1.2") == text
    assert unescape_header(v12, "1.0") == v12


@pytest.mark.parametrize(
    ("raw", "version"),
    [("\\t", "1.1"), ("\\t", "1.2"), ("x\\", "1.2"), ("\\r", "1.1"), ("\\\\\\", "1.2")],
)
def test_unescape_errors(raw: str, version: str) -> None:
    with pytest.raises(RemoteProtocolError, match="undefined escape sequence") as info:
        unescape_header(raw, version)
    check_error_frame(info.value)


def test_escape_unknown_version() -> None:
    with pytest.raises(ValueError, match=r"2\.0"):
        escape_header("x", "2.0")
    with pytest.raises(ValueError, match=r"2\.0"):
        unescape_header("x", "2.0")


@pytest.mark.parametrize("version", ["1.1", "1.2"])
def test_headers_escaped_on_the_wire(version: str) -> None:
    frame = Frame(SEND, (("a:b", "c\nd\\e"),))
    assert serialize(frame, version) == b"SEND\na\\cb:c\\nd\\\\e\n\n\x00"
    check_parse(serialize(frame, version), [frame], version=version)


@all_versions
@pytest.mark.parametrize("command", [Command.CONNECT, Command.STOMP, Command.CONNECTED])
def test_connect_frames_are_never_escaped(version: str, command: Command) -> None:
    frame = Frame(command, (("login", "a\\b"), ("passcode", "x:y")))
    data = serialize(frame, version)
    assert data == command.encode() + b"\nlogin:a\\b\npasscode:x:y\n\n\x00"
    check_parse(data, [frame], version=version)


# -- what a version cannot carry --------------------------------------------------------------

UNREPRESENTABLE_RAW = [("a:b", "v"), ("a\nb", "v"), ("a\rb", "v"), ("a", "x\ny"), ("a", "x\ry")]


@pytest.mark.parametrize(("name", "value"), UNREPRESENTABLE_RAW)
def test_1_0_cannot_carry(name: str, value: str) -> None:
    with pytest.raises(LocalProtocolError, match="cannot carry"):
        serialize(Frame(SEND, ((name, value),)), "1.0")
    for version in ("1.1", "1.2"):
        check_parse(
            serialize(Frame(SEND, ((name, value),)), version),
            [Frame(SEND, ((name, value),))],
            version=version,
        )


@all_versions
@pytest.mark.parametrize(("name", "value"), UNREPRESENTABLE_RAW)
def test_connect_frames_cannot_carry(version: str, name: str, value: str) -> None:
    with pytest.raises(LocalProtocolError, match="cannot carry"):
        serialize(Frame(Command.CONNECT, ((name, value),)), version)


def test_1_1_cannot_carry_a_trailing_cr() -> None:
    frame = Frame(SEND, (("a", "x\r"),))
    with pytest.raises(LocalProtocolError, match="ends with CR"):
        serialize(frame, "1.1")
    check_parse(serialize(frame, "1.2"), [frame], version="1.2")
    inner = Frame(SEND, (("a\r", "x\ry"),))  # a CR elsewhere is fine in 1.1
    check_parse(serialize(inner, "1.1"), [inner], version="1.1")


@all_versions
def test_name_starting_with_nul(version: str) -> None:
    with pytest.raises(LocalProtocolError, match="NUL"):
        serialize(Frame(SEND, (("\0a", "v"),)), version)
    frame = Frame(SEND, (("a\0", "\0"),))
    check_parse(serialize(frame, version), [frame], version=version)
