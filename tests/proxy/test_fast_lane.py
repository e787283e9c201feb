"""The fast lane against the general path, by property: the same bytes from the app (and from
the broker), through a Session with the fast lane and through one without (``APP_FAST_LANE``
empty: every frame parsed), give the broker and the app the same bytes and leave the same
session state (the window's entries, counters, statistics). Scripted brokers on the mock clock
(docs/architecture.md, "The fast lane")."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import proxy.session.app_side
import proxy.session.core
from protocol import Command
from tests.proxy import scripted_broker
from tests.proxy.scripted_broker import (
    ACTIVEMQ,
    RABBITMQ,
    Network,
    make_config,
    start_session,
)

QUEUE = b"/queue/fast"

# Header lines an app SEND may carry: ordinary ones, repeats of those the sidecar reads, and
# unusual ones (an escape, a second colon, not ASCII, a temporary destination, a transaction).
_LINES = st.sampled_from(
    [
        b"receipt:r1",
        b"receipt:r2",
        b"receipt:r3",
        b"mq-sidecar-id:app-1",
        b"_AMQ_DUPL_ID:dupl-1",
        b"persistent:true",
        b"content-type:text/plain",
        b"reply-to:/temp-queue/replies",
        b"reply-to:/queue/replies",
        b"transaction:tx1",
        b"transaction:nope",
        b"x-escaped:a\\cb",
        b"x-colon:a:b",
        b"x-name:\xc3\xa9",
        b"empty:",
        b":",
    ]
)
_BODIES = st.sampled_from([b"", b"hello", b"x" * 300, b"a\0b"])


@st.composite
def app_frames(draw: st.DrawFn) -> bytes:
    """One frame of the app's: mostly SENDs (any of the lines above, content-length right,
    wrong-looking or none, CRLF sometimes), BEGIN/COMMIT of ``tx1``, heart-beats."""
    kind = draw(st.sampled_from(["send"] * 6 + ["begin", "commit", "beat"]))
    if kind == "beat":
        return b"\n"
    if kind in ("begin", "commit"):
        return b"%s\ntransaction:tx1\nreceipt:%s\n\n\0" % (kind.upper().encode(), kind.encode())
    lines = [b"destination:" + QUEUE, *draw(st.lists(_LINES, max_size=4))]
    draw(st.randoms()).shuffle(lines)
    body = draw(_BODIES)
    length = draw(st.sampled_from(["none", "right", "padded"]))
    if length == "right" or (length == "none" and b"\0" in body):
        lines.append(b"content-length:%d" % len(body))
    elif length == "padded":
        lines.append(b"content-length:%04d" % len(body))
    eol = b"\r\n" if draw(st.integers(0, 9)) == 0 else b"\n"
    return b"SEND" + eol + b"".join(line + eol for line in lines) + eol + body + b"\0"


# Header lines a broker MESSAGE may carry besides destination, message-id, subscription and
# ack: the ids the sidecar cuts (its own, Artemis' copy of it, a producer's sidecar receipt),
# repeats of what it rewrites, an escape, ActiveMQ's end of a browse.
_MESSAGE_LINES = st.sampled_from(
    [
        b"mq-sidecar-id:abc-1",
        b"mq-sidecar-id:abc-2",
        b"_AMQ_DUPL_ID:abc-1",
        b"_AMQ_DUPL_ID:other",
        b"receipt:0a1b2c-1-r5",
        b"receipt:app-receipt",
        b"ack:extra",
        b"subscription:extra",
        b"redelivered:true",
        b"browser:end",
        b"x-escaped:a\\cb",
        b"x-colon:a:b",
        b"content-type:text/plain",
    ]
)
#: The app's subscriptions: (destination, ack mode); the broker delivers on all three.
_SUBSCRIPTIONS = (
    (b"/queue/auto", "auto"),
    (b"/queue/ci", "client-individual"),
    (b"/queue/c", "client"),
)


@st.composite
def broker_messages(draw: st.DrawFn) -> tuple[int, int, list[bytes], bytes, int]:
    """One MESSAGE's parts: which subscription (index), which message-id (a few, so some
    repeat: duplicates), extra header lines, a body, and how many ``ack`` entries (0-2)."""
    return (
        draw(st.integers(0, len(_SUBSCRIPTIONS) - 1)),
        draw(st.integers(1, 4)),
        draw(st.lists(_MESSAGE_LINES, max_size=3)),
        draw(_BODIES),
        draw(st.sampled_from([1, 1, 1, 0, 2])),
    )


def _message_bytes(
    parts: tuple[int, int, list[bytes], bytes, int], upstream_ids: dict[bytes, str], n: int
) -> bytes:
    sub, mid, extra, body, acks = parts
    destination = _SUBSCRIPTIONS[sub][0]
    lines = [
        b"destination:" + destination,
        # ActiveMQ's ids hold colons (escaped on the way to the app: the general path).
        (b"message-id:ID:m-%d" if mid == 4 else b"message-id:m-%d") % mid,
        b"subscription:" + upstream_ids[destination].encode(),
        *(b"ack:a-%d-%d" % (n, i) for i in range(acks)),
        *extra,
    ]
    if b"\0" in body:
        lines.append(b"content-length:%d" % len(body))
    return b"MESSAGE\n" + b"".join(line + b"\n" for line in lines) + b"\n" + body + b"\0"


def _window_state(running: scripted_broker.Running) -> list[tuple[Any, ...]]:
    core = running.session.core
    return [
        (e.seq, e.size, e.app_receipt, e.receipt, e.frame, e.sent, e.confirmed, e.deferred)
        for e in core.flow.window
    ]


def _run(
    stream: bytes,
    server: str,
    hold: bool,
    chunk: int,
    *,
    fast: bool,
    messages: Sequence[tuple[int, int, list[bytes], bytes, int]] = (),
) -> tuple[list[bytes], list[Any], list[Any], Any, list[Any]]:
    """Run the app's bytes through a session (after it subscribed and the broker delivered
    ``messages``, when any); what the broker got (bytes of every write to it), what the app
    got (bytes), the window's entries, the statistics and counters."""
    written: list[bytes] = []
    to_app: list[bytes] = []
    original = scripted_broker.LinkSocket.send_all

    async def record(
        self: scripted_broker.LinkSocket, data: bytes | bytearray | memoryview
    ) -> None:
        written.append(bytes(data))
        await original(self, data)

    result: list[Any] = []

    async def scenario() -> None:
        async with trio.open_nursery() as nursery:
            network = Network(nursery)
            broker = network.add("primary", 61001, server=server)
            running = await start_session(nursery, network, make_config(broker))
            await running.app.connect()
            link = await broker.wait_for_links(1)
            if messages:
                for at, (destination, mode) in enumerate(_SUBSCRIPTIONS):
                    await running.app.send(
                        Command.SUBSCRIBE,
                        {"destination": destination.decode(), "id": f"s{at}", "ack": mode},
                    )
                await trio.testing.wait_all_tasks_blocked()
                upstream_ids = {
                    (f.get("destination") or "").encode(): i for i, f in link.subscriptions.items()
                }
                for n, parts in enumerate(messages):
                    await link._stream.send_all(_message_bytes(parts, upstream_ids, n))
                    await trio.testing.wait_all_tasks_blocked()
            if hold:
                broker.receipts = "hold"
            for at in range(0, len(stream), chunk):
                await running.app.stream.send_all(stream[at : at + chunk])
                # Each piece is read and handled before the next one comes: what a read
                # holds (and so which frame ends a burst) is the same in both runs.
                await trio.testing.wait_all_tasks_blocked()
            await trio.sleep(5)  # mock clock: until everything is idle
            core = running.session.core
            stats = running.session.statistics()
            result.extend(
                [
                    b"".join(to_app),
                    _window_state(running),
                    stats,
                    (core.flow.window.bytes, core.flow.window.confirmed_total, core.app.frames_in),
                ]
            )
            nursery.cancel_scope.cancel()

    reader = scripted_broker.AppClient.run_reader

    async def run_reader(self: scripted_broker.AppClient) -> None:
        receive = self.stream.receive_some

        async def receive_some(max_bytes: int | None = None) -> bytes | bytearray:
            data = await receive(max_bytes)
            to_app.append(bytes(data))
            return data

        self.stream.receive_some = receive_some  # type: ignore[method-assign]
        await reader(self)

    patch = pytest.MonkeyPatch()
    try:
        patch.setattr(scripted_broker.LinkSocket, "send_all", record)
        patch.setattr(scripted_broker.AppClient, "run_reader", run_reader)
        if not fast:
            patch.setattr(proxy.session.core, "APP_FAST_LANE", frozenset())
        trio.run(scenario, clock=trio.testing.MockClock(autojump_threshold=0))
    finally:
        patch.undo()
    app_bytes, window, stats, counters = result
    return written, [app_bytes], window, stats, [counters]


