"""Frame values, events, limits and the error classes."""

from __future__ import annotations

import copy
import dataclasses
import pickle
from typing import Any

import pytest

from protocol import (
    CLIENT_COMMANDS,
    CONNECTION_CLOSED,
    HEARTBEAT,
    NEED_DATA,
    SERVER_COMMANDS,
    VERSIONS,
    Command,
    ConnectionClosed,
    Frame,
    HeartBeat,
    Limits,
    LocalProtocolError,
    NeedData,
    ProtocolError,
    RemoteProtocolError,
)
from tests.protocol.helpers import check_error_frame

SEND = Command.SEND


def test_commands() -> None:
    assert Command.SEND == "SEND"
    assert len(Command) == 15
    assert set(Command) == CLIENT_COMMANDS | SERVER_COMMANDS
    assert not CLIENT_COMMANDS & SERVER_COMMANDS
    assert {Command.CONNECTED, Command.MESSAGE, Command.RECEIPT, Command.ERROR} == SERVER_COMMANDS
    assert VERSIONS == ("1.0", "1.1", "1.2")


def test_frame_defaults_and_equality() -> None:
    frame = Frame(Command.DISCONNECT)
    assert frame.headers == ()
    assert frame.body == b""
    assert frame == Frame(Command.DISCONNECT, (), b"")
    assert hash(frame) == hash(Frame(Command.DISCONNECT))
    with pytest.raises(dataclasses.FrozenInstanceError):
        frame.body = b"x"  # type: ignore[misc]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"command": "SEND"},
        {"command": SEND, "headers": [("a", "b")]},
        {"command": SEND, "headers": (("a", "b", "c"),)},
        {"command": SEND, "headers": (("a", 1),)},
        {"command": SEND, "headers": ((b"a", "b"),)},
        {"command": SEND, "headers": (["a", "b"],)},
        {"command": SEND, "body": "text"},
        {"command": SEND, "body": bytearray(b"x")},
    ],
)
def test_frame_type_checks(kwargs: dict[str, Any]) -> None:
    with pytest.raises(TypeError):
        Frame(**kwargs)


def test_build() -> None:
    expected = Frame(SEND, (("destination", "/q"), ("a", "1")), b"x")
    assert Frame.build(SEND, {"destination": "/q", "a": "1"}, b"x") == expected
    assert Frame.build(SEND, [("destination", "/q"), ("a", "1")], b"x") == expected
    assert Frame.build(SEND, iter([["destination", "/q"], ["a", "1"]]), b"x") == expected  # type: ignore[arg-type]
    assert Frame.build(SEND) == Frame(SEND)
    with pytest.raises(TypeError):
        Frame.build(SEND, {"a": 1})  # type: ignore[arg-type]


def test_repeated_headers_first_wins() -> None:
    frame = Frame(SEND, (("a", "1"), ("b", "2"), ("a", "3"), ("a", "4")))
    assert frame.get("a") == "1"
    assert frame.get("b") == "2"
    assert frame.get("c") is None
    assert frame.get("c", "dflt") == "dflt"
    assert frame.get("A") is None  # names are case-sensitive
    assert frame.get_all("a") == ("1", "3", "4")
    assert frame.get_all("c") == ()
    assert frame.has("b")
    assert not frame.has("c")


def test_with_header() -> None:
    frame = Frame(SEND, (("a", "1"), ("b", "2"), ("a", "3")), b"body")
    assert frame.with_header("a", "9") == Frame(SEND, (("a", "9"), ("b", "2")), b"body")
    assert frame.with_header("c", "9").headers == (("a", "1"), ("b", "2"), ("a", "3"), ("c", "9"))
    assert frame.with_header("b", "").headers == (("a", "1"), ("b", ""), ("a", "3"))
    assert frame.headers == (("a", "1"), ("b", "2"), ("a", "3"))  # unchanged


def test_without() -> None:
    frame = Frame(SEND, (("a", "1"), ("b", "2"), ("a", "3"), ("c", "4")), b"body")
    assert frame.without("a") == Frame(SEND, (("b", "2"), ("c", "4")), b"body")
    assert frame.without("a", "c").headers == (("b", "2"),)
    assert frame.without("zzz") == frame
    assert frame.without() == frame


