"""RabbitMQ streams through the sidecar, against a real RabbitMQ 3.10 node (issue 32 part 1;
docs/behaviour.md, "Streams"; the broker's facts in docs/brokers.md, "Streams").

An app reads a stream through the sidecar while a producer publishes to it straight to the node;
a fault proxy resets the sidecar's broker connection and refuses new ones while the producer
goes on, then lets the sidecar back. For each starting position the app must be shown every
message from its position on once, in offset order, none missing. Before the fix the sidecar
re-sent the app's SUBSCRIBE unchanged: ``first``, ``offset=N`` and ``timestamp=T`` showed the
stream again from there, ``next`` lost what was published during the outage. For comparison
the same cut is made to a stomp.py app connected straight to the node that tracks its own
offset and re-subscribes at ``offset=<last + 1>`` (``DirectApp``); both print the figures
(published / shown / shown twice / missing) of issue 32's closing note.

Bad input (issue 32, "Bad input"): a SUBSCRIBE the broker refuses on a stream (an
``x-stream-offset`` it cannot read, no ``prefetch-count``, ``ack:auto``) gets the broker's
own ERROR through the sidecar, and the sidecar goes on serving.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from protocol import Command, Frame
from testbed import RabbitMQ
from tests.faultproxy import FaultProxy
from tests.integration.stream_support import DirectApp, figures
from tests.integration.support import RawClient, SidecarThread, sidecar_config, unique

FAST = {"retry_interval": "50", "max_retry_interval": "200", "connect_timeout": "2000"}
EVENTS = "/mq-sidecar/events"
#: Messages published before the app subscribes, while it reads, while its sidecar's broker
#: connection is down, and after the restore (the last one is the end marker).
BEFORE, WHILE_UP, WHILE_DOWN, AFTER = 200, 200, 300, 100
TOTAL = BEFORE + WHILE_UP + WHILE_DOWN + AFTER
#: The app's reads before the cut: half of what was published while it reads.
READ_BEFORE_CUT = 100
#: A bound on the frames any one read loop takes (every message at most three times, events).
MAX_FRAMES = 4 * TOTAL
#: Seconds the direct app may take to read up to the cut, then to the end.
READ_WAIT = 60.0


@pytest.fixture
def proxy(rabbitmq: RabbitMQ) -> Iterator[FaultProxy]:
    with FaultProxy((rabbitmq.host, rabbitmq.stomp_port)) as faults:
        yield faults


def sidecar_url(proxy: FaultProxy) -> str:
    return f"stomp://127.0.0.1:{proxy.port}?host=/"


def until(client: RawClient, predicate: object, what: str) -> list[Frame]:
    """Frames read from ``client`` up to and including the first that ``predicate`` accepts
    (bounded by :data:`MAX_FRAMES`)."""
    assert callable(predicate)
    frames: list[Frame] = []
    for _ in range(MAX_FRAMES):
        frame = client.frame()
        frames.append(frame)
        if predicate(frame):
            return frames
    raise AssertionError(f"no {what} within {MAX_FRAMES} frames")


def declare_stream(broker: RabbitMQ, name: str | None = None) -> str:
    """A new durable stream queue (RabbitMQ declares a queue on a SUBSCRIBE to ``/queue/``),
    named ``name`` (default: a new name); returns its ``/amq/queue/`` destination."""
    name = name or unique("stream").replace("-", "_")
    client = RawClient((broker.host, broker.stomp_port))
    client.connect()
    client.send_frame(
        "SUBSCRIBE",
        {
            "destination": f"/queue/{name}",
            "id": "declare",
            "ack": "client-individual",
            "prefetch-count": "1",
            "x-queue-type": "stream",
            "durable": "true",
            "auto-delete": "false",
            "receipt": "declared",
        },
    )
    assert client.frame().get("receipt-id") == "declared"
    client.close()
    return f"/amq/queue/{name}"


class Producer:
    """Publishes straight to the node (not through the sidecar): message ``seq`` (body and
    header) is at offset ``seq`` of the new stream, since it is the stream's only writer."""

    def __init__(self, broker: RabbitMQ, destination: str) -> None:
        self.client = RawClient((broker.host, broker.stomp_port))
        self.client.connect()
        self.destination = destination
        self.sent = 0

    def publish(self, n: int, body: bytes | None = None) -> None:
        """Publish ``n`` more (``body``, default ``n<seq>``); return once the broker confirmed
        the last (a stream confirms in order: one connection's messages are appended in
        order)."""
        for i in range(n):
            seq = self.sent
            self.sent += 1
            headers = {"destination": self.destination, "seq": str(seq)}
            if i == n - 1:
                headers["receipt"] = f"p{seq}"
            self.client.send_frame("SEND", headers, body or f"n{seq}".encode())
        until(self.client, lambda f: f.get("receipt-id") == f"p{self.sent - 1}", "confirm")


