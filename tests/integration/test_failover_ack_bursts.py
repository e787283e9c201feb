"""A consumer that ACKs in bursts, as the Spark data source does, across a kill -9 of an
ActiveMQ shared-store primary (docs/results.md, "Stalled after the broker's failover").

The app holds one batch of messages unacknowledged and ACKs it, all at once, when the next batch
is complete (the streaming reader ACKs a batch when Spark commits it). At the kill thousands of
its ACKs are in the sidecar's window unconfirmed; the backup redelivers a prefetch window of
messages the app had already acknowledged, which the sidecar hides and acknowledges itself
(docs/behaviour.md, "Duplicate detection"). Before the fix the relay waited for the write of
those ACKs once 64 KiB of them were queued, while ActiveMQ, blocked writing the redeliveries to
it, read nothing: no message reached the app any more (or, when the broker's silence ended the
leg, the session reattached and messages stayed on the queue). Run with ``-s`` for the numbers.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import stomp

from testbed import ActiveMQ
from tests.conftest import ActiveMQPairFactory
from tests.integration.support import WAIT, SidecarThread, sidecar_config, unique
from tests.integration.test_failover import FAST, exactly_once

#: Messages on the queue before the consumer starts, their body size (bytes), the consumer's
#: prefetch window and batch. A window of 8,000 messages of 600 bytes is more than the loopback
#: sockets between the broker and the sidecar hold, so the broker's writes block while the
#: sidecar does not read (the condition of the stall: 2 stalls in 2 runs before the fix).
N = 24_000
BODY = 600
PREFETCH = 8_000
BATCH = 4_000
#: The primary is killed right after the app's ACK burst of this batch.
KILL_AFTER_BATCHES = 3
#: Seconds without a new message (while some are missing) that count as a stall.
STALL = 10.0


class BatchConsumer(stomp.ConnectionListener):  # type: ignore[misc]
    """A ``client-individual`` consumer that ACKs a batch of ``BATCH`` messages at once when
    the next batch is complete (and whatever it holds once nothing arrived for 0.5 s)."""

    def __init__(self, address: tuple[str, int], destination: str) -> None:
        self.lock = threading.Lock()
        self.bodies: list[str] = []
        self.errors: list[dict[str, str]] = []
        self.receipts: set[str] = set()
        self.pending: list[str] = []  # ack ids received, not in a batch yet
        self.batch: list[str] = []  # the batch held unacknowledged until the next one
        self.conn = stomp.Connection12([address], heartbeats=(0, 0), vhost="/")
        self.conn.set_listener("batches", self)
        self.conn.connect(wait=True)
        self.conn.subscribe(
            destination,
            id="batches",
            ack="client-individual",
            headers={"activemq.prefetchSize": str(PREFETCH), "receipt": "sub"},
        )

    def on_message(self, frame: Any) -> None:
        with self.lock:
            self.bodies.append(frame.body)
            self.pending.append(frame.headers["ack"])

    def on_receipt(self, frame: Any) -> None:
        self.receipts.add(frame.headers.get("receipt-id", ""))

    def on_error(self, frame: Any) -> None:
        self.errors.append(dict(frame.headers))

    def count(self) -> int:
        with self.lock:
            return len(self.bodies)

    def step(self, idle: bool) -> int:
        """Form the next batch and ACK the one before it; returns how many were ACKed."""
        with self.lock:
            if len(self.pending) >= BATCH or (self.pending and idle):
                acks, self.batch = self.batch, self.pending[:BATCH]
                self.pending = self.pending[BATCH:]
            elif idle and self.batch:
                acks, self.batch = self.batch, []
            else:
                return 0
        for ack_id in acks:
            self.conn.ack(ack_id)
        return len(acks)

    def settled(self) -> bool:
        with self.lock:
            return not self.pending and not self.batch

    def close(self) -> None:
        """DISCONNECT and wait for its RECEIPT (the broker has every ACK sent before it)."""
        self.conn.disconnect(receipt="bye")
        deadline = time.monotonic() + 3 * WAIT
        while "bye" not in self.receipts and time.monotonic() < deadline:
            time.sleep(0.02)
        assert "bye" in self.receipts, "DISCONNECT not confirmed"


class _Browser(stomp.ConnectionListener):  # type: ignore[misc]
    def __init__(self) -> None:
        self.bodies: list[str] = []
        self.ended = threading.Event()

    def on_message(self, frame: Any) -> None:
        if frame.headers.get("browser") == "end":
            self.ended.set()
        else:
            self.bodies.append(frame.body)


def fill(broker: ActiveMQ, destination: str) -> None:
    """``N`` persistent messages ``m0..`` straight to ``broker``; the RECEIPT of the last one
    says the broker has them all (it handles one connection's frames in order)."""
    conn = stomp.Connection12([(broker.host, broker.stomp_port)], heartbeats=(0, 0))
    done = threading.Event()

    class Receipts(stomp.ConnectionListener):  # type: ignore[misc]
        def on_receipt(self, frame: Any) -> None:
            done.set()

    conn.set_listener("receipts", Receipts())
    conn.connect(wait=True)
    for i in range(N):
        headers = {"persistent": "true"}
        if i == N - 1:
            headers["receipt"] = "last"
        conn.send(destination, f"m{i}".ljust(BODY, "x"), headers=headers)
    assert done.wait(60), "the broker did not confirm the last message"
    conn.disconnect()


def browse(broker: ActiveMQ, destination: str) -> list[str]:
    """The bodies still on ``destination`` (an ActiveMQ queue browser, up to ``browser:end``)."""
    conn = stomp.Connection12([(broker.host, broker.stomp_port)], heartbeats=(0, 0))
    browser = _Browser()
    conn.set_listener("browser", browser)
    conn.connect(wait=True)
    conn.subscribe(destination, id="browse", ack="auto", headers={"browser": "true"})
    assert browser.ended.wait(3 * WAIT), "no browser:end"
    conn.disconnect()
    return browser.bodies


def test_ack_bursts_in_flight_at_a_kill9_do_not_stall_the_consumer(
    activemq_pair: ActiveMQPairFactory,
) -> None:
    """Every message reaches the app once, the session fails over once (no reattach to a
    broker gone silent), and nothing the app acknowledged stays on the queue."""
    primary, backup = activemq_pair(lock_sleep_ms=200)
    destination = unique()
    fill(primary, destination)
    config = sidecar_config(
        f"failover:({primary.stomp_url},{backup.stomp_url})",
        upstream_heartbeat="1000,1000",
        max_unacked=str(4 * PREFETCH),  # the drill's factor: the sidecar never stops reading
        **FAST,
    )
    with SidecarThread(config) as sidecar:
        consumer = BatchConsumer(sidecar.address, destination)
        batches, window_at_kill, killed_at = 0, -1, 0.0
        last_count, last_change = -1, time.monotonic()
        while time.monotonic() - last_change < STALL:
            time.sleep(0.02)
            count = consumer.count()
            if count != last_count:
                last_count, last_change = count, time.monotonic()
            if len(set(consumer.bodies)) >= N and consumer.settled():
                break
            if consumer.step(idle=time.monotonic() - last_change > 0.5):
                batches += 1
                if batches == KILL_AFTER_BATCHES:
                    primary.kill()
                    killed_at = time.monotonic()
                    (session,) = sidecar.status()["sessions"]
                    window_at_kill = session["window"]["frames"]
        recovered_s = time.monotonic() - killed_at
        (session_stats,) = sidecar.statistics().sessions
        stalled = len(set(consumer.bodies)) < N
        if not stalled:  # a stalled session would not confirm the DISCONNECT either
            consumer.close()
    left = [] if stalled else browse(backup, destination)
    missing, duplicated = exactly_once([b.rstrip("x") for b in consumer.bodies], N)
    print(
        f"\n[ack bursts at kill -9] n={N} prefetch={PREFETCH} batch={BATCH} "
        f"window_at_kill={window_at_kill} received={len(consumer.bodies)} missing={missing} "
        f"duplicates_shown={duplicated} redeliveries_hidden={session_stats.redeliveries_hidden} "
        f"failovers={session_stats.failovers} left_on_queue={len(left)} "
        f"seconds_after_kill={recovered_s:.1f}"
    )
    assert killed_at > 0, "the primary was never killed"
    assert (missing, duplicated) == (0, 0), f"stalled with {missing} messages never received"
    assert consumer.errors == []
    assert session_stats.failovers == 1, "the session reattached: the broker went silent"
    assert session_stats.redeliveries_hidden > 1_000  # the burst of the sidecar's own ACKs
    assert left == []
