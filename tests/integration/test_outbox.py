"""The outbox wired into the daemon (issue 17, docs/outbox.md), against real brokers and real
processes: producers answered with no broker up, then every message forwarded once; the
CONNECT answered by the sidecar itself; a full outbox; two sidecars on one directory; what a
killed sidecar or an ended session left, forwarded by the outbox forwarder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from config import Config
from protocol import Command
from testbed import ActiveMQ, BrokerProcess, RabbitMQ, free_port, wait_stomp
from tests.integration.support import (
    WAIT,
    Client,
    RawClient,
    SidecarThread,
    sidecar_config,
    sidecar_process,
    unique,
    wait_until,
)

#: Quick reconnects: the broker comes up in the middle of the test.
FAST = {"retry_interval": "50", "max_retry_interval": "250", "connect_timeout": "2000"}


def _nowhere() -> str:
    """A broker URL on a loopback port where nothing listens."""
    return f"stomp://127.0.0.1:{free_port()}"


def outbox_env(brokers: str, directory: Path, admin_listen: str) -> dict[str, str]:
    """The environment of a ``mq-sidecar run`` process in outbox mode on ``directory``
    (:func:`~tests.integration.support.sidecar_process`), with :data:`FAST` reconnects."""
    return {
        "MQ_SIDECAR_BROKERS": brokers,
        "MQ_SIDECAR_ADMIN_LISTEN": admin_listen,
        "MQ_SIDECAR_OUTBOX": "true",
        "MQ_SIDECAR_OUTBOX_DIR": str(directory),
        **{f"MQ_SIDECAR_{k.upper()}": v for k, v in FAST.items()},
    }


def _outbox_config(brokers: str, directory: Path, **overrides: object) -> Config:
    return sidecar_config(
        brokers, outbox="true", outbox_dir=str(directory), **{**FAST, **overrides}
    )


def test_connect_is_answered_with_no_broker_up(tmp_path: Path) -> None:
    config = sidecar_config(_nowhere(), outbox="true", outbox_dir=str(tmp_path / "ob"), **FAST)
    with SidecarThread(config) as sidecar:
        raw = RawClient(sidecar.address)
        connected = raw.connect(**{"accept-version": "1.1,1.2", "heart-beat": "0,0"})
        assert connected.get("version") == "1.2"
        assert (connected.get("server") or "").startswith("mq-sidecar/")
        assert connected.get("heart-beat") == "10000,10000"  # client_heartbeat
        (session,) = sidecar.statistics().sessions
        assert session.state == "reconnecting"
        assert sidecar.status()["outbox"]["frames"] == 0
        raw.close()


def test_without_the_outbox_no_broker_means_an_error(tmp_path: Path) -> None:
    config = sidecar_config(
        _nowhere(), initial_connect_attempts="1", initial_connect_period="0", **FAST
    )
    with SidecarThread(config) as sidecar:
        raw = RawClient(sidecar.address)
        raw.send_frame("CONNECT", {"accept-version": "1.2", "host": "/"})
        assert raw.frame().command is Command.ERROR
        raw.close()


def test_a_full_outbox_holds_the_app_then_refuses_naming_the_limit(tmp_path: Path) -> None:
    config = _outbox_config(
        _nowhere(),
        tmp_path / "ob",
        outbox_max_bytes="2000",
        call_timeout="1000",
        drain_timeout="500",  # no broker: what it holds is not forwarded before exit
    )
    destination = unique()
    body = b"x" * 500
    with SidecarThread(config) as sidecar:
        raw = RawClient(sidecar.address)
        raw.connect()
        stored = 0
        for n in range(3):  # about 600 bytes each as stored
            raw.send_frame("SEND", {"destination": destination, "receipt": f"r{n}"}, body)
            answer = raw.frame()
            assert answer.command is Command.RECEIPT, answer
            assert answer.get("receipt-id") == f"r{n}"
            stored += 1
        assert sidecar.status()["outbox"]["frames"] == stored
        raw.send_frame("SEND", {"destination": destination, "receipt": "full"}, body)
        started = time.monotonic()
        answer = raw.frame()  # held (back-pressure) until call_timeout, then refused
        waited = time.monotonic() - started
        assert answer.command is Command.ERROR, answer
        assert answer.get("receipt-id") == "full"
        assert "outbox_max_bytes" in (answer.get("message") or "")
        assert answer.get("mq-sidecar-outcome") == "refused"
        assert waited >= 0.5  # it waited for room first (call_timeout is 1 s)
        # The session goes on: the next frame that fits is stored... once there is room.
        assert sidecar.status()["outbox"]["frames"] == stored
        raw.close()


def test_a_second_sidecar_on_the_same_outbox_dir_exits_1(tmp_path: Path) -> None:
    directory = tmp_path / "ob"
    brokers = _nowhere()
    with SidecarThread(_outbox_config(brokers, directory)):
        result = subprocess.run(
            [sys.executable, "-m", "proxy", "run", "--listen", "127.0.0.1:0"],
            capture_output=True,
            text=True,
            timeout=60,
            env={
                **os.environ,
                "MQ_SIDECAR_BROKERS": brokers,
                "MQ_SIDECAR_ADMIN_LISTEN": "127.0.0.1:0",
                "MQ_SIDECAR_OUTBOX": "true",
                "MQ_SIDECAR_OUTBOX_DIR": str(directory),
            },
            check=False,
        )
    assert result.returncode == 1, result
    lines = [line for line in result.stderr.splitlines() if line.startswith("mq-sidecar:")]
    assert len(lines) == 1, result.stderr
    assert f"process {os.getpid()}" in lines[0]
    assert "two sidecars cannot share one outbox_dir" in lines[0]
    assert "Traceback" not in result.stderr


@pytest.mark.activemq
def test_receipts_while_the_broker_is_down_then_every_message_arrives_once(
    tmp_path: Path,
) -> None:
    broker = ActiveMQ("amq-outbox", tmp_path / "amq")
    destination = unique("/queue/outbox")
    count = 50
    with SidecarThread(_outbox_config(broker.stomp_url, tmp_path / "ob")) as sidecar:
        producer = Client(sidecar.address)
        producer.connect()  # answered by the sidecar: no broker yet
        for n in range(count):
            producer.conn.send(destination, f"m{n}", headers={"receipt": f"r{n}"})
        for n in range(count):
            producer.receipt(f"r{n}")
        outbox = sidecar.status()["outbox"]
        assert outbox["frames"] == count
        assert outbox["forwarded_total"] == 0
        with broker:  # the broker comes up after the SENDs were confirmed
            # Removed from the store (frames), then counted (forwarded_total), in that order.
            wait_until(lambda: sidecar.status()["outbox"]["forwarded_total"] == count, timeout=60)
            assert sidecar.status()["outbox"]["frames"] == 0
            metrics = sidecar.metrics()
            assert f"mq_sidecar_outbox_forwarded_total {float(count)}" in metrics
            assert "mq_sidecar_outbox_frames 0.0" in metrics
            consumer = Client((broker.host, broker.stomp_port), vhost=broker.vhost)
            consumer.connect()
            consumer.conn.subscribe(destination, id="1", ack="auto")
            bodies = [m.body for m in consumer.messages(count, timeout=WAIT)]
            consumer.expect_silence(1.0)  # no copy of any
            assert bodies == [f"m{n}" for n in range(count)]  # in order, each once
            consumer.close()
            producer.close()


def _consume_once_in_order(broker: BrokerProcess, destination: str, bodies: list[str]) -> None:
    """Every body arrives at a consumer of ``destination`` on the broker itself, once each,
    in order, and nothing more."""
    consumer = Client((broker.host, broker.stomp_port), vhost=broker.vhost)
    consumer.connect()
    consumer.conn.subscribe(destination, id="1", ack="auto")
    got = [m.body for m in consumer.messages(len(bodies), timeout=WAIT)]
    consumer.expect_silence(1.0)
    consumer.close()
    assert got == bodies


@pytest.mark.activemq
def test_what_a_killed_sidecar_stored_is_forwarded_by_the_next(tmp_path: Path) -> None:
    broker = ActiveMQ("amq-outbox-kill", tmp_path / "amq")
    directory = tmp_path / "ob"
    destination = unique("/queue/outbox")
    bodies = [f"k{n}" for n in range(40)]
    port = free_port()
    proc = sidecar_process(port, outbox_env(broker.stomp_url, directory, "127.0.0.1:0"))
    try:
        wait_stomp("127.0.0.1", port, timeout=30)  # answered by the sidecar: no broker
        producer = Client(("127.0.0.1", port))
        producer.connect()
        for n, body in enumerate(bodies):
            producer.conn.send(destination, body, headers={"receipt": f"r{n}"})
        for n in range(len(bodies)):
            producer.receipt(f"r{n}")
    finally:
        proc.kill()  # kill -9: the sidecar never forwarded them
        proc.wait(timeout=WAIT)
    producer.conn.disconnect()
    with broker, SidecarThread(_outbox_config(broker.stomp_url, directory)) as sidecar:
        assert sidecar.status()["outbox"]["recovery"]["frames"] == len(bodies)
        wait_until(lambda: sidecar.status()["outbox"]["unowned_sessions"] == 0, timeout=60)
        wait_until(lambda: sidecar.status()["outbox"]["forwarded_total"] == len(bodies), timeout=60)
        assert sidecar.status()["outbox"]["frames"] == 0
        _consume_once_in_order(broker, destination, bodies)


@pytest.mark.activemq
@pytest.mark.parametrize("leaving", ["close", "disconnect"])
def test_what_an_ended_session_stored_is_forwarded_when_a_broker_comes(
    tmp_path: Path, leaving: str
) -> None:
    broker = ActiveMQ("amq-outbox-orphan", tmp_path / "amq")
    destination = unique("/queue/outbox")
    bodies = [f"o{n}" for n in range(20)]
    with SidecarThread(_outbox_config(broker.stomp_url, tmp_path / "ob")) as sidecar:
        raw = RawClient(sidecar.address)
        raw.connect()
        for n, body in enumerate(bodies):
            raw.send_frame("SEND", {"destination": destination, "receipt": f"r{n}"}, body.encode())
            assert raw.frame().get("receipt-id") == f"r{n}"
        if leaving == "disconnect":  # answered by the sidecar: no broker, all stored
            raw.send_frame("DISCONNECT", {"receipt": "bye"})
            assert raw.frame().get("receipt-id") == "bye"
        raw.close()  # with no broker up
        wait_until(lambda: not sidecar.statistics().sessions)
        assert sidecar.status()["outbox"]["frames"] == len(bodies)
        with broker:
            wait_until(
                lambda: sidecar.status()["outbox"]["forwarded_total"] == len(bodies), timeout=60
            )
            _consume_once_in_order(broker, destination, bodies)


@pytest.fixture(params=["activemq", "rabbitmq"])
def live_broker(request: pytest.FixtureRequest) -> BrokerProcess:
    """Each broker of the test bed in turn, up for the whole test."""
    broker: ActiveMQ | RabbitMQ = request.getfixturevalue(request.param)
    return broker


def test_with_a_broker_up_the_broker_connected_and_every_message_arrives_once(
    live_broker: BrokerProcess, tmp_path: Path
) -> None:
    destination = unique("/queue/outbox")
    bodies = [f"u{n}" for n in range(30)]
    config = _outbox_config(live_broker.stomp_url, tmp_path / "ob")
    with SidecarThread(config) as sidecar:
        raw = RawClient(sidecar.address)
        connected = raw.connect(host=live_broker.vhost)
        assert not (connected.get("server") or "").startswith("mq-sidecar/")  # the broker's
        for n, body in enumerate(bodies):
            raw.send_frame("SEND", {"destination": destination, "receipt": f"r{n}"}, body.encode())
        for n in range(len(bodies)):
            answer = raw.frame()
            assert (answer.command, answer.get("receipt-id")) == (Command.RECEIPT, f"r{n}")
        wait_until(lambda: sidecar.status()["outbox"]["forwarded_total"] == len(bodies))
        assert sidecar.status()["outbox"]["frames"] == 0
        raw.send_frame("DISCONNECT", {"receipt": "bye"})
        assert raw.frame().get("receipt-id") == "bye"  # once each RECEIPT: none a second time
        raw.close()
        _consume_once_in_order(live_broker, destination, bodies)


@pytest.mark.activemq
def test_a_transaction_committed_with_the_broker_down_is_durable_and_forwarded(
    tmp_path: Path,
) -> None:
    broker = ActiveMQ("amq-outbox-tx", tmp_path / "amq")
    destination = unique("/queue/outbox")
    bodies = [f"t{n}" for n in range(10)]
    with SidecarThread(_outbox_config(broker.stomp_url, tmp_path / "ob")) as sidecar:
        raw = RawClient(sidecar.address)
        raw.connect()
        raw.send_frame("BEGIN", {"transaction": "tx"})
        for body in bodies:
            raw.send_frame("SEND", {"destination": destination, "transaction": "tx"}, body.encode())
        raw.send_frame("COMMIT", {"transaction": "tx", "receipt": "commit"})
        answer = raw.frame()
        assert (answer.command, answer.get("receipt-id")) == (Command.RECEIPT, "commit")
        assert sidecar.status()["outbox"]["frames"] == len(bodies)  # durable at the RECEIPT
        with broker:
            wait_until(
                lambda: sidecar.status()["outbox"]["forwarded_total"] == len(bodies), timeout=60
            )
            _consume_once_in_order(broker, destination, bodies)
        raw.close()


@pytest.mark.activemq
def test_spooling_events_and_readiness_while_activemq_is_down_then_up(tmp_path: Path) -> None:
    """The control channel says when the session's SENDs started to wait in the outbox
    (SPOOLING, before their first RECEIPT) and when they had all reached ActiveMQ
    (SPOOL_DRAINED, after the FAILOVER onto it), once each; /readyz is ready throughout
    (docs/behaviour.md, "SPOOLING and SPOOL_DRAINED"; docs/operations.md, "Readiness in
    outbox mode")."""
    broker = ActiveMQ("amq-outbox-events", tmp_path / "amq")
    destination = unique("/queue/outbox")
    bodies = [f"e{n}" for n in range(10)]
    with SidecarThread(_outbox_config(broker.stomp_url, tmp_path / "ob")) as sidecar:
        raw = RawClient(sidecar.address)
        raw.connect()  # answered by the sidecar: no broker yet
        events = {"destination": "/mq-sidecar/events", "id": "ev", "ack": "auto"}
        raw.send_frame("SUBSCRIBE", {**events, "receipt": "ev"})
        assert raw.frame().get("receipt-id") == "ev"
        for n, body in enumerate(bodies):
            raw.send_frame("SEND", {"destination": destination, "receipt": f"r{n}"}, body.encode())
        frames = [raw.frame() for _ in range(len(bodies) + 1)]
        assert [(f.command, f.get("event")) for f in frames[:2]] == [
            (Command.MESSAGE, "SPOOLING"),
            (Command.RECEIPT, None),
        ]
        assert [f.get("receipt-id") for f in frames[1:]] == [f"r{n}" for n in range(len(bodies))]
        spooling = json.loads(frames[0].body)
        assert spooling["spooled_frames"] == 1
        assert spooling["outbox_max_bytes"] == sidecar.config.outbox_max_bytes
        status = sidecar.status()
        assert status["ready"] is True, status["not_ready_reasons"]
        with broker:
            got = [raw.frame(), raw.frame()]
            assert [f.get("event") for f in got] == ["FAILOVER", "SPOOL_DRAINED"]
            drained = json.loads(got[1].body)
            assert drained["forwarded_frames"] == len(bodies)
            assert drained["to_broker"] == f"{broker.host}:{broker.stomp_port}"
            assert sidecar.status()["outbox"]["frames"] == 0
            _consume_once_in_order(broker, destination, bodies)
            raw.close()