class App:
    """The app through the sidecar: reads the stream with ``client-individual`` ACKs, one per
    message, and the control channel's events."""

    def __init__(self, address: tuple[str, int], destination: str, position: str) -> None:
        self.client = RawClient(address)
        self.client.connect()
        self.client.send_frame("SUBSCRIBE", {"destination": EVENTS, "id": "ev", "ack": "auto"})
        self.client.send_frame(
            "SUBSCRIBE",
            {
                "destination": destination,
                "id": "s",
                "ack": "client-individual",
                "prefetch-count": "50",
                "x-stream-offset": position,
                "receipt": "sub",
            },
        )
        until(self.client, lambda f: f.get("receipt-id") == "sub", "SUBSCRIBE receipt")
        self.shown: list[int] = []
        self.offsets: list[int] = []
        self.errors: list[Frame] = []
        self.events: list[str] = []
        self.failover: dict[str, object] = {}
        self.gaps: list[dict[str, object]] = []
        self.outcomes: list[dict[str, object]] = []

    def read(self, predicate: object, what: str) -> None:
        """Read (and ACK each message) until ``predicate(frame)``."""
        assert callable(predicate)

        def take(frame: Frame) -> bool:
            if frame.command is Command.ERROR:
                self.errors.append(frame)
            elif frame.command is Command.MESSAGE and frame.get("subscription") == "ev":
                self.events.append(frame.get("event") or "")
                if frame.get("event") == "FAILOVER":
                    self.failover = json.loads(frame.body)
                elif frame.get("event") == "STREAM_GAP":
                    self.gaps.extend(json.loads(frame.body)["offsets_missed"])
                elif frame.get("event") == "OUTCOME":
                    self.outcomes.extend(json.loads(frame.body)["frames"])
            elif frame.command is Command.MESSAGE:
                self.shown.append(int(frame.get("seq") or "-1"))
                self.offsets.append(int(frame.get("x-stream-offset") or "-1"))
                self.client.send_frame("ACK", {"id": frame.get("ack") or ""})
            return bool(predicate(frame))

        until(self.client, take, what)


class Reader:
    """Reads a stream straight from the node, from ``first``, until it has been quiet for a
    second: what the stream holds, as (offset, seq) pairs."""

    def __init__(self, broker: RabbitMQ, destination: str) -> None:
        self.client = RawClient((broker.host, broker.stomp_port))
        self.client.connect()
        self.client.send_frame(
            "SUBSCRIBE",
            {
                "destination": destination,
                "id": "r",
                "ack": "client-individual",
                "prefetch-count": "100",
                "x-stream-offset": "first",
            },
        )

    def read_all(self) -> list[tuple[int, int]]:
        pairs: list[tuple[int, int]] = []
        self.client.sock.settimeout(1.0)
        with contextlib.suppress(TimeoutError):
            for _ in range(MAX_FRAMES):
                frame = self.client.frame()
                assert frame.command is Command.MESSAGE, frame
                pairs.append(
                    (int(frame.get("x-stream-offset") or "-1"), int(frame.get("seq") or "-1"))
                )
                self.client.send_frame("ACK", {"id": frame.get("ack") or ""})
        self.client.close()
        return pairs


