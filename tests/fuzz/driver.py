"""Drive hostile byte streams into a running sidecar over real sockets and judge the result.

The sidecar under test is a real ``python -m proxy run`` child process
(:class:`testbed.sidecar.SidecarProcess`, made by :func:`fuzz_sidecar`) in front of a real
broker, not a thread of the test process, because:

* its memory is its own: ``VmRSS``/``VmHWM`` in ``/proc/PID/status`` measure the sidecar alone,
  not pytest, hypothesis and the fuzz client;
* a crash is visible as what it would be in production: the process exits (and its log, a
  file of its own, holds the traceback);
* leaks are checked from outside, as an operator would: ``/status`` and ``/metrics`` on the
  admin port, and the process' own sockets and file descriptors from ``/proc`` (an upstream
  leg is a socket connected to the broker's port, whatever the sidecar believes);
* the fuzz client's CPU does not share the sidecar's GIL.

A run (:func:`run_stomp_fuzz`, :func:`run_http_fuzz`) starts a well-behaved stomp.py session
(:class:`WellBehaved`: SEND with a receipt, receive, ACK, over and over) and keeps it running
while ``concurrency`` workers play :class:`~tests.fuzz.streams.Case` after case against the
listener; then it waits for the sidecar to settle and checks that nothing leaked. Cases
``0..len(kinds)-1`` are one of each kind, later ones are drawn by weight. All but the last
kind (slowloris, the slowest: 10 s on the admin port) are the warm-up, after which the RSS
baseline is taken; the slowloris case then runs beside the first drawn ones. Everything is
bounded in time: each case has a budget, each wait a deadline. Times are seconds, sizes
bytes, memory KiB unless the name says MiB.
"""

from __future__ import annotations

import collections
import contextlib
import http.client
import math
import os
import random
import re
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import trio

import protocol
from testbed.sidecar import SidecarProcess, metric_total
from tests.fuzz import streams
from tests.fuzz.streams import Case

__all__ = [
    "FuzzReport",
    "SidecarProcess",
    "Tally",
    "WellBehaved",
    "fuzz_sidecar",
    "http_case_for",
    "run_http_fuzz",
    "run_stomp_fuzz",
    "stomp_case_for",
]

#: Sidecar options of the fuzz runs (merged under the caller's): a short handshake timeout so
#: slowloris cases end soon, a short call timeout and drain, header limits below the broker's
#: (ActiveMQ's 1000 headers and 10240-byte lines: so the oversized-header cases test the sidecar's
#: own limits, which the defaults set above every broker's, and the checks expect its ERROR), and
#: frames up to 1 MiB instead of the default 144 MiB. Why: with 16 MiB frames (8 at a time, by
#: ``giant_frame`` cases) RSS measures glibc more than the sidecar: once a 16 MiB buffer is freed,
#: glibc raises its mmap threshold to 16 MiB and later buffers come from the heap, which it keeps.
#: Measured over 3 minutes: RSS swung between 45 and 118 MiB with no upward trend (baseline 53, peak
#: 135); with ``MALLOC_MMAP_THRESHOLD_=131072`` the same run ended +7 MiB over its baseline, and
#: with 1 MiB frames +9 MiB (peak 50). ``python -m tests.fuzz.run --option
#: max_frame_bytes=150994944`` fuzzes with the default.
FUZZ_OPTIONS: dict[str, object] = {
    "handshake_timeout": 1500,
    "call_timeout": 10000,
    "drain_timeout": 5000,
    "connect_timeout": 5000,
    "max_frame_bytes": 1024 * 1024,
    "max_headers": 1000,
    "max_header_line_bytes": 10240,
    "log_level": "info",
}

_SESSION = re.compile(r"session (\S+?)[: ]")
#: Extra seconds every case may take beyond its pauses, sends and expected close.
_CASE_SLACK = 30.0
#: Bytes per second a case's data is assumed to move at, at worst (for its time budget).
_WORST_RATE = 2e6


# -- the sidecar process ------------------------------------------------------------------------


def fuzz_sidecar(
    name: str, workdir: Path, *, brokers: str, options: Mapping[str, object] | None = None
) -> SidecarProcess:
    """The sidecar under test (``testbed.sidecar``): ``options`` over :data:`FUZZ_OPTIONS`;
    ready once a STOMP CONNECT through it is answered (so the broker is reachable too)."""
    return SidecarProcess(
        name, workdir, brokers=brokers, options={**FUZZ_OPTIONS, **(options or {})}
    )


