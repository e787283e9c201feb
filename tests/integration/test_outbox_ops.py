"""Operating the outbox (issue 28 part 5, docs/outbox.md), against a real ActiveMQ: frames
older than ``outbox_max_age`` dropped with the outcome ``expired`` (named to a connected app,
logged for an ended session's, counted), SIGTERM in outbox mode forwarding until the outbox is
empty or the drain deadline, the outbox forwarder's progress in events and ``/status``."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from config import Config
from protocol import Command
from testbed import ActiveMQ, BrokerProcess
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


def producer(sidecar: SidecarThread, *, events: bool = True) -> RawClient:
    """An app connected to ``sidecar`` (answered by the sidecar when no broker is up),
    subscribed to its own session's events."""
    raw = RawClient(sidecar.address)
    raw.connect(**{"heart-beat": "0,0"})
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
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """ActiveMQ down; ``outbox_max_age`` 1 s. App A stores three SENDs (one with an
    ``mq-sidecar-id`` of its own) and stays connected; app B stores two and leaves. After a
    second both sets are dropped: A gets an OUTCOME event naming each of its frames by
    ``mq-sidecar-id``, outcome ``expired``, cause ``outbox_max_age`` (then SPOOL_DRAINED:
    nothing of it is left); B's are logged by ``mq-sidecar-id``; all five counted
    (``mq_sidecar_outbox_expired_total``, ``mq_sidecar_frame_outcomes_total{outcome="expired"}``,
    ``/status``). A SEND A stores afterwards is forwarded once ActiveMQ is up, and nothing
    expired reaches it."""
    caplog.set_level(logging.WARNING, logger="mq_sidecar.outbox")
    broker = ActiveMQ("amq-outbox-age", tmp_path / "amq")
    destination = unique("/queue/outbox-age")
    config = outbox_config(broker.stomp_url, tmp_path / "ob", outbox_max_age="1000")
    with SidecarThread(config) as sidecar:
        app_a = producer(sidecar)
        send_stored(app_a, destination, ["a0", "a1"])
        send_stored(app_a, destination, ["a2"], **{"mq-sidecar-id": "mine-a2"})
        app_b = producer(sidecar, events=False)
        send_stored(app_b, destination, ["b0", "b1"])
        app_b.close()
        assert sidecar.status()["outbox"]["frames"] == 5

        outcome = next_event(app_a, "OUTCOME")  # about a second later
        frames = outcome["frames"]
        assert isinstance(frames, list)
        assert [(f["outcome"], f["cause"], f["receipt"]) for f in frames] == [
            ("expired", "outbox_max_age", None)
        ] * 3
        ids = [f["mq_sidecar_id"] for f in frames]
        assert ids[2] == "mine-a2"
        assert all(ids), ids
        assert "outbox_max_age (1000 ms)" in str(outcome["reason"])
        drained = next_event(app_a, "SPOOL_DRAINED")
        assert "expired" in str(drained["reason"])
        wait_until(lambda: sidecar.status()["outbox"]["expired_total"] == 5)
        assert sidecar.status()["outbox"]["frames"] == 0
        logged = [r.getMessage() for r in caplog.records if "dropped (expired)" in r.getMessage()]
        assert len(logged) == 1, logged
        assert "2 frame(s) of session" in logged[0], logged
        assert sample(sidecar, "mq_sidecar_outbox_expired_total") == 5
        assert sample(sidecar, 'mq_sidecar_frame_outcomes_total{outcome="expired"}') == 5

        send_stored(app_a, destination, ["late"])
        with broker:
            wait_until(lambda: sidecar.status()["outbox"]["forwarded_total"] == 1, timeout=60)
            assert on_broker(broker, destination, 1) == ["late"]
        app_a.close()
