"""A scripted STOMP broker and a scripted app, on in-memory streams, for Session unit tests.

No sockets and no real broker: :class:`Network` is the ``open_stream`` a
:class:`proxy.session.Session` is given (``StreamOpener``). For a broker it knows and that is
reachable it returns one end of a ``trio.testing.memory_stream_pair`` and serves the other end
as a :class:`BrokerLink` of the :class:`ScriptedBroker` at that ``host:port``; for one that is
down (``reachable = False``) it raises OSError, as a refused TCP connect does.

A :class:`ScriptedBroker` speaks STOMP through ``protocol.Connection(Role.SERVER)`` and does
what the test says: answers CONNECT with CONNECTED (its ``server`` header decides what the
sidecar expects of it: ``ActiveMQ/...`` cumulative receipts and stable message ids,
``RabbitMQ/...`` neither) or refuses the login with an ERROR; records every frame; answers
receipts at once or holds them until released (in order, or reversed as RabbitMQ's publisher
confirms may overtake each other); delivers MESSAGEs on the subscriptions of a link; sends
heart-beats; drops a link (a clean close, a reset, or half a frame and a close); goes silent
(stops reading and writing, the socket stays open).

:class:`AppClient` plays the app: it writes STOMP frames to the Session's app stream through
``protocol.Connection(Role.CLIENT)`` and records, with the trio time of arrival, every frame it
gets back. Everything runs in the test's nursery; waits are bounded with ``trio.fail_after``.
"""

from __future__ import annotations

import errno
import json
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import trio
import trio.testing

import protocol
from config import Broker, Config
from protocol import Command, ConnectionClosed, Frame, HeartBeat, Role
from proxy.legs.memory import MemoryBudgetGate
from proxy.outbox.service import OutboxService
from proxy.reconnect.board import ReconnectBoard
from proxy.session import Session

if TYPE_CHECKING:
    from proxy.telemetry.tracing import Tracing

__all__ = [
    "ACTIVEMQ",
    "EVENTS",
    "RABBITMQ",
    "AppClient",
    "BrokerLink",
    "Network",
    "Running",
    "ScriptedBroker",
    "make_config",
    "start_session",
    "wait_until",
]

#: ``server`` headers of CONNECTED: proxy.legs.broker.Upstream derives the broker's behaviour.
ACTIVEMQ = "ActiveMQ/5.17.0"
RABBITMQ = "RabbitMQ/3.10.8"
#: The control channel's destination (Config.events_destination's default).
EVENTS = "/mq-sidecar/events"
#: Seconds (trio time, mock clock) any single wait of a test may take before it fails.
WAIT = 60.0
#: Bytes asked per read.
_RECEIVE = 65536


class Signal:
    """Wakes every waiter whenever something changed (a frame arrived, a link closed)."""

    def __init__(self) -> None:
        self._event = trio.Event()

    def changed(self) -> None:
        self._event.set()
        self._event = trio.Event()

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        """Return once ``predicate()`` holds; fail (TooSlowError) after :data:`WAIT` s."""
        with trio.fail_after(WAIT):
            while not predicate():
                await self._event.wait()


async def wait_until(predicate: Callable[[], bool], poll: float = 0.01) -> None:
    """Poll ``predicate`` every ``poll`` seconds (mock clock) until it holds; TooSlowError
    after :data:`WAIT` s. For conditions nothing signals (``Session.statistics()``)."""
    with trio.fail_after(WAIT):
        while not predicate():  # noqa: ASYNC110 (the session's statistics signal nothing)
            await trio.sleep(poll)


# -- the broker ---------------------------------------------------------------------------------


class LinkSocket(trio.abc.Stream):
    """The sidecar's end of one link: a memory stream the broker can *reset* (the next read
    or write fails with BrokenResourceError, as a TCP RST does) as well as close (EOF)."""

    def __init__(self, inner: trio.abc.Stream) -> None:
        self._inner = inner
        self.reset = False

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self.reset:
            await trio.lowlevel.checkpoint()
            raise trio.BrokenResourceError("connection reset by peer")
        await self._inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self._inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        data = await self._inner.receive_some(max_bytes)
        if self.reset:
            raise trio.BrokenResourceError("connection reset by peer")
        return data

    async def aclose(self) -> None:
        await self._inner.aclose()