def is_message(seq: int) -> object:
    return lambda f: f.command is Command.MESSAGE and f.get("seq") == str(seq)


#: The starting positions of the connection-cut cases, through the sidecar and direct.
POSITIONS = ["first", "next", "offset=150", "timestamp"]


def new_stream(rabbitmq: RabbitMQ, position: str) -> tuple[str, Producer, str, list[int]]:
    """A cut case's stream, its producer (BEFORE already published unless ``position`` is
    ``next``), the SUBSCRIBE's position (``timestamp``: an hour back, the whole stream, as
    timestamps are of chunks) and the ``seq`` list the app must be shown."""
    stream = declare_stream(rabbitmq)
    producer = Producer(rabbitmq, stream)
    if position != "next":
        producer.publish(BEFORE)
    if position == "timestamp":
        position = f"timestamp={int(time.time()) - 3600}"
    start = 150 if position == "offset=150" else 0
    return stream, producer, position, list(range(start, TOTAL))


@pytest.mark.parametrize("position", POSITIONS)
def test_a_stream_subscription_resumes_where_the_app_is_after_a_reset(
    rabbitmq: RabbitMQ, proxy: FaultProxy, position: str
) -> None:
    stream, producer, position, expected = new_stream(rabbitmq, position)
    config = sidecar_config(sidecar_url(proxy), **FAST)
    with SidecarThread(config) as sidecar:
        app = App(sidecar.address, stream, position)
        if position == "next":
            producer.publish(BEFORE)  # after the SUBSCRIBE: all of it is "next"
        producer.publish(WHILE_UP)
        app.read(is_message(BEFORE + READ_BEFORE_CUT - 1), "the reads before the cut")

        proxy.refuse(True)
        proxy.reset()
        producer.publish(WHILE_DOWN)
        proxy.refuse(False)
        app.read(lambda f: f.get("event") == "FAILOVER", "FAILOVER")
        producer.publish(AFTER)
        app.read(is_message(TOTAL - 1), "the last message")
        app.client.close()

    shown, twice, missing = figures(app.shown, expected)
    print(
        f"\nstream {position} sidecar: published {TOTAL}, expected {len(expected)}, shown "
        f"{shown}, shown twice {twice}, missing {missing}, events {app.events}, "
        f"hidden on the new leg {app.failover.get('redeliveries_hidden')} (at the FAILOVER)"
    )
    assert app.errors == []
    assert app.events.count("FAILOVER") == 1
    assert (twice, missing) == (0, 0)
    assert app.shown == expected  # once each, in offset order
    assert app.offsets == expected  # the broker's x-stream-offset reaches the app


