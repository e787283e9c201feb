"""Chaos soak (issue 7): apps through sidecars against real brokers under seeded random faults.

Topology (everything on 127.0.0.1, brokers started here and stopped by PID):

- **activemq**: a shared-store primary/backup pair (kahaDB lock poll 200 ms), each broker
  behind its own :class:`~tests.faultproxy.FaultProxy`; the sidecars see
  ``failover:(proxyA,proxyB)``;
- **rabbitmq**: one node behind a fault proxy (no backup: the sidecar reattaches to it; durable
  queues and persistent messages, so a kill -9 loses nothing the broker confirmed).

Per broker system two sidecars (:class:`~tests.integration.support.SidecarThread`), both
``failover_mode = transparent`` with 500 ms upstream heart-beats:

- **main**: unlimited reconnects (``reconnect_period = 0``), the default ``call_timeout``;
  ``transaction_failover`` is ``replay`` for ActiveMQ and ``rollback`` for RabbitMQ, so both
  modes are soaked. Apps on it must never lose a confirmed message, never see one twice, never
  lose their connection.
- **impatient**: ``reconnect_period`` 4 s and ``call_timeout`` 1.5 s, so that long faults end
  its sessions with a DISCONNECT event and frames time out with an ERROR: the reporting paths.
  Its producers are *polite*: after a RECONNECTING event they send nothing until the FAILOVER
  (or the end of the session), so every frame they sent was in the sidecar's hands before the
  session could give up (a frame still in the app's socket when the sidecar closes it cannot
  be reported by anyone).

Workload per system: three queues, one consumer each through the main sidecar (ack modes
``client-individual``, ``auto`` and ``client`` with cumulative ACKs), recording every message
id it sees; producers SENDing persistent messages with unique ids (body and receipt id) and
pipelined receipts: one plain producer per queue and one transactional producer (BEGIN, 1-5
SENDs over the queues, COMMIT or, one time in ten, ABORT, each with a receipt) on the main
sidecar; one plain and one transactional polite producer on the impatient sidecar. Every
client subscribes to its own session's events on ``/mq-sidecar/events``.

Faults, one loop per system, at seeded random times: ``kill`` (kill -9 of the live broker; on
ActiveMQ the backup takes over and the killed one restarts as the new backup, on RabbitMQ the
node restarts on the same port), ``hang`` (SIGSTOP for a few seconds, then SIGCONT),
``blackhole`` (the live broker's link stops forwarding, sockets open), ``reset`` (every
connection on the link RST), ``slow`` (each chunk delayed and throttled for a while) and ``cut``
(the link resets after N more bytes, mid-frame). Each loop first injects every kind once in a
seeded order (so even a short run covers them all), then random kinds until the deadline, and
after each fault waits (bounded) for recovery: brokers healthy, every main-sidecar session
running, every main producer confirmed and every consumer received something since.

At the end producers stop and wait for their answers, consumers drain until quiet, and what is
still on the brokers is read directly. The invariants are checked from every message id
(:meth:`Ledger.check`); the figures and violations are returned as a :class:`SoakReport`.
The sidecar recognises a message seen twice per subscription (README "Duplicate detection"), so
each queue has exactly one consumer: with competing consumers the second copy of a replayed
SEND may legitimately reach another session.

CLI (the figures are printed, the JSON summary written)::

    .venv/bin/python -m tests.chaos.soak --minutes 60 --seed 7 [--json PATH] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import random
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

import protocol
from protocol import Command, Frame
from testbed import ActiveMQ, BrokerError, RabbitMQ, start_activemq_pair, wait_stomp
from tests.faultproxy import FaultProxy
from tests.integration.support import SidecarThread, sidecar_config

__all__ = [
    "FAULT_KINDS",
    "FaultRecord",
    "Ledger",
    "SoakError",
    "SoakOptions",
    "SoakReport",
    "Violation",
    "main",
    "run_soak",
]

log = logging.getLogger("chaos.soak")

#: The sidecar's control channel (``events_destination``).
EVENTS = "/mq-sidecar/events"
#: Every fault the loops can inject.
FAULT_KINDS = ("kill", "hang", "blackhole", "reset", "slow", "cut")
#: Relative weights of the random faults after the first round (kill -9 is the main course).
FAULT_WEIGHTS = {"kill": 3, "hang": 2, "blackhole": 2, "reset": 2, "slow": 1, "cut": 2}
#: Seconds a fault with its recovery usually takes, to decide whether one more fits.
FAULT_BUDGET = {"kill": 12.0, "hang": 8.0, "blackhole": 8.0, "reset": 3.0, "slow": 8.0, "cut": 3.0}
#: Consumer ack modes, one queue each (``client`` is cumulative).
ACK_MODES = ("client-individual", "auto", "client")
#: The systems a soak can run.
SYSTEMS = ("activemq", "rabbitmq")
#: Seconds a broker gets to start, restart or take over (loaded 2-core machine).
BROKER_TIMEOUT = 120.0
#: Seconds a client waits for the sidecar's CONNECTED, a subscription's RECEIPT...
CLIENT_TIMEOUT = 30.0
#: Seconds a stopping producer waits for the answers to what it sent (call_timeout is 30 s).
ANSWER_TIMEOUT = 75.0
#: Cap on the violations kept per kind in the report (the counts are exact).
MAX_EXAMPLES = 50


class SoakError(RuntimeError):
    """The test bed failed (a broker did not start or take over): not a sidecar finding."""


@dataclass
class SoakOptions:
    """What a soak runs. Durations in seconds unless named otherwise.

    ``minutes``: length of the fault phase (each loop still injects every kind once, even if
    that takes longer). ``rate``: SENDs per second of each plain producer; ``tx_rate``:
    transactions per second of each transactional producer; ``pipeline``: receipts a producer
    may await at once. ``gap``: range of the pause before each fault; ``fault_seconds``: range
    of the length of a hang, blackhole or slow link. ``recovery_timeout``: bound of the wait
    for recovery after a fault; ``drain_timeout``: bound of the final drain; ``quiet``: a
    drain ends after this long without a new message once everything expected arrived.
    ``heartbeat_ms``: the sidecars' upstream heart-beat (both directions). ``ack_modes``:
    one queue and consumer per mode. ``impatient_call_timeout_ms``: the impatient sidecar's
    ``call_timeout`` (its ``reconnect_period`` is 4000 ms).
    """

    minutes: float = 1.0
    seed: int = 7
    systems: tuple[str, ...] = SYSTEMS
    kinds: tuple[str, ...] = FAULT_KINDS
    rate: float = 20.0
    tx_rate: float = 3.0
    pipeline: int = 16
    gap: tuple[float, float] = (1.0, 4.0)
    fault_seconds: tuple[float, float] = (1.5, 6.0)
    recovery_timeout: float = 120.0
    drain_timeout: float = 120.0
    quiet: float = 3.0
    heartbeat_ms: int = 500
    ack_modes: tuple[str, ...] = ACK_MODES
    impatient_call_timeout_ms: int = 1500
    max_faults: int = 10_000
    workdir: Path | None = None
    json_path: Path | None = None

    def __post_init__(self) -> None:
        unknown = set(self.systems) - set(SYSTEMS)
        if unknown or not self.systems:
            raise ValueError(f"systems must be among {SYSTEMS}, got {self.systems}")
        if set(self.ack_modes) - set(ACK_MODES) or not self.ack_modes:
            raise ValueError(f"ack modes must be among {ACK_MODES}, got {self.ack_modes}")
        bad = set(self.kinds) - set(FAULT_KINDS)
        if bad or not self.kinds:
            raise ValueError(f"fault kinds must be among {FAULT_KINDS}, got {self.kinds}")


# -- records ---------------------------------------------------------------------------------


@dataclass(slots=True)
class Sent:
    """One message a producer sent: its id (body and receipt id) and what became of it.

    ``outcome``: ``pending``, ``confirmed`` (RECEIPT), ``error_dropped`` (call_timeout ERROR
    saying the frame was never sent and is dropped), ``error_maybe`` (call_timeout ERROR, the
    frame was sent and may still take effect), ``error_other`` (any other ERROR naming it),
    ``unanswered_at_close`` (the session ended first), ``unanswered`` (the session stayed up
    but no answer came within the bound). ``reported_lost``: listed in a DISCONNECT event.
    Times are seconds since the soak started.
    """

    id: str
    system: str
    producer: str
    queue: str
    tx: str | None
    sent_at: float
    session: int
    outcome: str = "pending"
    detail: str = ""
    answered_at: float | None = None
    reported_lost: bool = False


@dataclass(slots=True)
class Tx:
    """One transaction: its messages, the end sent (``COMMIT``/``ABORT``) and its outcome.

    ``outcome``: ``open``, ``committed``, ``aborted``, ``rolled_back`` (ERROR "rolled back"),
    ``in_doubt`` (ERROR "in doubt"), ``timeout_dropped``/``timeout_maybe`` (call_timeout
    ERROR on the end frame), ``error`` (another ERROR), ``unanswered_at_close`` (the session
    ended with the end frame unanswered), ``session_lost`` (the session ended before the end
    frame was sent), ``unanswered`` (no answer within the bound, session up).
    """

    id: str
    system: str
    producer: str
    started_at: float
    ids: list[str] = field(default_factory=list)
    end: str | None = None
    outcome: str = "open"
    detail: str = ""
    reported_lost: bool = False


@dataclass
class FaultRecord:
    """One injected fault: system, kind, drawn parameters, and times (seconds since start)."""

    system: str
    kind: str
    params: dict[str, Any]
    started_at: float
    ended_at: float | None = None
    recovered_after: float | None = None  # seconds from the end of the fault to recovery


@dataclass(frozen=True)
class Violation:
    """A broken invariant: ``kind`` (e.g. ``lost``, ``duplicated``), one line of detail, the
    message or transaction ids involved, and when (seconds since start)."""

    kind: str
    detail: str
    ids: tuple[str, ...] = ()
    at: float = 0.0


class Ledger:
    """Everything the soak observed, keyed by message id; only touched from the soak's trio
    thread. :meth:`check` turns it into figures and violations."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.sent: dict[str, Sent] = {}
        self.txs: dict[str, Tx] = {}
        # id -> (consumer, consumer session number, seconds since start) per delivery
        self.received: dict[str, list[tuple[str, int, float]]] = defaultdict(list)
        self.leftover: dict[str, list[str]] = defaultdict(list)  # id -> queues still holding it
        self.unknown_received: Counter[str] = Counter()
        self.events: list[dict[str, Any]] = []
        self.reported_labels: set[str] = set()
        self.faults: list[FaultRecord] = []
        self.violations: list[Violation] = []
        self.counts: Counter[str] = Counter()
        self.last_confirm: dict[str, float] = {}  # producer -> time of its last RECEIPT
        self.last_receive: dict[str, float] = {}  # consumer -> time of its last MESSAGE

    def now(self) -> float:
        """Seconds since the soak started."""
        return time.monotonic() - self.t0

    def violation(self, kind: str, detail: str, ids: tuple[str, ...] = ()) -> None:
        """Record a broken invariant (also logged at once)."""
        log.warning("VIOLATION %s: %s %s", kind, detail, " ".join(ids[:10]))
        self.violations.append(Violation(kind, detail, ids, round(self.now(), 3)))

    def answer(self, sent: Sent, message: str | None, body: str = "") -> None:
        """A RECEIPT (``message`` None) or an ERROR answering ``sent``."""
        sent.answered_at = self.now()
        if message is None:
            sent.outcome = "confirmed"
            self.last_confirm[sent.producer] = sent.answered_at
            return
        sent.detail = message
        if "not confirmed" in message:
            sent.outcome = "error_dropped" if "never sent" in body else "error_maybe"
        else:
            sent.outcome = "error_other"
        self.counts[f"{sent.system}.errors.{sent.outcome}"] += 1

    def tx_answer(self, tx: Tx, message: str | None, body: str = "") -> None:
        """A RECEIPT (``message`` None) or an ERROR answering ``tx``'s COMMIT or ABORT."""
        if message is None:
            tx.outcome = "committed" if tx.end == "COMMIT" else "aborted"
            return
        tx.detail = message
        if "rolled back" in message:
            tx.outcome = "rolled_back"
        elif "in doubt" in message:
            tx.outcome = "in_doubt"
        elif "not confirmed" in message:
            tx.outcome = "timeout_dropped" if "never sent" in body else "timeout_maybe"
        else:
            tx.outcome = "error"
        self.counts[f"{tx.system}.tx_errors.{tx.outcome}"] += 1

    def event(self, client: str, body: dict[str, Any]) -> None:
        """A control-channel event one client got about its own session."""
        body = dict(body)
        body["client"] = client
        body["at"] = round(self.now(), 3)
        self.events.append(body)
        if body.get("event") == "DISCONNECT":
            for label in body.get("frames_lost") or ():
                self.reported_labels.add(str(label))

    def receive(self, consumer: str, message_id: str, session: int) -> None:
        """A consumer (an app) got the message ``message_id`` on its ``session``-th
        connection to the sidecar."""
        at = self.now()
        self.received[message_id].append((consumer, session, at))
        self.last_receive[consumer] = at
        if message_id not in self.sent:
            self.unknown_received[message_id] += 1

    def describe(self, message_id: str) -> str:
        """One line: what the producer saw of ``message_id`` and when it was received."""
        sent = self.sent.get(message_id)
        got = ", ".join(f"{c}#{k}@{t:.2f}" for c, k, t in self.received.get(message_id, ()))
        if sent is None:
            return f"never sent; received {got or 'never'}"
        answered = "-" if sent.answered_at is None else f"{sent.answered_at:.2f}"
        return (
            f"sent {sent.sent_at:.2f} (session {sent.session}), {sent.outcome} at {answered}"
            f"{' ' + repr(sent.detail) if sent.detail else ''}"
            f"{', in a DISCONNECT event' if sent.reported_lost else ''}; received {got or 'never'}"
        )

    # -- the invariants ----------------------------------------------------------------------

    def check(self) -> list[Violation]:
        """Apply the invariants to every message and transaction; returns the new violations
        (also appended to ``violations``).

        Per message id (``n`` = times an app received it):

        - ``n > 1``: **duplicated** (never allowed in transparent mode);
        - not in a transaction: confirmed and ``n == 0``: **lost**; ERROR saying "never sent
          and is dropped" and ``n == 1``: **dropped_but_delivered** (the ERROR lied); neither
          confirmed nor received: **unreported_loss** unless an ERROR named it or a
          DISCONNECT event listed it; never answered while the session stayed up:
          **unanswered**;
        - in a transaction: committed, every message ``n == 1`` (else **lost_in_commit**);
          aborted, rolled back or never committed (end frame dropped, session lost before the
          end): every ``n == 0`` (else **uncommitted_delivered**); outcome unknown (in doubt,
          timeout, session ended): all or nothing (else **partial_transaction**), and when
          nothing arrived it must have been reported (ERROR or DISCONNECT), else
          **unreported_loss**;
        - received but never sent: **phantom**.
        """
        found: list[Violation] = []

        def add(kind: str, detail: str, ids: tuple[str, ...]) -> None:
            found.append(Violation(kind, detail, ids, round(self.now(), 3)))

        for mid, sent in self.sent.items():
            sent.reported_lost = mid in self.reported_labels
            n = len(self.received.get(mid, ()))
            if n > 1:
                deliveries = self.received[mid]
                by = ", ".join(f"{c}#{k}@{t:.1f}" for c, k, t in deliveries)
                # A consumer whose session the sidecar ended starts afresh: the broker's
                # redeliveries are then new to it (a consequence of that other violation).
                kind = (
                    "duplicated_after_session_loss"
                    if len({(c, k) for c, k, _ in deliveries}) > 1
                    else "duplicated"
                )
                add(kind, f"{mid} received {n} times ({by}); {self.describe(mid)}", (mid,))
            if sent.tx is not None:
                continue
            if sent.outcome == "confirmed" and n == 0:
                add("lost", f"{mid} confirmed, never received; {self.describe(mid)}", (mid,))
            elif sent.outcome == "error_dropped" and n > 0:
                add(
                    "dropped_but_delivered",
                    f"{mid}: ERROR said never sent and dropped, yet received; {self.describe(mid)}",
                    (mid,),
                )
            elif sent.outcome == "unanswered":
                add("unanswered", f"{mid} ({sent.producer}) never answered, session up", (mid,))
            elif (
                sent.outcome in ("pending", "unanswered_at_close")
                and n == 0
                and not sent.reported_lost
            ):
                add(
                    "unreported_loss",
                    f"{mid} ({sent.producer}, sent {sent.sent_at:.1f}) unanswered when the "
                    "session ended, not received, not in any DISCONNECT event",
                    (mid,),
                )
        for txid, tx in self.txs.items():
            counts = [len(self.received.get(m, ())) for m in tx.ids]
            got = sum(1 for c in counts if c > 0)
            tx.reported_lost = f"{txid}.end" in self.reported_labels or any(
                self.sent[m].reported_lost for m in tx.ids
            )
            ids = tuple(tx.ids)
            if tx.outcome == "committed":
                if got < len(tx.ids):
                    missing = tuple(m for m, c in zip(tx.ids, counts, strict=True) if c == 0)
                    add("lost_in_commit", f"{txid} committed, {len(missing)} not received", missing)
            elif tx.outcome in ("aborted", "rolled_back", "timeout_dropped", "session_lost"):
                if got:
                    add(
                        "uncommitted_delivered",
                        f"{txid} {tx.outcome} ({tx.end or 'no end sent'}, started "
                        f"{tx.started_at:.1f} s, {tx.detail!r}) but {got} of {len(tx.ids)} "
                        f"received; {self.describe(tx.ids[0])}",
                        ids,
                    )
            elif tx.outcome == "open":
                continue  # never ended: the soak stopped inside it (not expected; see below)
            else:  # in_doubt, timeout_maybe, error, unanswered_at_close, unanswered
                if 0 < got < len(tx.ids):
                    add("partial_transaction", f"{txid} {tx.outcome}: {got}/{len(tx.ids)}", ids)
                if tx.outcome == "unanswered":
                    add("unanswered", f"{txid} end frame never answered, session up", ids)
                elif tx.outcome == "unanswered_at_close" and not got and not tx.reported_lost:
                    add(
                        "unreported_loss",
                        f"{txid} COMMIT unanswered when the session ended, nothing received, "
                        "not in any DISCONNECT event",
                        ids,
                    )
        for mid, n in self.unknown_received.items():
            add("phantom", f"{mid} received {n} times but never sent", (mid,))
        self.violations.extend(found)
        return found


