"""The stream read's own STOMP connection (``mq_sidecar_spark._stream_link``): its frame parser
on STOMP 1.2's forms (content-length and NUL-terminated bodies, escapes, repeated headers, CRLF
lines, EOLs between frames, frames cut anywhere), and the connection's waits and errors against a
scripted peer on a loopback socket. Scripted units beside the real ones: every stream read test
in ``test_stream.py`` runs it against a real sidecar in front of RabbitMQ."""

from __future__ import annotations

import collections
import socket
import threading
from collections.abc import Callable, Iterator

import pytest

from mq_sidecar_spark._link import Delivery
from mq_sidecar_spark._stream_link import Frame, MalformedFrame, StreamLink, parse_frames
from mq_sidecar_spark._stream_options import parse_stream_options
from mq_sidecar_spark.errors import (
    StompConnectError,
    StompConnectionLost,
    StompErrorFrame,
    StompTimeout,
)

FRAMES = (
    b"MESSAGE\nsubscription:s\nx-stream-offset:0\nack:1\ncontent-length:5\n\na\x00b\nc\x00"
    b"\n\n"  # EOLs between frames (heart-beats)
    b"MESSAGE\nx-stream-offset:1\nk:first\nk:second\nesc\\cname:a\\nb\\\\c\\\\\\\\\n\nbody\x00"
    b"RECEIPT\nreceipt-id:r1\n\n\x00"
    b"MESSAGE\r\nx-stream-offset:2\r\nh:v\r\n\r\ncr\r\nlf\x00\r\n"
    b"CONNECTED\nversion:1.2\nserver:a\\cb\n\n\x00"
)
EXPECTED: list[tuple[str, dict[str, str], bytes]] = [
    ("MESSAGE", {"subscription": "s", "x-stream-offset": "0", "ack": "1", "content-length": "5"},
     b"a\x00b\nc"),
    ("MESSAGE", {"x-stream-offset": "1", "k": "first", "esc:name": "a\nb\\c\\\\"}, b"body"),
    ("RECEIPT", {"receipt-id": "r1"}, b""),
    ("MESSAGE", {"x-stream-offset": "2", "h": "v"}, b"cr\r\nlf"),
    ("CONNECTED", {"version": "1.2", "server": "a\\cb"}, b""),
]  # fmt: skip


def _parse_in_pieces(data: bytes, cut: int) -> list[tuple[str, dict[str, str], bytes]]:
    """Every frame of ``data`` fed to the parser in pieces of ``cut`` bytes, as ``recv`` may
    return them (what a piece leaves over is kept, as the connection keeps it)."""
    messages: collections.deque[Delivery] = collections.deque()
    frames: list[tuple[str, dict[str, str], bytes]] = []
    buffer = b""
    for at in range(0, len(data), cut):
        buffer += data[at : at + cut]
        others: list[Frame] = []
        before = len(messages)
        used = parse_frames(buffer, messages, others)
        buffer = buffer[used:]
        # the parser keeps the order within one call; MESSAGEs and others interleave only
        # across the pieces here when each piece holds one frame at most
        frames += [("MESSAGE", *messages[n]) for n in range(before, len(messages))]
        frames += others
    assert buffer.strip(b"\r\n") == b""
    return frames


@pytest.mark.parametrize("cut", [1, 2, 3, 7, 64, len(FRAMES)])
def test_frames_cut_anywhere_parse_the_same(cut: int) -> None:
    got = _parse_in_pieces(FRAMES, cut)
    if cut == len(FRAMES):  # one call: MESSAGEs, then the others, each in order
        assert got == [f for f in EXPECTED if f[0] == "MESSAGE"] + [
            f for f in EXPECTED if f[0] != "MESSAGE"
        ]
    else:
        assert sorted(got, key=repr) == sorted(EXPECTED, key=repr)
        assert [f for f in got if f[0] == "MESSAGE"] == [f for f in EXPECTED if f[0] == "MESSAGE"]


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"MESSAGE\nno colon\n\n\x00", "without ':'"),
        (b"MESSAGE\na:b\\tc\n\n\x00", "undefined escape"),
        (b"MESSAGE\na:b\\\n\n\x00", "undefined escape"),
        (b"MESSAGE\ncontent-length:2\n\nabc\x00", "no NUL after the 2 bytes"),
        (b"MESSAGE\ncontent-length:x\n\nabc\x00", "content-length 'x'"),
        (b"MESSAGE\na:\xff\n\n\x00", "not UTF-8"),
    ],
)
def test_malformed_frames_are_named(data: bytes, error: str) -> None:
    with pytest.raises(MalformedFrame, match=error):
        parse_frames(data, collections.deque(), [])


Script = Callable[[socket.socket], None]


@pytest.fixture
def peer() -> Iterator[Callable[[Script], int]]:
    """A loopback listener that runs one script against its first connection; the port."""
    threads: list[threading.Thread] = []
    servers: list[socket.socket] = []

    def start(script: Script) -> int:
        server = socket.create_server(("127.0.0.1", 0))
        servers.append(server)

        def run() -> None:
            conn, _ = server.accept()
            with conn:
                script(conn)

        threads.append(threading.Thread(target=run, daemon=True))
        threads[-1].start()
        return int(server.getsockname()[1])

    yield start
    for thread in threads:
        thread.join(10)
    for server in servers:
        server.close()