#: Two sessions per example, on the mock clock: no deadline.
_SESSIONS = settings(
    deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)


def _same(
    stream: bytes,
    server: str,
    hold: bool,
    chunk: int,
    messages: Sequence[tuple[int, int, list[bytes], bytes, int]] = (),
) -> None:
    """The run with the lane and the run without it wrote and kept the same."""
    fast = _run(stream, server, hold, chunk, fast=True, messages=messages)
    general = _run(stream, server, hold, chunk, fast=False, messages=messages)
    assert b"".join(fast[0]) == b"".join(general[0])
    assert fast[1:] == general[1:]


@settings(_SESSIONS, max_examples=200)
@given(
    frames=st.lists(app_frames(), min_size=1, max_size=12),
    server=st.sampled_from([ACTIVEMQ, RABBITMQ]),
    hold=st.booleans(),
    chunk=st.sampled_from([1 << 16, 7, 100]),
)
def test_the_fast_lane_writes_and_keeps_what_the_general_path_does(
    frames: list[bytes], server: str, hold: bool, chunk: int
) -> None:
    _same(b"".join(frames), server, hold, chunk)


@settings(_SESSIONS, max_examples=150)
@given(
    messages=st.lists(broker_messages(), min_size=1, max_size=10),
    frames=st.lists(app_frames(), max_size=3),
    server=st.sampled_from([ACTIVEMQ, RABBITMQ]),
)
def test_messages_around_the_fast_lane_are_what_the_general_path_delivers(
    messages: list[tuple[int, int, list[bytes], bytes, int]], frames: list[bytes], server: str
) -> None:
    """Broker MESSAGEs on auto, client-individual and client subscriptions (duplicates,
    repeats, the ids the sidecar cuts, escapes; parsed either way) among the app's SENDs and
    the RECEIPTs answering them: the same bytes to the app and the broker (the sidecar's ACKs),
    the same window, statistics and counters, with and without the lane."""
    _same(b"".join(frames), server, False, 1 << 16, messages)


def test_ordinary_sends_take_the_fast_lane(monkeypatch: pytest.MonkeyPatch) -> None:
    """The property above compares something: ordinary SENDs do come as bytes, and every
    unusual one is parsed first."""
    taken: list[Command] = []
    parsed: list[bytes] = []
    original: Callable[..., Any] = proxy.session.app_side.AppSide._fast_lane

    def spy(self: proxy.session.app_side.AppSide, frame: Any) -> bool:
        ok = bool(original(self, frame))
        (taken.append(frame.command) if ok else parsed.append(frame.data))
        return ok

    monkeypatch.setattr(proxy.session.app_side.AppSide, "_fast_lane", spy)
    stream = (
        b"SEND\ndestination:/queue/a\nreceipt:r1\n\nx\0"
        b"SEND\ndestination:/queue/a\ntransaction:t\n\nx\0"
        b"SEND\ndestination:/queue/a\\c\n\nx\0"
    )
    written, *_ = _run(stream, ACTIVEMQ, False, 1 << 16, fast=True)
    assert taken == [Command.SEND]
    assert parsed == [b"SEND\ndestination:/queue/a\ntransaction:t\n\nx\0"]
    assert any(b"receipt:r1" in w or b"mq-sidecar-id:s1-1" in w for w in written)