# -- a small async STOMP client ----------------------------------------------------------------


class LinkClosed(Exception):
    """The connection is gone (EOF, reset, refused, or no CONNECTED)."""


class Pulse:
    """A re-armable trio event: ``fire()`` wakes every current waiter."""

    def __init__(self) -> None:
        self._event = trio.Event()

    def fire(self) -> None:
        self._event.set()
        self._event = trio.Event()

    async def wait(self, seconds: float) -> None:
        """Wait for the next ``fire()``, at most ``seconds``."""
        with trio.move_on_after(seconds):
            await self._event.wait()


class StompConnection:
    """STOMP 1.2 over a trio TCP stream, built on the sans-I/O ``protocol`` package.

    ``open()`` connects and waits for CONNECTED (heart-beats 0,0); ``send()`` is safe from
    several tasks; ``receive()`` returns the next frame (heart-beats skipped) or None at EOF.
    Errors of the transport become :class:`LinkClosed`.
    """

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.parser = protocol.FrameParser(protocol.Limits(max_frame_bytes=1 << 24), version="1.2")
        self._lock = trio.Lock()

    @classmethod
    async def open(
        cls, address: tuple[str, int], *, vhost: str = "/", connect_timeout: float = CLIENT_TIMEOUT
    ) -> StompConnection:
        """Connect to ``address`` and wait up to ``connect_timeout`` s for CONNECTED;
        LinkClosed else."""
        try:
            with trio.fail_after(connect_timeout):
                stream = await trio.open_tcp_stream(*address)
                conn = cls(stream)
                try:
                    await conn.send(
                        Frame.build(
                            Command.CONNECT,
                            {"accept-version": "1.2", "host": vhost, "heart-beat": "0,0"},
                        )
                    )
                    frame = await conn.receive()
                except BaseException:
                    await trio.aclose_forcefully(stream)
                    raise
        except (OSError, trio.TooSlowError) as exc:
            raise LinkClosed(f"connect to {address}: {exc!r}") from exc
        if frame is None or frame.command is not Command.CONNECTED:
            await trio.aclose_forcefully(stream)
            what = "EOF" if frame is None else f"{frame.command} {frame.get('message')!r}"
            raise LinkClosed(f"CONNECT to {address} answered {what}")
        return conn

    async def send(self, frame: Frame) -> None:
        """Write one frame; LinkClosed if the connection is gone."""
        data = protocol.serialize(frame, "1.2")
        try:
            async with self._lock:
                await self.stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            raise LinkClosed(repr(exc)) from exc

    async def receive(self) -> Frame | None:
        """The next frame, or None once the peer closed (or broke) the connection."""
        while True:
            try:
                event = self.parser.next_event()
            except protocol.RemoteProtocolError:
                return None
            if isinstance(event, Frame):
                return event
            if isinstance(event, protocol.ConnectionClosed):
                return None
            if isinstance(event, protocol.HeartBeat):
                continue
            try:
                data = await self.stream.receive_some(65536)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                return None
            self.parser.receive_data(data)

    async def aclose(self) -> None:
        """Close the socket (no DISCONNECT)."""
        await trio.aclose_forcefully(self.stream)


