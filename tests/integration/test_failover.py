"""Failover with real faults (issue 3): kill -9 of a real broker, a real restart, a blackholing
and resetting TCP proxy. Every fault loop here is bounded in count and time, loopback only.

Apps are stomp.py clients through a sidecar; the control channel is a stomp.py subscription to
``/mq-sidecar/events``. Numbers worth reporting (outage seen by the app against the broker's own
takeover time, counts) are printed; run with ``-s`` to see them.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import stomp

from testbed import ActiveMQ, RabbitMQ, wait_stomp
from tests.conftest import ActiveMQPairFactory
from tests.faultproxy import FaultProxy
from tests.integration.support import (
    WAIT,
    Client,
    Received,
    SidecarThread,
    client,
    sidecar_config,
    unique,
    wait_until,
)

EVENTS = "/mq-sidecar/events"
#: Fast policy for tests: first retry within 50 ms, capped at 500 ms.
FAST = {"retry_interval": "50", "max_retry_interval": "500", "connect_timeout": "2000"}


def subscribe_events(c: Client, *, every_session: bool = False) -> None:
    headers = {"receipt": "events"}
    if every_session:
        headers["mq-sidecar-scope"] = "all"
    c.conn.subscribe(destination=EVENTS, id="events", ack="auto", headers=headers)
    c.receipt("events")


def next_event(c: Client, kind: str, timeout: float = 30.0, **match: object) -> dict[str, Any]:
    """The next control-channel event of ``kind`` whose fields equal ``match`` (others are
    skipped)."""
    deadline = time.monotonic() + timeout
    while True:
        m = c.expect("MESSAGE", max(0.1, deadline - time.monotonic()))
        if m.headers.get("destination") != EVENTS:
            raise AssertionError(f"expected an event, got {m}")
        body: dict[str, Any] = json.loads(m.body)
        assert m.headers["event"] == body["event"]
        if body["event"] == kind and all(body.get(k) == v for k, v in match.items()):
            return body


class Consumer(stomp.ConnectionListener):  # type: ignore[misc]
    """A stomp.py consumer that records every body and ACKs each MESSAGE as it arrives."""

    def __init__(
        self,
        address: tuple[str, int],
        destination: str,
        ack: str = "client-individual",
        credentials: tuple[str, str] | None = None,
    ) -> None:
        self.bodies: list[str] = []
        self.errors: list[Received] = []
        self.lock = threading.Lock()
        self.conn = stomp.Connection12([address], heartbeats=(0, 0), vhost="/")
        self.conn.set_listener("consumer", self)
        self.ack_mode = ack
        self.conn.connect(*(credentials or (None, None)), wait=True)
        self._subscribed = threading.Event()
        self._closed = threading.Event()
        self.conn.subscribe(destination=destination, id="c", ack=ack, headers={"receipt": "csub"})
        if not self._subscribed.wait(WAIT):
            raise AssertionError("consumer SUBSCRIBE not confirmed")

    def on_receipt(self, frame: Any) -> None:
        if frame.headers.get("receipt-id") == "csub":
            self._subscribed.set()
        elif frame.headers.get("receipt-id") == "cbye":
            self._closed.set()

    def on_message(self, frame: Any) -> None:
        with self.lock:
            self.bodies.append(frame.body)
        if self.ack_mode != "auto":
            self.conn.ack(frame.headers["ack"])

    def on_error(self, frame: Any) -> None:
        self.errors.append(Received("ERROR", dict(frame.headers), frame.body))

    def count(self) -> int:
        with self.lock:
            return len(self.bodies)

    def close(self) -> None:
        """DISCONNECT and wait for its RECEIPT: the broker confirms it only after every ACK
        sent before it (stomp.py's disconnect() does not wait)."""
        if self.conn.is_connected():
            self.conn.disconnect(receipt="cbye")
            assert self._closed.wait(3 * WAIT), "DISCONNECT not confirmed"


class Producer(threading.Thread):
    """Sends ``n`` messages (each with a receipt) from a thread; records receipts and errors."""

    def __init__(
        self,
        address: tuple[str, int],
        destination: str,
        n: int,
        credentials: tuple[str, str] | None = None,
        **headers: str,
    ) -> None:
        super().__init__(name="producer", daemon=True)
        self.client = Client(address)
        self.client.connect(*(credentials or (None, None)))
        self.destination = destination
        self.n = n
        self.headers = headers

    def run(self) -> None:
        for i in range(self.n):
            self.client.conn.send(
                self.destination, f"m{i}", headers={"receipt": f"p{i}", **self.headers}
            )

    def outcome(self, timeout: float) -> tuple[int, list[Received]]:
        """Receipts received and errors, after waiting up to ``timeout`` for every receipt."""
        self.join(timeout)
        assert not self.is_alive(), "producer still blocked"
        receipts = 0
        errors: list[Received] = []
        deadline = time.monotonic() + timeout
        while receipts + len(errors) < self.n and time.monotonic() < deadline:
            try:
                frame = self.client.control_queue.get(timeout=max(0.1, deadline - time.monotonic()))
            except Exception:
                break
            if frame.command == "RECEIPT":
                receipts += 1
            elif frame.command == "ERROR":
                errors.append(frame)
        return receipts, errors


def exactly_once(bodies: list[str], n: int) -> tuple[int, int]:
    """(missing, duplicated) counts against m0..m{n-1}."""
    counts = Counter(bodies)
    missing = sum(1 for i in range(n) if counts[f"m{i}"] == 0)
    duplicated = sum(c - 1 for c in counts.values() if c > 1)
    return missing, duplicated


def run_transfer(
    sidecar: SidecarThread,
    n: int,
    fault: Any,
    *,
    at_fraction: float = 0.4,
    timeout: float = 120.0,
    settle: float = 0.0,
) -> tuple[Consumer, Producer, Client]:
    """Producer and consumer through the sidecar; ``fault()`` runs once the consumer has
    received ``at_fraction`` of ``n``; returns when everything arrived (or the timeout).
    ``settle``: seconds between the consumer's SUBSCRIBE (which declares the queue) and the
    producer's start.

    The control client subscribes to its own session's events, or to every session's when the
    sidecar has a ``client_login`` (which every client then presents: the rule of
    ``mq-sidecar-scope:all``, docs/behaviour.md, "Control channel")."""
    config = sidecar.config
    credentials = None
    if config.client_login is not None and config.client_passcode is not None:
        credentials = (config.client_login, config.client_passcode.reveal())
    control = Client(sidecar.address)
    control.connect(*(credentials or (None, None)))
    subscribe_events(control, every_session=credentials is not None)
    dest = unique()
    consumer = Consumer(sidecar.address, dest, credentials=credentials)
    producer = Producer(sidecar.address, dest, n, credentials, persistent="true")
    time.sleep(settle)
    producer.start()
    wait_until(lambda: consumer.count() >= n * at_fraction, timeout)
    fault()
    try:
        wait_until(lambda: len(set(consumer.bodies)) >= n, timeout)
    except AssertionError:
        stats = sidecar.statistics()
        raise AssertionError(
            f"transfer incomplete: consumer has {len(set(consumer.bodies))} of {n} "
            f"({consumer.count()} deliveries), producer alive={producer.is_alive()}, "
            f"consumer errors={consumer.errors}, sessions={stats.sessions}"
        ) from None
    return consumer, producer, control


def test_kill9_primary_takeover_is_transparent(activemq_pair: ActiveMQPairFactory) -> None:
    """kill -9 of an ActiveMQ shared-store primary under 20,000 persistent messages: the
    consumer gets every body exactly once, the producer sees no error, FAILOVER is announced."""
    primary, backup = activemq_pair(lock_sleep_ms=200)
    config = sidecar_config(
        f"failover:({primary.stomp_url},{backup.stomp_url})",
        upstream_heartbeat="1000,1000",
        client_login="ops",  # the control client watches every session (mq-sidecar-scope:all)
        client_passcode="ops-secret",
        **FAST,
    )
    n = 20_000
    takeover: dict[str, float] = {}

    def kill_primary() -> None:
        killed = time.monotonic()
        primary.kill()

        def measure() -> None:  # the broker's own takeover time, measured directly
            wait_stomp(backup.host, backup.stomp_port, timeout=60)
            takeover["broker_s"] = time.monotonic() - killed

        threading.Thread(target=measure, daemon=True).start()

    with SidecarThread(config) as sidecar:
        consumer, producer, control = run_transfer(sidecar, n, kill_primary)
        receipts, errors = producer.outcome(60)
        from_primary = f"127.0.0.1:{primary.stomp_port}"
        to_backup = f"127.0.0.1:{backup.stomp_port}"
        # Every FAILOVER of the three sessions (producer, consumer, control), awaited: first
        # until each has moved off the primary, then as many as the sidecar counted.
        moves: dict[str, list[dict[str, Any]]] = {}
        while len(moves) < 3 or not all(
            any(e["from_broker"] == from_primary != e["to_broker"] for e in es)
            for es in moves.values()
        ):
            e = next_event(control, "FAILOVER")
            moves.setdefault(e["session_id"], []).append(e)
        stats = sidecar.statistics()
        for _ in range(sum(s.failovers for s in stats.sessions) - sum(map(len, moves.values()))):
            e = next_event(control, "FAILOVER")
            moves.setdefault(e["session_id"], []).append(e)
        events = [e for es in moves.values() for e in es if e["from_broker"] == from_primary]
        event = max(events, key=lambda e: e["replayed_frames"])  # the producer's session
        # The kill moves each session once, to the backup. A session may move again only as a
        # reattach to the backup after that broker went silent past the heart-beat (1 s x 2),
        # which the test does not cause: a just-started backup JVM on a loaded machine can
        # (issue 36). Any other second move fails the test, with the events.
        # The same holds for a reattach to the primary before the kill: ActiveMQ closes a
        # connection whose heart-beats come late, which a loaded machine can cause (seen at load
        # average 11 on 2 cores); it is listed with the later moves, not counted as the kill's.
        killed_moves = {
            sid: [e["to_broker"] for e in es if e["from_broker"] == from_primary != e["to_broker"]]
            for sid, es in moves.items()
        }
        later = [
            e
            for es in moves.values()
            for e in es
            if e["from_broker"] != from_primary or e["to_broker"] == from_primary
        ]
        hidden = sum(s.duplicates_hidden + s.redeliveries_hidden for s in stats.sessions)
        consumer.close()
        producer.client.close()
        control.close()
    missing, duplicated = exactly_once(consumer.bodies, n)
    wait_until(lambda: "broker_s" in takeover)
    print(
        f"\n[kill -9 takeover] sent={n} receipts={receipts} received={len(consumer.bodies)} "
        f"missing={missing} duplicates_shown={duplicated} hidden={hidden} "
        f"app_outage_ms(producer,consumer,control)={[e['outage_ms'] for e in events]} "
        f"replayed={event['replayed_frames']} "
        f"broker_takeover_ms={takeover['broker_s'] * 1000:.0f} "
        f"later_moves={[(e['session_id'], e['to_broker'], e['reason']) for e in later]}"
    )
    assert (missing, duplicated) == (0, 0)
    assert errors == []
    assert consumer.errors == []
    assert receipts == n
    assert sorted(killed_moves.values()) == [[to_backup]] * 3, "the kill moves every session once"
    assert all(
        e["reattached"] and e["to_broker"] == to_backup and e["reason"].startswith("broker silent")
        for e in later
    ), later
    assert {s.session_id: s.failovers for s in stats.sessions} == {
        sid: len(es) for sid, es in moves.items()
    }
    assert event["from_broker"] == f"127.0.0.1:{primary.stomp_port}"
    assert 0 < event["outage_ms"] < 30_000
    assert event["reattached"] is False


@pytest.fixture
def own_rabbitmq(tmp_path: Path) -> Iterator[RabbitMQ]:
    broker = RabbitMQ("rmq-restart", tmp_path)
    broker.start()
    broker.wait_ready(90)
    try:
        yield broker
    finally:
        broker.stop()


@pytest.mark.rabbitmq
def test_rabbitmq_kill_and_restart_reattaches(own_rabbitmq: RabbitMQ) -> None:
    """A RabbitMQ node killed and restarted on the same port: the sidecar reattaches to it
    and the transfer completes exactly once (durable queue, persistent messages).

    The queue is declared 5 s before the producer starts: RabbitMQ 3.10 sometimes does not
    recover a durable queue declared about a second before a kill -9, with the confirmed
    persistent messages in it (measured without a sidecar too: 2 of 30 direct runs;
    docs/brokers.md, "A RabbitMQ cluster"): the consumer then waits near 4,150 of 5,000 for
    messages the broker no longer has. Declared 5 s earlier: 0 of 40 runs (issue 25 part 7)."""
    config = sidecar_config(own_rabbitmq.stomp_url, upstream_heartbeat="1000,1000", **FAST)
    n = 5_000

    def restart() -> None:
        own_rabbitmq.kill()
        own_rabbitmq.start()
        own_rabbitmq.wait_ready(90)

    with SidecarThread(config) as sidecar:
        consumer, producer, control = run_transfer(sidecar, n, restart, timeout=180, settle=5.0)
        receipts, errors = producer.outcome(60)
        event = next_event(control, "FAILOVER")
        consumer.close()
        producer.client.close()
        control.close()
    missing, duplicated = exactly_once(consumer.bodies, n)
    print(
        f"\n[rabbitmq restart] sent={n} receipts={receipts} received={len(consumer.bodies)} "
        f"missing={missing} duplicates_shown={duplicated} outage_ms={event['outage_ms']} "
        f"replayed={event['replayed_frames']}"
    )
    assert (missing, duplicated) == (0, 0)
    assert errors == []
    assert receipts == n
    assert event["reattached"] is True


@pytest.fixture
def second_activemq(tmp_path: Path) -> Iterator[ActiveMQ]:
    with ActiveMQ("second", tmp_path) as broker:
        yield broker


@pytest.fixture
def proxied(activemq: ActiveMQ) -> Iterator[FaultProxy]:
    """A fault proxy in front of the session's ActiveMQ."""
    with FaultProxy((activemq.host, activemq.stomp_port)) as proxy:
        yield proxy


def proxied_config(proxy: FaultProxy, **overrides: str) -> Any:
    values = {**FAST, **overrides}
    return sidecar_config(f"stomp://127.0.0.1:{proxy.port}", **values)


@pytest.mark.activemq
def test_blackhole_detected_by_heartbeats_then_failover(
    proxied: FaultProxy, second_activemq: ActiveMQ
) -> None:
    interval_ms = 500
    config = sidecar_config(
        f"failover:(stomp://127.0.0.1:{proxied.port},{second_activemq.stomp_url})",
        upstream_heartbeat=f"{interval_ms},{interval_ms}",
        heartbeat_grace="2.0",
        retry_interval="50",
        max_retry_interval="500",
        connect_timeout="1000",
    )
    with SidecarThread(config) as sidecar, client(sidecar.address) as app:
        subscribe_events(app)
        dest = unique()
        app.conn.subscribe(destination=dest, id="d", ack="auto", headers={"receipt": "d"})
        app.receipt("d")
        blackholed = time.time()
        proxied.blackhole()
        reconnecting = next_event(app, "RECONNECTING")
        detected_s = reconnecting["timestamp"] - blackholed
        failover = next_event(app, "FAILOVER")
        app.conn.send(dest, "on the second broker", headers={"receipt": "s"})
        app.receipt("s")
        got = app.expect("MESSAGE")
    print(f"\n[blackhole] detected after {detected_s * 1000:.0f} ms (heart-beat {interval_ms} ms)")
    assert "silent" in reconnecting["reason"]
    assert detected_s < 2 * interval_ms / 1000 + 1.0
    assert failover["to_broker"] == f"127.0.0.1:{second_activemq.stomp_port}"
    assert got.body == "on the second broker"


@pytest.mark.activemq
def test_control_channel_reports_reconnecting_and_failover(proxied: FaultProxy) -> None:
    with SidecarThread(proxied_config(proxied)) as sidecar, client(sidecar.address) as app:
        subscribe_events(app)
        proxied.reset()
        reconnecting = next_event(app, "RECONNECTING")
        failover = next_event(app, "FAILOVER")
    broker = f"127.0.0.1:{proxied.port}"
    assert reconnecting["from_broker"] == broker
    assert failover["from_broker"] == broker
    assert failover["to_broker"] == broker
    assert failover["reattached"] is True
    for key in (
        "session_id",
        "reason",
        "attempts",
        "outage_ms",
        "replayed_frames",
        "transactions_replayed",
        "transactions_rolled_back",
        "transactions_in_doubt",
        "redeliveries_hidden",
        "duplicates_hidden",
        "frames_lost",
    ):
        assert key in failover, key


@pytest.mark.activemq
@pytest.mark.parametrize("mode", ["replay", "rollback"])
def test_transaction_open_at_failover(proxied: FaultProxy, mode: str) -> None:
    """replay: the transaction is re-run on the new connection and commits exactly once.
    rollback: COMMIT answers ERROR "rolled back", the connection stays open, and a message
    the transaction had acknowledged comes back."""
    config = proxied_config(proxied, transaction_failover=mode)
    work, out = unique(), unique()
    with (
        SidecarThread(config) as sidecar,
        client(sidecar.address) as app,
        client(sidecar.address) as reader,
    ):
        app.conn.send(work, "work item", headers={"persistent": "true", "receipt": "w"})
        app.receipt("w")
        reader.conn.subscribe(destination=out, id="o", ack="auto", headers={"receipt": "o"})
        reader.receipt("o")
        subscribe_events(app)
        app.conn.subscribe(
            destination=work, id="w", ack="client-individual", headers={"receipt": "ws"}
        )
        app.receipt("ws")
        item = app.expect("MESSAGE")
        app.conn.begin("tx")
        app.conn.ack(item.headers["ack"], transaction="tx")
        app.conn.send(out, "before failover", transaction="tx", headers={"receipt": "b"})
        app.receipt("b")
        proxied.reset()
        next_event(app, "FAILOVER")
        app.conn.send(out, "after failover", transaction="tx")
        app.conn.commit("tx", headers={"receipt": "commit"})
        if mode == "replay":
            app.receipt("commit")
            got = reader.messages(2)
            assert sorted(m.body for m in got) == ["after failover", "before failover"]
            reader.expect_silence(1.0)
            app.expect_silence(0.5)  # the acknowledged work item does not come back
        else:
            error = app.expect("ERROR")
            assert error.headers["receipt-id"] == "commit"
            assert "rolled back" in error.headers["message"]
            again = app.expect("MESSAGE")  # the work item, redelivered
            assert again.body == "work item"
            reader.expect_silence(1.0)  # nothing of the transaction was committed
            app.conn.ack(again.headers["ack"], receipt="ack2")
            app.receipt("ack2")  # the connection is still open and usable


@pytest.mark.activemq
@pytest.mark.parametrize("mode", ["transparent", "strict"])
def test_unacked_messages_across_failover(proxied: FaultProxy, mode: str) -> None:
    config = proxied_config(proxied, failover_mode=mode)
    dest = unique()
    with SidecarThread(config) as sidecar, client(sidecar.address) as app:
        for i in range(3):
            app.conn.send(dest, f"m{i}", headers={"persistent": "true", "receipt": f"s{i}"})
            app.receipt(f"s{i}")
        subscribe_events(app)
        app.conn.subscribe(
            destination=dest, id="d", ack="client-individual", headers={"receipt": "d"}
        )
        app.receipt("d")
        held = app.messages(3)
        app.conn.ack(held[0].headers["ack"], receipt="a0")
        app.receipt("a0")
        proxied.reset()
        next_event(app, "FAILOVER")
        if mode == "transparent":
            app.expect_silence(1.0)  # m1, m2 redelivered by the broker but not shown again
            for m in held[1:]:  # the old ack ids still work
                app.conn.ack(m.headers["ack"], receipt=f"a-{m.body}")
                app.receipt(f"a-{m.body}")
        else:
            again = app.messages(2)
            assert sorted(m.body for m in again) == ["m1", "m2"]
            assert all(m.headers["redelivered"] == "true" for m in again)
            assert {m.headers["ack"] for m in again}.isdisjoint(m.headers["ack"] for m in held)
            app.conn.ack(held[1].headers["ack"], receipt="stale")
            error = app.expect("ERROR")
            assert error.headers["receipt-id"] == "stale"
            assert "stale" in error.headers["message"]
            for m in again:
                app.conn.ack(m.headers["ack"])
            app.conn.send(unique(), "still open", headers={"receipt": "open"})
            app.receipt("open")
    with SidecarThread(config) as sidecar, client(sidecar.address) as check:
        check.conn.subscribe(destination=dest, id="x", ack="auto", headers={"receipt": "x"})
        check.receipt("x")
        check.expect_silence(1.0)  # everything was acknowledged exactly once


@pytest.mark.activemq
def test_auto_ack_messages_are_not_shown_twice(proxied: FaultProxy) -> None:
    config = proxied_config(proxied)
    n = 3000
    with SidecarThread(config) as sidecar:
        dest = unique()
        consumer = Consumer(sidecar.address, dest, ack="auto")
        producer = Producer(sidecar.address, dest, n, persistent="true")
        producer.start()
        resets = 0
        for fraction in (0.2, 0.5, 0.8):  # three resets while messages flow
            wait_until(lambda f=fraction: consumer.count() >= n * f, 60)  # type: ignore[misc]
            proxied.reset()
            resets += 1
        wait_until(lambda: len(set(consumer.bodies)) >= n, 60)
        receipts, errors = producer.outcome(60)
        time.sleep(0.5)  # let any straggling duplicate arrive before counting
        consumer.close()
        producer.client.close()
    missing, duplicated = exactly_once(consumer.bodies, n)
    assert resets == 3
    assert (missing, duplicated) == (0, 0)
    assert errors == []
    assert receipts == n


@pytest.mark.activemq
def test_reconnect_exhausted_reports_lost_frames(proxied: FaultProxy) -> None:
    # Three rounds 500 ms apart, no jitter: time for both frames to reach the window first.
    config = proxied_config(
        proxied,
        reconnect_attempts="3",
        retry_interval="500",
        max_retry_interval="500",
        jitter="0",
    )
    with SidecarThread(config) as sidecar:
        app = Client(sidecar.address)
        app.connect()
        subscribe_events(app)
        proxied.refuse(True)
        proxied.reset()
        next_event(app, "RECONNECTING")
        dest = unique()
        app.conn.send(dest, "lost one", headers={"receipt": "lost-1"})
        app.conn.send(dest, "lost two", headers={"receipt": "lost-2"})
        wait_until(
            lambda: any(
                s.window is not None and s.window.frames == 2 for s in sidecar.statistics().sessions
            ),
            timeout=1.0,
        )
        disconnect = next_event(app, "DISCONNECT")
        error = app.expect("ERROR")
        assert app.expect("DISCONNECTED")
    assert {"lost-1", "lost-2"} <= set(disconnect["frames_lost"])
    assert disconnect["attempts"] >= 3
    assert "lost-1" in error.headers["message"]
    assert "lost-2" in error.headers["message"]


@pytest.mark.activemq
def test_call_timeout_answers_and_drops_unsent_frames(proxied: FaultProxy) -> None:
    config = proxied_config(proxied, call_timeout="500")
    dest = unique()
    with SidecarThread(config) as sidecar, client(sidecar.address) as app:
        subscribe_events(app)
        app.conn.subscribe(destination=dest, id="d", ack="auto", headers={"receipt": "d"})
        app.receipt("d")
        proxied.refuse(True)
        proxied.reset()
        next_event(app, "RECONNECTING")
        started = time.monotonic()
        app.conn.send(dest, "too late", headers={"receipt": "slow"})
        error = app.expect("ERROR")
        waited = time.monotonic() - started
        assert error.headers["receipt-id"] == "slow"
        assert "500 ms" in error.headers["message"]
        proxied.refuse(False)
        next_event(app, "FAILOVER")
        app.conn.send(dest, "in time", headers={"receipt": "ok"})
        app.receipt("ok")
        got = app.expect("MESSAGE")
        assert got.body == "in time"  # the dropped frame was never sent
        app.expect_silence(0.5)
    assert waited >= 0.4


@pytest.mark.activemq
def test_full_window_blocks_the_app_and_resumes(proxied: FaultProxy) -> None:
    window = 65_536
    config = proxied_config(proxied, confirmation_window_size=str(window))
    dest = unique()
    n, body = 2000, "x" * 4096  # 8 MiB: more than the window and the kernel's buffers
    with SidecarThread(config) as sidecar, client(sidecar.address) as app:
        consumer = Consumer(sidecar.address, dest, ack="auto")
        subscribe_events(app)
        proxied.refuse(True)
        proxied.reset()
        next_event(app, "RECONNECTING")

        def produce() -> None:
            for _ in range(n):
                app.conn.send(dest, body)

        producer = threading.Thread(target=produce, daemon=True)
        producer.start()
        peak = 0
        for _ in range(20):  # bounded: 20 samples over about 2 s
            time.sleep(0.1)
            for s in sidecar.statistics().sessions:
                if s.window is not None:
                    peak = max(peak, s.window.bytes)
        assert producer.is_alive(), "the app should be blocked by the full window"
        assert 0 < peak <= window + 4096 + 512
        proxied.refuse(False)
        producer.join(60)
        assert not producer.is_alive()
        wait_until(lambda: consumer.count() >= n, 60)
        consumer.close()
    assert consumer.count() == n


def test_receipts_and_cumulative_confirmation(relay: Any) -> None:
    """What each broker does with receipts, and that the window copes.

    A mixed load: persistent and transient SENDs to two queues (every 7th with a receipt),
    ACKs, UNSUBSCRIBE. ActiveMQ answers receipts in order, so one receipt confirms everything
    before it (window ``out_of_order`` stays 0). RabbitMQ answers a transient SEND's receipt
    at once and a persistent one's after fsync (publisher confirms), so receipts overtake
    each other: the sidecar gives every SEND to RabbitMQ its own receipt, and an overtaken
    entry waits for its own. Either way every receipt reaches the app exactly once.
    """
    a, b = unique(), unique()
    with client(relay.address) as app:
        app.conn.subscribe(
            destination=a, id="a", ack="client-individual", headers={"receipt": "sa"}
        )
        app.receipt("sa")
        for i in range(300):
            headers = {"receipt": f"r{i}"} if i % 7 == 0 else {}
            if i % 2:
                headers["persistent"] = "true"
            app.conn.send(a if i % 3 else b, f"m{i}", headers=headers)
        got = {app.expect("RECEIPT").headers["receipt-id"] for _ in range(0, 300, 7)}
        assert got == {f"r{i}" for i in range(0, 300, 7)}
        for m in app.messages(200):
            app.conn.ack(m.headers["ack"])
        app.conn.unsubscribe(id="a", headers={"receipt": "ua"})
        app.receipt("ua")
        app.expect_silence(0.3)  # no receipt twice
        stats = [s for s in relay.sidecar.statistics().sessions if s.frames_from_app > 300]
    assert stats
    for s in stats:
        assert s.window is not None
        assert s.window.frames == 0  # everything confirmed
        if relay.flavor == "activemq":
            assert s.window.out_of_order == 0
        print(f"\n[receipts {relay.flavor}] out_of_order={s.window.out_of_order}")


@pytest.mark.activemq
def test_priority_backup_fails_back_to_the_first_broker(
    proxied: FaultProxy, second_activemq: ActiveMQ
) -> None:
    """priorityBackup: after failing over to the second broker, the session returns to the
    first one once it answers again, at a quiet point, and says so in a FAILOVER event."""
    first = f"127.0.0.1:{proxied.port}"
    config = sidecar_config(
        f"failover:(stomp://{first},{second_activemq.stomp_url})?priorityBackup=true",
        **FAST,
    )
    dest = unique()
    with SidecarThread(config) as sidecar, client(sidecar.address) as app:
        subscribe_events(app)
        app.conn.subscribe(destination=dest, id="d", ack="auto", headers={"receipt": "d"})
        app.receipt("d")
        proxied.refuse(True)
        proxied.reset()
        away = next_event(app, "FAILOVER")
        assert away["to_broker"] == f"127.0.0.1:{second_activemq.stomp_port}"
        proxied.refuse(False)
        back = next_event(app, "FAILOVER", timeout=30)
        assert back["to_broker"] == first
        assert back["reason"] == "failback to the first broker"
        app.conn.send(dest, "home again", headers={"receipt": "h"})
        app.receipt("h")
        assert app.expect("MESSAGE").body == "home again"
        stats = sidecar.statistics()
    assert any(s.broker == first for s in stats.sessions)


@pytest.mark.activemq
def test_a_failover_shows_in_the_metrics(proxied: FaultProxy, second_activemq: ActiveMQ) -> None:
    """A real scrape of /metrics after a failover: the counters the operator alerts on."""
    from prometheus_client.parser import text_string_to_metric_families

    from tests.integration.test_admin import admin_address, http_get

    first = f"127.0.0.1:{proxied.port}"
    second = f"127.0.0.1:{second_activemq.stomp_port}"
    config = sidecar_config(f"failover:(stomp://{first},{second_activemq.stomp_url})", **FAST)
    with SidecarThread(config) as sidecar, client(sidecar.address) as app:
        subscribe_events(app)
        dest = unique()
        app.conn.send(dest, "before", headers={"receipt": "b"})
        app.receipt("b")
        proxied.refuse(True)
        proxied.reset()
        next_event(app, "FAILOVER", to_broker=second)
        status, _, body = http_get(admin_address(sidecar), "/metrics")
    assert status == 200
    text = body.decode()
    print(
        "\n[scrape after failover]\n"
        + "\n".join(
            line
            for line in text.splitlines()
            if line.startswith(
                (
                    "mq_sidecar_failovers_total",
                    "mq_sidecar_outage_seconds_count",
                    "mq_sidecar_upstream_connect_attempts_total",
                    "mq_sidecar_upstream_connected",
                )
            )
        )
    )
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    failovers = [
        v
        for (name, labels), v in samples.items()
        if name == "mq_sidecar_failovers_total"
        and ("from_broker", first) in labels
        and ("to_broker", second) in labels
    ]
    assert failovers
    assert failovers[0] >= 1
    outages = [
        v
        for (name, labels), v in samples.items()
        if name == "mq_sidecar_outage_seconds_count" and ("outcome", "failed_over") in labels
    ]
    assert outages
    assert outages[0] >= 1


@pytest.mark.activemq
def test_event_stream_reports_a_failover_on_kill9(activemq_pair: ActiveMQPairFactory) -> None:
    """GET /events (SSE) carries the FAILOVER of a session whose broker was killed -9."""
    from tests.integration.test_admin import EventStream, admin_address

    primary, backup = activemq_pair(lock_sleep_ms=200)
    config = sidecar_config(f"failover:({primary.stomp_url},{backup.stomp_url})", **FAST)
    with SidecarThread(config) as sidecar, client(sidecar.address) as app:
        events = EventStream(admin_address(sidecar))
        try:
            app.conn.send(unique(), "x", headers={"receipt": "x"})
            app.receipt("x")
            primary.kill()
            seen = [events.next_event(timeout=30) for _ in range(2)]
        finally:
            events.close()
    kinds = [kind for kind, _ in seen]
    assert kinds == ["RECONNECTING", "FAILOVER"]
    failover = seen[1][1]
    assert failover["from_broker"] == f"127.0.0.1:{primary.stomp_port}"
    assert failover["to_broker"] == f"127.0.0.1:{backup.stomp_port}"
    assert isinstance(failover["outage_ms"], int)
    assert failover["outage_ms"] > 0


@pytest.mark.activemq
def test_connection_cut_in_the_middle_of_a_frame(proxied: FaultProxy) -> None:
    """The link breaks after N bytes, in the middle of a frame the app sent: the sidecar
    reattaches, replays what was not confirmed, and every message arrives exactly once."""
    config = proxied_config(proxied)
    dest, n = unique(), 200
    with SidecarThread(config) as sidecar, client(sidecar.address) as app:
        consumer = Consumer(sidecar.address, dest)
        subscribe_events(app)
        proxied.cut_after(20_000)  # about a quarter of the way in
        for i in range(n):
            app.conn.send(dest, f"m{i}" + "." * 300, headers={"receipt": f"r{i}"})
        for _ in range(n):
            app.expect("RECEIPT")
        next_event(app, "FAILOVER")
        wait_until(lambda: len(set(consumer.bodies)) >= n)
        time.sleep(0.3)  # a duplicate, if any, would arrive now
        consumer.close()
    bodies = [b.rstrip(".") for b in consumer.bodies]
    assert exactly_once(bodies, n) == (0, 0)


@pytest.mark.activemq
def test_an_app_holding_max_unacked_past_the_heartbeat_tolerance_causes_no_failover(
    activemq: ActiveMQ,
) -> None:
    """While the app holds ``max_unacked`` messages the session stops reading the broker
    (docs/behaviour.md, "Limits and bad input"), and the broker's heart-beats wait in the
    kernel. Coming back to read after longer than the heart-beat tolerance, the session must take
    them, not judge the broker silent by a deadline that passed while it was not reading (it
    failed over for nothing)."""
    config = sidecar_config(
        activemq.stomp_url, upstream_heartbeat="250,250", heartbeat_grace="2.0", max_unacked="2"
    )
    dest = unique()
    with SidecarThread(config) as sidecar, client(sidecar.address) as app:
        for i in range(4):
            app.conn.send(dest, f"m{i}", headers={"receipt": f"s{i}"})
            app.receipt(f"s{i}")
        app.conn.subscribe(destination=dest, id="d", ack="client-individual")
        held = app.messages(2)
        app.expect_silence(2.0)  # 4x the tolerance (250 ms x 2.0), nothing read upstream
        for m in held:
            app.conn.ack(m.headers["ack"])
        rest = app.messages(2)
        for m in rest:
            app.conn.ack(m.headers["ack"], receipt=f"a-{m.body}")
            app.receipt(f"a-{m.body}")
        (session,) = sidecar.statistics().sessions
    assert [m.body for m in held + rest] == ["m0", "m1", "m2", "m3"]
    assert session.failovers == 0