# -- the well-behaved session -------------------------------------------------------------------


class WellBehaved:
    """A stomp.py (STOMP 1.2) session that must not notice the fuzzing: it SENDs numbered
    messages with receipts to its own queue and receives and ACKs each one (client-individual)
    until stopped. ``errors`` lists what went wrong (an ERROR frame, a missing receipt or
    message, a wrong body, a lost connection); ``sent`` counts receipted SENDs, ``received``
    the messages that came back in order.

    Waits are bounded by ``timeout`` seconds each (generous: the machine is loaded).
    """

    def __init__(
        self, address: tuple[str, int], *, timeout: float = 60.0, pause: float = 0.02
    ) -> None:
        self.address = address
        self.timeout = timeout
        self.pause = pause
        self.queue = f"/queue/mq-sidecar-fuzz.well-behaved-{os.getpid()}-{random.randrange(10**9)}"
        self.sent = 0
        self.received = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="well-behaved", daemon=True)

    def start(self) -> None:
        """Connect, subscribe, and start the loop in a thread; returns once subscribed."""
        self._thread.start()
        if not self._started.wait(self.timeout):
            self.errors.append("did not connect and subscribe in time")

    def stop(self) -> None:
        """Finish the current round, DISCONNECT, join the thread."""
        self._stop.set()
        self._thread.join(self.timeout * 3)
        if self._thread.is_alive():
            self.errors.append("the well-behaved session did not stop")

    def _run(self) -> None:
        from tests.integration.support import Client

        client: Client | None = None
        try:
            client = Client(self.address, version="1.2")
            client.connect()
            client.conn.subscribe(
                self.queue, id="wb", ack="client-individual", headers={"receipt": "wb-sub"}
            )
            client.receipt("wb-sub", self.timeout)
            self._started.set()
            i = 0
            while not self._stop.is_set():
                i += 1
                body = f"well-behaved {i}"
                client.conn.send(self.queue, body, headers={"receipt": f"wb-r{i}"})
                client.receipt(f"wb-r{i}", self.timeout)
                self.sent += 1
                message = client.expect("MESSAGE", self.timeout)
                if message.body != body:
                    raise AssertionError(f"expected {body!r}, got {message.body!r}")
                client.conn.ack(message.headers["ack"])
                self.received += 1
                self._stop.wait(self.pause)
            client.close()
            leftover = []
            while not client.control_queue.empty():
                frame = client.control_queue.get()
                if frame.command != "DISCONNECTED":
                    leftover.append(frame)
            if leftover:
                raise AssertionError(f"unexpected frames: {leftover}")
        except Exception as exc:  # reported by stop(); the test asserts on it
            self.errors.append(f"{type(exc).__name__}: {exc}")
            self._started.set()
            if client is not None:
                with contextlib.suppress(Exception):
                    client.conn.disconnect()


# -- playing cases ------------------------------------------------------------------------------


@dataclass
class ConnResult:
    """What one connection of a case saw."""

    sent: int = 0
    received: int = 0
    closed: str = "open"  # eof | reset | open | ours
    close_delay: float | None = None  # seconds from our last byte to the server's close
    connected: bool = False
    session: str | None = None  # the sidecar's session id (CONNECTED ``session``)
    errors: list[str] = field(default_factory=list)  # ERROR messages (STOMP)
    receipts: list[str] = field(default_factory=list)  # RECEIPT ids (STOMP)
    statuses: list[int] = field(default_factory=list)  # response codes (HTTP)
    bad_output: str | None = None  # the server's bytes were not STOMP
    connect_failed: str | None = None


