"""Evacuating a broker under load through a running sidecar, with two real, independent brokers
of one kind, ActiveMQ then RabbitMQ (docs/operations.md, "Actions"): the operator's
``POST /actions/evacuate`` over real HTTP, every session moving at its next quiet point with a
FAILOVER event whose reason says it was requested, and nothing lost or shown twice; then the
other way round, so both brokers are evacuated in turn and the consumer goes back to the
messages left on the first one.

The rules of the actions (405, 401, 403, 400, 409) are tested on memory streams in
tests/proxy/test_admin_actions.py, the sessions' moves on scripted brokers in
tests/proxy/test_evacuation.py.
"""

from __future__ import annotations

import http.client
import json
import logging
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import stomp
from prometheus_client.parser import text_string_to_metric_families

from testbed import ActiveMQ, RabbitMQ
from tests.integration.support import (
    WAIT,
    Client,
    SidecarThread,
    sidecar_config,
    unique,
    wait_until,
)
from tests.integration.test_admin import admin_address
from tests.integration.test_failover import (
    FAST,
    Consumer,
    Producer,
    exactly_once,
    next_event,
    subscribe_events,
)

TOKEN = "evac-90c1d4"
#: Messages of the transfer: the evacuation comes at a quarter of them.
N = 3000


Broker = ActiveMQ | RabbitMQ


@pytest.fixture(
    params=[
        pytest.param("activemq", marks=pytest.mark.activemq),
        pytest.param("rabbitmq", marks=pytest.mark.rabbitmq),
    ]
)
def two_brokers(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Broker, Broker]]:
    """Two independent brokers of one kind: the session's and one of this test's."""
    if request.param == "activemq":
        first: Broker = request.getfixturevalue("activemq")
        with ActiveMQ("evac-b", tmp_path) as second:
            yield first, second
        return
    first = request.getfixturevalue("rabbitmq")
    other = RabbitMQ("rmq-evac", tmp_path)
    other.start()
    try:
        other.wait_ready(90)
        yield first, other
    finally:
        other.stop()


def act(sidecar: SidecarThread, action: str, body: dict[str, object]) -> tuple[int, dict[str, Any]]:
    """``POST /actions/<action>`` with the token over a real HTTP connection."""
    conn = http.client.HTTPConnection(*admin_address(sidecar), timeout=WAIT)
    try:
        conn.request(
            "POST",
            f"/actions/{action}",
            body=json.dumps(body),
            headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        )
        response = conn.getresponse()
        answer: dict[str, Any] = json.loads(response.read())
        return response.status, answer
    finally:
        conn.close()


def brokers_up(sidecar: SidecarThread) -> bool:
    return all(b["state"] == "up" for b in sidecar.status()["brokers"])


def moved(control: Client, n: int, to_broker: str) -> list[dict[str, Any]]:
    """The next ``n`` FAILOVER events to ``to_broker`` (every session's: the control client
    watches them all)."""
    return [next_event(control, "FAILOVER", timeout=30, to_broker=to_broker) for _ in range(n)]