@pytest.mark.parametrize("position", POSITIONS)
def test_a_direct_app_that_tracks_its_offset_resumes_after_a_reset(
    rabbitmq: RabbitMQ, proxy: FaultProxy, position: str
) -> None:
    """The comparison for the case above (issue 32's closing note): the same stream, publishing
    and cut for a stomp.py app connected straight to the node through its own fault proxy,
    held mid-read with MESSAGEs not yet acknowledged when its connection is reset while new
    ones are refused; it reconnects by itself and re-subscribes at ``offset=<last + 1>``."""
    stream, producer, position, expected = new_stream(rabbitmq, position)
    last = BEFORE + READ_BEFORE_CUT - 1
    direct = DirectApp([("127.0.0.1", proxy.port)], stream, position, hold_at=last)
    try:
        if position == "next":
            producer.publish(BEFORE)
        producer.publish(WHILE_UP)
        assert direct.held.wait(READ_WAIT), "the reads before the cut"

        done = threading.Thread(
            target=direct.keep_up,
            args=(lambda: bool(direct.shown) and direct.shown[-1] == TOTAL - 1, READ_WAIT),
            daemon=True,
        )
        done.start()
        proxy.refuse(True)
        proxy.reset()
        direct.release()
        producer.publish(WHILE_DOWN)
        proxy.refuse(False)
        producer.publish(AFTER)
        done.join(READ_WAIT + 5)
    finally:
        direct.close()

    shown, twice, missing = figures(direct.shown, expected)
    print(
        f"\nstream {position} direct: published {TOTAL}, expected {len(expected)}, shown "
        f"{shown}, shown twice {twice}, missing {missing}, re-subscribes "
        f"{direct.resubscribes}, connects refused {direct.refused}, redeliveries it dropped "
        f"{direct.dropped}"
    )
    assert direct.errors == []
    assert direct.resubscribes >= 1
    assert direct.shown == expected  # once each, in offset order, none missing


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ({"x-stream-offset": "offset=abc", "prefetch-count": "10"}, "Processing error"),
        ({"x-stream-offset": "first"}, "precondition_failed"),
        ({"x-stream-offset": "first", "prefetch-count": "10", "ack": "auto"}, "Processing error"),
    ],
    ids=["unreadable-offset", "no-prefetch", "ack-auto"],
)
def test_a_subscribe_the_broker_refuses_gets_the_brokers_error(
    rabbitmq: RabbitMQ, headers: dict[str, str], message: str
) -> None:
    """Transparency: the broker judges a stream SUBSCRIBE (measured: docs/brokers.md,
    "Streams"); the app gets the broker's ERROR, the sidecar serves the next session."""
    stream = declare_stream(rabbitmq)
    config = sidecar_config(f"stomp://{rabbitmq.host}:{rabbitmq.stomp_port}?host=/", **FAST)
    with SidecarThread(config) as sidecar:
        app = RawClient(sidecar.address)
        app.connect()
        app.send_frame(
            "SUBSCRIBE",
            {"destination": stream, "id": "s", "ack": "client-individual", **headers},
        )
        error = until(app, lambda f: f.command is Command.ERROR, "ERROR")[-1]
        assert error.get("message") == message, error
        app.close()
        # The sidecar goes on: a new session reads the stream.
        Producer(rabbitmq, stream).publish(1)
        again = RawClient(sidecar.address)
        again.connect()
        again.send_frame(
            "SUBSCRIBE",
            {
                "destination": stream,
                "id": "s",
                "ack": "client-individual",
                "prefetch-count": "10",
                "x-stream-offset": "first",
            },
        )
        shown = until(again, lambda f: f.command is Command.MESSAGE, "MESSAGE")[-1]
        assert (shown.body, shown.get("x-stream-offset")) == (b"n0", "0")
        again.close()


#: Retention for the truncation test (a policy: RabbitMQ 3.10's STOMP plugin passes
#: ``x-max-length-bytes`` to a declaration but not the segment size or ``x-max-age``, measured):
#: segments of about ten 500-byte messages, about forty kept.
RETENTION = '{"stream-max-segment-size-bytes":5000,"max-length-bytes":20000}'


