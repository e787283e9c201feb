"""The drain on SIGTERM against real brokers (docs/behaviour.md, "Drain on SIGTERM"): a producer
pipelines persistent SENDs with receipts through the sidecar, the sidecar is told to shut down
in the middle of it, and afterwards the queue is read directly from the broker.

What must hold:

- every SEND the app got a RECEIPT for is on the broker;
- every message on the broker had its RECEIPT passed to the app, or was named to the app as in
  doubt (outcome ``unknown``) in an OUTCOME event;
- with a broker that stops answering, every frame still unconfirmed at ``drain_timeout`` is
  named to the app by its receipt id and ``mq-sidecar-id``: in an OUTCOME event, the final
  ERROR and the log of a sidecar that got a real SIGTERM (and exits 0);
- a session reconnecting at SIGTERM goes on trying, and hands over the RECEIPTs of its replay.

The numbers (receipts handed over during the drain, frames named) are printed (``-s``): see
docs/results.md, "Drain on SIGTERM".
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from prometheus_client import generate_latest

import protocol
from config import Config
from testbed import ActiveMQ, BrokerProcess, RabbitMQ
from testbed.sidecar import SidecarProcess
from tests.faultproxy import FaultProxy
from tests.integration.support import (
    WAIT,
    RawClient,
    SidecarThread,
    sidecar_config,
    unique,
    wait_until,
)

#: The control channel's destination.
EVENTS = "/mq-sidecar/events"
#: SENDs a producer writes at most (bounds the test whatever the broker's speed).
MAX_SENDS = 20_000
#: Receipts the producer must have had before the shutdown starts (load is flowing).
RECEIPTS_BEFORE_SHUTDOWN = 300
#: SENDs the producer has written and not had answered at most (its own send window).
IN_FLIGHT = 200


@dataclass
class Producer:
    """One app connection that pipelines persistent SENDs with receipts (``p-<n>``, body
    ``<n>``) from a writer thread, at most :data:`IN_FLIGHT` unanswered, while a reader thread
    records every frame it gets back."""

    address: tuple[str, int]
    destination: str
    frames: list[protocol.Frame] = field(default_factory=list)
    sent: int = 0
    answered: int = 0  # RECEIPTs and ERRORs
    _answered: threading.Event = field(default_factory=threading.Event)
    closed: threading.Event = field(default_factory=threading.Event)
    stop_writing: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.raw = RawClient(self.address)
        self.raw.connect(**{"heart-beat": "0,0"})
        self.raw.send_frame(
            "SUBSCRIBE", {"destination": EVENTS, "id": "events", "ack": "auto", "receipt": "ev"}
        )
        answer = self.raw.frame()
        assert answer.get("receipt-id") == "ev", answer
        self.sock, self.parser = self.raw.sock, self.raw.parser

    def start(self) -> None:
        """Read and write."""
        self.start_reading()
        self.start_writing()

    def start_reading(self) -> None:
        self._spawn(self._read)

    def start_writing(self) -> None:
        self._spawn(self._write)

    def _spawn(self, target: Callable[[], None]) -> None:
        thread = threading.Thread(target=target, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _write(self) -> None:
        batch = 20
        try:
            while self.sent < MAX_SENDS and not self.stop_writing.is_set():
                if self.sent - self.answered >= IN_FLIGHT:
                    self._answered.wait(0.01)  # a client's own send window is full
                    self._answered.clear()
                    continue
                data = b"".join(
                    protocol.serialize(
                        protocol.Frame.build(
                            protocol.Command.SEND,
                            {
                                "destination": self.destination,
                                "receipt": f"p-{n}",
                                "persistent": "true",
                            },
                            str(n).encode(),
                        ),
                        "1.2",
                    )
                    for n in range(self.sent, self.sent + batch)
                )
                self.sock.sendall(data)
                self.sent += batch
        except OSError:
            pass  # the sidecar stopped reading (timeout) or closed the connection

    def _read(self) -> None:
        try:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    break
                self.parser.receive_data(data)
                while isinstance(event := self.parser.next_event(), protocol.Frame):
                    self.frames.append(event)
                    if event.command is not protocol.Command.MESSAGE:
                        self.answered += 1
                        self._answered.set()
        except OSError:
            pass
        self.closed.set()

    def join(self) -> None:
        assert self.closed.wait(WAIT), "the sidecar did not close the app's connection"
        self.stop_writing.set()
        for thread in self._threads:
            thread.join(WAIT)
        self.raw.close()

    # what the app got

    def receipts(self) -> set[int]:
        return {
            int(rid[2:])
            for f in self.frames
            if f.command is protocol.Command.RECEIPT
            and (rid := f.get("receipt-id") or "").startswith("p-")
        }

    def errors(self) -> list[protocol.Frame]:
        return [f for f in self.frames if f.command is protocol.Command.ERROR]

    def events(self, kind: str) -> list[dict[str, object]]:
        out = []
        for f in self.frames:
            if f.command is protocol.Command.MESSAGE and f.get("event") == kind:
                out.append(json.loads(f.body))
        return out

    def named(self, outcome: str | None = None) -> dict[int, dict[str, object]]:
        """Frames named in OUTCOME events (by the number in their receipt id)."""
        out: dict[int, dict[str, object]] = {}
        for event in self.events("OUTCOME"):
            frames = event["frames"]
            assert isinstance(frames, list)
            for report in frames:
                receipt = report.get("receipt") or ""
                if receipt.startswith("p-") and (outcome is None or report["outcome"] == outcome):
                    out[int(receipt[2:])] = report
        return out


def on_broker(broker: BrokerProcess, destination: str) -> list[int]:
    """Every message body on ``destination``, read directly from the broker."""
    raw = RawClient(("127.0.0.1", broker.stomp_port))
    raw.connect(host=broker.vhost)
    subscribe = {"destination": destination, "id": "1", "ack": "auto", "prefetch-count": "1000"}
    raw.send_frame("SUBSCRIBE", subscribe)
    raw.sock.settimeout(1.5)  # the queue is drained once nothing arrives for this long
    bodies: list[int] = []
    try:
        while True:
            frame = raw.frame()
            assert frame.command is protocol.Command.MESSAGE, frame
            bodies.append(int(frame.body))
    except TimeoutError:
        pass
    finally:
        raw.close()
    return bodies


def metric(sidecar: SidecarThread, name: str, **labels: str) -> float:
    """One sample of a counter of a stopped sidecar (read after its loop ended: only the
    counter's own collector, the scrape-time gauges need the loop)."""
    assert sidecar._sidecar is not None
    registry = sidecar._sidecar.registry.restricted_registry([name])
    text = generate_latest(registry).decode()
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    prefix = f"{name}{{{want}}} " if labels else f"{name} "
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line.split()[-1])
    raise AssertionError(f"no {prefix.strip()} in the metrics")


