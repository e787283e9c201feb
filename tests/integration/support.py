"""Test support for integration tests: a sidecar in a thread, stomp.py and raw clients.

stomp.py (the reference client) is synchronous and threaded, so the sidecar under test runs its
own ``trio.run`` in a background thread and the tests drive stomp.py from the main thread. The
raw client speaks bytes for the bad-input tests that stomp.py cannot express.
"""

from __future__ import annotations

import functools
import os
import queue
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import stomp
import trio
from prometheus_client import generate_latest

import protocol
from config import Config, load_config
from proxy.app import Sidecar, serve
from proxy.telemetry.statistics import SidecarStatistics
from testbed import BrokerProcess

if TYPE_CHECKING:
    from proxy.telemetry.tracing import Tracing

#: Generous per-wait bound for anything a broker does on loopback.
WAIT = 10.0


def wait_until(predicate: Callable[[], bool], timeout: float = WAIT) -> None:
    """Poll ``predicate`` every 20 ms until true; AssertionError after ``timeout`` seconds.

    For state that a sidecar thread changes after the test's last frame (a session closing).
    """
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(0.02)


def unique(prefix: str = "/queue/t") -> str:
    """A destination no other test uses."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def sidecar_process(port: int, env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    """A ``mq-sidecar run`` process listening on ``127.0.0.1:port``, configured by ``env``
    (``MQ_SIDECAR_*`` variables, over this process's environment), its output discarded: for
    the tests that kill it (``.kill()`` is kill -9). The caller waits for its port."""
    return subprocess.Popen(
        [sys.executable, "-m", "proxy", "run", "--listen", f"127.0.0.1:{port}"],
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def sidecar_config(brokers: str, **overrides: object) -> Config:
    """A config for a test sidecar on an ephemeral loopback port."""
    values: dict[str, object | None] = {
        "listen": "127.0.0.1:0",
        "admin_listen": "127.0.0.1:0",
        "brokers": brokers,
    }
    values.update(overrides)
    return load_config(path=None, env={}, overrides=values)


class SidecarThread:
    """Run ``proxy.app.serve`` in a background thread with its own trio loop.

    Use as a context manager; ``address`` is the bound STOMP address. ``tracing``: the
    sessions' tracing (a test's in-memory exporter; tests/integration/test_tracing.py).
    """

    def __init__(self, config: Config, *, tracing: Tracing | None = None) -> None:
        self.config = config
        self.tracing = tracing
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._sidecar: Sidecar | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._thread = threading.Thread(target=self._main, name="sidecar", daemon=True)
        self.address: tuple[str, int] = ("127.0.0.1", 0)

    def _main(self) -> None:
        try:
            trio.run(self._amain)
        except BaseException as exc:  # reported to the test thread, never lost
            self._error = exc
            self._ready.set()

    async def _amain(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        async with trio.open_nursery() as nursery:
            sidecar: Sidecar = await nursery.start(
                functools.partial(serve, self.config, tracing=self.tracing)
            )
            self._sidecar = sidecar
            assert sidecar.listen_address is not None
            self.address = sidecar.listen_address
            self._ready.set()

    def __enter__(self) -> SidecarThread:
        self._thread.start()
        if not self._ready.wait(WAIT) or self._error is not None:
            raise RuntimeError(f"sidecar did not start: {self._error!r}")
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Graceful shutdown (what SIGTERM does); waits for the thread."""
        if self._sidecar is not None and self._thread.is_alive():
            trio.from_thread.run_sync(self._sidecar.request_shutdown, trio_token=self._token)
        self._thread.join(self.config.drain_timeout / 1000 + WAIT)
        assert not self._thread.is_alive(), "sidecar thread did not stop"
        if self._error is not None:
            raise self._error

    def statistics(self) -> SidecarStatistics:
        """The running sidecar's statistics, read inside its trio loop."""
        assert self._sidecar is not None
        return trio.from_thread.run_sync(self._sidecar.statistics, trio_token=self._token)

    def status(self) -> dict[str, Any]:
        """The ``/status`` document, built inside the sidecar's trio loop."""
        assert self._sidecar is not None
        admin = self._sidecar.admin
        assert admin is not None
        return trio.from_thread.run_sync(admin.status, trio_token=self._token)

    def metrics(self) -> str:
        """The ``/metrics`` text exposition of the sidecar's registry (inside its loop)."""
        sidecar = self._sidecar
        assert sidecar is not None
        text = trio.from_thread.run_sync(generate_latest, sidecar.registry, trio_token=self._token)
        return text.decode()


