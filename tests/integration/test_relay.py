"""The relay against real brokers: stomp.py apps through the sidecar do what real apps do.

Every test runs against ActiveMQ Classic and RabbitMQ (the ``relay`` fixture) unless the
feature exists on one broker only (selectors: ActiveMQ; see docs/brokers.md for the differences).
"""

from __future__ import annotations

import pytest

from tests.integration.support import (
    Client,
    RawClient,
    Received,
    Relay,
    client,
    unique,
)

VERSIONS = ["1.0", "1.1", "1.2"]


def subscribe(
    c: Client, destination: str, sub_id: str = "s1", ack: str = "auto", **headers: str
) -> None:
    """SUBSCRIBE and wait for its receipt, so the subscription is live before anything is sent."""
    receipt = f"sub-{sub_id}"
    c.conn.subscribe(
        destination=destination, id=sub_id, ack=ack, headers={"receipt": receipt, **headers}
    )
    c.receipt(receipt)


def send(c: Client, destination: str, body: str | bytes, **headers: str) -> None:
    """SEND with a receipt and wait for it (the broker has the message)."""
    receipt = f"send-{unique('r')}"
    c.conn.send(destination, body, headers={"receipt": receipt, **headers})
    c.receipt(receipt)


def ack(c: Client, m: Received, *, transaction: str | None = None, nack: bool = False) -> None:
    """ACK (or NACK) ``m`` the way a client of ``c.version`` does."""
    fn = c.conn.nack if nack else c.conn.ack
    if c.version == "1.2":
        fn(m.headers["ack"], transaction=transaction)
    elif c.version == "1.1":
        fn(m.headers["message-id"], m.headers["subscription"], transaction=transaction)
    else:
        fn(m.headers["message-id"], transaction=transaction)


@pytest.mark.parametrize("version", VERSIONS)
def test_send_and_receive_ack_auto(relay: Relay, version: str) -> None:
    dest = unique()
    with client(relay.address, version=version) as c:
        subscribe(c, dest)
        for i in range(3):
            send(c, dest, f"hello {i}", **{"x-app": f"v{i}"})
        got = c.messages(3)
    assert [m.body for m in got] == ["hello 0", "hello 1", "hello 2"]
    assert [m.headers["x-app"] for m in got] == ["v0", "v1", "v2"]
    assert all(m.headers["destination"] == dest for m in got)
    if version != "1.0":
        assert all(m.headers["subscription"] == "s1" for m in got)
    assert all("ack" not in m.headers for m in got), "auto mode needs no ack id"


def test_sends_carry_the_duplicate_detection_id_the_broker_understands(relay: Relay) -> None:
    """mq-sidecar-id on every SEND; Artemis' _AMQ_DUPL_ID only where it means something (not
    to ActiveMQ Classic or RabbitMQ, which would keep it as one more message property)."""
    dest = unique()
    with client(relay.address) as producer:
        send(producer, dest, "one")
    with client(relay.broker_address) as direct:
        subscribe(direct, dest)
        (got,) = direct.messages(1)
    assert got.headers["mq-sidecar-id"]
    assert "_AMQ_DUPL_ID" not in got.headers


def test_ack_auto_settles_every_message_upstream(relay: Relay) -> None:
    """An app's auto subscription is acknowledged upstream by the sidecar: one ACK per
    message on RabbitMQ, one cumulative client ACK per burst on ActiveMQ. Either way nothing
    is left for the next consumer, and a client-individual subscription on the same session
    keeps what its app did not acknowledge (a RabbitMQ client ACK would have settled it)."""
    dest, held_dest = unique(), unique()
    with client(relay.address) as producer:
        producer.conn.send(held_dest, "held", headers={"persistent": "true"})
        for i in range(300):
            producer.conn.send(dest, f"m{i}", headers={"persistent": "true"})
        send(producer, dest, "last", persistent="true")
    with client(relay.address) as app:
        subscribe(app, held_dest, "held", ack="client-individual")
        assert [m.body for m in app.messages(1)] == ["held"]
        subscribe(app, dest, "auto")
        got = app.messages(301)
    assert [m.body for m in got] == [f"m{i}" for i in range(300)] + ["last"]
    with client(relay.address) as after:
        subscribe(after, dest, "again")
        subscribe(after, held_dest, "held-again")
        assert [m.body for m in after.messages(1)] == ["held"]
        after.expect_silence(1.0)


@pytest.mark.parametrize("version", ["1.1", "1.2"])
def test_client_individual_ack_redelivers_only_unacked(relay: Relay, version: str) -> None:
    dest = unique()
    with client(relay.address, version=version) as producer:
        for i in range(3):
            send(producer, dest, f"m{i}", persistent="true")
    with client(relay.address, version=version) as c:
        subscribe(c, dest, ack="client-individual")
        got = c.messages(3)
        if version == "1.2":
            # The ack ids are the sidecar's own: small numbers, not the broker's ids.
            assert [m.headers["ack"] for m in got] == ["1", "2", "3"]
        ack(c, got[1])
    with client(relay.address, version=version) as c:
        subscribe(c, dest)
        again = c.messages(2)
        c.expect_silence()
    assert sorted(m.body for m in again) == ["m0", "m2"]


