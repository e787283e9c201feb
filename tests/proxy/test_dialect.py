"""The broker dialect read off CONNECTED's ``server`` header (proxy/legs/dialect.py), one value
per broker (measured on ActiveMQ 5.17 and RabbitMQ 3.10; Artemis' from its documentation)."""

from __future__ import annotations

import pytest

from proxy.legs.dialect import BrokerDialect


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


def test_activemq_classic() -> None:
    d = BrokerDialect.from_server("ActiveMQ/5.17.6")
    assert d.cumulative_receipts
    assert not d.artemis_duplicate_ids
    assert d.receipt_breaks_wildcard_subscribe
    assert d.stable_message_ids
    assert not d.copies_receipt_into_messages


@pytest.mark.parametrize("server", ["ActiveMQ-Artemis/2.31.2 ActiveMQ Artemis Messaging Engine"])
def test_artemis(server: str) -> None:
    d = BrokerDialect.from_server(server)
    assert d.artemis_duplicate_ids
    assert d.stable_message_ids
    assert not d.receipt_breaks_wildcard_subscribe
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