def test_offsets_removed_by_retention_during_an_outage_are_named_as_a_gap(
    rabbitmq: RabbitMQ, proxy: FaultProxy
) -> None:
    """Retention removes the offset the sidecar resumes at while its broker connection is
    down: RabbitMQ starts the new leg at the first offset it still has (measured); the app gets
    a STREAM_GAP event naming the offsets it can never see, then every message still stored,
    once each, in order (issue 32 part 3)."""
    name = unique("ret").replace("-", "_")
    rabbitmq.rabbitmqctl("set_policy", "--apply-to", "queues", f"p_{name}", f"^{name}$", RETENTION)
    try:
        stream = declare_stream(rabbitmq, name)
        producer = Producer(rabbitmq, stream)
        producer.publish(30)
        config = sidecar_config(sidecar_url(proxy), **FAST)
        with SidecarThread(config) as sidecar:
            app = App(sidecar.address, stream, "first")
            app.read(is_message(29), "the reads before the cut")
            proxy.refuse(True)
            proxy.reset()
            producer.publish(400, body=b"x" * 500)  # about ten times what is kept
            proxy.refuse(False)
            app.read(lambda f: f.get("event") == "FAILOVER", "FAILOVER")
            # Retention may have left no message at all (measured: a stream whose first
            # offset is its next one): the gap is known at the next message.
            producer.publish(20)
            app.read(lambda f: f.get("event") == "STREAM_GAP", "STREAM_GAP")
            app.read(is_message(449), "the last message")
            app.client.close()
        stored = Reader(rabbitmq, stream).read_all()  # what the stream holds now, directly
    finally:
        rabbitmq.rabbitmqctl("clear_policy", f"p_{name}")

    (gap,) = app.gaps
    shown_after = app.shown[30:]
    print(
        f"\nretention: published 450, shown {len(app.shown)} (0..29, then {shown_after[0]}..), "
        f"stored now {len(stored)} (from seq {stored[0][1]}, offset {stored[0][0]}), gap {gap}"
    )
    assert app.errors == []
    assert app.shown[:30] == list(range(30))
    assert gap["first"] == app.offsets[29] + 1
    assert gap["last"] == app.offsets[30] - 1
    assert gap["count"] == gap["last"] - gap["first"] + 1 > 300
    # After the gap: exactly what the stream still holds, once each, in order.
    assert [(o, s) for o, s in zip(app.offsets[30:], shown_after, strict=True)] == stored
    assert len(set(app.shown)) == len(app.shown)


@pytest.mark.long
def test_a_single_nodes_stream_after_a_kill_waits_then_the_session_ends_at_reconnect_period(
    tmp_path: Path,
) -> None:
    """Issue 32 part 5: one RabbitMQ 3.10 node killed with kill -9 and started again on its
    data. Its stream answers every SUBSCRIBE with ``not_found`` "home node ... is down or
    inaccessible" (and closes the connection) for as long as it was watched (docs/brokers.md,
    "Streams"). The sidecar keeps the app's session and subscription, never shows the app the
    ERROR, retries with back-off; at ``reconnect_period`` (20 s here) it gives up as any
    reconnect does: DISCONNECT, then its ERROR. Printed: the attempts and how long."""
    broker = RabbitMQ("rmqkill", tmp_path / "rmq")
    with broker:
        stream = declare_stream(broker)
        Producer(broker, stream).publish(100)
        config = sidecar_config(
            f"stomp://{broker.host}:{broker.stomp_port}?host=/",
            **FAST,
            reconnect_period="20000",
        )
        with SidecarThread(config) as sidecar:
            app = App(sidecar.address, stream, "first")
            app.read(is_message(99), "the stream")
            killed = time.monotonic()
            broker.kill()
            broker.start()
            broker.wait_ready(120)
            back = time.monotonic()
            frames = until(app.client, lambda f: f.command is Command.ERROR, "the final ERROR")
            ended = time.monotonic()
            app.client.close()
    events = [f.get("event") for f in frames if f.get("subscription") == "ev"]
    reasons = {json.loads(f.body)["reason"][:40] for f in frames if f.get("event")}
    print(
        f"\nsingle node killed: back after {back - killed:.1f} s, session ended "
        f"{ended - back:.1f} s later; events {Counter(events)}; reasons {reasons}"
    )
    assert app.shown == list(range(100))
    assert [f.command for f in frames].count(Command.MESSAGE) == len(events)  # no message
    assert events[-1] == "DISCONNECT"
    assert "not_found" in frames[-1].body.decode() or "reconnect" in (
        frames[-1].get("message") or ""
    )
