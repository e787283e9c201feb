"""Transparency against real brokers: what an app sees through the sidecar is what it would see
from the broker directly (docs/behaviour.md, "Transparency first"), modulo the ids the sidecar
owns. Each test names the behaviour a user found different and checks it on the broker(s) it
concerns; tests/differential/ compares whole scenarios run both ways.
"""

from __future__ import annotations

from tests.integration.support import Client, Relay, client, unique

#: Headers of a received MESSAGE that belong to that delivery, not to the message: a client
#: that re-publishes a message copies the rest (the Ruby stomp gem's ``unreceive`` and most
#: dead-letter code do so).
_DELIVERY_HEADERS = {"ack", "subscription", "message-id", "destination", "content-length"}


def _subscribe(c: Client, destination: str, sub_id: str = "s1") -> None:
    c.conn.subscribe(destination=destination, id=sub_id, ack="client-individual",
                     headers={"receipt": f"sub-{sub_id}"})  # fmt: skip
    c.receipt(f"sub-{sub_id}")


def test_a_republished_message_with_copied_headers_is_a_new_message(relay: Relay) -> None:
    """Re-publishing a received MESSAGE to the same destination with its headers copied
    delivers the copy, as the broker does directly. Before: the copy carried the first
    message's ``mq-sidecar-id``, the consumer's sidecar took it for a duplicate, acknowledged
    it upstream and hid it: the app waited forever (a silent loss)."""
    dest = unique()
    with client(relay.address) as producer, client(relay.address) as consumer:
        _subscribe(consumer, dest)
        producer.conn.send(dest, "order 1", headers={"receipt": "p1", "x-attempt": "1"})
        producer.receipt("p1")
        (first,) = consumer.messages(1)
        assert "mq-sidecar-id" not in first.headers  # the sidecar's own id stays its own
        copied = {k: v for k, v in first.headers.items() if k not in _DELIVERY_HEADERS}
        copied["x-attempt"] = "2"
        consumer.conn.ack(first.headers["ack"])
        consumer.conn.send(dest, first.body, headers={**copied, "receipt": "again"})
        consumer.receipt("again")
        (second,) = consumer.messages(1)
        assert (second.body, second.headers["x-attempt"]) == ("order 1", "2")
        consumer.conn.ack(second.headers["ack"])
        consumer.expect_silence(0.3)


def test_an_idempotence_key_the_app_sets_still_suppresses_its_retry(relay: Relay) -> None:
    """An app asks for idempotence by setting ``mq-sidecar-id`` on its SEND (a Spark task
    retry reuses its row's id): a second SEND with the same key, from another session, is
    recognised by the consumer's sidecar and not shown again. The key is not shown to the
    consumer (it is the sidecars' duplicate-detection id)."""
    dest = unique()
    with client(relay.address) as consumer:
        _subscribe(consumer, dest)
        for attempt in ("1", "2"):
            with client(relay.address) as producer:
                producer.conn.send(
                    dest,
                    "row 7",
                    headers={"mq-sidecar-id": "job-1/p0/7", "receipt": "p", "x-attempt": attempt},
                )
                producer.receipt("p")
        (only,) = consumer.messages(1)
        assert only.headers["x-attempt"] == "1"
        assert "mq-sidecar-id" not in only.headers
        consumer.conn.ack(only.headers["ack"])
        consumer.expect_silence(0.5)