def test_replace() -> None:
    frame = Frame(SEND, (("a", "1"),), b"body")
    assert frame.replace(body=b"new") == Frame(SEND, (("a", "1"),), b"new")
    assert frame.replace(command=Command.MESSAGE, headers=()) == Frame(Command.MESSAGE, (), b"body")
    assert frame.replace() == frame
    with pytest.raises(TypeError):
        frame.replace(body="str")  # type: ignore[arg-type]


def test_copy_and_pickle() -> None:
    frame = Frame(SEND, (("a", "1"), ("a", "2")), b"body")
    for copied in (copy.copy(frame), copy.deepcopy(frame), pickle.loads(pickle.dumps(frame))):
        assert copied == frame
        assert type(copied) is Frame


def test_repr_truncates_and_hides_passcode() -> None:
    frame = Frame(Command.CONNECT, (("login", "me"), ("passcode", "s3cret")), b"x" * 5000)
    text = repr(frame)
    assert "s3cret" not in text
    assert "'me'" in text
    assert "5000 bytes" in text
    assert len(text) < 300
    assert repr(Frame(SEND, (), b"ab")) == "Frame(Command.SEND, headers=(), body=b'ab')"


def test_event_sentinels() -> None:
    assert HeartBeat() == HEARTBEAT
    assert isinstance(NEED_DATA, NeedData)
    assert isinstance(CONNECTION_CLOSED, ConnectionClosed)
    assert repr(HEARTBEAT) == "HEARTBEAT"
    assert repr(NEED_DATA) == "NEED_DATA"
    assert repr(CONNECTION_CLOSED) == "CONNECTION_CLOSED"
    assert NeedData() != HEARTBEAT  # type: ignore[comparison-overlap]


def test_limits() -> None:
    limits = Limits()
    # At least what the brokers take (protocol/_limits.py): RabbitMQ's 128 MiB body plus 16 MiB
    # of headers; ActiveMQ takes 1001 headers and 10241-byte lines, RabbitMQ any.
    assert limits.max_frame_bytes == 144 * 1024 * 1024
    assert limits.max_headers == 2000
    assert limits.max_header_line_bytes == 65536
    assert Limits(1, 1, 1).max_headers == 1
    for field in ("max_frame_bytes", "max_headers", "max_header_line_bytes"):
        with pytest.raises(ValueError, match=field):
            Limits(**{field: 0})
        with pytest.raises(ValueError, match=field):
            Limits(**{field: -5})
        with pytest.raises(TypeError, match=field):
            Limits(**{field: 1.5})  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=field):
            Limits(**{field: True})


def test_protocol_error_is_abstract() -> None:
    with pytest.raises(TypeError):
        ProtocolError("nope")
    assert isinstance(LocalProtocolError("x"), ProtocolError)
    assert str(LocalProtocolError("bad call")) == "bad call"


def test_remote_protocol_error_default_frame() -> None:
    exc = RemoteProtocolError("something broke")
    assert isinstance(exc, ProtocolError)
    assert str(exc) == "something broke"
    assert exc.error_frame.headers == (
        ("message", "something broke"),
        ("content-type", "text/plain"),
    )
    assert exc.error_frame.body.decode().startswith("something broke\n")
    check_error_frame(exc)


def test_remote_protocol_error_message_is_one_short_line() -> None:
    exc = RemoteProtocolError("line one\nline two\r\n" + "x" * 1000)
    message = exc.error_frame.get("message")
    assert message is not None
    assert message.startswith("line one line two x")
    assert len(message) <= 200
    check_error_frame(exc)


def test_remote_protocol_error_custom_frame() -> None:
    custom = Frame(Command.ERROR, (("message", "custom"),), b"details")
    assert RemoteProtocolError("x", error_frame=custom).error_frame is custom
    with pytest.raises(ValueError, match="ERROR"):
        RemoteProtocolError("x", error_frame=Frame(SEND))
