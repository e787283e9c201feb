"""The load generator: a raw-socket STOMP 1.2 client written for benchmarking, and its workers.

Why not stomp.py: it parses every frame in Python on a receiver thread and hands it to a
listener, and uses a whole core at fewer 1 KiB messages/s than a broker delivers directly
(docs/testing.md, "Benchmarks"), so a direct-vs-sidecar ratio measured with it would compare
two runs of stomp.py. :func:`measure_capacity` reports both clients' limits against a null broker
(``bench/results/latest-meta.json``, key ``loadgen``).

How :class:`RawStomp` stays cheap:

* outgoing frames are serialized once with :func:`protocol.serialize` (the project's own
  codec, so they are valid STOMP) and written in batches with one ``sendall``;
* incoming bytes are split at NUL octets (``bytes.split``, in C) instead of parsed header by
  header. This is exact for what the benchmarks receive: frames without ``content-length``
  bodies containing NUL (the bodies are ``b"x" * 1024``, ERROR bodies are text), with
  heart-beat EOLs between frames stripped. Only the headers a workload needs (``ack``,
  ``receipt-id``) are looked up, as raw (still escaped) bytes, which is exactly what an ACK
  must send back.

Workers for several sessions at once (:func:`scale_worker`) run in their own processes
(``multiprocessing`` spawn) over non-blocking sockets and a selector, so 1,000 sessions need
neither 1,000 threads nor the harness's own core.
"""

from __future__ import annotations

import contextlib
import gc
import json
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection as Pipe
from typing import Any

import protocol
from protocol import Command, Frame

__all__ = [
    "BODY",
    "LoadgenError",
    "LoadgenTimeout",
    "Measurement",
    "RawStomp",
    "app_loop_until",
    "consume",
    "drain",
    "fill",
    "header",
    "measure_capacity",
    "round_trips",
    "scale_worker",
    "send_fire_and_forget",
    "send_pipelined",
    "send_sync",
]

#: Message body of every benchmark message: 1 KiB, no NUL byte.
BODY = b"x" * 1024
#: Frames written per ``sendall`` in fire-and-forget workloads.
BATCH = 100
#: Default bound, in seconds, for any single wait of the load generator.
WAIT = 60.0


class LoadgenError(RuntimeError):
    """The broker or the sidecar answered with an ERROR, closed the connection, or timed out."""


class LoadgenTimeout(LoadgenError):
    """Nothing arrived on a connection within its timeout."""


def header(frame: bytes, name: bytes) -> bytes | None:
    """The raw (still escaped) value of header ``name`` in a frame split by :class:`RawStomp`.

    First occurrence wins (STOMP 1.2 "Repeated Header Entries"). ``None`` when absent.
    """
    end = frame.find(b"\n\n")
    head = frame if end < 0 else frame[:end]
    key = b"\n" + name + b":"
    i = head.find(key)
    if i < 0:
        return None
    i += len(key)
    j = head.find(b"\n", i)
    value = head[i:] if j < 0 else head[i:j]
    return value[:-1] if value.endswith(b"\r") else value


def command_of(frame: bytes) -> bytes:
    """The command line of a split frame (``b"MESSAGE"``...)."""
    end = frame.find(b"\n")
    line = frame if end < 0 else frame[:end]
    return line[:-1] if line.endswith(b"\r") else line


def send_frame(destination: str, *, persistent: bool, receipt: str | None = None) -> bytes:
    """One serialized 1 KiB SEND. Non-persistent means no ``persistent`` header at all
    (RabbitMQ makes a queue exclusive on ``persistent:false``: docs/brokers.md, "Other
    traps")."""
    headers = [("destination", destination)]
    if persistent:
        headers.append(("persistent", "true"))
    if receipt is not None:
        headers.append(("receipt", receipt))
    return protocol.serialize(Frame.build(Command.SEND, headers, BODY), "1.2")