@pytest.mark.parametrize("version", VERSIONS)
def test_client_ack_is_cumulative(relay: Relay, version: str) -> None:
    dest = unique()
    with client(relay.address, version=version) as producer:
        for i in range(3):
            send(producer, dest, f"m{i}", persistent="true")
    with client(relay.address, version=version) as c:
        subscribe(c, dest, ack="client")
        got = c.messages(3)
        ack(c, got[1])  # acknowledges m0 and m1 (STOMP "ack:client" is cumulative)
        send(c, unique(), "flush")  # a receipted frame after the ACK: the broker has seen it
    with client(relay.address, version=version) as c:
        subscribe(c, dest)
        again = c.messages(1)
        c.expect_silence()
    assert [m.body for m in again] == ["m2"]


def test_nack(relay: Relay) -> None:
    """NACK: RabbitMQ requeues at once; ActiveMQ sends a persistent message to its DLQ."""
    dest = unique()
    with client(relay.address) as c:
        send(c, dest, "poison", persistent="true")
        subscribe(c, dest, ack="client-individual")
        m = c.expect("MESSAGE")
        ack(c, m, nack=True)
        if relay.flavor == "rabbitmq":
            again = c.expect("MESSAGE")
            assert again.body == "poison"
            assert again.headers["redelivered"] == "true"
            ack(c, again)
        else:
            c.expect_silence()
            # Other tests' poison may sit in the shared DLQ too: look for ours (bounded).
            subscribe(c, "/queue/ActiveMQ.DLQ", sub_id="dlq")
            for _ in range(100):
                dead = c.expect("MESSAGE")
                if dead.headers.get("original-destination") == dest:
                    break
            assert dead.body == "poison"
            assert dead.headers["message-id"] == m.headers["message-id"]


def test_transactions_commit_and_abort(relay: Relay) -> None:
    dest = unique()
    with client(relay.address) as producer, client(relay.address) as consumer:
        subscribe(consumer, dest)
        producer.conn.begin("tx-commit")
        producer.conn.send(dest, "committed", transaction="tx-commit")
        consumer.expect_silence(0.3)  # not visible before COMMIT
        producer.conn.commit("tx-commit", headers={"receipt": "c1"})
        producer.receipt("c1")
        assert consumer.expect("MESSAGE").body == "committed"
        producer.conn.begin("tx-abort")
        producer.conn.send(dest, "aborted", transaction="tx-abort")
        producer.conn.abort("tx-abort", headers={"receipt": "a1"})
        producer.receipt("a1")
        consumer.expect_silence()


def test_ack_in_aborted_transaction_is_not_an_ack(relay: Relay) -> None:
    dest = unique()
    with client(relay.address) as c:
        send(c, dest, "keep me", persistent="true")
    with client(relay.address) as c:
        subscribe(c, dest, ack="client-individual")
        m = c.expect("MESSAGE")
        c.conn.begin("tx1")
        ack(c, m, transaction="tx1")
        c.conn.abort("tx1", headers={"receipt": "ab"})
        c.receipt("ab")
    with client(relay.address) as c:
        subscribe(c, dest)
        again = c.expect("MESSAGE")
    assert again.body == "keep me"
    assert again.headers.get("redelivered") == "true"


def test_receipt_ids_are_mapped_per_session(relay: Relay) -> None:
    """Two sessions use the same receipt id; each gets its own RECEIPT. A consumer of their
    messages sees what it would see directly: RabbitMQ copies a SEND's receipt header into the
    MESSAGE (docs/brokers.md, "Receipts"), so there each MESSAGE shows its producer's receipt
    id; ActiveMQ shows none."""
    dest = unique()
    with client(relay.address) as a, client(relay.address) as b, client(relay.address) as consumer:
        subscribe(consumer, dest)
        a.conn.send(dest, "from a", headers={"receipt": "same"})
        b.conn.send(dest, "from b", headers={"receipt": "same"})
        assert a.receipt("same").headers["receipt-id"] == "same"
        assert b.receipt("same").headers["receipt-id"] == "same"
        a.expect_silence(0.2)
        b.expect_silence(0.2)
        got = consumer.messages(2)
        consumer.conn.send(dest, "no receipt")
        (plain,) = consumer.messages(1)
    assert sorted(m.body for m in got) == ["from a", "from b"]
    expected = "same" if relay.flavor == "rabbitmq" else None
    assert [m.headers.get("receipt") for m in got] == [expected, expected]
    assert "receipt" not in plain.headers  # the sidecar's own receipt request is not shown


@pytest.mark.activemq
def test_selector(amq_relay: Relay) -> None:
    dest = unique()
    with client(amq_relay.address) as c:
        subscribe(c, dest, selector="color = 'red'")
        for color in ("red", "blue", "red"):
            send(c, dest, color, color=color)
        got = c.messages(2)
        c.expect_silence()
    assert [m.body for m in got] == ["red", "red"]