def _read_frame(conn: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\x00"):
        chunk = conn.recv(1)
        if not chunk:
            return data
        data += chunk
    return data


def _connected(conn: socket.socket) -> None:
    assert _read_frame(conn).startswith(b"CONNECT\naccept-version:1.2\nhost:/\n")
    conn.sendall(b"CONNECTED\nversion:1.2\n\n\x00")


def _subscribed(conn: socket.socket) -> None:
    frame = _read_frame(conn)
    assert b"\ndestination:/amq/queue/s\n" in frame
    assert b"\nx-stream-offset:offset=7\n" in frame
    conn.sendall(b"RECEIPT\nreceipt-id:t-sub\n\n\x00")


def _new(port: int, timeout: str = "5s") -> StreamLink:
    """A StreamLink to 127.0.0.1:``port`` (vhost ``/``), not connected."""
    given = {"stream": "true", "destination": "/amq/queue/s", "port": str(port), "vhost": "/"}
    return StreamLink(parse_stream_options({**given, "timeout": timeout}, batch=True))


def _link(port: int, timeout: str = "5s") -> StreamLink:
    """A StreamLink to 127.0.0.1:``port``, connected and subscribed as :func:`_subscribed`
    expects."""
    link = _new(port, timeout)
    try:
        link.start()
        link.connect()
        link.subscribe("/amq/queue/s", "t", {"x-stream-offset": "offset=7"}, ack="client")
    except BaseException:
        link.close(graceful=False)
        raise
    return link


def _take_ten_times(link: StreamLink) -> list[Delivery]:
    """What ten takes of up to 5 s each get (the error that ends them propagates)."""
    got: list[Delivery] = []
    for _ in range(10):
        got += link.take_wait(10, 5.0)
    return got


def test_messages_an_ack_and_a_disconnect(peer: Callable[[Script], int]) -> None:
    """MESSAGEs come in order up to ``limit`` per take; the ACK is written as a frame; close
    waits for the DISCONNECT's RECEIPT."""
    seen: list[bytes] = []

    def script(conn: socket.socket) -> None:
        _connected(conn)
        _subscribed(conn)
        conn.sendall(b"".join(b"MESSAGE\nack:%d\n\nm%d\x00" % (n, n) for n in range(5)))
        seen.append(_read_frame(conn))
        bye = _read_frame(conn)
        seen.append(bye)
        conn.sendall(b"RECEIPT\nreceipt-id:mq-sidecar-spark-disconnect\n\n\x00")

    link = _link(peer(script))
    got: list[Delivery] = []
    for _ in range(10):
        got += link.take_wait(2, 5.0)
        if len(got) == 5:
            break
    assert [body for _, body in got] == [b"m0", b"m1", b"m2", b"m3", b"m4"]
    link.ack("4")
    assert link.take_wait(10, 0.1) == []
    link.close()
    bye = b"DISCONNECT\nreceipt:mq-sidecar-spark-disconnect\n\n\x00"
    assert seen == [b"ACK\nid:4\n\n\x00", bye]


def test_an_error_comes_after_the_messages_before_it(peer: Callable[[Script], int]) -> None:
    def script(conn: socket.socket) -> None:
        _connected(conn)
        _subscribed(conn)
        conn.sendall(b"MESSAGE\nack:1\n\nm\x00ERROR\nmessage:gone\n\nthe details\x00")

    link = _link(peer(script))
    assert [body for _, body in link.take_wait(10, 5.0)] == [b"m"]
    with pytest.raises(StompErrorFrame, match="sent ERROR: gone\nthe details") as caught:
        _take_ten_times(link)
    assert (caught.value.message, caught.value.body) == ("gone", "the details")
    link.close()


def test_a_refused_subscribe_and_a_lost_connection(peer: Callable[[Script], int]) -> None:
    def refuse(conn: socket.socket) -> None:
        _connected(conn)
        _read_frame(conn)
        conn.sendall(b"ERROR\nmessage:precondition_failed\n\nno\x00")

    with pytest.raises(StompErrorFrame, match="precondition_failed"):
        _link(peer(refuse))

    def lose(conn: socket.socket) -> None:
        _connected(conn)
        _subscribed(conn)

    link = _link(peer(lose))
    with pytest.raises(StompConnectionLost, match="was lost"):
        _take_ten_times(link)
    link.close()


def test_every_wait_is_bounded(peer: Callable[[Script], int]) -> None:
    """No CONNECTED, no RECEIPT, no MESSAGE: each wait ends after its bound."""
    done = threading.Event()

    def silent(conn: socket.socket) -> None:
        done.wait(10)

    link = _new(peer(silent), "300ms")
    link.start()
    with pytest.raises(StompConnectError, match=r"no CONNECTED .* within 0.3 s"):
        link.connect()
    link.close()
    done.set()

    def no_receipt(conn: socket.socket) -> None:
        _connected(conn)
        _read_frame(conn)
        done.wait(10)

    done.clear()
    with pytest.raises(StompTimeout, match=r"no receipt .* within 0.3 s after the SUBSCRIBE"):
        _link(peer(no_receipt), "300ms")
    done.set()

    def quiet(conn: socket.socket) -> None:
        _connected(conn)
        _subscribed(conn)
        done.wait(10)

    done.clear()
    link = _link(peer(quiet))
    assert link.take_wait(10, 0.2) == []
    link.close(graceful=False)
    done.set()


def test_nothing_listening_is_named() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
    link = _new(port)
    with pytest.raises(StompConnectError, match=r"cannot connect to the sidecar at 127\.0\.0\.1:"):
        link.start()