def connect_frame(vhost: str) -> bytes:
    """A STOMP 1.2 CONNECT without heart-beats (``host`` is RabbitMQ's vhost)."""
    frame = Frame.build(
        Command.CONNECT, {"accept-version": "1.2", "host": vhost, "heart-beat": "0,0"}
    )
    return protocol.serialize(frame, "1.2")


def subscribe_frame(destination: str, sub_id: str, ack: str, receipt: str | None = None) -> bytes:
    """A serialized SUBSCRIBE (``ack``: auto, client, client-individual)."""
    headers = [("destination", destination), ("id", sub_id), ("ack", ack)]
    if receipt is not None:
        headers.append(("receipt", receipt))
    return protocol.serialize(Frame.build(Command.SUBSCRIBE, headers), "1.2")


@dataclass
class Measurement:
    """One timed run of one workload on one connection.

    ``seconds``: wall time (``time.perf_counter``); ``count``: messages or round trips;
    ``client_cpu``: CPU seconds of the load generator's thread over the same interval;
    ``latencies``: per-round-trip seconds (latency workloads only).
    """

    seconds: float
    count: int
    client_cpu: float
    latencies: list[float] = field(default_factory=list)

    @property
    def rate(self) -> float:
        """``count / seconds``."""
        return self.count / self.seconds if self.seconds > 0 else 0.0

    @property
    def client_cpu_pct(self) -> float:
        """The load generator's CPU as a percentage of one core over the run."""
        return 100.0 * self.client_cpu / self.seconds if self.seconds > 0 else 0.0


class RawStomp:
    """A blocking STOMP 1.2 client over one TCP socket; CONNECTs in the constructor.

    Args:
        port: STOMP port on 127.0.0.1 (a broker's or a sidecar's).
        vhost: CONNECT ``host`` header ("/" for RabbitMQ; ActiveMQ ignores it).
        timeout: seconds any single read may block before :class:`LoadgenError`.

    Raises:
        LoadgenError: no CONNECTED (an ERROR, the connection closed, a timeout).
        OSError: the TCP connection failed.
    """

    def __init__(self, port: int, vhost: str, *, timeout: float = WAIT) -> None:
        self.port = port
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.settimeout(timeout)
        self._tail = b""
        self._pending: deque[bytes] = deque()
        self.send(connect_frame(vhost))
        first = self.next_frame()
        if command_of(first) != b"CONNECTED":
            self.sock.close()
            raise LoadgenError(f"port {port}: no CONNECTED: {first[:300]!r}")
        self.connected = first

    def send(self, data: bytes) -> None:
        """Write bytes (one or more serialized frames)."""
        self.sock.sendall(data)

    def read_frames(self) -> list[bytes]:
        """Block for the next chunk of bytes; return the complete frames in it (maybe none).

        Raises:
            LoadgenError: the peer closed the connection or nothing arrived in time.
        """
        try:
            data = self.sock.recv(1 << 20)
        except TimeoutError as exc:
            raise LoadgenTimeout(f"port {self.port}: no data within the timeout") from exc
        except OSError as exc:
            raise LoadgenError(f"port {self.port}: connection failed: {exc}") from exc
        if not data:
            raise LoadgenError(f"port {self.port}: connection closed by the peer")
        parts = (self._tail + data).split(b"\x00") if self._tail else data.split(b"\x00")
        self._tail = parts.pop()
        return [p.lstrip(b"\r\n") for p in parts]

    def next_frame(self) -> bytes:
        """The next complete frame, reading as needed."""
        while not self._pending:
            self._pending.extend(self.read_frames())
        return self._pending.popleft()

    def take_pending(self) -> list[bytes]:
        """Frames already read but not yet returned by :meth:`next_frame`."""
        out = list(self._pending)
        self._pending.clear()
        return out

    def wait_receipt(self, receipt_id: bytes, *, on_frame: Any = None) -> None:
        """Read until the RECEIPT ``receipt_id``; an ERROR raises :class:`LoadgenError`.

        ``on_frame``: called with every other frame read meanwhile (events, messages).
        """
        while True:
            frame = self.next_frame()
            cmd = command_of(frame)
            if cmd == b"RECEIPT" and header(frame, b"receipt-id") == receipt_id:
                return
            if cmd == b"ERROR":
                raise LoadgenError(f"port {self.port}: ERROR: {frame[:500]!r}")
            if on_frame is not None:
                on_frame(frame)

    def disconnect(self) -> None:
        """DISCONNECT with a receipt (the broker has then handled every earlier frame), close."""
        with contextlib.suppress(OSError, LoadgenError):
            self.send(
                protocol.serialize(Frame.build(Command.DISCONNECT, {"receipt": "bye"}), "1.2")
            )
            self.wait_receipt(b"bye")
        self.close()

    def close(self) -> None:
        """Close the socket."""
        with contextlib.suppress(OSError):
            self.sock.close()