def check_on_broker(broker: BrokerProcess, dest: str, producer: Producer) -> tuple[int, int]:
    """Read ``dest`` from the broker and check it against what the app was told: every
    RECEIPT's message is there, once; every message there had its RECEIPT or was named
    ``unknown``. Returns (messages on the broker, of those without a RECEIPT)."""
    receipts = producer.receipts()
    stored = on_broker(broker, dest)
    stored_set = set(stored)
    in_doubt = set(producer.named("unknown"))
    thrown_away = stored_set - receipts
    assert len(stored) == len(stored_set), "a message is on the broker twice"
    missing = receipts - stored_set
    assert not missing, f"RECEIPTs for messages not on the broker: {sorted(missing)[:10]}"
    assert thrown_away <= in_doubt, (
        f"{len(thrown_away - in_doubt)} message(s) on the broker whose RECEIPT the app never "
        "got and that were not named as in doubt"
    )
    assert not receipts & set(producer.named()), "a frame both confirmed and named"
    return len(stored), len(thrown_away)


@pytest.fixture(params=["activemq", "rabbitmq"])
def broker(request: pytest.FixtureRequest) -> BrokerProcess:
    """Each real broker in turn."""
    result: ActiveMQ | RabbitMQ = request.getfixturevalue(request.param)
    return result


