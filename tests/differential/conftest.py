"""Fixtures: a differential lab (an in-process sidecar in front of the broker, and the trio
loop the scenarios' clients run in) per broker and test module. The brokers are the suite's
``activemq`` / ``rabbitmq`` fixtures (tests/conftest.py), which also mark the tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from testbed import ActiveMQ, RabbitMQ
from tests.differential.runner import Lab


@pytest.fixture(scope="module")
def amq_lab(activemq: ActiveMQ) -> Iterator[Lab]:
    with Lab("activemq", activemq.stomp_url, (activemq.host, activemq.stomp_port)) as lab:
        yield lab


@pytest.fixture(scope="module")
def rmq_lab(rabbitmq: RabbitMQ) -> Iterator[Lab]:
    with Lab("rabbitmq", rabbitmq.stomp_url, (rabbitmq.host, rabbitmq.stomp_port)) as lab:
        yield lab