@contextlib.contextmanager
def _timed(count: int) -> Iterator[Measurement]:
    """Measure wall and thread CPU time of the block into the yielded Measurement; the GC is
    off meanwhile (the same for direct and sidecar runs; avoids pauses inside a run)."""
    m = Measurement(0.0, count, 0.0)
    gc_was = gc.isenabled()
    gc.disable()
    cpu0 = time.thread_time()
    t0 = time.perf_counter()
    try:
        yield m
    finally:
        m.seconds = time.perf_counter() - t0
        m.client_cpu = time.thread_time() - cpu0
        if gc_was:
            gc.enable()


def _error_in(frames: list[bytes], port: int) -> None:
    for f in frames:
        if f.startswith(b"ERROR"):
            raise LoadgenError(f"port {port}: ERROR: {f[:500]!r}")


# --- producer workloads ----------------------------------------------------------------


def send_fire_and_forget(c: RawStomp, dest: str, n: int, *, persistent: bool) -> Measurement:
    """``n`` SENDs without receipts, the last one with a receipt; the clock stops at that
    RECEIPT (a broker handles a connection's frames in order, so every SEND is then done)."""
    one = send_frame(dest, persistent=persistent)
    batch = one * BATCH
    last = send_frame(dest, persistent=persistent, receipt="end")
    full, rest = divmod(n - 1, BATCH)
    with _timed(n) as m:
        for _ in range(full):
            c.send(batch)
        c.send(one * rest + last)
        c.wait_receipt(b"end")
    return m


def send_sync(c: RawStomp, dest: str, n: int, *, persistent: bool) -> Measurement:
    """``n`` SENDs, each with a receipt awaited before the next SEND is written."""
    frames = [send_frame(dest, persistent=persistent, receipt=f"s{i}") for i in range(n)]
    ids = [f"s{i}".encode() for i in range(n)]
    with _timed(n) as m:
        for frame, rid in zip(frames, ids, strict=True):
            c.send(frame)
            c.wait_receipt(rid)
    return m


def send_pipelined(
    c: RawStomp, dest: str, n: int, *, persistent: bool, window: int = 100
) -> Measurement:
    """``n`` SENDs, each with a receipt, at most ``window`` unanswered at any time; the clock
    stops at the last RECEIPT. Receipts may come back in any order (RabbitMQ's do)."""
    frames = [send_frame(dest, persistent=persistent, receipt=f"p{i}") for i in range(n)]
    with _timed(n) as m:
        sent = min(window, n)
        c.send(b"".join(frames[:sent]))
        got = 0
        while got < n:
            frames_in = c.read_frames()
            k = 0
            for f in frames_in:
                if f.startswith(b"RECEIPT"):
                    k += 1
                elif f.startswith(b"ERROR"):
                    raise LoadgenError(f"port {c.port}: ERROR: {f[:500]!r}")
            got += k
            if k and sent < n:
                more = min(k, n - sent)
                c.send(b"".join(frames[sent : sent + more]))
                sent += more
    return m


# --- consumer workloads ----------------------------------------------------------------