@dataclass
class Tally:
    """Counts of a run. ``problems`` keeps the first few descriptions of each kind."""

    cases: int = 0
    connections: int = 0
    bytes_sent: int = 0
    kinds: collections.Counter[str] = field(default_factory=collections.Counter)
    outcomes: collections.Counter[str] = field(default_factory=collections.Counter)
    hangs: int = 0
    wrong: int = 0
    problems: list[str] = field(default_factory=list)
    #: The sidecar's session id of every STOMP connection that got CONNECTED -> its case.
    sessions: dict[str, str] = field(default_factory=dict)

    #: Longest time (s) the server took to close after a case's last byte (or half-close).
    slowest_close: float = 0.0
    #: Wrong answers by class (the text after the case label, numbers and ids dropped).
    classes: collections.Counter[str] = field(default_factory=collections.Counter)

    def problem(self, kind: str, text: str) -> None:
        """Count a hang or a wrong answer and keep its description (the first 20 of each)."""
        if kind == "hang":
            self.hangs += 1
        else:
            self.wrong += 1
        what = text.split(": ", 1)[-1]
        self.classes[f"{kind}: {_VARIABLE.sub('#', what)[:70]}"] += 1
        if sum(p.startswith(kind) for p in self.problems) < 20:
            self.problems.append(f"{kind}: {text}")


def _stomp_reader(result: ConnResult) -> Callable[[bytes], None]:
    parser = protocol.FrameParser(protocol.Limits(max_frame_bytes=64 << 20), version="1.0")

    def consume(data: bytes) -> None:
        if result.bad_output is not None:
            return
        parser.receive_data(data)
        try:
            while True:
                event = parser.next_event()
                if isinstance(event, protocol.NeedData):
                    return
                if not isinstance(event, protocol.Frame):
                    continue
                if event.command is protocol.Command.CONNECTED:
                    result.connected = True
                    result.session = event.get("session")
                    parser.version = event.get("version") or "1.0"
                elif event.command is protocol.Command.ERROR:
                    result.errors.append(event.get("message") or "")
                elif event.command is protocol.Command.RECEIPT:
                    result.receipts.append(event.get("receipt-id") or "")
        except protocol.RemoteProtocolError as exc:
            result.bad_output = str(exc)

    return consume


#: What varies between two problems of one class: numbers, lists, parentheses.
_VARIABLE = re.compile(r"[0-9]+|\[.*?\]|\(.*?\)")
_STATUS_LINE = re.compile(rb"(?:^|\n)HTTP/1\.[01] (\d{3}) ")


def _http_reader(result: ConnResult) -> Callable[[bytes], None]:
    head = bytearray()

    def consume(data: bytes) -> None:
        # Status lines are found in what was received so far (bodies here never hold one).
        if len(head) < 1 << 20:
            head.extend(data)
            result.statuses = [int(m) for m in _STATUS_LINE.findall(bytes(head))]

    return consume


async def _connection(
    address: tuple[str, int], case: Case, result: ConnResult, consume: Callable[[bytes], None]
) -> None:
    try:
        stream = await trio.open_tcp_stream(*address)
    except OSError as exc:
        result.connect_failed = str(exc)
        return
    peer_done = trio.Event()
    finished_at: list[float] = []

    async def read() -> None:
        try:
            while True:
                data = await stream.receive_some(65536)
                if not data:
                    result.closed = "eof"
                    break
                result.received += len(data)
                consume(data)
        except trio.BrokenResourceError:
            result.closed = "reset"
        except trio.ClosedResourceError:
            result.closed = "ours"
        if finished_at and result.closed in ("eof", "reset"):
            result.close_delay = trio.current_time() - finished_at[0]
        peer_done.set()

    async def send() -> None:
        for part in case.parts:
            for piece in part.pieces():
                if peer_done.is_set():
                    return
                try:
                    await stream.send_all(piece)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return
                result.sent += len(piece)
            if part.pause:
                with trio.move_on_after(part.pause):
                    await peer_done.wait()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            await send()
            finished_at.append(trio.current_time())
            if peer_done.is_set():
                result.close_delay = 0.0
            if case.end == "rst":
                with contextlib.suppress(OSError):
                    stream.socket.setsockopt(
                        socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                    )
                await stream.aclose()
                result.closed = "ours"
                return
            if case.end == "fin" and not peer_done.is_set():
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    await stream.send_eof()
            bound = case.expect.closed_within
            with trio.move_on_after(bound if bound is not None else 0):
                await peer_done.wait()
            nursery.cancel_scope.cancel()
    finally:
        if result.closed == "open":
            with contextlib.suppress(OSError):
                stream.socket.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                )
        await trio.aclose_forcefully(stream)


def _budget(case: Case) -> float:
    pauses = sum(p.pause for p in case.parts)
    close = case.expect.closed_within or 0.0
    return pauses + case.size / _WORST_RATE + close + _CASE_SLACK