class BrokerLink:
    """One connection accepted by a :class:`ScriptedBroker` (the server side of a link).

    Attributes:
        index: 1-based number of this link among the broker's links.
        frames: every frame received, in order (CONNECT first).
        subscriptions: live subscriptions by id (the SUBSCRIBE frames).
        held: receipt ids not answered yet (``receipts = "hold"``).
        closed: the link is over (either side closed it).
    """

    def __init__(self, broker: ScriptedBroker, index: int, stream: trio.abc.Stream) -> None:
        self.broker = broker
        self.index = index
        self.conn = protocol.Connection(Role.SERVER)
        self.frames: list[Frame] = []
        #: The trio time of every heart-beat the sidecar wrote on this link.
        self.beats: list[float] = []
        self.subscriptions: dict[str, Frame] = {}
        self.held: list[str] = []
        self.closed = False
        self.silent = False
        self.socket: LinkSocket | None = None
        self._stream = stream
        self._write_lock = trio.Lock()
        self._scope = trio.CancelScope()
        self._deliveries = 0

    # what the test sees

    def commands(self) -> list[Command]:
        """The commands received, in order."""
        return [f.command for f in self.frames]

    def received(self, command: Command) -> list[Frame]:
        """The frames of one command received, in order."""
        return [f for f in self.frames if f.command is command]

    # what the test does

    async def send(self, frame: Frame) -> None:
        """Write one frame to the sidecar (through the server-side state machine)."""
        async with self._write_lock:
            await self._stream.send_all(self.conn.send(frame))

    async def deliver(
        self,
        destination: str,
        body: bytes,
        *,
        message_id: str,
        headers: Iterable[tuple[str, str]] = (),
    ) -> str:
        """Deliver a MESSAGE on this link's subscription to ``destination``; returns the
        ``ack`` header it carries (what the sidecar must ACK with on this link)."""
        sub_id = next(
            (i for i, f in self.subscriptions.items() if f.get("destination") == destination),
            None,
        )
        assert sub_id is not None, f"no subscription to {destination} on link {self.index}"
        self._deliveries += 1
        ack = f"{self.broker.name}-l{self.index}-a{self._deliveries}"
        message = Frame(
            Command.MESSAGE,
            (
                ("destination", destination),
                ("message-id", message_id),
                ("subscription", sub_id),
                ("ack", ack),
                *headers,
            ),
            body,
        )
        await self.send(message)
        return ack

    async def release(self, *, reverse: bool = False, count: int | None = None) -> list[str]:
        """Answer held receipts: the oldest ``count`` (all when None), in order or reversed
        (RabbitMQ: publisher confirms may overtake each other). Returns the ids answered."""
        n = len(self.held) if count is None else min(count, len(self.held))
        batch, self.held = self.held[:n], self.held[n:]
        if reverse:
            batch.reverse()
        for receipt in batch:
            await self.send(Frame(Command.RECEIPT, (("receipt-id", receipt),)))
        return batch

    async def drop(self, how: str = "close") -> None:
        """Lose the link: ``close`` (clean EOF), ``reset`` (the sidecar's next read fails
        as on a TCP RST) or ``mid_frame`` (half a MESSAGE frame, then EOF)."""
        assert how in ("close", "reset", "mid_frame"), how
        if how == "reset" and self.socket is not None:
            self.socket.reset = True
        if how == "mid_frame":
            half = protocol.serialize(
                Frame(
                    Command.MESSAGE,
                    (("destination", "/queue/cut"), ("message-id", "cut"), ("subscription", "x")),
                    b"never finished" * 4,
                ),
                self.conn.version,
            )
            async with self._write_lock:
                await self._stream.send_all(half[: len(half) // 2])
        self._scope.cancel()
        await self._close()

    def go_silent(self) -> None:
        """Stop reading, answering and beating; the connection stays open (a hung broker)."""
        self.silent = True
        self._scope.cancel()

    # serving

    async def _close(self) -> None:
        if not self.closed:
            self.closed = True
            await trio.aclose_forcefully(self._stream)
            self.broker.signal.changed()

    async def run(self) -> None:
        """Serve the link until it is dropped, the sidecar closes it, or (silent) forever."""
        try:
            with self._scope:
                async with trio.open_nursery() as nursery:
                    await self._serve(nursery)
                    nursery.cancel_scope.cancel()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the sidecar closed its end under a write
        if self.silent:
            await trio.sleep_forever()  # keep the socket open; the test's nursery ends this
        await self._close()

    async def _serve(self, nursery: trio.Nursery) -> None:
        while True:
            event = self.conn.next_event()
            if isinstance(event, protocol.NeedData):
                data = await self._stream.receive_some(_RECEIVE)
                self.conn.receive_data(bytes(data))
                continue
            if isinstance(event, ConnectionClosed):
                return
            if isinstance(event, HeartBeat):
                self.beats.append(trio.current_time())
                continue
            assert isinstance(event, Frame)
            self.frames.append(event)
            self.broker.signal.changed()
            if not await self._handle(event, nursery):
                return

    async def _handle(self, frame: Frame, nursery: trio.Nursery) -> bool:
        """Answer one frame; False when the link is over."""
        broker = self.broker
        command = frame.command
        if command in (Command.CONNECT, Command.STOMP):
            if broker.refuse is not None:
                await self.send(
                    Frame(
                        Command.ERROR,
                        (("message", broker.refuse), ("content-type", "text/plain")),
                        f"{broker.refuse}\n".encode(),
                    )
                )
                return False
            version = protocol.negotiate_version(frame.get("accept-version"), (broker.version,))
            assert version is not None, "the sidecar did not offer the broker's version"
            await self.send(
                Frame(
                    Command.CONNECTED,
                    (
                        ("version", version),
                        ("heart-beat", broker.heart_beat),
                        ("server", broker.server),
                        ("session", f"{broker.name}-l{self.index}"),
                    ),
                )
            )
            if self.conn.heartbeat[0]:
                nursery.start_soon(self._beat, self.conn.heartbeat[0] / 1000)
            return True
        if command is Command.SUBSCRIBE:
            self.subscriptions[frame.get("id") or ""] = frame
        elif command is Command.UNSUBSCRIBE:
            self.subscriptions.pop(frame.get("id") or "", None)
        receipt = frame.get("receipt")
        if command is Command.DISCONNECT:
            if receipt is not None:
                await self.send(Frame(Command.RECEIPT, (("receipt-id", receipt),)))
            return False
        if receipt is not None:
            if broker.receipts == "hold":
                self.held.append(receipt)
                broker.signal.changed()
            else:
                await self.send(Frame(Command.RECEIPT, (("receipt-id", receipt),)))
        return True

    async def _beat(self, interval: float) -> None:
        while True:
            await trio.sleep(interval)
            async with self._write_lock:
                await self._stream.send_all(self.conn.send_heartbeat())


class ScriptedBroker:
    """A broker at ``host:port`` that follows the test's script (module docstring).

    Attributes (set them at any time):
        reachable: False: connecting raises OSError (the broker is down).
        refuse: answer CONNECT with an ERROR carrying this message (login refused).
        receipts: ``"auto"`` answers every receipt at once, ``"hold"`` keeps them for
            :meth:`BrokerLink.release`.
        heart_beat: the ``heart-beat`` header of CONNECTED (``"0,0"``: none).
    """

    def __init__(
        self,
        name: str,
        host: str,
        port: int,
        *,
        server: str = ACTIVEMQ,
        version: str = "1.2",
        heart_beat: str = "0,0",
    ) -> None:
        self.name = name
        self.config = Broker(host, port)
        self.server = server
        self.version = version
        self.heart_beat = heart_beat
        self.reachable = True
        self.refuse: str | None = None
        self.receipts = "auto"
        self.links: list[BrokerLink] = []
        self.connects = 0  # connection attempts while reachable (links opened)
        self.refused_attempts = 0  # attempts while unreachable
        self.signal = Signal()

    @property
    def label(self) -> str:
        return self.config.label

    @property
    def link(self) -> BrokerLink:
        """The latest link (the one a test usually means)."""
        assert self.links, f"nobody connected to {self.name}"
        return self.links[-1]

    def live_links(self) -> list[BrokerLink]:
        return [link for link in self.links if not link.closed]

    def frames(self) -> list[Frame]:
        """Every frame received on every link, in link order."""
        return [f for link in self.links for f in link.frames]

    async def wait_for_links(self, n: int) -> BrokerLink:
        """Wait until the broker has had ``n`` links; returns the ``n``-th."""
        await self.signal.wait_until(lambda: len(self.links) >= n)
        return self.links[n - 1]

    async def wait_for(
        self, command: Command, n: int = 1, *, link: int | None = None
    ) -> list[Frame]:
        """Wait until ``n`` frames of ``command`` arrived (on link number ``link``, or on any);
        returns them all."""

        def frames() -> list[Frame]:
            source = self.frames() if link is None else self.links[link - 1].frames
            return [f for f in source if f.command is command]

        await self.signal.wait_until(
            lambda: (link is None or len(self.links) >= link) and len(frames()) >= n
        )
        return frames()


class Network:
    """The sidecar's ``open_stream`` onto a set of scripted brokers (by ``host:port``)."""

    def __init__(self, nursery: trio.Nursery) -> None:
        self.nursery = nursery
        self.brokers: dict[str, ScriptedBroker] = {}
        self.attempts: list[tuple[float, str, bool]] = []  # (time, label, reached)

    def add(self, name: str, port: int, **kwargs: Any) -> ScriptedBroker:
        broker = ScriptedBroker(name, "broker.test", port, **kwargs)
        self.brokers[broker.label] = broker
        return broker

    async def open_stream(self, broker: Broker) -> trio.abc.Stream:
        """The Session's StreamOpener: a memory stream to the scripted broker, or OSError."""
        await trio.lowlevel.checkpoint()
        scripted = self.brokers.get(broker.label)
        reached = scripted is not None and scripted.reachable
        self.attempts.append((trio.current_time(), broker.label, reached))
        if scripted is None or not scripted.reachable:
            if scripted is not None:
                scripted.refused_attempts += 1
            raise OSError(errno.ECONNREFUSED, f"Connection refused ({broker.label})")
        ours, theirs = trio.testing.memory_stream_pair()
        scripted.connects += 1
        link = BrokerLink(scripted, len(scripted.links) + 1, theirs)
        link.socket = LinkSocket(ours)
        scripted.links.append(link)
        scripted.signal.changed()
        self.nursery.start_soon(link.run)
        return link.socket


def make_config(*brokers: ScriptedBroker, **overrides: Any) -> Config:
    """A Config for ``brokers`` with test-friendly values: no jitter (exact delays), fast
    retries, no upstream heart-beats unless asked; ``overrides`` are Config fields
    (durations in milliseconds)."""
    values: dict[str, Any] = {
        "brokers": tuple(b.config for b in brokers),
        "retry_interval": 100,
        "retry_interval_multiplier": 2.0,
        "max_retry_interval": 1000,
        "jitter": 0.0,
        "initial_connect_attempts": 1,
        "upstream_heartbeat": (0, 0),
        "call_timeout": 30_000,
    }
    values.update(overrides)
    return Config(**values)


# -- the app ------------------------------------------------------------------------------------


@dataclass
class Received:
    """A frame the app got, with the trio time it arrived."""

    at: float
    frame: Frame


class AppClient:
    """The app: a STOMP client on the Session's app stream (``run_reader`` must run)."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.conn = protocol.Connection(Role.CLIENT)
        self.log: list[Received] = []
        self.closed = False
        self.closed_at: float | None = None
        self.writes_done = 0  # frames whose send_all returned (the sidecar read them)
        self.signal = Signal()
        self._lock = trio.Lock()

    @property
    def frames(self) -> list[Frame]:
        return [r.frame for r in self.log]

    async def run_reader(self) -> None:
        """Read until EOF, recording every frame (heart-beats are ignored)."""
        try:
            while True:
                event = self.conn.next_event()
                if isinstance(event, protocol.NeedData):
                    data = await self.stream.receive_some(_RECEIVE)
                    self.conn.receive_data(bytes(data))
                    continue
                if isinstance(event, ConnectionClosed):
                    break
                if isinstance(event, Frame):
                    self.log.append(Received(trio.current_time(), event))
                    self.signal.changed()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        self.closed = True
        self.closed_at = trio.current_time()
        self.signal.changed()

    async def send(
        self,
        command: Command,
        headers: Mapping[str, str] | Iterable[tuple[str, str]] = (),
        body: bytes = b"",
    ) -> None:
        frame = Frame.build(command, headers, body)
        async with self._lock:
            await self.stream.send_all(self.conn.send(frame))
            self.writes_done += 1

    async def connect(self, **headers: str) -> Frame:
        """CONNECT (STOMP 1.2, no heart-beats) and return the answer (CONNECTED or ERROR)."""
        await self.send(
            Command.CONNECT,
            {"accept-version": "1.2", "host": "/", "heart-beat": "0,0", **headers},
        )
        await self.signal.wait_until(lambda: bool(self.log))
        return self.log[0].frame

    async def subscribe_events(self) -> None:
        """SUBSCRIBE to the control channel and wait for its RECEIPT."""
        await self.send(
            Command.SUBSCRIBE,
            {"destination": EVENTS, "id": "events", "ack": "auto", "receipt": "events-sub"},
        )
        await self.wait_receipt("events-sub")

    # what the app got

    def of(self, command: Command) -> list[Frame]:
        return [f for f in self.frames if f.command is command]

    def receipt_ids(self) -> list[str]:
        return [f.get("receipt-id") or "" for f in self.of(Command.RECEIPT)]

    def errors(self) -> list[Frame]:
        return self.of(Command.ERROR)

    def messages(self, destination: str) -> list[Frame]:
        return [f for f in self.of(Command.MESSAGE) if f.get("destination") == destination]

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        """Control-channel events (JSON bodies), optionally only those of ``kind``."""
        out: list[dict[str, Any]] = []
        for f in self.messages(EVENTS):
            body: dict[str, Any] = json.loads(f.body)
            assert body["event"] == f.get("event")
            if kind is None or body["event"] == kind:
                out.append(body)
        return out

    def arrival(self, predicate: Callable[[Frame], bool]) -> float:
        """When the first frame matching ``predicate`` arrived."""
        return next(r.at for r in self.log if predicate(r.frame))

    def index(self, predicate: Callable[[Frame], bool]) -> int:
        """Position of the first frame matching ``predicate`` among the frames received."""
        return next(i for i, f in enumerate(self.frames) if predicate(f))

    async def wait_receipt(self, receipt: str) -> None:
        await self.signal.wait_until(lambda: receipt in self.receipt_ids())

    async def wait_error(self, n: int = 1) -> Frame:
        """Wait for the ``n``-th ERROR; returns it."""
        await self.signal.wait_until(lambda: len(self.errors()) >= n)
        return self.errors()[n - 1]

    async def wait_event(self, kind: str, n: int = 1) -> dict[str, Any]:
        """Wait for the ``n``-th event of ``kind``; returns it."""
        await self.signal.wait_until(lambda: len(self.events(kind)) >= n)
        return self.events(kind)[n - 1]

    async def wait_closed(self) -> None:
        await self.signal.wait_until(lambda: self.closed)


@dataclass
class Running:
    """A Session serving an AppClient; ``done`` is set when ``Session.run`` returned."""

    session: Session
    app: AppClient
    done: trio.Event = field(default_factory=trio.Event)


async def start_session(
    nursery: trio.Nursery,
    network: Network,
    config: Config,
    *,
    lockstep: bool = False,
    session_id: str = "s1",
    reconnects: ReconnectBoard | None = None,
    outbox: OutboxService | None = None,
    tracing: Tracing | None = None,
    memory: MemoryBudgetGate | None = None,
) -> Running:
    """Start a Session on an in-memory app stream (``lockstep``: the app's writes return
    only once the Session has read them, like TCP with no buffer) and the app's reader;
    ``reconnects``: the board it shares with other sessions (a private one when None);
    ``outbox``: the sidecar's outbox (``outbox`` on in ``config``); ``tracing``: the sidecar's
    tracing (tests/proxy/test_tracing.py); ``memory``: the sidecar's memory budget. The app
    has not sent CONNECT yet."""
    app_end: trio.abc.Stream
    session_end: trio.abc.Stream
    if lockstep:
        app_end, session_end = trio.testing.lockstep_stream_pair()
    else:
        app_end, session_end = trio.testing.memory_stream_pair()
    session = Session(
        config,
        session_end,
        session_id,
        rng=random.Random(7),
        open_stream=network.open_stream,
        reconnects=reconnects,
        outbox=outbox,
        tracing=tracing,
        memory=memory,
    )
    running = Running(session, AppClient(app_end))

    async def run() -> None:
        try:
            await session.run()
        finally:
            running.done.set()

    nursery.start_soon(run)
    nursery.start_soon(running.app.run_reader)
    return running