def consume(c: RawStomp, dest: str, n: int, *, ack: str) -> Measurement:
    """Receive ``n`` messages of a pre-filled queue with ``ack`` auto or client-individual.

    The clock starts when SUBSCRIBE is written. With ``client-individual`` every MESSAGE is
    ACKed (the ACKs of one read go out in one write) and the last ACK carries a receipt: the
    clock stops at that RECEIPT, when the broker has handled every ACK. With ``auto`` it stops
    at the ``n``-th MESSAGE.
    """
    individual = ack == "client-individual"
    with _timed(n) as m:
        c.send(subscribe_frame(dest, "bench", ack))
        got = 0
        while got < n:
            frames_in = c.read_frames()
            acks: list[bytes] = []
            for f in frames_in:
                if f.startswith(b"MESSAGE"):
                    got += 1
                    if individual:
                        ack_id = header(f, b"ack")
                        if ack_id is None:
                            raise LoadgenError(f"MESSAGE without ack header: {f[:300]!r}")
                        last = got == n
                        acks.append(
                            b"ACK\nid:"
                            + ack_id
                            + (b"\nreceipt:acked" if last else b"")
                            + b"\n\n\x00"
                        )
                elif f.startswith(b"ERROR"):
                    raise LoadgenError(f"port {c.port}: ERROR: {f[:500]!r}")
            if acks:
                c.send(b"".join(acks))
        if individual:
            c.wait_receipt(b"acked")
    return m


# --- helpers for the harness -----------------------------------------------------------


def fill(port: int, vhost: str, dest: str, n: int, *, persistent: bool) -> None:
    """Put ``n`` messages on ``dest`` (fire-and-forget, then a receipt); untimed."""
    c = RawStomp(port, vhost)
    try:
        send_fire_and_forget(c, dest, n, persistent=persistent)
    finally:
        c.disconnect()


def drain(port: int, vhost: str, dest: str, n: int, *, idle: float = 5.0) -> int:
    """Consume (ack auto) up to ``n`` messages of ``dest``; stop early after ``idle`` seconds
    without a message. Returns the number received. Keeps queues from piling up between
    runs (ActiveMQ's producer flow control would stall the next run: docs/brokers.md, "Other
    traps")."""
    c = RawStomp(port, vhost, timeout=idle)
    got = 0
    try:
        c.send(subscribe_frame(dest, "drain", "auto"))
        while got < n:
            try:
                frames = c.read_frames()
            except LoadgenTimeout:
                break
            got += sum(1 for f in frames if f.startswith(b"MESSAGE"))
    finally:
        c.disconnect()
    return got


def round_trips(c: RawStomp, frames: list[bytes], ids: list[bytes]) -> list[float]:
    """One round trip per serialized frame (each asks receipt ``ids[i]``), in order: write
    it, wait for its RECEIPT. Returns each round trip's seconds."""
    out: list[float] = []
    gc_was = gc.isenabled()
    gc.disable()
    try:
        for frame, rid in zip(frames, ids, strict=True):
            t0 = time.perf_counter()
            c.send(frame)
            c.wait_receipt(rid)
            out.append(time.perf_counter() - t0)
    finally:
        if gc_was:
            gc.enable()
    return out


@dataclass
class AppLog:
    """What an app session saw during a fault: receipt arrival times (``perf_counter``) and
    control-channel events (JSON bodies, with their arrival time under ``_arrived``)."""

    receipts: list[float] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def events_of(self, kind: str) -> list[dict[str, Any]]:
        """The events of ``kind`` (RECONNECTING, FAILOVER, DISCONNECT) so far."""
        with self.lock:
            return [e for e in self.events if e.get("event") == kind]

    def wait_event(self, kind: str, count: int, timeout: float) -> dict[str, Any]:
        """Wait for the ``count``-th event of ``kind`` and return it.

        Raises:
            LoadgenError: the session failed (``error`` set) or ``timeout`` seconds passed.
        """
        deadline = time.monotonic() + timeout
        while True:
            events = self.events_of(kind)
            if len(events) >= count:
                return events[count - 1]
            if self.error is not None:
                raise LoadgenError(f"app session failed: {self.error}")
            if time.monotonic() > deadline:
                raise LoadgenError(f"no {kind} event #{count} within {timeout} s")
            time.sleep(0.002)