def _judge_stomp(case: Case, r: ConnResult, tally: Tally, label: str) -> None:
    e = case.expect
    if r.session is not None:
        tally.sessions[r.session] = label
        label += f" session {r.session}"
    reset = r.closed == "reset"
    if r.bad_output is not None:
        tally.problem("wrong", f"{label}: the sidecar sent invalid STOMP: {r.bad_output}")
    if r.errors:
        tally.outcomes[f"ERROR {r.errors[0][:60]}"] += 1
    else:
        tally.outcomes[f"closed: {r.closed}" + (" after CONNECTED" if r.connected else "")] += 1
    if e.connected is True and not r.connected and not reset:
        tally.problem("wrong", f"{label}: no CONNECTED")
    if e.connected is False and r.connected:
        tally.problem("wrong", f"{label}: CONNECTED to a bad CONNECT")
    if e.no_error and (r.errors or reset):
        tally.problem("wrong", f"{label}: a valid session got {r.errors or 'a reset'}")
    if e.error is not None:
        if r.errors and e.error not in r.errors[0]:
            tally.problem("wrong", f"{label}: expected ERROR {e.error!r}, got {r.errors[0]!r}")
        elif not r.errors and not reset:
            tally.problem("wrong", f"{label}: expected ERROR {e.error!r}, got none")
    missing = [x for x in e.receipts if x not in r.receipts]
    if missing and not reset:
        tally.problem("wrong", f"{label}: RECEIPT(s) {missing} missing (got {r.receipts})")


def _judge_http(case: Case, r: ConnResult, tally: Tally, label: str) -> None:
    e = case.expect
    tally.outcomes[f"HTTP {r.statuses[:1] or 'none'} closed: {r.closed}"] += 1
    statuses = r.statuses
    if statuses[:1] == [503] and case.kind != "storm":
        tally.outcomes["rejected (503) under a storm"] += 1
        return
    if e.status_in and any(s not in e.status_in for s in statuses):
        tally.problem(
            "wrong", f"{label}: statuses {statuses}, expected within {sorted(e.status_in)}"
        )
    if e.statuses and statuses != list(e.statuses[: len(statuses)]):
        tally.problem("wrong", f"{label}: statuses {statuses}, expected {list(e.statuses)}")
    elif e.statuses and len(statuses) < len(e.statuses) and r.closed != "reset":
        tally.problem("wrong", f"{label}: {len(statuses)} of {len(e.statuses)} responses")


async def play(
    address: tuple[str, int], case: Case, tally: Tally, *, http_mode: bool = False
) -> None:
    """Play ``case`` (all its connections at once), then judge every connection."""
    results = [ConnResult() for _ in range(case.fanout)]
    make = _http_reader if http_mode else _stomp_reader
    budget = _budget(case)
    with trio.move_on_after(budget) as scope:
        async with trio.open_nursery() as nursery:
            for r in results:
                nursery.start_soon(_connection, address, case, r, make(r))
    tally.cases += 1
    tally.kinds[case.kind] += 1
    tally.connections += case.fanout
    label = f"case {case.index} ({case.kind}, end {case.end}, {case.size} bytes)"
    if scope.cancelled_caught:
        tally.problem("hang", f"{label}: not done within its budget of {budget:.0f} s")
        return
    for r in results:
        tally.bytes_sent += r.sent
        if r.close_delay is not None:
            tally.slowest_close = max(tally.slowest_close, r.close_delay)
        if r.connect_failed is not None:
            tally.problem("wrong", f"{label}: connect failed: {r.connect_failed}")
            continue
        if case.expect.closed_within is not None and r.closed == "open":
            tally.problem(
                "hang",
                f"{label}: neither answered nor closed {case.expect.closed_within:g} s after "
                f"our last byte (sent {r.sent}, received {r.received})",
            )
            continue
        (_judge_http if http_mode else _judge_stomp)(case, r, tally, label)


async def play_many(
    address: tuple[str, int],
    cases: Iterator[Case],
    tally: Tally,
    *,
    concurrency: int,
    deadline: float,
    http_mode: bool = False,
) -> None:
    """Play ``cases`` with ``concurrency`` workers until they run out or ``deadline``
    (``trio.current_time()`` seconds) passes; no new case starts after the deadline."""

    async def worker() -> None:
        for case in cases:
            await play(address, case, tally, http_mode=http_mode)
            if trio.current_time() >= deadline:
                return

    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(worker)


