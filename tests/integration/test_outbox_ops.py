"""Operating the outbox (issue 28 part 5, docs/outbox.md), against a real ActiveMQ: frames
older than ``outbox_max_age`` dropped with the outcome ``expired`` (named to a connected app,
logged for an ended session's, counted), SIGTERM in outbox mode forwarding until the outbox is
empty or the drain deadline, the outbox forwarder's progress in events and ``/status``."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

import pytest

import protocol
from config import Config
from protocol import Command
from testbed import ActiveMQ, BrokerProcess, free_port
from testbed.sidecar import SidecarProcess
from tests.faultproxy import FaultProxy
from tests.integration.support import (
    WAIT,
    Client,
    RawClient,
    SidecarThread,
    sidecar_config,
    unique,
    wait_until,
)

#: Quick reconnects: the broker comes up in the middle of a test.
FAST = {"retry_interval": "50", "max_retry_interval": "250", "connect_timeout": "2000"}
EVENTS = {"destination": "/mq-sidecar/events", "id": "ev", "ack": "auto"}


def outbox_config(brokers: str, directory: Path, **overrides: object) -> Config:
    """A sidecar in outbox mode on ``directory`` with :data:`FAST` reconnects."""
    return sidecar_config(
        brokers, outbox="true", outbox_dir=str(directory), **{**FAST, **overrides}
    )


class App(RawClient):
    """A raw app client that keeps the CONNECTED it got (its ``session`` header: the key)."""

    connect_frame: protocol.Frame


def producer(sidecar: SidecarThread | SidecarProcess, *, events: bool = True) -> App:
    """An app connected to ``sidecar`` (answered by the sidecar when no broker is up),
    subscribed to its own session's events."""
    raw = App(sidecar.address)
    raw.connect_frame = raw.connect(**{"heart-beat": "0,0"})
    if events:
        raw.send_frame("SUBSCRIBE", {**EVENTS, "receipt": "ev"})
        assert raw.frame().get("receipt-id") == "ev"
    return raw


def send_stored(raw: RawClient, destination: str, bodies: list[str], **headers: str) -> None:
    """SENDs with receipts ``r-<body>``, each answered (stored) before the next; events that
    come meanwhile (SPOOLING) are skipped."""
    for body in bodies:
        raw.send_frame(
            "SEND", {"destination": destination, "receipt": f"r-{body}", **headers}, body.encode()
        )
        while (answer := raw.frame()).command is Command.MESSAGE:
            pass
        assert (answer.command, answer.get("receipt-id")) == (Command.RECEIPT, f"r-{body}")


def next_event(raw: RawClient, kind: str) -> dict[str, object]:
    """The body of the next event ``kind`` the app gets (other frames skipped)."""
    while True:
        frame = raw.frame()
        if frame.command is Command.MESSAGE and frame.get("event") == kind:
            body: dict[str, object] = json.loads(frame.body)
            return body


def on_broker(broker: BrokerProcess, destination: str, count: int) -> list[str]:
    """``count`` bodies read from ``destination`` on the broker itself, then 1 s of silence."""
    consumer = Client((broker.host, broker.stomp_port), vhost=broker.vhost)
    consumer.connect()
    consumer.conn.subscribe(destination, id="1", ack="auto")
    got = [str(m.body) for m in consumer.messages(count, timeout=WAIT)]
    consumer.expect_silence(1.0)
    consumer.close()
    return got


def sample(sidecar: SidecarThread, line_start: str) -> float:
    """The value of the metrics line starting ``line_start`` (name and labels)."""
    for line in sidecar.metrics().splitlines():
        if line.startswith(line_start + " "):
            return float(line.split()[-1])
    raise AssertionError(f"no {line_start} in the metrics")


