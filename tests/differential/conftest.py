"""Fixtures: a differential lab (an in-process sidecar in front of the broker, and the trio
loop the scenarios' clients run in) per broker and test module. The brokers are the suite's
``activemq`` / ``rabbitmq`` fixtures (tests/conftest.py), which also mark the tests; and a
RabbitMQ node of its own with ``stomp.implicit_connect`` on (``rmq_implicit_lab``, marked by
the ``rabbitmq`` marker of the test that uses it)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from testbed import ActiveMQ, RabbitMQ
from tests.conftest import _require_rabbitmq
from tests.differential.runner import Lab


@pytest.fixture(scope="module")
def amq_lab(activemq: ActiveMQ) -> Iterator[Lab]:
    with Lab("activemq", activemq.stomp_url, (activemq.host, activemq.stomp_port)) as lab:
        yield lab


@pytest.fixture(scope="module")
def rmq_lab(rabbitmq: RabbitMQ) -> Iterator[Lab]:
    with Lab("rabbitmq", rabbitmq.stomp_url, (rabbitmq.host, rabbitmq.stomp_port)) as lab:
        yield lab


@pytest.fixture(scope="module")
def rmq_implicit_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """RabbitMQ with ``stomp.implicit_connect = true`` (a frame before CONNECT opens the
    session), a node of its own (~5 s to start), and a lab in front of it."""
    _require_rabbitmq()
    broker = RabbitMQ(
        "rmqi", tmp_path_factory.mktemp("rabbitmq-implicit"), conf=["stomp.implicit_connect = true"]
    )
    with (
        broker,
        Lab("rabbitmq", broker.stomp_url, (broker.host, broker.stomp_port)) as lab,
    ):
        yield lab