# -- runs ---------------------------------------------------------------------------------------


def stomp_case_for(
    seed: int, index: int, *, limits: streams.StompLimits, scale: streams.Scale
) -> Case:
    """Case ``index`` of run ``seed``: one of each kind first, then drawn by weight."""
    kinds = list(streams.STOMP_KINDS)
    kind = kinds[index] if index < len(kinds) else None
    return streams.stomp_case(
        streams.case_rng(seed, index), index, limits=limits, scale=scale, kind=kind
    )


def http_case_for(seed: int, index: int) -> Case:
    """Admin-plane case ``index`` of run ``seed``: one of each kind first, then by weight."""
    kinds = list(streams.HTTP_KINDS)
    kind = kinds[index] if index < len(kinds) else None
    return streams.http_case(streams.case_rng(seed, index), index, kind=kind)


@dataclass
class FuzzReport:
    """The result of one fuzz run and its checks; :meth:`text` prints it, :attr:`ok` judges."""

    target: str
    seed: int
    seconds: float
    tally: Tally
    crashed: str | None
    bad_log_lines: list[str]
    well_behaved_sent: int
    well_behaved_received: int
    well_behaved_errors: list[str]
    leaks: list[str]
    rss_baseline_kib: int
    rss_after_kib: int
    rss_peak_kib: int
    rss_margin_kib: int
    fds_baseline: int
    fds_after: int

    @property
    def crashes(self) -> int:
        """The sidecar died (1), plus each incident logged at ERROR: the records of one
        session (its ``internal error`` and its ``closed: internal error``) count once."""
        incidents = {
            (m.group(1) if (m := _SESSION.search(line)) else line) for line in self.bad_log_lines
        }
        return int(self.crashed is not None) + len(incidents)

    @property
    def rss_growth_kib(self) -> int:
        """RSS after the run minus the baseline after the warm-up."""
        return self.rss_after_kib - self.rss_baseline_kib

    @property
    def ok(self) -> bool:
        """No crash, hang, wrong answer, well-behaved error, leak; RSS back within margin."""
        return (
            self.crashes == 0
            and self.tally.hangs == 0
            and self.tally.wrong == 0
            and not self.well_behaved_errors
            and self.well_behaved_sent > 0
            and self.well_behaved_received == self.well_behaved_sent
            and not self.leaks
            and self.rss_growth_kib <= self.rss_margin_kib
        )

    def _process_state(self) -> str:
        return "alive" if self.crashed is None else f"died: {self.crashed}"

    def text(self) -> str:
        """A human-readable summary (what the closing note pastes)."""
        t = self.tally
        mib = 1024
        lines = [
            f"== {self.target} fuzz, seed {self.seed}: {self.seconds:.1f} s",
            f"inputs tried: {t.cases} cases, {t.connections} connections, "
            f"{t.bytes_sent / 1e6:.1f} MB sent",
            f"crashes: {self.crashes} (process {self._process_state()}, "
            f"{len(self.bad_log_lines)} ERROR log records)",
            f"hangs: {t.hangs} (slowest close after a case's last byte: {t.slowest_close:.1f} s)",
            f"wrong answers: {t.wrong}",
            f"well-behaved session: {self.well_behaved_sent} receipted SENDs, "
            f"{self.well_behaved_received} received, {len(self.well_behaved_errors)} errors",
            f"leaks: {len(self.leaks)}" + (f" ({'; '.join(self.leaks)})" if self.leaks else ""),
            f"RSS: baseline {self.rss_baseline_kib / mib:.1f} MiB after warm-up, "
            f"{self.rss_after_kib / mib:.1f} MiB after ({self.rss_growth_kib / mib:+.1f} MiB, "
            f"allowed +{self.rss_margin_kib / mib:.0f}), peak {self.rss_peak_kib / mib:.1f} MiB",
            f"file descriptors: {self.fds_baseline} -> {self.fds_after}",
            "cases by kind: " + ", ".join(f"{k} {n}" for k, n in sorted(t.kinds.items())),
            "outcomes: " + ", ".join(f"{k}: {n}" for k, n in t.outcomes.most_common(14)),
        ]
        lines += [f"  {n} x {what}" for what, n in t.classes.most_common(10)]
        lines += [f"  problem: {p}" for p in t.problems]
        lines += [f"  well-behaved error: {e}" for e in self.well_behaved_errors[:10]]
        for line in self.bad_log_lines[:10]:
            found = _SESSION.search(line)
            case = self.tally.sessions.get(found.group(1)) if found else None
            lines.append(f"  log: {line}" + (f" <- {case}" if case else ""))
        lines.append("RESULT: " + ("OK" if self.ok else "FAILED"))
        return "\n".join(lines)