def _text(frame: Frame) -> str:
    return frame.body.decode("utf-8", "replace")


# -- apps ------------------------------------------------------------------------------------


class Producer:
    """An app that SENDs persistent messages with unique ids through a sidecar, pipelined.

    Plain: one SEND after another (``rate`` per second) to its queues in turn, each with
    ``receipt`` = the message id = the body. Transactional: BEGIN, 1-5 SENDs to random queues
    (each with a receipt), then COMMIT (ABORT one time in ten) with receipt ``<tx>.end``; one
    transaction at a time. ``polite``: send nothing between a RECONNECTING event and the next
    FAILOVER. A session that ends is reconnected (a new session) until ``stop``.
    """

    def __init__(
        self,
        name: str,
        system: str,
        address: tuple[str, int],
        queues: list[str],
        ledger: Ledger,
        *,
        rng: random.Random,
        rate: float,
        pipeline: int,
        transactional: bool = False,
        polite: bool = False,
        main: bool = True,
    ) -> None:
        self.name = name
        self.system = system
        self.address = address
        self.queues = queues
        self.ledger = ledger
        self.rng = rng
        self.interval = 1.0 / rate
        self.pipeline = pipeline
        self.transactional = transactional
        self.polite = polite
        self.main = main
        self.seq = 0
        self.tx_seq = 0
        self.sessions = 0
        self.done = trio.Event()
        self.pulse = Pulse()
        self.outstanding: dict[str, Sent] = {}
        self.tx_pending: dict[str, Tx] = {}
        self.open_tx: Tx | None = None
        self.paused = False
        self.closed = False
        self.said_goodbye = False
        self.disconnect_sent = False
        self.final_error = ""

    async def run(self, stop: trio.Event) -> None:
        """Produce until ``stop``, then collect the answers and DISCONNECT."""
        try:
            while not stop.is_set():
                try:
                    conn = await StompConnection.open(self.address)
                except LinkClosed as exc:
                    self.ledger.counts[f"{self.system}.connect_failed"] += 1
                    if self.main:
                        self.ledger.violation("connect_failed", f"{self.name}: {exc}")
                    await trio.sleep(0.5)
                    continue
                self.sessions += 1
                try:
                    await self._session(conn, stop)
                finally:
                    await conn.aclose()
                if self.disconnect_sent and not self.said_goodbye:
                    self.ledger.violation(
                        "disconnect_receipt_lost",
                        f"{self.name}: the sidecar closed the connection after DISCONNECT "
                        "without its RECEIPT"
                        if self.closed
                        else f"{self.name}: no RECEIPT for DISCONNECT within {ANSWER_TIMEOUT} s",
                    )
                elif self.closed and not self.said_goodbye:
                    self.ledger.counts[f"{self.system}.sessions_ended"] += 1
                    if self.main:
                        self.ledger.violation(
                            "session_ended",
                            f"{self.name} session {self.sessions} ended by the main sidecar: "
                            f"{self.final_error or 'closed'}",
                        )
                    await trio.sleep(0.2)
        finally:
            self.done.set()

    async def _session(self, conn: StompConnection, stop: trio.Event) -> None:
        self.outstanding, self.tx_pending, self.open_tx = {}, {}, None
        self.paused = self.closed = self.said_goodbye = self.disconnect_sent = False
        self.final_error = ""
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._read, conn)
                try:
                    await conn.send(
                        Frame.build(
                            Command.SUBSCRIBE,
                            {"destination": EVENTS, "id": "events", "ack": "auto"},
                        )
                    )
                    await self._produce(conn, stop)
                    await self._finish(conn)
                except LinkClosed:
                    pass
                nursery.cancel_scope.cancel()
        finally:
            self._account_leftovers()

    def _account_leftovers(self) -> None:
        at_close = self.closed and not self.said_goodbye
        for sent in self.outstanding.values():
            sent.outcome = "unanswered_at_close" if at_close else "unanswered"
        for tx in self.tx_pending.values():
            tx.outcome = "unanswered_at_close" if at_close else "unanswered"
        if self.open_tx is not None:
            self.open_tx.outcome = "session_lost"
        self.outstanding, self.tx_pending, self.open_tx = {}, {}, None

    async def _read(self, conn: StompConnection) -> None:
        while True:
            frame = await conn.receive()
            if frame is None:
                self.closed = True
                self.pulse.fire()
                return
            command = frame.command
            if command is Command.RECEIPT:
                self._answer(frame.get("receipt-id") or "", None, "")
            elif command is Command.ERROR:
                receipt = frame.get("receipt-id")
                message = frame.get("message") or ""
                if receipt is not None:
                    self._answer(receipt, message, _text(frame))
                else:
                    self.final_error = message
                    self.ledger.counts[f"{self.system}.session_errors"] += 1
                    log.info("%s: ERROR %s", self.name, message)
            elif command is Command.MESSAGE and frame.get("destination") == EVENTS:
                self._on_event(json.loads(frame.body))
            else:
                self.ledger.violation("unexpected_frame", f"{self.name} got {frame!r}")
            self.pulse.fire()

    def _answer(self, receipt: str, message: str | None, body: str) -> None:
        if receipt == "bye":
            self.said_goodbye = True
            return
        sent = self.outstanding.pop(receipt, None)
        if sent is not None:
            self.ledger.answer(sent, message, body)
            return
        tx = self.tx_pending.pop(receipt, None)
        if tx is not None:
            self.ledger.tx_answer(tx, message, body)
            return
        self.ledger.violation(
            "stray_answer", f"{self.name}: answer for unknown or answered receipt {receipt!r}"
        )

    def _on_event(self, body: dict[str, Any]) -> None:
        self.ledger.event(self.name, body)
        kind = body.get("event")
        if kind == "RECONNECTING":
            self.paused = self.polite
        elif kind == "FAILOVER":
            self.paused = False

    async def _gate(self, stop: trio.Event, *, in_tx: bool = False) -> bool:
        """Wait for room in the pipeline (and, if polite, a running session); False when the
        producer should stop (outside a transaction). LinkClosed when the session ended."""
        while True:
            if self.closed:
                raise LinkClosed("closed")
            if stop.is_set() and not in_tx:
                return False
            busy = len(self.outstanding) + len(self.tx_pending)
            if busy < self.pipeline and not self.paused:
                return True
            await self.pulse.wait(0.5)

    async def _produce(self, conn: StompConnection, stop: trio.Event) -> None:
        next_at = trio.current_time()
        while not stop.is_set():
            if self.transactional:
                await self._transaction(conn, stop)
            elif await self._gate(stop):
                await self._send(conn, self.queues[self.seq % len(self.queues)], None)
            now = trio.current_time()
            next_at = max(next_at + self.interval, now - 1.0)  # no catch-up burst after a stall
            with trio.move_on_at(next_at):
                await stop.wait()

    async def _send(self, conn: StompConnection, queue: str, tx: Tx | None) -> None:
        self.seq += 1
        if tx is None:
            mid = f"{self.name}-{self.seq}"
        else:
            mid = f"{tx.id}.{len(tx.ids)}"
            tx.ids.append(mid)
        sent = Sent(
            mid,
            self.system,
            self.name,
            queue,
            tx.id if tx else None,
            self.ledger.now(),
            self.sessions,
        )
        self.ledger.sent[mid] = sent
        self.outstanding[mid] = sent
        headers = {"destination": queue, "persistent": "true", "receipt": mid}
        if tx is not None:
            headers["transaction"] = tx.id
        await conn.send(Frame.build(Command.SEND, headers, mid.encode()))

    async def _transaction(self, conn: StompConnection, stop: trio.Event) -> None:
        if not await self._gate(stop):
            return
        self.tx_seq += 1
        tx = Tx(f"{self.name}-t{self.tx_seq}", self.system, self.name, self.ledger.now())
        self.ledger.txs[tx.id] = tx
        self.open_tx = tx
        await conn.send(Frame.build(Command.BEGIN, {"transaction": tx.id}))
        for _ in range(self.rng.randint(1, 5)):
            await self._gate(stop, in_tx=True)
            await self._send(conn, self.rng.choice(self.queues), tx)
        await self._gate(stop, in_tx=True)
        end = "ABORT" if self.rng.random() < 0.1 else "COMMIT"
        receipt = f"{tx.id}.end"
        tx.end = end
        self.tx_pending[receipt] = tx
        self.open_tx = None
        await conn.send(Frame.build(Command(end), {"transaction": tx.id, "receipt": receipt}))
        while receipt in self.tx_pending:  # one transaction at a time
            if self.closed:
                raise LinkClosed("closed")
            await self.pulse.wait(0.5)

    async def _finish(self, conn: StompConnection) -> None:
        """Stopping: wait (bounded) for every answer, then DISCONNECT with a receipt."""
        with trio.move_on_after(ANSWER_TIMEOUT):
            while (self.outstanding or self.tx_pending) and not self.closed:
                await self.pulse.wait(0.5)
        if self.closed:
            raise LinkClosed("closed")
        self.disconnect_sent = True
        await conn.send(Frame.build(Command.DISCONNECT, {"receipt": "bye"}))
        with trio.move_on_after(ANSWER_TIMEOUT):
            while not self.said_goodbye and not self.closed:
                await self.pulse.wait(0.5)