def app_loop_until(
    c: RawStomp, dest: str, stop: threading.Event, log: AppLog, *, persistent: bool = True
) -> None:
    """An app session: SEND with a receipt, wait for it, repeat until ``stop`` is set.

    Records every receipt's arrival and every control-channel event in ``log`` (subscribe the
    connection to the events destination first). Meant to run in a thread; an ERROR or a
    closed connection ends it with ``log.error`` set.
    """

    def on_frame(frame: bytes) -> None:
        if frame.startswith(b"MESSAGE") and header(frame, b"event") is not None:
            body = frame.partition(b"\n\n")[2]
            event = json.loads(body)
            event["_arrived"] = time.perf_counter()
            with log.lock:
                log.events.append(event)

    i = 0
    try:
        while not stop.is_set():
            i += 1
            rid = f"a{i}"
            c.send(send_frame(dest, persistent=persistent, receipt=rid))
            c.wait_receipt(rid.encode(), on_frame=on_frame)
            with log.lock:
                log.receipts.append(time.perf_counter())
        # Events that arrived with the last receipt.
        for frame in c.take_pending():
            on_frame(frame)
    except (LoadgenError, OSError) as exc:
        log.error = f"{type(exc).__name__}: {exc}"


def watch_events(c: RawStomp, stop: threading.Event, log: AppLog) -> None:
    """Read control-channel events from ``c`` into ``log`` until ``stop`` (a thread body)."""
    c.sock.settimeout(0.2)
    while not stop.is_set():
        try:
            frames = c.read_frames()
        except LoadgenTimeout:
            continue
        except LoadgenError as exc:
            log.error = str(exc)
            return
        for frame in frames:
            if frame.startswith(b"MESSAGE") and header(frame, b"event") is not None:
                event = json.loads(frame.partition(b"\n\n")[2])
                event["_arrived"] = time.perf_counter()
                with log.lock:
                    log.events.append(event)


# --- many sessions in one process: the scale worker ------------------------------------


class _Session:
    """One session of a scale worker: socket, buffers, handshake state, counters."""

    __slots__ = ("dest", "expected", "index", "out", "received", "sock", "state", "tail")

    def __init__(self, index: int, dest: str) -> None:
        self.index = index
        self.dest = dest
        self.sock: socket.socket | None = None
        self.state = "new"  # new -> connecting -> connected -> subscribed -> done
        self.out = bytearray()
        self.tail = b""
        self.received = 0
        self.expected = 0