@dataclass
class Received:
    """A frame a stomp.py client received: command, headers (a dict, as stomp.py gives)."""

    command: str
    headers: dict[str, str]
    body: Any


class _Collector(stomp.ConnectionListener):  # type: ignore[misc]
    """Queues MESSAGEs on one queue and everything else (RECEIPT, ERROR, DISCONNECTED) on
    another: a broker may dispatch a MESSAGE before the RECEIPT of the SEND that caused it."""

    def __init__(self, messages: queue.Queue[Received], control: queue.Queue[Received]) -> None:
        self.messages = messages
        self.control = control

    def _put(self, command: str, frame: Any) -> None:
        q = self.messages if command == "MESSAGE" else self.control
        q.put(Received(command, dict(frame.headers), frame.body))

    def on_message(self, frame: Any) -> None:
        self._put("MESSAGE", frame)

    def on_receipt(self, frame: Any) -> None:
        self._put("RECEIPT", frame)

    def on_error(self, frame: Any) -> None:
        self._put("ERROR", frame)

    def on_disconnected(self) -> None:
        self.control.put(Received("DISCONNECTED", {}, b""))


class Client:
    """A stomp.py connection whose received frames are queued for the test to take.

    Args:
        address: (host, port) to connect to (the sidecar, or a broker directly).
        version: "1.0", "1.1" or "1.2" (stomp.py Connection10/11/12).
        vhost: CONNECT host header (RabbitMQ needs "/" when connecting directly).
        binary: keep bodies as bytes (stomp.py auto_decode=False).
    """

    def __init__(
        self,
        address: tuple[str, int],
        *,
        version: str = "1.2",
        vhost: str | None = "/",
        binary: bool = False,
        heartbeats: tuple[int, int] = (0, 0),
    ) -> None:
        kwargs: dict[str, Any] = {"auto_decode": not binary}
        if version != "1.0":
            kwargs.update(heartbeats=heartbeats, vhost=vhost)
        cls = {"1.0": stomp.Connection10, "1.1": stomp.Connection11, "1.2": stomp.Connection12}
        self.version = version
        self.conn = cls[version]([address], **kwargs)
        self.message_queue: queue.Queue[Received] = queue.Queue()
        self.control_queue: queue.Queue[Received] = queue.Queue()
        self.conn.set_listener("collector", _Collector(self.message_queue, self.control_queue))

    def connect(
        self, login: str | None = None, passcode: str | None = None, **headers: str
    ) -> None:
        """CONNECT and wait for CONNECTED."""
        self.conn.connect(login, passcode, wait=True, headers=headers)

    def expect(self, command: str, timeout: float = WAIT) -> Received:
        """The next MESSAGE (``command`` "MESSAGE"), or the next other frame, which must be
        ``command`` (RECEIPT, ERROR, DISCONNECTED)."""
        q = self.message_queue if command == "MESSAGE" else self.control_queue
        try:
            frame = q.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no {command} within {timeout} s") from None
        assert frame.command == command, f"expected {command}, got {frame}"
        return frame

    def messages(self, n: int, timeout: float = WAIT) -> list[Received]:
        """The next ``n`` frames, all MESSAGEs."""
        return [self.expect("MESSAGE", timeout) for _ in range(n)]

    def expect_silence(self, seconds: float = 0.5) -> None:
        """No MESSAGE arrives for ``seconds``, and no ERROR or RECEIPT is waiting."""
        try:
            frame = self.message_queue.get(timeout=seconds)
        except queue.Empty:
            pass
        else:
            raise AssertionError(f"expected nothing, got {frame}")
        assert self.control_queue.empty(), f"unexpected {self.control_queue.get()}"

    def receipt(self, receipt_id: str, timeout: float = WAIT) -> Received:
        """Wait for the RECEIPT answering ``receipt_id``."""
        frame = self.expect("RECEIPT", timeout)
        assert frame.headers.get("receipt-id") == receipt_id, frame
        return frame

    def close(self) -> None:
        """DISCONNECT if still connected."""
        if self.conn.is_connected():
            self.conn.disconnect()