class Consumer:
    """An app consuming one queue through the main sidecar and recording every message id.

    ``ack``: ``client-individual`` (ACK each message at once), ``auto`` (no ACKs), or
    ``client`` (a cumulative ACK every 10 messages and after 0.25 s without one). A session
    that ends is a violation (transparent mode keeps it up); the consumer then subscribes
    again so the soak goes on.
    """

    def __init__(
        self,
        name: str,
        system: str,
        address: tuple[str, int],
        *,
        queue: str,
        ack: str,
        ledger: Ledger,
    ) -> None:
        self.name = name
        self.system = system
        self.address = address
        self.queue = queue
        self.ack = ack
        self.ledger = ledger
        self.conn: StompConnection | None = None
        self.closing = False
        self.said_goodbye = trio.Event()
        self.pulse = Pulse()
        self.last_ack: str | None = None
        self.unacked = 0
        self.sessions = 0
        self.count = 0
        self.finished = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Subscribe (``task_status.started()`` once the SUBSCRIBE is confirmed), then consume
        until :meth:`close`."""
        try:
            await self._run(task_status)
        finally:
            self.finished.set()

    async def _run(self, task_status: trio.TaskStatus[None]) -> None:
        started = False
        while not self.closing:
            try:
                conn = await StompConnection.open(self.address)
            except LinkClosed as exc:
                if not started:
                    raise SoakError(f"{self.name} cannot connect: {exc}") from exc
                self.ledger.violation("connect_failed", f"{self.name}: {exc}")
                await trio.sleep(0.5)
                continue
            self.sessions += 1
            self.conn = conn
            try:
                await conn.send(
                    Frame.build(Command.SUBSCRIBE, {"destination": EVENTS, "id": "events"})
                )
                await conn.send(
                    Frame.build(
                        Command.SUBSCRIBE,
                        {"destination": self.queue, "id": "q", "ack": self.ack, "receipt": "sub"},
                    )
                )
                async with trio.open_nursery() as nursery:
                    if self.ack == "client":
                        nursery.start_soon(self._flush_acks, conn)
                    if not started:
                        subscribed = await self._read_until_subscribed(conn)
                        if not subscribed:
                            raise SoakError(f"{self.name}: SUBSCRIBE not confirmed")
                        started = True
                        task_status.started()
                    await self._read(conn)
                    nursery.cancel_scope.cancel()
            except LinkClosed:
                pass
            finally:
                await conn.aclose()
            if self.said_goodbye.is_set():
                return
            if self.is_closing():  # set by close(), in another task
                self.ledger.violation(
                    "disconnect_receipt_lost",
                    f"{self.name}: the sidecar closed the connection after DISCONNECT without "
                    "its RECEIPT",
                )
                return
            self.ledger.violation("consumer_session_ended", f"{self.name} lost its session")
            await trio.sleep(0.2)

    def is_closing(self) -> bool:
        """Whether :meth:`close` was called."""
        return self.closing

    async def _read_until_subscribed(self, conn: StompConnection) -> bool:
        with trio.move_on_after(CLIENT_TIMEOUT):
            while True:
                frame = await conn.receive()
                if frame is None:
                    return False
                if frame.command is Command.RECEIPT and frame.get("receipt-id") == "sub":
                    return True
                await self._handle(conn, frame)
        return False

    async def _read(self, conn: StompConnection) -> None:
        while True:
            frame = await conn.receive()
            if frame is None:
                return
            await self._handle(conn, frame)
            if self.said_goodbye.is_set():
                return

    async def _handle(self, conn: StompConnection, frame: Frame) -> None:
        command = frame.command
        if command is Command.MESSAGE:
            if frame.get("destination") == EVENTS:
                self.ledger.event(self.name, json.loads(frame.body))
                return
            self.ledger.receive(self.name, _text(frame), self.sessions)
            self.count += 1
            self.pulse.fire()
            ack = frame.get("ack")
            if self.ack == "client-individual" and ack is not None:
                await conn.send(Frame.build(Command.ACK, {"id": ack}))
            elif self.ack == "client" and ack is not None:
                self.last_ack = ack
                self.unacked += 1
                if self.unacked >= 10:
                    await self._ack_now(conn)
        elif command is Command.RECEIPT and frame.get("receipt-id") == "bye":
            self.said_goodbye.set()
        elif command is Command.RECEIPT and frame.get("receipt-id") == "sub":
            pass  # a SUBSCRIBE made again after a lost session
        elif command is Command.ERROR:
            self.ledger.violation(
                "consumer_error", f"{self.name}: ERROR {frame.get('message')!r} {_text(frame)!r}"
            )
        else:
            self.ledger.violation("unexpected_frame", f"{self.name} got {frame!r}")

    async def _ack_now(self, conn: StompConnection) -> None:
        if self.last_ack is not None and self.unacked:
            ack, self.unacked = self.last_ack, 0
            await conn.send(Frame.build(Command.ACK, {"id": ack}))

    async def _flush_acks(self, conn: StompConnection) -> None:
        with contextlib.suppress(LinkClosed):
            while True:
                await trio.sleep(0.25)
                await self._ack_now(conn)

    async def close(self) -> None:
        """ACK what is held, DISCONNECT with a receipt and wait for it (bounded)."""
        self.closing = True
        conn = self.conn
        if conn is None:
            return
        with contextlib.suppress(LinkClosed):
            if self.ack == "client":
                await self._ack_now(conn)
            await conn.send(Frame.build(Command.DISCONNECT, {"receipt": "bye"}))
        with trio.move_on_after(ANSWER_TIMEOUT):
            await self.finished.wait()
        if not self.finished.is_set():
            self.ledger.violation("unanswered", f"{self.name}: DISCONNECT receipt never came")
            await conn.aclose()


# -- broker systems ---------------------------------------------------------------------------


def draw_params(kind: str, rng: random.Random, options: SoakOptions) -> dict[str, Any]:
    """The random parameters of one fault (drawn in the fault loop, so a seed fixes them)."""
    low, high = options.fault_seconds
    if kind in ("hang", "blackhole"):
        return {"seconds": round(rng.uniform(low, high), 2)}
    if kind == "slow":
        return {
            "seconds": round(rng.uniform(low, high + 2.0), 2),
            "delay_s": round(rng.uniform(0.01, 0.25), 3),
            "bytes_per_s": rng.choice([16_384, 65_536, 262_144]),
        }
    if kind == "cut":
        return {"after_bytes": rng.randint(1, 30_000)}
    return {}


class System:
    """A broker system under test: brokers, fault proxies, sidecars, queues."""

    name = ""
    tag = ""
    transaction_failover = "replay"

    def __init__(self, workdir: Path, ack_modes: tuple[str, ...] = ACK_MODES) -> None:
        self.workdir = workdir
        self.proxies: list[FaultProxy] = []
        self.main: SidecarThread | None = None
        self.impatient: SidecarThread | None = None
        self.ack_modes = ack_modes
        short = {"client-individual": "ind", "auto": "auto", "client": "cli"}
        self.queues = [f"/queue/chaos-{self.tag}-{short[mode]}" for mode in ack_modes]

    def start(self) -> None:
        """Start the brokers and their proxies (blocking)."""
        raise NotImplementedError

    def brokers_url(self) -> str:
        """The sidecars' ``brokers`` setting (through the proxies)."""
        raise NotImplementedError

    def healthy(self) -> bool:
        """True when the brokers are as they should be between faults (blocking)."""
        raise NotImplementedError

    def direct_address(self) -> tuple[str, int]:
        """The live broker's own STOMP address (no proxy), for the final leftover scan."""
        raise NotImplementedError

    def inject(self, kind: str, params: dict[str, Any]) -> None:
        """Inject one fault and undo it (blocking; run in a worker thread). Adds measured
        values to ``params``. Raises SoakError if the test bed does not recover."""
        raise NotImplementedError

    def stop(self) -> None:
        """Stop everything this system started (idempotent)."""
        raise NotImplementedError

    def start_sidecars(self, options: SoakOptions) -> None:
        """Start the main and the impatient sidecar in front of the proxies."""
        hb = f"{options.heartbeat_ms},{options.heartbeat_ms}"
        common = {
            "upstream_heartbeat": hb,
            "retry_interval": "50",
            "max_retry_interval": "500",
            "failover_mode": "transparent",
            "transaction_failover": self.transaction_failover,
            "drain_timeout": "3000",
        }
        self.main = SidecarThread(
            sidecar_config(
                self.brokers_url(),
                connect_timeout="2000",
                reconnect_attempts="-1",
                reconnect_period="0",
                **common,
            )
        ).__enter__()
        self.impatient = SidecarThread(
            sidecar_config(
                self.brokers_url(),
                connect_timeout="1000",
                reconnect_period="4000",
                call_timeout=str(options.impatient_call_timeout_ms),
                initial_connect_attempts="2",
                **common,
            )
        ).__enter__()

    def stop_sidecars(self) -> None:
        for sidecar in (self.impatient, self.main):
            if sidecar is not None:
                with contextlib.suppress(Exception):
                    sidecar.stop()
        self.main = self.impatient = None

    def _proxied(self, port: int) -> FaultProxy:
        proxy = FaultProxy(("127.0.0.1", port)).__enter__()
        self.proxies.append(proxy)
        return proxy

    def _link_fault(self, proxy: FaultProxy, kind: str, params: dict[str, Any]) -> None:
        if kind == "blackhole":
            proxy.blackhole()
            try:
                time.sleep(params["seconds"])
            finally:
                proxy.pass_through()
        elif kind == "reset":
            proxy.reset()
        elif kind == "slow":
            proxy.slow(params["delay_s"], params["bytes_per_s"])
            try:
                time.sleep(params["seconds"])
            finally:
                proxy.pass_through()
        elif kind == "cut":
            proxy.cut_after(params["after_bytes"])
        else:
            raise ValueError(kind)

    def _close_proxies(self) -> None:
        for proxy in self.proxies:
            with contextlib.suppress(Exception):
                proxy.close()
        self.proxies = []