def test_sigterm_drain_under_load(broker: BrokerProcess) -> None:
    """SIGTERM while a producer pipelines persistent SENDs: every RECEIPT the app got is on the
    broker, and every message on the broker had its RECEIPT passed to the app (or was named
    as in doubt); with a broker that answers, the drain completes and names nothing but the
    SENDs the app wrote after it began that a read under way brought (``refused``, none of
    them on the broker: check_on_broker); the final ERROR names those."""
    dest = unique("/queue/drain")
    sidecar = SidecarThread(sidecar_config(broker.stomp_url, drain_timeout="5000"))
    with sidecar:
        producer = Producer(sidecar.address, dest)
        producer.start()
        wait_until(lambda: len(producer.receipts()) >= RECEIPTS_BEFORE_SHUTDOWN)
        before = len(producer.receipts())
        started = time.monotonic()
        sidecar.stop()
        drain_seconds = time.monotonic() - started
        producer.join()
    stored, thrown_away = check_on_broker(broker, dest, producer)
    print(
        f"\n{broker.name}: {producer.sent} SENDs written, {before} RECEIPTs before the "
        f"shutdown, {len(producer.receipts()) - before} handed over during the drain "
        f"({drain_seconds:.2f} s), {stored} on the broker, {thrown_away} of them without a "
        f"RECEIPT, {len(producer.named())} named"
    )
    assert thrown_away == 0
    named = producer.named()
    assert {(r["outcome"], r["cause"]) for r in named.values()} <= {("refused", "drain")}
    (error,) = producer.errors()
    message = error.get("message") or ""
    if named:
        assert message.startswith(f"mq-sidecar is shutting down; {len(named)} frame(s) not")
        assert all(f"p-{n}: refused" in error.body.decode() for n in named)
    else:
        assert message == "mq-sidecar is shutting down; reconnect to continue"
    assert metric(sidecar, "mq_sidecar_drains_total", result="completed") == 1
    assert metric(sidecar, "mq_sidecar_drains_total", result="deadline") == 0