@contextmanager
def client(address: tuple[str, int], **kwargs: Any) -> Iterator[Client]:
    """A connected :class:`Client`, disconnected at the end."""
    c = Client(address, **kwargs)
    c.connect()
    try:
        yield c
    finally:
        c.close()


class RawClient:
    """A plain socket speaking STOMP bytes; frames received are parsed with ``protocol``.

    For the bad-input tests: sends whatever bytes the test gives, even garbage.
    """

    #: Every RawClient opened and not yet closed; the integration conftest closes them after
    #: each test so a failing assertion never leaks a socket.
    open_clients: ClassVar[set[RawClient]] = set()

    def __init__(self, address: tuple[str, int], *, version: str = "1.2") -> None:
        self.sock = socket.create_connection(address, timeout=WAIT)
        RawClient.open_clients.add(self)
        self.parser = protocol.FrameParser(
            protocol.Limits(max_frame_bytes=64 << 20), version=version
        )

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_frame(
        self, command: str, headers: Mapping[str, str] | None = None, body: bytes = b""
    ) -> None:
        frame = protocol.Frame.build(protocol.Command(command), dict(headers or {}), body)
        self.sock.sendall(protocol.serialize(frame, self.parser.version))

    def connect(self, **headers: str) -> protocol.Frame:
        self.send_frame("CONNECT", {"accept-version": "1.2", "host": "/", **headers})
        connected = self.frame()
        assert connected.command is protocol.Command.CONNECTED, connected
        self.parser.version = connected.get("version") or "1.0"
        return connected

    def frame(self, *, heartbeats: bool = False) -> protocol.Frame:
        """Next frame (heart-beats skipped); AssertionError on EOF."""
        while True:
            event = self.parser.next_event()
            if isinstance(event, protocol.Frame):
                return event
            if isinstance(event, protocol.ConnectionClosed):
                raise AssertionError("connection closed")
            if isinstance(event, protocol.HeartBeat):
                if heartbeats:
                    raise AssertionError("heart-beat")
                continue
            data = self.sock.recv(65536)
            self.parser.receive_data(data)

    def heartbeat_or_frame(self) -> protocol.Event:
        """Next event: a HeartBeat or a Frame."""
        while True:
            event = self.parser.next_event()
            if not isinstance(event, protocol.NeedData):
                return event
            self.parser.receive_data(self.sock.recv(65536))

    def closed(self) -> bool:
        """True when the sidecar has closed the connection (EOF within WAIT seconds)."""
        try:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    return True
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False

    def close(self) -> None:
        self.sock.close()
        RawClient.open_clients.discard(self)


@dataclass
class Relay:
    """A running sidecar in front of a real broker, as the tests see it."""

    flavor: str  # "activemq" | "rabbitmq"
    broker: BrokerProcess
    sidecar: SidecarThread

    @property
    def address(self) -> tuple[str, int]:
        return self.sidecar.address

    @property
    def broker_address(self) -> tuple[str, int]:
        return (self.broker.host, self.broker.stomp_port)
