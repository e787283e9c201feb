"""Bad input the sidecar itself must refuse (frames it cannot parse, its own limits and ids):
the app gets an ERROR naming the problem and its connection closes; a second live session on
the same sidecar does not notice. What the broker can judge (a missing destination, an unknown
ack id or transaction, a frame before CONNECT, an unsupported version) gets the broker's own
answer instead: tests/integration/test_transparency.py.

These run against ActiveMQ (the behaviour is the sidecar's own); the broker-side login refusal
runs against RabbitMQ, the broker of the two that checks credentials by default.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from protocol import ConnectionClosed, Frame, HeartBeat
from testbed import ActiveMQ, RabbitMQ
from tests.integration.support import (
    Client,
    RawClient,
    SidecarThread,
    client,
    sidecar_config,
    unique,
    wait_until,
)


@pytest.fixture
def strict_sidecar(activemq: ActiveMQ) -> Iterator[SidecarThread]:
    """A sidecar with small limits and a short handshake timeout."""
    config = sidecar_config(
        activemq.stomp_url,
        max_frame_bytes=4096,
        max_headers=10,
        max_header_line_bytes=256,
        handshake_timeout=500,
    )
    with SidecarThread(config) as sidecar:
        yield sidecar


def assert_other_session_unaffected(bystander: Client) -> None:
    dest = unique()
    bystander.conn.subscribe(destination=dest, id="by", ack="auto", headers={"receipt": "by-sub"})
    bystander.receipt("by-sub")
    bystander.conn.send(dest, "still here")
    assert bystander.expect("MESSAGE").body == "still here"


def error_and_close(raw: RawClient) -> str:
    """The ERROR's message header; asserts the sidecar then closed the connection."""
    return error_frame_and_close(raw).get("message") or ""


def error_frame_and_close(raw: RawClient) -> Frame:
    """The ERROR frame, which must have a message; the sidecar must then close."""
    frame = raw.frame()
    assert frame.command == "ERROR", frame
    assert frame.get("message"), frame
    assert raw.closed(), "the sidecar must close the connection after the ERROR"
    return frame


BAD_AFTER_CONNECT = [
    pytest.param(
        b"SEND\ndestination:/queue/x\nno colon here\n\nbody\0", "header", id="malformed-header"
    ),
    # The broker's own answer (ActiveMQ: ERROR "Unknown STOMP action: FROB", then it closes).
    pytest.param(b"FROB\n\n\0", "unknown stomp action", id="unknown-command"),
    pytest.param(
        b"SEND\ndestination:/queue/x\n\n" + b"x" * 5000 + b"\0", "frame", id="oversized-frame"
    ),
    pytest.param(
        b"SEND\ndestination:/queue/x\n" + b"".join(b"h%d:v\n" % i for i in range(20)) + b"\n\0",
        "headers",
        id="too-many-headers",
    ),
    pytest.param(
        b"SEND\ndestination:/queue/x\nbig:" + b"v" * 400 + b"\n\n\0",
        "line",
        id="header-line-too-long",
    ),
    pytest.param(b"SEND\ndestination:/queue/x\nbad:esc\\qape\n\n\0", "escape", id="bad-escape"),
    pytest.param(
        b"MESSAGE\ndestination:/queue/x\nmessage-id:1\nsubscription:1\n\n\0",
        "MESSAGE",
        id="server-command",
    ),
]


@pytest.mark.parametrize(("data", "expected"), BAD_AFTER_CONNECT)
def test_bad_frame_after_connect(strict_sidecar: SidecarThread, data: bytes, expected: str) -> None:
    with client(strict_sidecar.address) as bystander:
        raw = RawClient(strict_sidecar.address)
        raw.connect()
        raw.send(data)
        message = error_and_close(raw)
        assert expected.lower() in message.lower()
        assert_other_session_unaffected(bystander)


BAD_BEFORE_CONNECT = [
    pytest.param(
        b"CONNECT\naccept-version:2.0,3.1\nhost:/\n\n\0", "version", id="unsupported-version"
    ),
    # A NUL is skipped, the rest is an unknown command: ActiveMQ's answer, and it closes.
    pytest.param(b"\x00\x01\x02garbage\n\n\0", "unknown stomp action", id="binary-garbage"),
]