class ActiveMQSystem(System):
    """An ActiveMQ shared-store pair, each broker behind a fault proxy; ``replay`` mode."""

    name = "activemq"
    tag = "amq"
    transaction_failover = "replay"

    def __init__(self, workdir: Path, ack_modes: tuple[str, ...] = ACK_MODES) -> None:
        super().__init__(workdir, ack_modes)
        self.brokers: list[ActiveMQ] = []

    def start(self) -> None:
        primary, backup = start_activemq_pair(
            self.workdir, name="chaos", lock_sleep_ms=200, timeout=BROKER_TIMEOUT
        )
        self.brokers = [primary, backup]
        for broker in self.brokers:
            self._proxied(broker.stomp_port)

    def brokers_url(self) -> str:
        a, b = (p.port for p in self.proxies)
        return f"failover:(stomp://127.0.0.1:{a},stomp://127.0.0.1:{b})"

    def live_index(self) -> int | None:
        """Index of the broker that serves (its log says started), or None."""
        for i, broker in enumerate(self.brokers):
            if broker.is_started():
                return i
        return None

    def healthy(self) -> bool:
        live = self.live_index()
        return live is not None and self.brokers[1 - live].is_backup_waiting()

    def direct_address(self) -> tuple[str, int]:
        live = self.live_index()
        if live is None:
            raise SoakError("no live ActiveMQ broker")
        return (self.brokers[live].host, self.brokers[live].stomp_port)

    def inject(self, kind: str, params: dict[str, Any]) -> None:
        live = self.live_index()
        if live is None:
            raise SoakError("no live ActiveMQ broker before the fault")
        broker, other = self.brokers[live], self.brokers[1 - live]
        params["target"] = broker.name
        if kind == "kill":
            killed = time.monotonic()
            broker.kill()
            try:
                wait_stomp(other.host, other.stomp_port, timeout=BROKER_TIMEOUT)
                params["takeover_s"] = round(time.monotonic() - killed, 3)
                broker.start()
                broker.wait_backup(BROKER_TIMEOUT)
            except (BrokerError, TimeoutError) as exc:
                raise SoakError(f"ActiveMQ did not recover from kill -9: {exc}") from exc
        elif kind == "hang":
            broker.suspend()
            try:
                time.sleep(params["seconds"])
            finally:
                broker.resume()
        else:
            self._link_fault(self.proxies[live], kind, params)

    def stop(self) -> None:
        self._close_proxies()
        for broker in reversed(self.brokers):  # the backup first: no pointless takeover
            if not broker.is_started():
                broker.stop()
        for broker in self.brokers:
            broker.stop()