def test_durable_topic_subscription(relay: Relay) -> None:
    topic = unique("/topic/t")
    sub_name = unique("d").lstrip("-")
    client_id = unique("cid").lstrip("-")
    if relay.flavor == "activemq":
        durable = {"activemq.subscriptionName": sub_name}
    else:
        durable = {"durable": "true", "auto-delete": "false"}
    c = Client(relay.address)
    c.connect(**{"client-id": client_id})
    subscribe(c, topic, sub_id=sub_name, **durable)
    c.close()
    with client(relay.address) as producer:
        for i in range(2):
            send(producer, topic, f"while away {i}", persistent="true")
    c = Client(relay.address)
    c.connect(**{"client-id": client_id})
    try:
        subscribe(c, topic, sub_id=sub_name, **durable)
        got = c.messages(2)
        assert [m.body for m in got] == ["while away 0", "while away 1"]
        # Removing the durable subscription: RabbitMQ takes UNSUBSCRIBE with durable:true;
        # ActiveMQ wants the consumer closed first, then UNSUBSCRIBE naming the subscription.
        if relay.flavor == "activemq":
            c.conn.unsubscribe(id=sub_name, headers={"receipt": "close"})
            c.receipt("close")
        c.conn.unsubscribe(id=sub_name, headers={"receipt": "unsub", **durable})
        c.receipt("unsub")
    finally:
        c.close()


def test_temp_queue_request_reply(relay: Relay) -> None:
    service = unique()
    with client(relay.address) as requester, client(relay.address) as responder:
        subscribe(responder, service, sub_id="svc")
        if relay.flavor == "activemq":  # ActiveMQ: the requester subscribes to its temp queue
            subscribe(requester, "/temp-queue/replies", sub_id="replies")
        requester.conn.send(service, "ping", headers={"reply-to": "/temp-queue/replies"})
        request = responder.expect("MESSAGE")
        reply_to = request.headers["reply-to"]
        assert reply_to != "/temp-queue/replies"  # rewritten by the broker to a real name
        responder.conn.send(reply_to, "pong")
        reply = requester.expect("MESSAGE")
    assert reply.body == "pong"


@pytest.mark.parametrize("version", ["1.1", "1.2"])
def test_one_mebibyte_binary_body_with_nul_bytes(relay: Relay, version: str) -> None:
    dest = unique()
    body = bytes(range(256)) * 4096
    assert len(body) == 1 << 20
    assert b"\0" in body
    with client(relay.address, version=version, binary=True) as c:
        subscribe(c, dest)
        send(c, dest, body)
        got = c.expect("MESSAGE")
    assert got.body == body
    assert got.headers["content-length"] == str(len(body))


@pytest.mark.parametrize("version", ["1.1", "1.2"])
def test_escaped_and_non_ascii_headers(relay: Relay, version: str) -> None:
    dest = unique()
    headers = {
        "x-colon": "a:b:c",
        "x-backslash": "C:\\temp\\new",
        "x-newline": "line one\nline two",
        "x-unicode": "héllo wörld ✓ 日本",
    }
    with client(relay.address, version=version) as c:
        subscribe(c, dest)
        send(c, dest, "ünïcødé body ✓", **headers)
        got = c.expect("MESSAGE")
    assert got.body == "ünïcødé body ✓"
    for name, value in headers.items():
        assert got.headers[name] == value, name


def test_versions_negotiated_per_leg(relay: Relay) -> None:
    """The app gets the version it asked for (``version:1.0`` too, as both brokers say it);
    upstream the sidecar speaks the broker's best."""
    for accept, expected in [("1.0", "1.0"), ("1.0,1.1", "1.1"), ("1.1,1.2", "1.2")]:
        raw = RawClient(relay.address, version="1.0")
        try:
            connected = raw.connect(**{"accept-version": accept})
            assert connected.get("version") == expected
            sessions = [s for s in relay.sidecar.statistics().sessions if s.app_version is not None]
            assert any(s.upstream_version == "1.2" for s in sessions)
        finally:
            raw.close()


def test_disconnect_with_receipt(relay: Relay) -> None:
    c = Client(relay.address)
    c.connect()
    c.conn.disconnect(receipt="bye")
    # stomp.py reports "disconnected" and the receipt in either order
    got = {c.control_queue.get(timeout=10).command for _ in range(2)}
    assert got == {"RECEIPT", "DISCONNECTED"}


@pytest.mark.parametrize("ask", ["0,500", "100,100", "1500,2500"])
def test_app_heartbeats_are_the_brokers_answer(relay: Relay, ask: str) -> None:
    """The app's CONNECTED ``heart-beat`` is what the broker answers the same ask directly
    (ActiveMQ: the ask swapped; RabbitMQ: swapped in whole seconds; docs/brokers.md,
    "Heart-beats"). Before: the sidecar's own ``client_heartbeat``, ``10000,10000``, so an
    app asking for fast beats got them ten times slower than from RabbitMQ."""
    answers = []
    for address in (relay.broker_address, relay.address):
        raw = RawClient(address)
        try:
            answers.append(raw.connect(**{"heart-beat": ask}).get("heart-beat"))
        finally:
            raw.close()
    direct, proxied = answers
    assert proxied == direct != "10000,10000"