@pytest.mark.parametrize(("data", "expected"), BAD_BEFORE_CONNECT)
def test_bad_start(strict_sidecar: SidecarThread, data: bytes, expected: str) -> None:
    with client(strict_sidecar.address) as bystander:
        raw = RawClient(strict_sidecar.address, version="1.0")
        raw.send(data)
        message = error_and_close(raw)
        assert expected.lower() in message.lower()
        assert_other_session_unaffected(bystander)


def test_client_that_never_finishes_connect(strict_sidecar: SidecarThread) -> None:
    with client(strict_sidecar.address) as bystander:
        raw = RawClient(strict_sidecar.address, version="1.0")
        raw.send(b"CONNECT\naccept-version:1.2\nhost:/\n")  # ... and nothing more
        message = error_and_close(raw)
        assert "within 0.5 s" in message
        assert_other_session_unaffected(bystander)


def test_sessions_end_without_leaking(strict_sidecar: SidecarThread) -> None:
    for _ in range(5):
        raw = RawClient(strict_sidecar.address)
        raw.connect()
        raw.send(b"FROB\n\n\0")
        error_and_close(raw)
        raw.close()
    with client(strict_sidecar.address):
        pass
    wait_until(lambda: strict_sidecar.statistics().sessions == ())


@pytest.mark.rabbitmq
def test_broker_refusing_login_reaches_the_app(rabbitmq: RabbitMQ) -> None:
    with SidecarThread(sidecar_config(rabbitmq.stomp_url)) as sidecar:
        raw = RawClient(sidecar.address)
        raw.send_frame(
            "CONNECT", {"accept-version": "1.2", "host": "/", "login": "guest", "passcode": "wrong"}
        )
        error = error_frame_and_close(raw)
        # RabbitMQ's own words ("Bad CONNECT", "Access refused for user 'guest'"), not ours
        assert error.get("message") == "Bad CONNECT"
        assert b"Access refused for user 'guest'" in error.body


@pytest.mark.rabbitmq
def test_sidecar_credentials_upstream_and_app_authentication(rabbitmq: RabbitMQ) -> None:
    """With its own upstream credentials the sidecar authenticates apps itself."""
    config = sidecar_config(
        rabbitmq.stomp_url,
        login="guest",
        passcode="guest",
        client_login="app",
        client_passcode="s3cret",
    )
    with SidecarThread(config) as sidecar:
        c = Client(sidecar.address)
        c.connect("app", "s3cret")
        dest = unique()
        c.conn.subscribe(destination=dest, id="1", ack="auto", headers={"receipt": "s"})
        c.receipt("s")
        c.conn.send(dest, "authenticated")
        assert c.expect("MESSAGE").body == "authenticated"
        c.close()
        raw = RawClient(sidecar.address)
        raw.send_frame(
            "CONNECT", {"accept-version": "1.2", "host": "/", "login": "app", "passcode": "guest"}
        )
        assert "access denied" in error_and_close(raw)


def test_app_that_stops_heartbeating_is_dropped(activemq: ActiveMQ) -> None:
    config = sidecar_config(activemq.stomp_url, client_heartbeat="200,200", heartbeat_grace=5.0)
    with SidecarThread(config) as sidecar:
        raw = RawClient(sidecar.address)
        connected = raw.connect(**{"heart-beat": "200,200"})
        assert connected.get("heart-beat") == "200,200"
        # The sidecar heart-beats us every 200 ms...
        for _ in range(3):
            event = raw.heartbeat_or_frame()
            assert event.__class__.__name__ == "HeartBeat", event
        # ...and we never heart-beat it: after 200 ms x 5 it gives up on us, closing without
        # a frame, as ActiveMQ does (before: ERROR "heart-beat timeout").
        for _ in range(100):  # bounded: 200 ms beats for at most ~5 s of grace and more
            event = raw.heartbeat_or_frame()
            if not isinstance(event, HeartBeat):
                break
        assert isinstance(event, ConnectionClosed), event