class RabbitMQSystem(System):
    """One RabbitMQ node behind a fault proxy (reattach only); ``rollback`` mode."""

    name = "rabbitmq"
    tag = "rmq"
    transaction_failover = "rollback"

    def __init__(self, workdir: Path, ack_modes: tuple[str, ...] = ACK_MODES) -> None:
        super().__init__(workdir, ack_modes)
        self.node = RabbitMQ("chaos-rmq", workdir)

    def start(self) -> None:
        self.node.start()

    def wait_started(self) -> None:
        """Wait for the node started by :meth:`start` (it starts slowly: overlap it)."""
        self.node.wait_ready(BROKER_TIMEOUT)
        self._proxied(self.node.stomp_port)

    def brokers_url(self) -> str:
        return f"stomp://127.0.0.1:{self.proxies[0].port}?host=/"

    def healthy(self) -> bool:
        if not self.node.running():
            return False
        try:
            wait_stomp(self.node.host, self.node.stomp_port, timeout=5.0)
        except TimeoutError:
            return False
        return True

    def direct_address(self) -> tuple[str, int]:
        return (self.node.host, self.node.stomp_port)

    def inject(self, kind: str, params: dict[str, Any]) -> None:
        if kind == "kill":
            killed = time.monotonic()
            self.node.kill()
            try:
                self.node.start()
                self.node.wait_ready(BROKER_TIMEOUT)
            except BrokerError as exc:
                raise SoakError(f"RabbitMQ did not restart after kill -9: {exc}") from exc
            params["restart_s"] = round(time.monotonic() - killed, 3)
        elif kind == "hang":
            self.node.suspend()
            try:
                time.sleep(params["seconds"])
            finally:
                self.node.resume()
        else:
            self._link_fault(self.proxies[0], kind, params)

    def stop(self) -> None:
        self._close_proxies()
        self.node.stop()


# -- the engine ------------------------------------------------------------------------------


@dataclass
class SoakReport:
    """Figures and violations of one soak; ``ok`` when there is no violation.

    ``figures`` is JSON-able: ``faults`` (per system and kind), ``messages`` (sent, confirmed,
    received, lost, duplicated, errors by kind, reported lost...), ``transactions`` (by
    outcome), ``events`` (RECONNECTING/FAILOVER/DISCONNECT seen by apps, outage figures),
    ``duration_s``. ``fault_log``: every fault with its parameters and recovery time.
    """

    options: dict[str, Any]
    figures: dict[str, Any]
    violations: list[Violation]
    fault_log: list[FaultRecord]
    workdir: str

    @property
    def ok(self) -> bool:
        return not self.violations

    def violation_counts(self) -> dict[str, int]:
        """How many violations of each kind."""
        return dict(Counter(v.kind for v in self.violations))

    def to_json(self) -> dict[str, Any]:
        """The whole report as JSON-able data (violations capped per kind)."""
        shown: Counter[str] = Counter()
        examples = []
        for v in self.violations:
            shown[v.kind] += 1
            if shown[v.kind] <= MAX_EXAMPLES:
                examples.append(
                    {"kind": v.kind, "detail": v.detail, "ids": list(v.ids), "at": v.at}
                )
        return {
            "ok": self.ok,
            "options": self.options,
            "figures": self.figures,
            "violation_counts": self.violation_counts(),
            "violations": examples,
            "faults": [
                {
                    "system": f.system,
                    "kind": f.kind,
                    "params": f.params,
                    "started_at": round(f.started_at, 3),
                    "ended_at": None if f.ended_at is None else round(f.ended_at, 3),
                    "recovered_after": f.recovered_after,
                }
                for f in self.fault_log
            ],
            "workdir": self.workdir,
        }

    def summary(self) -> str:
        """The figures as a few lines of text (what the CLI prints)."""
        f = self.figures
        m, t, e = f["messages"], f["transactions"], f["events"]
        faults = ", ".join(
            f"{system}: " + " ".join(f"{k}={n}" for k, n in sorted(kinds.items()))
            for system, kinds in sorted(f["faults"].items())
        )
        lines = [
            f"chaos soak seed={self.options['seed']} minutes={self.options['minutes']} "
            f"duration={f['duration_s']:.0f}s -> {'OK' if self.ok else 'VIOLATIONS'}",
            f"faults injected: {f['faults_total']} ({faults})",
            f"messages: sent={m['sent']} (in transactions {m['sent_in_transactions']}) "
            f"confirmed (plain SENDs)={m['confirmed']} received={m['received']} "
            f"deliveries={m['deliveries']} lost={m['lost']} duplicated={m['duplicated']} "
            f"(+{m['duplicated_after_session_loss']} after a consumer session loss) "
            f"errors={m['errors']} reported_lost={m['reported_lost']} "
            f"unanswered_at_close={m['unanswered_at_close']} left_on_broker={m['left_on_broker']}",
            "transactions: " + " ".join(f"{k}={n}" for k, n in sorted(t.items())),
            f"events: RECONNECTING={e['RECONNECTING']} FAILOVER={e['FAILOVER']} "
            f"(reattached={e['reattached']}, failed over={e['failed_over']}) "
            f"DISCONNECT={e['DISCONNECT']} max_outage_ms={e['max_outage_ms']} "
            f"median_outage_ms={e['median_outage_ms']} hidden duplicates={e['duplicates_hidden']} "
            f"redeliveries={e['redeliveries_hidden']}",
        ]
        for system, per in sorted(f["per_system"].items()):
            lines.append(
                f"  {system}: sent={per['sent']} confirmed={per['confirmed']} "
                f"received={per['received']} lost={per['lost']} duplicated={per['duplicated']} "
                f"failovers={per['failovers']} disconnects={per['disconnects']}"
            )
        if self.violations:
            lines.append(f"violations: {self.violation_counts()}")
            for v in self.violations[:20]:
                lines.append(f"  [{v.kind}] at {v.at:.1f}s: {v.detail}")
        return "\n".join(lines)


