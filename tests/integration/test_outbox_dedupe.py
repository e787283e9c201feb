"""Exactly once downstream across a kill -9 of the consumer's sidecar (issue 17 part 3,
docs/behaviour.md "Duplicate detection"), against a real ActiveMQ and a real ``mq-sidecar
run`` process: a consumer reads through a sidecar in outbox mode, the ids of what it
acknowledged are persisted in ``outbox_dir``, the sidecar is killed and a new one started on
the same directory, and copies of those messages (the same ``mq-sidecar-id``, sent to the
queue again, as a producer's sidecar that died before the broker's RECEIPT sends them) are
hidden from the consumer while a new message is shown."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from testbed import ActiveMQ, free_port, wait_stomp
from tests.integration.support import (
    WAIT,
    Client,
    SidecarThread,
    sidecar_config,
    sidecar_process,
    unique,
    wait_until,
)
from tests.integration.test_outbox import FAST, outbox_env


def _status(admin_port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/status", timeout=WAIT) as r:
        doc: dict[str, Any] = json.load(r)
    return doc


def _send_copies(broker: ActiveMQ, destination: str, ids: list[str]) -> None:
    """SEND one message per id straight to the broker, each carrying it as ``mq-sidecar-id``
    (what a producer's sidecar forwards, again after a restart: a new broker message, the
    same id), with a receipt: stored before this returns."""
    producer = Client((broker.host, broker.stomp_port), vhost=broker.vhost)
    producer.connect()
    for n, sidecar_id in enumerate(ids):
        headers = {"mq-sidecar-id": sidecar_id, "receipt": f"c{n}"}
        producer.conn.send(destination, f"body-{sidecar_id}", headers=headers)
        producer.receipt(f"c{n}")
    producer.close()


def _consumer(port: int, destination: str) -> Client:
    consumer = Client(("127.0.0.1", port))
    consumer.connect()
    consumer.conn.subscribe(destination, id="1", ack="client-individual", headers={"receipt": "s"})
    consumer.receipt("s")
    return consumer


@pytest.mark.activemq
def test_copies_are_hidden_after_a_kill_of_the_consumers_sidecar(tmp_path: Path) -> None:
    broker = ActiveMQ("amq-outbox-dedupe", tmp_path / "amq")
    directory = tmp_path / "ob"
    destination = unique("/queue/dedupe")
    ids = [f"order-{n}" for n in range(5)]
    port, admin_port = free_port(), free_port()
    with broker:
        env = outbox_env(broker.stomp_url, directory, f"127.0.0.1:{admin_port}")
        proc = sidecar_process(port, env)
        try:
            wait_stomp("127.0.0.1", port, timeout=30)
            consumer = _consumer(port, destination)
            _send_copies(broker, destination, ids)
            first = consumer.messages(len(ids))
            assert [m.body for m in first] == [f"body-{i}" for i in ids]
            for n, message in enumerate(first):
                assert "mq-sidecar-id" not in message.headers  # the sidecars' own
                consumer.conn.ack(message.headers["ack"], receipt=f"a{n}")
                consumer.receipt(f"a{n}")
            # Persisted (one commit or a few, trailing the ACKs): then the kill.
            wait_until(lambda: _status(admin_port)["outbox"]["seen_recorded"] == len(ids))
        finally:
            proc.kill()  # kill -9 of the consumer's sidecar
            proc.wait(timeout=WAIT)

        # The producer side forwards the same messages again (its sidecar never had the
        # broker's RECEIPT): new broker messages, the same mq-sidecar-ids. Then one new one.
        _send_copies(broker, destination, ids)
        config = sidecar_config(broker.stomp_url, outbox="true", outbox_dir=str(directory), **FAST)
        with SidecarThread(config) as sidecar:
            consumer = _consumer(sidecar.address[1], destination)
            _send_copies(broker, destination, ["order-new"])
            (shown,) = consumer.messages(1)
            assert shown.body == "body-order-new"
            consumer.conn.ack(shown.headers["ack"], receipt="a-new")
            consumer.receipt("a-new")
            consumer.expect_silence(1.0)
            status = sidecar.status()
            (session,) = status["sessions"]
            assert session["duplicates_hidden"] == len(ids)
            consumer.close()
        # Nothing is left on the queue: the hidden copies were acknowledged upstream.
        direct = Client((broker.host, broker.stomp_port), vhost=broker.vhost)
        direct.connect()
        direct.conn.subscribe(destination, id="1", ack="auto")
        direct.expect_silence(1.0)
        direct.close()