@pytest.mark.activemq
def test_frames_older_than_outbox_max_age_expire_named_logged_and_counted(
    activemq: ActiveMQ, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """ActiveMQ down; ``outbox_max_age`` 1 s. App A stores three SENDs (one with an
    ``mq-sidecar-id`` of its own) and stays connected; app B stores two and leaves. After a
    second both sets are dropped: A gets an OUTCOME event naming each of its frames by
    ``mq-sidecar-id``, outcome ``expired``, cause ``outbox_max_age`` (then SPOOL_DRAINED:
    nothing of it is left); B's are logged by ``mq-sidecar-id``; all five counted
    (``mq_sidecar_outbox_expired_total``, ``mq_sidecar_frame_outcomes_total{outcome="expired"}``,
    ``/status``). A SEND A stores afterwards is forwarded once ActiveMQ is up, and nothing
    expired reaches it.

    ActiveMQ is "down" behind a fault proxy that refuses every connection, so that it "comes
    up" at once, before the late SEND is a second old (a broker started only then may take
    longer than that on a loaded machine, and the late SEND would rightly expire too)."""
    caplog.set_level(logging.WARNING, logger="mq_sidecar.outbox")
    broker = activemq
    destination = unique("/queue/outbox-age")
    with FaultProxy((broker.host, broker.stomp_port)) as proxy:
        proxy.refuse(True)
        config = outbox_config(
            f"stomp://127.0.0.1:{proxy.port}", tmp_path / "ob", outbox_max_age="1000"
        )
        _expire_then_forward(config, proxy, broker, destination, caplog)


def _expire_then_forward(
    config: Config,
    proxy: FaultProxy,
    broker: ActiveMQ,
    destination: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with SidecarThread(config) as sidecar:
        app_a = producer(sidecar)
        send_stored(app_a, destination, ["a0", "a1"])
        send_stored(app_a, destination, ["a2"], **{"mq-sidecar-id": "mine-a2"})
        app_b = producer(sidecar, events=False)
        key_b = app_b.connect_frame.get("session")
        send_stored(app_b, destination, ["b0", "b1"])
        app_b.close()
        assert sidecar.status()["outbox"]["frames"] == 5

        # About a second later, in one sweep, or two when the frames straddle one.
        frames: list[dict[str, object]] = []
        while len(frames) < 3:
            outcome = next_event(app_a, "OUTCOME")
            assert "outbox_max_age (1000 ms)" in str(outcome["reason"])
            assert isinstance(outcome["frames"], list)
            frames += outcome["frames"]
        assert [(f["outcome"], f["cause"], f["receipt"]) for f in frames] == [
            ("expired", "outbox_max_age", None)
        ] * 3
        ids = [f["mq_sidecar_id"] for f in frames]
        assert ids[2] == "mine-a2"
        assert all(ids), ids
        drained = next_event(app_a, "SPOOL_DRAINED")
        assert "expired" in str(drained["reason"])
        wait_until(lambda: sidecar.status()["outbox"]["expired_total"] == 5)
        assert sidecar.status()["outbox"]["frames"] == 0
        logged = [r.getMessage() for r in caplog.records if "dropped (expired)" in r.getMessage()]
        counts = [int(line.split(" frame(s) of session ")[0].split()[-1]) for line in logged]
        assert all(f"session {key_b} " in line for line in logged), logged
        assert sum(counts) == 2, logged
        assert sample(sidecar, "mq_sidecar_outbox_expired_total") == 5
        assert sample(sidecar, 'mq_sidecar_frame_outcomes_total{outcome="expired"}') == 5

        send_stored(app_a, destination, ["late"])
        proxy.refuse(False)
        wait_until(lambda: sidecar.status()["outbox"]["forwarded_total"] == 1, timeout=60)
        assert on_broker(broker, destination, 1) == ["late"]
        app_a.close()


def outbox_process(name: str, tmp_path: Path, brokers: str, **options: object) -> SidecarProcess:
    """A ``mq-sidecar run`` process in outbox mode on ``tmp_path / "ob"``, ready when /readyz
    answers (no broker needed), with :data:`FAST` reconnects."""
    sidecar = SidecarProcess(
        name,
        tmp_path,
        brokers=brokers,
        options={
            "outbox": True,
            "outbox_dir": str(tmp_path / "ob"),
            **{k: int(v) for k, v in FAST.items()},
            **options,
        },
        readiness="readyz",
    )
    sidecar.start()
    sidecar.wait_ready()
    return sidecar


@pytest.mark.activemq
def test_sigterm_forwards_the_outbox_before_exit_when_a_broker_comes(tmp_path: Path) -> None:
    """A real SIGTERM to a sidecar whose outbox holds 50 frames of a connected app while
    ActiveMQ is down: the session ends at once (nothing in its window), /readyz says the
    outbox is forwarded before exit, ActiveMQ starts a second later, and the process exits 0
    only once all 50 reached it (in order, once each), well within drain_timeout."""
    broker = ActiveMQ("amq-outbox-sigterm", tmp_path / "amq")
    destination = unique("/queue/outbox-exit")
    bodies = [f"x{n}" for n in range(50)]
    sidecar = outbox_process(
        "exit", tmp_path, broker.stomp_url, drain_timeout=20_000, connect_timeout=1000
    )
    try:
        app = producer(sidecar, events=False)
        send_stored(app, destination, bodies)
        stopper = threading.Thread(target=sidecar.stop, daemon=True)
        started = time.monotonic()
        stopper.start()
        wait_until(lambda: b"forwarding the outbox" in sidecar.get("/readyz")[1])
        status, readyz = sidecar.get("/readyz")
        assert app.frame().command is Command.ERROR  # the session drained at once
        time.sleep(1.0)  # the sidecar keeps trying: the outbox is not empty
        assert stopper.is_alive()
        with broker:
            stopper.join(WAIT)
            took = time.monotonic() - started
            assert not stopper.is_alive()
            assert on_broker(broker, destination, len(bodies)) == bodies
        app.close()
    finally:
        sidecar.stop()
    log = sidecar.log_text()
    assert status == 503
    assert "50 frame(s) left, until it is empty or the drain deadline" in readyz.decode()
    assert sidecar.returncode == 0
    assert took < 20.0, took
    assert "outbox: forwarding 50 frame(s) before exit" in log
    assert "outbox: empty; every frame it held was forwarded before exit" in log
    print(f"\nSIGTERM to exit with 50 frames forwarded, ActiveMQ up 1 s after: {took:.2f} s")


def test_sigterm_with_no_broker_exits_at_the_deadline_leaving_the_outbox(tmp_path: Path) -> None:
    """No broker at all: the process exits 0 at drain_timeout (1.5 s), logging what it could
    not forward, and the next sidecar on the same outbox_dir finds every frame."""
    nowhere = f"stomp://127.0.0.1:{free_port()}"
    destination = unique("/queue/outbox-exit")
    sidecar = outbox_process("exit-nowhere", tmp_path, nowhere, drain_timeout=1500)
    try:
        app = producer(sidecar, events=False)
        send_stored(app, destination, ["n0", "n1", "n2"])
        started = time.monotonic()
        sidecar.stop()
        took = time.monotonic() - started
        app.close()
    finally:
        sidecar.stop()
    assert sidecar.returncode == 0
    assert 1.5 <= took < 1.5 + 4.5, took
    assert "outbox: 3 frame(s)" in sidecar.log_text()
    assert "not forwarded by the drain deadline" in sidecar.log_text()
    with SidecarThread(outbox_config(nowhere, tmp_path / "ob", drain_timeout="500")) as again:
        assert again.status()["outbox"]["recovery"]["frames"] == 3


@pytest.mark.activemq
def test_the_outbox_forwarder_tells_its_progress_in_events_and_status(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An app stores 5 frames while ActiveMQ is down and leaves: its session key is the
    outbox forwarder's (/status: ``connecting``, 1 left). ActiveMQ starts: a monitor subscribed
    with ``mq-sidecar-scope:all`` gets OUTBOX_FORWARDING (the key, 5 frames, the broker) then
    OUTBOX_FORWARDED (5 forwarded); /status says ``idle``, 1 done, 5 forwarded; the event log
    has both lines."""
    caplog.set_level(logging.INFO, logger="mq_sidecar.events")
    broker = ActiveMQ("amq-outbox-forwarder", tmp_path / "amq")
    destination = unique("/queue/outbox-fwd")
    login = {"login": "ops", "passcode": "ops-pw-31"}
    config = outbox_config(
        broker.stomp_url, tmp_path / "ob", client_login="ops", client_passcode="ops-pw-31"
    )
    with SidecarThread(config) as sidecar:
        monitor = RawClient(sidecar.address)
        monitor.connect(**login, **{"heart-beat": "0,0"})
        monitor.send_frame("SUBSCRIBE", {**EVENTS, "mq-sidecar-scope": "all", "receipt": "all"})
        assert monitor.frame().get("receipt-id") == "all"
        app = RawClient(sidecar.address)
        key = app.connect(**login, **{"heart-beat": "0,0"}).get("session")
        send_stored(app, destination, [f"f{n}" for n in range(5)])
        app.close()
        wait_until(lambda: sidecar.status()["outbox"]["forwarder"]["state"] == "connecting")
        assert sidecar.status()["outbox"]["forwarder"]["sessions_left"] == 1
        with broker:
            forwarding = next_event(monitor, "OUTBOX_FORWARDING")
            forwarded = next_event(monitor, "OUTBOX_FORWARDED")
            wait_until(lambda: sidecar.status()["outbox"]["forwarder"]["state"] == "idle")
            forwarder = sidecar.status()["outbox"]["forwarder"]
            assert on_broker(broker, destination, 5) == [f"f{n}" for n in range(5)]
        monitor.close()
    label = f"{broker.host}:{broker.stomp_port}"
    assert (forwarding["session_id"], forwarding["stored_frames"]) == (key, 5)
    assert forwarding["spooled_frames"] == 5  # its first name, deprecated
    assert forwarding["to_broker"] == label
    assert forwarding["reason"] == "forwarding what an ended session of this process stored"
    assert (forwarded["session_id"], forwarded["forwarded_frames"]) == (key, 5)
    assert forwarded["frames"] == []
    assert forwarder["sessions_done"] == 1
    assert forwarder["forwarded_total"] == 5
    assert forwarder["session"] is None
    logged = [r.getMessage() for r in caplog.records if r.name == "mq_sidecar.events"]
    assert f"session {key}: OUTBOX_FORWARDING: 5 stored frame(s) to {label}" in "\n".join(logged)
    assert f"session {key}: OUTBOX_FORWARDED: 5 stored frame(s) forwarded to {label}" in (
        "\n".join(logged)
    )