class Engine:
    """Runs the workload and the fault loops in one trio loop, then checks the ledger."""

    def __init__(self, options: SoakOptions, systems: list[System]) -> None:
        self.options = options
        self.systems = systems
        self.ledger = Ledger()
        self.rng = random.Random(options.seed)
        self.producers: dict[str, list[Producer]] = {}
        self.consumers: dict[str, list[Consumer]] = {}
        self.stats: dict[str, Any] = {}

    def _clients(self, system: System) -> None:
        assert system.main is not None
        assert system.impatient is not None
        main, impatient = system.main.address, system.impatient.address
        tag, opts, ledger = system.tag, self.options, self.ledger
        self.consumers[system.name] = [
            Consumer(
                f"{tag}.C-{q.rsplit('-', 1)[1]}", system.name, main, queue=q, ack=ack, ledger=ledger
            )
            for q, ack in zip(system.queues, system.ack_modes, strict=True)
        ]

        def rng() -> random.Random:
            return random.Random(self.rng.getrandbits(64))

        producers = [
            Producer(
                f"{tag}.P-{q.rsplit('-', 1)[1]}",
                system.name,
                main,
                [q],
                ledger,
                rng=rng(),
                rate=opts.rate,
                pipeline=opts.pipeline,
            )
            for q in system.queues
        ]
        producers.append(
            Producer(
                f"{tag}.T",
                system.name,
                main,
                system.queues,
                ledger,
                rng=rng(),
                rate=opts.tx_rate,
                pipeline=opts.pipeline,
                transactional=True,
            )
        )
        producers.append(
            Producer(
                f"{tag}.X",
                system.name,
                impatient,
                system.queues,
                ledger,
                rng=rng(),
                rate=opts.rate / 2,
                pipeline=opts.pipeline,
                polite=True,
                main=False,
            )
        )
        producers.append(
            Producer(
                f"{tag}.Y",
                system.name,
                impatient,
                system.queues,
                ledger,
                rng=rng(),
                rate=opts.tx_rate,
                pipeline=opts.pipeline,
                transactional=True,
                polite=True,
                main=False,
            )
        )
        self.producers[system.name] = producers

    async def run(self) -> None:
        """The whole soak: clients up, faults until the deadline, stop, drain, scan, check."""
        opts = self.options
        for system in self.systems:
            self._clients(system)
        stop = trio.Event()
        hard_deadline = trio.current_time() + opts.minutes * 60 + 900
        with trio.move_on_at(hard_deadline) as hard:
            async with trio.open_nursery() as nursery:
                for consumers in self.consumers.values():
                    for consumer in consumers:
                        await nursery.start(consumer.run)
                for producers in self.producers.values():
                    for producer in producers:
                        nursery.start_soon(producer.run, stop)
                await trio.sleep(1.0)  # traffic flowing before the first fault
                deadline = trio.current_time() + opts.minutes * 60
                async with trio.open_nursery() as faults:
                    for system in self.systems:
                        seed = self.rng.getrandbits(64)
                        faults.start_soon(self._fault_loop, system, random.Random(seed), deadline)
                log.info("%.1f s: fault phase over; stopping producers", self.ledger.now())
                stop.set()
                for producers in self.producers.values():
                    for producer in producers:
                        await producer.done.wait()
                await self._drain()
                await self._snapshot_statistics()
                for consumers in self.consumers.values():
                    for consumer in consumers:
                        await consumer.close()
                nursery.cancel_scope.cancel()
            await self._scan_leftovers()
        if hard.cancelled_caught:
            self.ledger.violation("soak_hung", "the soak did not finish within its hard deadline")
        self.ledger.check()

    async def _fault_loop(self, system: System, rng: random.Random, deadline: float) -> None:
        opts = self.options
        plan = list(opts.kinds)
        rng.shuffle(plan)
        injected = 0
        while injected < opts.max_faults:
            gap = rng.uniform(*opts.gap)
            if plan:
                kind = plan[0]
            else:
                weights = [FAULT_WEIGHTS[k] for k in opts.kinds]
                kind = rng.choices(opts.kinds, weights)[0]
                if trio.current_time() + gap + FAULT_BUDGET[kind] > deadline:
                    break
            await trio.sleep(gap)
            if plan:
                plan.pop(0)
            params = draw_params(kind, rng, opts)
            record = FaultRecord(system.name, kind, params, self.ledger.now())
            log.info("%.1f s: %s %s %s", record.started_at, system.name, kind, params)
            try:
                await trio.to_thread.run_sync(system.inject, kind, params)
            finally:
                record.ended_at = self.ledger.now()
                self.ledger.faults.append(record)
            injected += 1
            record.recovered_after = await self._wait_recovered(system, record)

    async def _wait_recovered(self, system: System, record: FaultRecord) -> float | None:
        """Seconds until the system works again after ``record`` (bounded); None (and a
        violation) if it does not within ``recovery_timeout``."""
        assert system.main is not None
        since = self.ledger.now()
        deadline = trio.current_time() + self.options.recovery_timeout
        main_producers = [p for p in self.producers[system.name] if p.main]
        consumers = self.consumers[system.name]
        waiting: list[str] = []
        while trio.current_time() < deadline:
            healthy = await trio.to_thread.run_sync(system.healthy)
            stats = await trio.to_thread.run_sync(system.main.statistics)
            waiting = [
                f"session {s.session_id} {s.state}" for s in stats.sessions if s.state != "running"
            ]
            if not healthy:
                waiting.append("brokers not healthy")
            waiting += [
                p.name
                for p in main_producers
                if not p.transactional and self.ledger.last_confirm.get(p.name, -1.0) <= since
            ]
            waiting += [
                c.name for c in consumers if self.ledger.last_receive.get(c.name, -1.0) <= since
            ]
            if not waiting:
                return round(self.ledger.now() - since, 3)
            await trio.sleep(0.25)
        self.ledger.violation(
            "not_recovered",
            f"{system.name} after {record.kind} {record.params} (ended at {since:.1f} s): "
            f"still waiting for {waiting} after {self.options.recovery_timeout:.0f} s",
        )
        return None

    def _expected(self) -> set[str]:
        expected = {
            m for m, s in self.ledger.sent.items() if s.tx is None and s.outcome == "confirmed"
        }
        for tx in self.ledger.txs.values():
            if tx.outcome == "committed":
                expected.update(tx.ids)
        return expected

    async def _drain(self) -> None:
        """Wait until every confirmed message arrived and nothing new came for ``quiet`` s
        (bounded by ``drain_timeout``)."""
        opts = self.options
        missing = [m for m in self._expected() if m not in self.ledger.received]
        log.info(
            "%.1f s: draining, %d expected messages not received yet",
            self.ledger.now(),
            len(missing),
        )
        deadline = trio.current_time() + opts.drain_timeout
        while trio.current_time() < deadline:
            missing = [m for m in missing if m not in self.ledger.received]
            last = max(self.ledger.last_receive.values(), default=0.0)
            if not missing and self.ledger.now() - last >= opts.quiet:
                log.info("%.1f s: drained", self.ledger.now())
                return
            await trio.sleep(0.2)
        log.warning("drain ended with %d expected messages missing: %s", len(missing), missing[:20])

    async def _snapshot_statistics(self) -> None:
        for system in self.systems:
            for role, sidecar in (("main", system.main), ("impatient", system.impatient)):
                if sidecar is None:
                    continue
                stats = await trio.to_thread.run_sync(sidecar.statistics)
                self.stats[f"{system.name}.{role}"] = {
                    "sessions": len(stats.sessions),
                    "failovers": sum(s.failovers for s in stats.sessions),
                    "duplicates_hidden": sum(s.duplicates_hidden for s in stats.sessions),
                    "redeliveries_hidden": sum(s.redeliveries_hidden for s in stats.sessions),
                    "out_of_order": sum(
                        s.window.out_of_order for s in stats.sessions if s.window is not None
                    ),
                }

    async def _scan_leftovers(self) -> None:
        """Read what is still on each live broker, directly (no sidecar, no proxy)."""
        for system in self.systems:
            try:
                address = await trio.to_thread.run_sync(system.direct_address)
                conn = await StompConnection.open(address)
            except (SoakError, LinkClosed) as exc:
                self.ledger.violation("scan_failed", f"{system.name}: {exc}")
                continue
            queues = list(system.queues)
            if system.name == "activemq":
                queues.append("/queue/ActiveMQ.DLQ")
            try:
                for i, queue in enumerate(queues):
                    await conn.send(
                        Frame.build(Command.SUBSCRIBE, {"destination": queue, "id": f"s{i}"})
                    )
                with trio.move_on_after(60.0):
                    while True:
                        frame: Frame | None = None
                        with trio.move_on_after(3.0):
                            frame = await conn.receive()
                        if frame is None or frame.command is not Command.MESSAGE:
                            break
                        self.ledger.leftover[_text(frame)].append(frame.get("destination") or "")
            finally:
                await conn.aclose()