def settle(consumer: Consumer, quiet: float = 1.0, timeout: float = 30.0) -> None:
    """Wait until the consumer got nothing for ``quiet`` seconds (at most ``timeout``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before = consumer.count()
        time.sleep(quiet)
        if consumer.count() == before:
            return
    raise AssertionError(f"the consumer kept receiving for {timeout} s")


def sample(metrics: str, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(metrics):
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return float(s.value)
    return None


def drain_directly(broker: Broker, destination: str, quiet: float = 1.0) -> list[str]:
    """Every body left on ``destination`` of ``broker``, read by a direct client (ACKed),
    until ``quiet`` seconds pass without one (at most N + 100 bodies)."""
    bodies: list[str] = []
    last = [time.monotonic()]

    class Listener(stomp.ConnectionListener):  # type: ignore[misc]
        def on_message(self, frame: Any) -> None:
            bodies.append(frame.body)
            last[0] = time.monotonic()
            conn.ack(frame.headers["ack"])

    conn = stomp.Connection12(
        [(broker.host, broker.stomp_port)], heartbeats=(0, 0), vhost=broker.vhost
    )
    conn.set_listener("drain", Listener())
    conn.connect(wait=True)
    try:
        conn.subscribe(destination=destination, id="drain", ack="client-individual")
        while time.monotonic() - last[0] < quiet and len(bodies) <= N + 100:
            time.sleep(0.05)
    finally:
        conn.disconnect()
    return bodies


def test_evacuation_under_load_moves_every_session_and_loses_nothing(
    two_brokers: tuple[Broker, Broker], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A producer (persistent SENDs, each with a receipt) and a consumer (ACKing each
    MESSAGE) through the sidecar on broker A; at a third of the transfer the operator
    evacuates A: the three sessions (producer, consumer, control) move to B with FAILOVER
    ``broker A evacuated: requested on the admin plane by 127.0.0.1``, the producer gets every
    receipt and no ERROR. Then A is restored and B evacuated: the sessions go back to A, where
    the consumer gets what was left there (the messages A took after the consumer left it)
    and the sidecar hides what A redelivers of what the app already had. In the end the app
    has every body exactly once. Each action is logged with who asked."""
    caplog.set_level(logging.INFO, "mq_sidecar.admin")
    first, second = two_brokers
    token_file = tmp_path / "admin-token"
    token_file.write_text(TOKEN + "\n")
    a, b = f"127.0.0.1:{first.stomp_port}", f"127.0.0.1:{second.stomp_port}"
    config = sidecar_config(
        f"failover:({first.stomp_url},{second.stomp_url})",
        admin_token_file=str(token_file),
        broker_probe_interval=200,
        client_login="ops",  # the control client watches every session (mq-sidecar-scope:all)
        client_passcode="ops-secret",
        login="guest",  # RabbitMQ's default user; ActiveMQ takes anyone
        passcode="guest",
        **FAST,
    )
    credentials = ("ops", "ops-secret")
    dest = unique("/queue/evac")
    with SidecarThread(config) as sidecar:
        wait_until(lambda: brokers_up(sidecar))
        control = Client(sidecar.address)
        control.connect(*credentials)
        subscribe_events(control, every_session=True)
        consumer = Consumer(sidecar.address, dest, credentials=credentials)
        producer = Producer(sidecar.address, dest, N, credentials, persistent="true")
        producer.start()
        wait_until(lambda: consumer.count() >= N // 4, 60)

        started = time.monotonic()
        status, answer = act(sidecar, "evacuate", {"broker": a})
        at_evacuation = consumer.count()
        assert (status, answer["ok"]) == (200, True), answer
        away = moved(control, 3, b)
        first_move = time.monotonic() - started
        after_move = consumer.count()
        evacuated = next(x for x in sidecar.status()["brokers"] if x["broker"] == a)["evacuated"]
        receipts, errors = producer.outcome(60)
        settle(consumer)  # what B has, the consumer has
        before_back = len(set(consumer.bodies))

        status, answer = act(sidecar, "restore", {"broker": a})
        assert status == 200, answer
        time.sleep(0.5)  # B is up for the prober (its live legs), A again
        wait_until(lambda: brokers_up(sidecar))
        status, answer = act(sidecar, "evacuate", {"broker": b})
        assert status == 200, answer
        back = moved(control, 3, a)
        wait_until(lambda: len(set(consumer.bodies)) >= N, 60)
        time.sleep(0.5)  # anything shown twice would come now
        stats = sidecar.statistics()
        hidden = sum(s.duplicates_hidden + s.redeliveries_hidden for s in stats.sessions)
        metrics = sidecar.metrics()
        consumer.close()
        producer.client.close()
        control.close()
    left = {"A": drain_directly(first, dest), "B": drain_directly(second, dest)}
    missing, duplicated = exactly_once(consumer.bodies, N)
    unseen = [body for bodies in left.values() for body in bodies if body not in consumer.bodies]
    print(
        f"\n[evacuation under load] sent={N} receipts={receipts} consumed: at the evacuation "
        f"{at_evacuation}, once all moved {after_move}, on B before going back {before_back}, "
        f"in the end {len(consumer.bodies)}: missing={missing} duplicates_shown={duplicated} "
        f"hidden={hidden} first_move_s={first_move:.2f} "
        f"app_held_ms={[e['app_held_ms'] for e in away]}/{[e['app_held_ms'] for e in back]} "
        f"replayed={[e['replayed_frames'] for e in away]} "
        f"left_on_brokers={ {k: len(v) for k, v in left.items()} } unseen_left={len(unseen)}"
    )
    assert (missing, duplicated) == (0, 0)
    assert unseen == []
    assert errors == []
    assert consumer.errors == []
    assert receipts == N
    for event in away:
        assert event["reason"] == f"broker {a} evacuated: requested on the admin plane by 127.0.0.1"
        assert event["from_broker"] == a
    for event in back:
        assert event["reason"] == f"broker {b} evacuated: requested on the admin plane by 127.0.0.1"
    assert evacuated is not None
    assert evacuated["seconds_left"] is None
    failovers = "mq_sidecar_failovers_total"
    assert sample(metrics, failovers, from_broker=a, to_broker=b, reason="evacuated") == 3
    assert sample(metrics, failovers, from_broker=b, to_broker=a, reason="evacuated") == 3
    assert sample(metrics, "mq_sidecar_admin_actions_total", action="evacuate", result="done") == 2
    assert Counter(s.broker for s in stats.sessions) == {a: 3}
    asked = [m for m in caplog.messages if m.startswith("admin action")]
    assert [m.split(": ")[1] for m in asked] == ["done"] * 3
    assert all(
        m.startswith(
            (
                "admin action evacuate asked by 127.0.0.1:",
                "admin action restore asked by 127.0.0.1:",
            )
        )
        for m in asked
    )