class _Engine:
    """Drives many non-blocking STOMP sessions with one selector."""

    def __init__(self, port: int, vhost: str, sessions: list[_Session]) -> None:
        self.port = port
        self.vhost = vhost
        self.sessions = sessions
        self.sel = selectors.DefaultSelector()

    def _want(self, s: _Session) -> None:
        assert s.sock is not None
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if s.out else 0)
        if s.state == "connecting":
            events = selectors.EVENT_WRITE
        self.sel.modify(s.sock, events, s)

    def _open(self, s: _Session) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.connect_ex(("127.0.0.1", self.port))
        s.sock = sock
        s.state = "connecting"
        self.sel.register(sock, selectors.EVENT_WRITE, s)

    def _flush(self, s: _Session) -> None:
        assert s.sock is not None
        while s.out:
            try:
                sent = s.sock.send(s.out)
            except BlockingIOError:
                break
            del s.out[:sent]
        self._want(s)

    def _frames(self, s: _Session) -> list[bytes]:
        assert s.sock is not None
        try:
            data = s.sock.recv(1 << 18)
        except BlockingIOError:
            return []
        if not data:
            raise LoadgenError(f"session {s.index}: connection closed by the peer")
        parts = (s.tail + data).split(b"\x00") if s.tail else data.split(b"\x00")
        s.tail = parts.pop()
        return [p.lstrip(b"\r\n") for p in parts]

    def open_all(self, *, concurrency: int, timeout: float) -> None:
        """CONNECT every session and SUBSCRIBE it (ack auto, with a receipt) to its own
        destination, at most ``concurrency`` handshakes in flight."""
        todo = deque(self.sessions)
        in_flight = 0
        ready = 0
        deadline = time.monotonic() + timeout
        while ready < len(self.sessions):
            while todo and in_flight < concurrency:
                self._open(todo.popleft())
                in_flight += 1
            if time.monotonic() > deadline:
                raise LoadgenError(
                    f"only {ready} of {len(self.sessions)} sessions subscribed within {timeout} s"
                )
            for key, mask in self.sel.select(timeout=1.0):
                s: _Session = key.data
                assert s.sock is not None
                if s.state == "connecting":
                    err = s.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    if err:
                        raise LoadgenError(f"session {s.index}: connect failed: errno {err}")
                    s.state = "connected?"
                    s.out += connect_frame(self.vhost)
                    self._flush(s)
                    continue
                if mask & selectors.EVENT_WRITE:
                    self._flush(s)
                if mask & selectors.EVENT_READ:
                    for f in self._frames(s):
                        cmd = command_of(f)
                        if cmd == b"CONNECTED":
                            s.out += subscribe_frame(s.dest, "s", "auto", receipt="sub")
                            s.state = "connected"
                            self._flush(s)
                        elif cmd == b"RECEIPT" and s.state == "connected":
                            s.state = "subscribed"
                            ready += 1
                            in_flight -= 1
                        elif cmd == b"ERROR":
                            raise LoadgenError(f"session {s.index}: ERROR: {f[:300]!r}")

    def transfer(self, per_session: int, *, persistent: bool, timeout: float) -> int:
        """Every session sends ``per_session`` SENDs to its own destination and receives
        them on its subscription; returns when all arrived. Returns messages received."""
        for s in self.sessions:
            s.expected = per_session
            s.received = 0
            s.out += send_frame(s.dest, persistent=persistent) * per_session
            self._flush(s)
        remaining = sum(1 for s in self.sessions if s.expected)
        total = 0
        deadline = time.monotonic() + timeout
        while remaining:
            if time.monotonic() > deadline:
                missing = sum(s.expected - s.received for s in self.sessions)
                raise LoadgenError(f"{missing} messages missing after {timeout} s")
            for key, mask in self.sel.select(timeout=1.0):
                s = key.data
                if mask & selectors.EVENT_WRITE:
                    self._flush(s)
                if mask & selectors.EVENT_READ:
                    frames = self._frames(s)
                    _error_in(frames, self.port)
                    k = sum(1 for f in frames if f.startswith(b"MESSAGE"))
                    if k:
                        s.received += k
                        total += k
                        if s.received >= s.expected and s.state != "done":
                            s.state = "done"
                            remaining -= 1
        for s in self.sessions:
            s.state = "subscribed"
        return total

    def close_all(self) -> None:
        """Close every socket (no DISCONNECT: the peer sees EOF, as from a crashed app)."""
        for s in self.sessions:
            if s.sock is not None:
                with contextlib.suppress(KeyError, ValueError):
                    self.sel.unregister(s.sock)
                s.sock.close()
        self.sel.close()