def _figures(engine: Engine, duration: float) -> dict[str, Any]:
    ledger = engine.ledger
    faults: dict[str, Counter[str]] = defaultdict(Counter)
    for f in ledger.faults:
        faults[f.system][f.kind] += 1
    violations = Counter(v.kind for v in ledger.violations)
    plain = [s for s in ledger.sent.values() if s.tx is None]
    outcomes = Counter(s.outcome for s in plain)
    deliveries = sum(len(v) for v in ledger.received.values())
    # Extra deliveries of one message to one consumer session (what transparent mode
    # forbids), and those to a consumer's later session after the sidecar ended its first.
    duplicated = sum(
        len(v) - len({(c, k) for c, k, _ in v}) for v in ledger.received.values() if len(v) > 1
    )
    after_loss = sum(len(v) - 1 for v in ledger.received.values() if len(v) > 1) - duplicated
    main = {p.name for ps in engine.producers.values() for p in ps if p.main}
    by_sidecar: dict[str, Counter[str]] = {"main": Counter(), "impatient": Counter()}
    for s in plain:
        by_sidecar["main" if s.producer in main else "impatient"][s.outcome] += 1
    errors = sum(n for o, n in outcomes.items() if o.startswith("error"))
    tx_outcomes = Counter(tx.outcome for tx in ledger.txs.values())
    kinds = Counter(e.get("event") for e in ledger.events)
    failovers = [e for e in ledger.events if e.get("event") == "FAILOVER"]
    outages = sorted(int(e.get("outage_ms") or 0) for e in failovers)
    per_session: dict[tuple[str, str], tuple[int, int]] = {}
    for e in failovers:
        key = (e["client"], str(e.get("session_id")))
        per_session[key] = (
            int(e.get("duplicates_hidden") or 0),
            int(e.get("redeliveries_hidden") or 0),
        )
    left = dict(ledger.leftover)
    per_system: dict[str, dict[str, int]] = {}
    for system in engine.systems:
        name = system.name
        sent = [s for s in ledger.sent.values() if s.system == name]
        ids = {s.id for s in sent}
        per_system[name] = {
            "sent": len(sent),
            "confirmed": sum(1 for s in sent if s.outcome == "confirmed"),
            "received": sum(1 for m in ids if m in ledger.received),
            "lost": sum(
                1
                for v in ledger.violations
                if v.kind in ("lost", "lost_in_commit")
                for m in v.ids
                if m in ids
            ),
            "duplicated": sum(
                len(ledger.received[m]) - len({(c, k) for c, k, _ in ledger.received[m]})
                for m in ids
                if len(ledger.received.get(m, ())) > 1
            ),
            "failovers": sum(1 for e in failovers if e["client"].startswith(system.tag + ".")),
            "disconnects": sum(
                1
                for e in ledger.events
                if e.get("event") == "DISCONNECT" and e["client"].startswith(system.tag + ".")
            ),
        }
    lost = sum(len(v.ids) for v in ledger.violations if v.kind in ("lost", "lost_in_commit"))
    return {
        "duration_s": round(duration, 1),
        "faults_total": len(ledger.faults),
        "faults": {s: dict(c) for s, c in faults.items()},
        "recovery_s_max": max((f.recovered_after or 0.0 for f in ledger.faults), default=0.0),
        "messages": {
            "sent": len(ledger.sent),
            "sent_plain": len(plain),
            "sent_in_transactions": len(ledger.sent) - len(plain),
            "confirmed": outcomes["confirmed"],
            "received": len(ledger.received),
            "deliveries": deliveries,
            "lost": lost,
            "duplicated": duplicated,
            "duplicated_after_session_loss": after_loss,
            "plain_outcomes_by_sidecar": {k: dict(v) for k, v in by_sidecar.items()},
            "errors": errors,
            "errors_by_kind": {o: n for o, n in outcomes.items() if o.startswith("error")},
            "reported_lost": sum(1 for s in ledger.sent.values() if s.reported_lost),
            "unanswered_at_close": outcomes["unanswered_at_close"],
            "unanswered": outcomes["unanswered"],
            "left_on_broker": len(left),
            "left_on_broker_received": sum(1 for m in left if m in ledger.received),
        },
        "transactions": {"started": len(ledger.txs), **dict(tx_outcomes)},
        "events": {
            "RECONNECTING": kinds["RECONNECTING"],
            "FAILOVER": kinds["FAILOVER"],
            "DISCONNECT": kinds["DISCONNECT"],
            "reattached": sum(1 for e in failovers if e.get("reattached")),
            "failed_over": sum(1 for e in failovers if not e.get("reattached")),
            "max_outage_ms": outages[-1] if outages else 0,
            "median_outage_ms": outages[len(outages) // 2] if outages else 0,
            "duplicates_hidden": sum(d for d, _ in per_session.values()),
            "redeliveries_hidden": sum(r for _, r in per_session.values()),
            "transactions_replayed": sum(
                len(e.get("transactions_replayed") or ()) for e in failovers
            ),
            "transactions_rolled_back": sum(
                len(e.get("transactions_rolled_back") or ()) for e in failovers
            ),
            "transactions_in_doubt": sum(
                len(e.get("transactions_in_doubt") or ()) for e in failovers
            ),
        },
        "per_system": per_system,
        "sidecar_statistics": engine.stats,
        "counts": dict(ledger.counts),
        "violations": dict(violations),
    }


@contextlib.contextmanager
def _workdir(options: SoakOptions) -> Iterator[Path]:
    if options.workdir is not None:
        options.workdir.mkdir(parents=True, exist_ok=True)
        yield options.workdir
    else:
        with tempfile.TemporaryDirectory(prefix="chaos-soak-") as tmp:
            yield Path(tmp)


def run_soak(options: SoakOptions) -> SoakReport:
    """Start the brokers, proxies and sidecars, run the soak, stop everything; the report.

    Blocking (runs its own ``trio.run``). Raises SoakError when the test bed fails (a broker
    does not start, take over or restart in time): that is not a sidecar finding.
    """
    started = time.monotonic()
    with _workdir(options) as workdir:
        systems: list[System] = []
        try:
            rabbit: RabbitMQSystem | None = None
            if "rabbitmq" in options.systems:
                rabbit = RabbitMQSystem(workdir, options.ack_modes)
                systems.append(rabbit)
                rabbit.start()  # overlaps its slow start with the ActiveMQ pair's
            if "activemq" in options.systems:
                amq = ActiveMQSystem(workdir, options.ack_modes)
                systems.insert(0, amq)
                amq.start()
            if rabbit is not None:
                rabbit.wait_started()
            for system in systems:
                system.start_sidecars(options)
            log.info("test bed up after %.1f s", time.monotonic() - started)
            engine = Engine(options, systems)
            try:
                trio.run(engine.run)
            except BaseExceptionGroup as group:  # a task's SoakError, out of the nursery
                found = group.subgroup(SoakError)
                if found is None:
                    raise
                first = found.exceptions[0]
                while isinstance(first, BaseExceptionGroup):
                    first = first.exceptions[0]
                raise first from group
        except BrokerError as exc:
            raise SoakError(f"test bed: {exc}") from exc
        finally:
            for system in systems:
                system.stop_sidecars()
            for system in systems:
                system.stop()
        duration = time.monotonic() - started
        report = SoakReport(
            options={
                "minutes": options.minutes,
                "seed": options.seed,
                "systems": list(options.systems),
                "kinds": list(options.kinds),
                "rate": options.rate,
                "tx_rate": options.tx_rate,
                "heartbeat_ms": options.heartbeat_ms,
                "ack_modes": list(options.ack_modes),
                "impatient_call_timeout_ms": options.impatient_call_timeout_ms,
            },
            figures=_figures(engine, duration),
            violations=list(engine.ledger.violations),
            fault_log=list(engine.ledger.faults),
            workdir=str(workdir),
        )
        if options.json_path is not None:
            options.json_path.write_text(json.dumps(report.to_json(), indent=2, sort_keys=True))
        return report


def main(argv: list[str] | None = None) -> int:
    """CLI: run a soak, print the figures, write the JSON summary; exit 1 on violations."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.chaos.soak", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--minutes", type=float, default=10.0, help="length of the fault phase")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="activemq,rabbitmq")
    parser.add_argument("--kinds", default=",".join(FAULT_KINDS), help="fault kinds to inject")
    parser.add_argument("--rate", type=float, default=20.0, help="SENDs/s per plain producer")
    parser.add_argument("--gap", default="3,12", help="min,max seconds between faults")
    parser.add_argument("--ack-modes", default=",".join(ACK_MODES), help="consumer ack modes")
    parser.add_argument(
        "--impatient-call-timeout", type=int, default=1500, help="ms (call_timeout)"
    )
    parser.add_argument("--json", type=Path, default=None, help="summary (WORKDIR/chaos-soak.json)")
    parser.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="broker files, logs and the summary (default: a new directory under the temp dir)",
    )
    parser.add_argument("--log", type=Path, default=None, help="log file (WORKDIR/soak.log)")
    args = parser.parse_args(argv)
    gap_low, gap_high = (float(x) for x in args.gap.split(","))
    workdir = args.workdir or Path(tempfile.gettempdir()) / (
        f"chaos-soak-{args.seed}-{time.strftime('%Y%m%d-%H%M%S')}"
    )
    json_path = args.json or workdir / "chaos-soak.json"
    log_path = args.log or workdir / "soak.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(
        filename=log_path,
        level=logging.INFO,
        format="%(asctime)s %(threadName)s %(name)s %(levelname)s %(message)s",
    )
    console = logging.StreamHandler(sys.stderr)
    console.setLevel(logging.INFO)
    logging.getLogger("chaos").addHandler(console)
    options = SoakOptions(
        minutes=args.minutes,
        seed=args.seed,
        systems=tuple(s for s in args.systems.split(",") if s),
        kinds=tuple(k for k in args.kinds.split(",") if k),
        rate=args.rate,
        gap=(gap_low, gap_high),
        ack_modes=tuple(m for m in args.ack_modes.split(",") if m),
        impatient_call_timeout_ms=args.impatient_call_timeout,
        workdir=workdir,
        json_path=json_path,
    )
    report = run_soak(options)
    print(report.summary())
    print(f"JSON summary: {json_path}; log: {log_path}; broker files: {workdir}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
