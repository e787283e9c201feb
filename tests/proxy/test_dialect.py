"""The broker dialect read off CONNECTED's ``server`` header (proxy/legs/dialect.py), one value
per broker (measured on ActiveMQ 5.17 and RabbitMQ 3.10; Artemis' from its documentation)."""

from __future__ import annotations

import pytest

from protocol import Command, Frame
from proxy.legs.dialect import BrokerDialect, HeartBeatAnswer


def test_before_any_leg_a_session_assumes_a_broker_that_follows_stomp() -> None:
    assert BrokerDialect() == BrokerDialect.from_server(None) == BrokerDialect.from_server("")
    assert BrokerDialect().cumulative_receipts
    assert BrokerDialect().artemis_duplicate_ids


def test_rabbitmq() -> None:
    d = BrokerDialect.from_server("RabbitMQ/3.10.8")
    assert not d.cumulative_receipts
    assert not d.artemis_duplicate_ids
    assert not d.client_ack_per_subscription
    assert d.acks_ignore_subscription
    assert d.copies_receipt_into_messages
    assert d.rabbitmq_stomp10_rules
    assert not d.receipt_breaks_wildcard_subscribe
    assert not d.stable_message_ids
    assert d.closes_silent_clients_quietly


def test_activemq_classic() -> None:
    d = BrokerDialect.from_server("ActiveMQ/5.17.6")
    assert d.cumulative_receipts
    assert not d.artemis_duplicate_ids
    assert d.receipt_breaks_wildcard_subscribe
    assert d.stable_message_ids
    assert not d.copies_receipt_into_messages
    assert d.closes_silent_clients_quietly


@pytest.mark.parametrize("server", ["ActiveMQ-Artemis/2.31.2 ActiveMQ Artemis Messaging Engine"])
def test_artemis(server: str) -> None:
    d = BrokerDialect.from_server(server)
    assert d.artemis_duplicate_ids
    assert d.stable_message_ids
    assert not d.receipt_breaks_wildcard_subscribe
    assert not d.closes_silent_clients_quietly  # not measured: the sidecar's ERROR
    assert d.server == server


@pytest.mark.parametrize(
    ("destination", "breaks"),
    [("/queue/a.*", True), ("/topic/a.>", True), ("/queue/a.b", False), ("/queue/*x", False)],
)
def test_a_receipt_on_a_wildcard_subscribe_is_avoided_on_activemq_only(
    destination: str, breaks: bool
) -> None:
    assert (
        BrokerDialect.from_server("ActiveMQ/5.17.6").subscribe_receipt_breaks(destination) is breaks
    )
    assert not BrokerDialect.from_server("RabbitMQ/3.10.8").subscribe_receipt_breaks(destination)


@pytest.mark.parametrize(
    ("ask", "activemq", "rabbitmq"),
    [
        # Measured: ActiveMQ 5.17.2 and RabbitMQ 3.10.8, CONNECT heart-beat -> CONNECTED.
        ((0, 0), (0, 0), (0, 0)),
        ((100, 100), (100, 100), (1000, 1000)),
        ((1500, 2500), (2500, 1500), (2000, 1000)),
        ((1000, 0), (0, 1000), (0, 1000)),
        ((0, 999), (999, 0), (1000, 0)),
    ],
)
def test_the_heart_beats_a_broker_answers(
    ask: tuple[int, int], activemq: tuple[int, int], rabbitmq: tuple[int, int]
) -> None:
    amq = BrokerDialect.from_server("ActiveMQ/5.17.2").heart_beat_answer
    rmq = BrokerDialect.from_server("RabbitMQ/3.10.8").heart_beat_answer
    assert (amq.answer(ask), rmq.answer(ask)) == (activemq, rabbitmq)


@pytest.mark.parametrize("server", ["", "ActiveMQ-Artemis/2.31.2"])
def test_a_broker_whose_heart_beat_rule_is_not_known(server: str) -> None:
    rule = BrokerDialect.from_server(server).heart_beat_answer
    assert rule is HeartBeatAnswer.UNKNOWN
    assert rule.answer((100, 100)) is None


@pytest.mark.parametrize("durable", [("durable", "true"), ("persistent", "true")])
def test_rabbitmq_refuses_a_durable_subscription_without_id(durable: tuple[str, str]) -> None:
    rmq = BrokerDialect.from_server("RabbitMQ/3.10.8")
    amq = BrokerDialect.from_server("ActiveMQ/5.17.2")
    without_id = Frame(Command.SUBSCRIBE, (("destination", "/topic/t"), durable))
    assert rmq.refuses_durable_without_id(without_id)
    assert not amq.refuses_durable_without_id(without_id)
    assert not rmq.refuses_durable_without_id(without_id.with_header("id", "s1"))
    plain = Frame(Command.SUBSCRIBE, (("destination", "/topic/t"), ("persistent", "false")))
    assert not rmq.refuses_durable_without_id(plain)