def _wait(predicate: Callable[[], bool], timeout: float, interval: float = 0.25) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def settle(
    sidecar: SidecarProcess, *, sessions: int, admin: int = 0, timeout: float = 60.0
) -> list[str]:
    """Wait until the sidecar holds exactly ``sessions`` sessions with one upstream leg each
    (``/status``, ``/metrics`` and its own sockets agree) and at most ``admin`` admin
    connections besides the one asking; return what is still off after ``timeout`` s."""
    problems: list[str] = []

    def check() -> bool:
        problems.clear()
        if not sidecar.running():
            problems.append("the sidecar is not running")
            return True
        try:
            return _check(problems)
        except (OSError, http.client.HTTPException) as exc:
            problems.append(f"the admin port did not answer: {exc!r}")
            return False

    def _check(found: list[str]) -> bool:
        status = sidecar.status()
        open_ = status["sessions_open"]
        if open_ != sessions:
            states = collections.Counter(str(s["state"]) for s in status["sessions"])
            found.append(f"/status: {open_} sessions open, expected {sessions} ({dict(states)})")
        upstream = metric_total(sidecar.metrics(), "mq_sidecar_upstream_connected")
        if upstream != sessions:
            found.append(f"mq_sidecar_upstream_connected {upstream:g}, expected {sessions}")
        counts = sidecar.sockets()
        if counts.upstream != sessions:
            found.append(f"{counts.upstream} sockets to the broker, expected {sessions}")
        if counts.app != sessions:
            found.append(f"{counts.app} app sockets, expected {sessions}")
        if counts.admin > admin + 1:
            found.append(f"{counts.admin} admin sockets, expected at most {admin + 1}")
        admin_stats = status["admin"]
        assert isinstance(admin_stats, dict)
        if admin_stats["connections"] > admin + 1 or admin_stats["sse_clients"]:
            found.append(f"admin plane: {admin_stats}")
        return not found

    _wait(check, timeout, interval=0.5)
    return list(problems)


def _quiet_rss(sidecar: SidecarProcess, seconds: float = 2.0) -> int:
    """The lowest RSS seen over ``seconds`` (memory freed at the end of sessions shows up)."""
    low = sidecar.rss_kib()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.25)
        low = min(low, sidecar.rss_kib())
    return low


def _fuzz_run(
    sidecar: SidecarProcess,
    *,
    target: str,
    seed: int,
    make_case: Callable[[int], Case],
    warmup: int,
    count: int | None,
    seconds: float | None,
    concurrency: int,
    rss_margin_mib: float,
    http_mode: bool,
    progress: Callable[[str], None] | None,
) -> FuzzReport:
    started = time.monotonic()
    tally = Tally()
    well = WellBehaved(sidecar.address)
    well.start()
    leaks: list[str] = []
    crashed: str | None = None
    address = sidecar.admin_address if http_mode else sidecar.address

    def run(first: int, last: int | None, limit: float, *, report: bool) -> None:
        indices = iter(range(first, last)) if last is not None else _count(first)

        def cases() -> Iterator[Case]:
            for i in indices:
                yield make_case(i)

        async def main() -> None:
            deadline = trio.current_time() + limit
            async with trio.open_nursery() as nursery:
                if progress is not None and report:
                    nursery.start_soon(_report_progress, tally, progress, sidecar)
                await play_many(
                    address,
                    cases(),
                    tally,
                    concurrency=concurrency,
                    deadline=deadline,
                    http_mode=http_mode,
                )
                nursery.cancel_scope.cancel()

        trio.run(main)

    try:
        run(0, warmup, math.inf, report=False)
        leaks += [f"after warm-up: {p}" for p in settle(sidecar, sessions=1)]
        rss_baseline = _quiet_rss(sidecar)
        fds_baseline = sidecar.fd_count()
        limit = seconds if seconds is not None else math.inf
        run(warmup, None if count is None else warmup + count, limit, report=True)
        if not sidecar.running():
            crashed = f"exit status {sidecar.returncode}"
        leaks += settle(sidecar, sessions=1)
        rss_after = _quiet_rss(sidecar) if sidecar.running() else 0
        fds_after = sidecar.fd_count() if sidecar.running() else 0
        rss_peak = sidecar.peak_rss_kib() if sidecar.running() else 0
    finally:
        well.stop()
    if sidecar.running():
        leaks += [f"after the well-behaved session left: {p}" for p in settle(sidecar, sessions=0)]
        if fds_after > fds_baseline + 2:
            leaks.append(f"file descriptors {fds_baseline} -> {fds_after}")
    elif crashed is None:
        crashed = "exited"
    return FuzzReport(
        target=target,
        seed=seed,
        seconds=time.monotonic() - started,
        tally=tally,
        crashed=crashed,
        bad_log_lines=sidecar.error_log_lines(),
        well_behaved_sent=well.sent,
        well_behaved_received=well.received,
        well_behaved_errors=well.errors,
        leaks=leaks,
        rss_baseline_kib=rss_baseline,
        rss_after_kib=rss_after,
        rss_peak_kib=rss_peak,
        rss_margin_kib=int(rss_margin_mib * 1024),
        fds_baseline=fds_baseline,
        fds_after=fds_after,
    )