def scale_worker(
    pipe: Pipe,
    *,
    port: int,
    vhost: str,
    first: int,
    count: int,
    dest_prefix: str,
    persistent: bool,
    concurrency: int,
) -> None:
    """Process body of one scale load generator: sessions ``first .. first+count-1``.

    Protocol on ``pipe`` (the parent's commands, the worker's answers; every answer is a
    dict with ``cpu`` = this process's CPU seconds for the phase):

    * the worker opens and subscribes its sessions, then sends ``{"ready": seconds}``;
    * ``("transfer", per_session, timeout)`` -> ``{"done": seconds, "received": n}``;
    * ``("close",)`` -> ``{"closed": True}``, then the worker exits.

    Any failure is reported as ``{"error": "..."}`` and ends the worker. Destinations are
    ``f"{dest_prefix}-{index}"``.
    """
    sessions = [_Session(i, f"{dest_prefix}-{i}") for i in range(first, first + count)]
    engine = _Engine(port, vhost, sessions)
    try:
        cpu0 = time.process_time()
        t0 = time.perf_counter()
        engine.open_all(concurrency=concurrency, timeout=300.0)
        pipe.send({"ready": time.perf_counter() - t0, "cpu": time.process_time() - cpu0})
        while True:
            cmd = pipe.recv()
            if cmd[0] == "transfer":
                cpu0 = time.process_time()
                t0 = time.perf_counter()
                received = engine.transfer(cmd[1], persistent=persistent, timeout=cmd[2])
                pipe.send(
                    {
                        "done": time.perf_counter() - t0,
                        "received": received,
                        "cpu": time.process_time() - cpu0,
                    }
                )
            elif cmd[0] == "close":
                engine.close_all()
                pipe.send({"closed": True, "cpu": 0.0})
                return
    except (EOFError, BrokenPipeError):
        engine.close_all()  # the parent went away
    except Exception as exc:
        engine.close_all()
        with contextlib.suppress(OSError):
            pipe.send({"error": f"{type(exc).__name__}: {exc}"})


# --- load generator capacity against a null broker -------------------------------------


def _null_broker(pipe: Pipe, mode: str, n: int) -> None:
    """Process body: a STOMP "broker" that does nothing but answer, to measure a client alone.

    ``mode`` "sink": read ``n`` SENDs after CONNECT, answer the last one's receipt.
    ``mode`` "source": after SUBSCRIBE, write ``n`` MESSAGE frames (ActiveMQ-like headers) as
    fast as the client reads them, while discarding whatever the client writes (ACKs).
    Sends its port on ``pipe``, serves one connection, exits.
    """
    listener = socket.create_server(("127.0.0.1", 0))
    pipe.send(listener.getsockname()[1])
    conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = b""
    while b"\x00" not in buf:
        buf += conn.recv(65536)
    buf = buf.partition(b"\x00")[2]
    conn.sendall(b"CONNECTED\nversion:1.2\nheart-beat:0,0\n\n\x00")
    if mode == "sink":
        nuls = buf.count(b"\x00")
        while nuls < n:
            data = conn.recv(1 << 20)
            if not data:
                return
            nuls += data.count(b"\x00")
        conn.sendall(b"RECEIPT\nreceipt-id:end\n\n\x00")
    else:
        while b"\x00" not in buf:
            buf += conn.recv(65536)

        def discard() -> None:
            with contextlib.suppress(OSError):
                while conn.recv(1 << 20):
                    pass

        reader = threading.Thread(target=discard, daemon=True)
        reader.start()
        frames = []
        for i in range(BATCH):
            frames.append(
                b"MESSAGE\ncontent-length:1024\nexpires:0\ndestination:/queue/bench\n"
                b"subscription:bench\npriority:4\nack:ID\\cbench-" + str(i).encode() + b"\n"
                b"message-id:ID\\cvm-40123-1700000000000-1\\c1\\c1\\c1\\c"
                + str(i).encode()
                + b"\ntimestamp:1700000000000\n\n"
                + BODY
                + b"\x00\n"
            )
        batch = b"".join(frames)
        for _ in range(n // BATCH):
            conn.sendall(batch)
        reader.join(60)  # until the client closes
        conn.close()
        return
    with contextlib.suppress(OSError):
        conn.recv(1)
    conn.close()


def measure_capacity(n: int = 50_000, *, stomppy: bool = True) -> dict[str, Any]:
    """The load generator's own limits against a null broker process (no real broker).

    Returns msg/s, client CPU % and msg per client CPU-second (:func:`_capacity`) for:
    RawStomp fire-and-forget SENDs, RawStomp consume with ack auto and with client-individual
    ACKs, and (``stomppy``) stomp.py consuming the same stream (for reference: what the
    benchmarks would measure with stomp.py as the client).
    """
    import multiprocessing  # noqa: PLC0415 (only the harness needs it)

    ctx = multiprocessing.get_context("spawn")
    n -= n % BATCH
    results: dict[str, Any] = {}

    def with_null(mode: str) -> tuple[Any, int]:
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_null_broker, args=(child, mode, n), daemon=True)
        proc.start()
        if not parent.poll(30):
            raise LoadgenError("null broker did not start")
        port: int = parent.recv()
        return proc, port

    proc, port = with_null("sink")
    c = RawStomp(port, "/")
    m = send_fire_and_forget(c, "/queue/bench", n, persistent=False)
    c.close()
    proc.join(10)
    results["rawstomp_send_ff"] = _capacity(n, m.seconds, m.client_cpu)

    for ack in ("auto", "client-individual"):
        proc, port = with_null("source")
        c = RawStomp(port, "/")
        m = _consume_only(c, n, ack=ack)
        c.close()
        proc.join(10)
        results[f"rawstomp_consume_{ack}"] = _capacity(n, m.seconds, m.client_cpu)
    if not stomppy:
        return results
    try:
        results["stomppy_consume_auto"] = _stomppy_consume(with_null, n)
    except Exception as exc:  # stomp.py is optional here: a reference figure only
        results["stomppy_consume_auto"] = {"error": f"{type(exc).__name__}: {exc}"}
    return results