def test_sigterm_with_a_silent_broker_names_every_frame_unconfirmed_at_the_deadline(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    """A real SIGTERM to a sidecar process whose broker went silent (blackholed) under load:
    /readyz answers 503 during the drain; at drain_timeout every frame forwarded and still
    unconfirmed is named to the app, by receipt id and mq-sidecar-id, as ``unknown`` (an OUTCOME
    event, the final ERROR, the log); the process exits 0 within drain_timeout + 4.5 s."""
    dest = unique("/queue/drain")
    drain_s = 1.5
    with FaultProxy(("127.0.0.1", broker.stomp_port)) as proxied:
        sidecar = SidecarProcess(
            "drain",
            tmp_path,
            brokers=f"stomp://127.0.0.1:{proxied.port}",
            options={"drain_timeout": int(drain_s * 1000)},
            vhost=broker.vhost,
        )
        sidecar.start()
        try:
            sidecar.wait_ready()
            producer = Producer(sidecar.address, dest)
            producer.start()
            wait_until(lambda: len(producer.receipts()) >= RECEIPTS_BEFORE_SHUTDOWN)
            proxied.blackhole()
            time.sleep(0.3)  # the producer's window fills up with unconfirmed SENDs
            stopper = threading.Thread(target=sidecar.stop, daemon=True)
            started = time.monotonic()
            stopper.start()
            wait_until(lambda: sidecar.get("/readyz")[0] == 503, timeout=drain_s)
            readyz = sidecar.get("/readyz")[1].decode()
            stopper.join(WAIT)
            took = time.monotonic() - started
            producer.join()
        finally:
            sidecar.stop()
        log = sidecar.log_text()
    assert "shutting down: draining sessions" in readyz
    assert sidecar.returncode == 0
    assert drain_s <= took < drain_s + 4.5 + 1.0, took
    named = producer.named()
    assert named, "nothing was unconfirmed at the deadline"
    assert {r["outcome"] for r in named.values()} == {"unknown"}
    assert {r["cause"] for r in named.values()} == {"drain_deadline"}
    assert all(r["mq_sidecar_id"] for r in named.values())
    (error,) = producer.errors()
    message = error.get("message") or ""
    assert message.startswith(f"mq-sidecar is shutting down; {len(named)} frame(s) not confirmed")
    for n, report in named.items():
        assert f"p-{n} (mq-sidecar-id {report['mq_sidecar_id']}): unknown" in error.body.decode()
        assert f"p-{n} (mq-sidecar-id {report['mq_sidecar_id']}): unknown" in log
    assert "drain_timeout reached: 1 of 1 session(s)" in log
    stored, thrown_away = check_on_broker(broker, dest, producer)
    print(
        f"\n{broker.name}: {len(producer.receipts())} RECEIPTs, {len(named)} named unknown at "
        f"the deadline, {stored} on the broker ({thrown_away} of them named), exit after "
        f"{took:.2f} s"
    )


def reconnecting_config(proxied: FaultProxy) -> Config:
    """A sidecar behind ``proxied`` that reconnects every 100 ms without end, drain 5 s."""
    return sidecar_config(
        f"stomp://127.0.0.1:{proxied.port}",
        drain_timeout="5000",
        retry_interval="100",
        max_retry_interval="100",
        jitter="0",
        reconnect_attempts="-1",
    )


def reconnecting_producer(sidecar: SidecarThread, proxied: FaultProxy, dest: str) -> Producer:
    """A producer (reading) whose session is RECONNECTING: ``proxied`` refuses and was reset."""
    producer = Producer(sidecar.address, dest)
    producer.start_reading()
    proxied.refuse(True)
    proxied.reset()
    wait_until(lambda: bool(producer.events("RECONNECTING")))
    return producer


@pytest.mark.activemq
def test_a_session_reconnecting_at_sigterm_keeps_trying_and_hands_over_its_replay(
    activemq: ActiveMQ,
) -> None:
    """The broker is unreachable at SIGTERM, with SENDs the app handed over in the window: the
    session goes on reconnecting during the drain; when the broker is back (0.5 s later) the
    window is replayed and every RECEIPT reaches the app before the session ends."""
    dest = unique("/queue/drain")
    with FaultProxy(("127.0.0.1", activemq.stomp_port)) as proxied:
        sidecar = SidecarThread(reconnecting_config(proxied))
        with sidecar:
            producer = reconnecting_producer(sidecar, proxied, dest)
            producer.start_writing()

            def window_full() -> bool:
                (session,) = sidecar.statistics().sessions
                return session.window is not None and session.window.frames == IN_FLIGHT

            wait_until(window_full)
            stopper = threading.Thread(target=sidecar.stop, daemon=True)
            stopper.start()
            time.sleep(0.5)
            proxied.refuse(False)
            stopper.join(WAIT)
            producer.join()
    assert len(producer.receipts()) == IN_FLIGHT
    # refused: SENDs the producer wrote once the RECEIPTs came, after the drain began.
    assert {r["outcome"] for r in producer.named().values()} <= {"replayed", "refused"}
    stored, _ = check_on_broker(activemq, dest, producer)
    assert stored == IN_FLIGHT
    assert metric(sidecar, "mq_sidecar_drains_total", result="completed") == 1


@pytest.mark.activemq
def test_frames_written_after_the_drain_began_are_named_not_dropped(activemq: ActiveMQ) -> None:
    """The app is idle between bursts when SIGTERM comes, with a SEND in the window (the broker
    is unreachable, the session reconnecting); it then writes three SENDs (a receipt asked; an
    ``mq-sidecar-id`` of its own; neither). The sidecar does not take them: none reaches the
    broker, and each is named ``refused`` (cause ``drain``) in an OUTCOME event and in the final
    ERROR, which no longer says that every frame was confirmed; the first SEND is replayed when
    the broker is back and its RECEIPT reaches the app (docs/behaviour.md, "Drain on SIGTERM")."""
    dest = unique("/queue/drain")
    with FaultProxy(("127.0.0.1", activemq.stomp_port)) as proxied:
        sidecar = SidecarThread(reconnecting_config(proxied))
        with sidecar:
            producer = reconnecting_producer(sidecar, proxied, dest)
            send = {"destination": dest, "persistent": "true"}
            producer.raw.send_frame("SEND", {**send, "receipt": "p-0"}, b"0")

            def in_window() -> bool:
                (session,) = sidecar.statistics().sessions
                return session.window is not None and session.window.frames == 1

            wait_until(in_window)
            stopper = threading.Thread(target=sidecar.stop, daemon=True)
            stopper.start()
            assert sidecar._sidecar is not None
            wait_until(lambda: sidecar._sidecar is not None and sidecar._sidecar.draining)
            producer.raw.send(
                b"".join(
                    protocol.serialize(protocol.Frame.build(protocol.Command.SEND, h, b), "1.2")
                    for h, b in (
                        ({**send, "receipt": "p-1"}, b"1"),
                        ({**send, "mq-sidecar-id": "late-2"}, b"2"),
                        (send, b"3"),
                    )
                )
            )
            time.sleep(0.3)  # the sidecar has the three SENDs before the broker is back
            proxied.refuse(False)
            stopper.join(WAIT)
            producer.join()
    assert producer.receipts() == {0}
    assert on_broker(activemq, dest) == [0]
    refused = [
        report
        for event in producer.events("OUTCOME")
        for report in event["frames"]  # type: ignore[attr-defined]
        if report["outcome"] == "refused"
    ]
    assert [(r["receipt"], r["mq_sidecar_id"], r["cause"]) for r in refused] == [
        ("p-1", None, "drain"),
        (None, "late-2", "drain"),
        (None, None, "drain"),
    ]
    (error,) = producer.errors()
    assert error.get("message") == (
        "mq-sidecar is shutting down; 3 frame(s) not confirmed: p-1: refused, late-2: refused, "
        "SEND #0: refused"
    )
    assert metric(sidecar, "mq_sidecar_frame_outcomes_total", outcome="refused") == 3