def _count(start: int) -> Iterator[int]:
    i = start
    while True:
        yield i
        i += 1


async def _report_progress(
    tally: Tally, progress: Callable[[str], None], sidecar: SidecarProcess
) -> None:
    started = trio.current_time()
    while True:
        await trio.sleep(10)
        rss = f"{sidecar.rss_kib() / 1024:.1f} MiB" if sidecar.running() else "-"
        progress(
            f"{trio.current_time() - started:5.0f} s: {tally.cases} cases, "
            f"{tally.connections} connections, {tally.hangs} hangs, {tally.wrong} wrong, "
            f"sidecar RSS {rss}"
        )


def run_stomp_fuzz(
    sidecar: SidecarProcess,
    *,
    seed: int,
    count: int | None = None,
    seconds: float | None = None,
    concurrency: int = 8,
    scale: streams.Scale = streams.Scale(),  # noqa: B008 (immutable)
    rss_margin_mib: float = 30.0,
    progress: Callable[[str], None] | None = None,
) -> FuzzReport:
    """Fuzz the STOMP listener: one case of each kind (warm-up, then the RSS baseline), then
    ``count`` cases or ``seconds`` of them, with the well-behaved session running; settle and
    check for leaks."""
    opts = sidecar.options
    limits = streams.StompLimits(
        max_frame_bytes=int(opts.get("max_frame_bytes", 16 * 1024 * 1024)),  # type: ignore[call-overload]
        max_headers=int(opts.get("max_headers", 1000)),  # type: ignore[call-overload]
        max_header_line_bytes=int(opts.get("max_header_line_bytes", 10240)),  # type: ignore[call-overload]
        handshake_timeout=int(opts["handshake_timeout"]) / 1000,  # type: ignore[call-overload]
    )
    return _fuzz_run(
        sidecar,
        target="STOMP listener",
        seed=seed,
        make_case=lambda i: stomp_case_for(seed, i, limits=limits, scale=scale),
        warmup=len(streams.STOMP_KINDS) - 1,
        count=count,
        seconds=seconds,
        concurrency=concurrency,
        rss_margin_mib=rss_margin_mib,
        http_mode=False,
        progress=progress,
    )


def run_http_fuzz(
    sidecar: SidecarProcess,
    *,
    seed: int,
    count: int | None = None,
    seconds: float | None = None,
    concurrency: int = 6,
    rss_margin_mib: float = 30.0,
    progress: Callable[[str], None] | None = None,
) -> FuzzReport:
    """Fuzz the admin port the same way (with the well-behaved STOMP session running)."""
    return _fuzz_run(
        sidecar,
        target="admin HTTP port",
        seed=seed,
        make_case=lambda i: http_case_for(seed, i),
        warmup=len(streams.HTTP_KINDS) - 1,
        count=count,
        seconds=seconds,
        concurrency=concurrency,
        rss_margin_mib=rss_margin_mib,
        http_mode=True,
        progress=progress,
    )