def _capacity(n: int, seconds: float, cpu: float) -> dict[str, Any]:
    """``msg_per_s`` measured, the client's ``client_cpu_pct`` of one core, and
    ``msg_per_cpu_s``: messages per CPU-second of the client, its ceiling on a free core
    (what counts on a machine where other processes take CPU from it)."""
    return {
        "msg_per_s": round(n / seconds),
        "client_cpu_pct": round(100 * cpu / seconds),
        "msg_per_cpu_s": round(n / cpu) if cpu > 0 else None,
    }


def _consume_only(c: RawStomp, n: int, *, ack: str) -> Measurement:
    """Like :func:`consume` without the final ACK receipt (the null broker sends none)."""
    individual = ack == "client-individual"
    with _timed(n) as m:
        c.send(subscribe_frame("/queue/bench", "bench", ack))
        got = 0
        while got < n:
            acks = []
            for f in c.read_frames():
                if f.startswith(b"MESSAGE"):
                    got += 1
                    if individual:
                        acks.append(b"ACK\nid:" + (header(f, b"ack") or b"") + b"\n\n\x00")
            if acks:
                c.send(b"".join(acks))
    return m


def _stomppy_consume(with_null: Any, n: int) -> dict[str, Any]:
    import stomp  # noqa: PLC0415 (optional reference client)

    proc, port = with_null("source")
    done = threading.Event()
    count = [0]

    class Listener(stomp.ConnectionListener):  # type: ignore[misc]
        def on_message(self, frame: Any) -> None:
            count[0] += 1
            if count[0] >= n:
                done.set()

    conn = stomp.Connection12([("127.0.0.1", port)], heartbeats=(0, 0), vhost="/")
    conn.set_listener("count", Listener())
    conn.connect(wait=True)
    cpu0 = time.process_time()  # stomp.py works on its receiver thread: whole process
    t0 = time.perf_counter()
    conn.subscribe("/queue/bench", id="bench", ack="auto")
    finished = done.wait(120)
    seconds = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    with contextlib.suppress(Exception):
        conn.disconnect()
    proc.join(10)
    if not finished:
        raise LoadgenError(f"stomp.py got {count[0]} of {n} messages")
    return _capacity(n, seconds, cpu)
