"""Fixtures: a sidecar in front of each real broker (session-scoped), and the ``relay``
fixture that runs a test once against ActiveMQ and once against RabbitMQ."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from testbed import ActiveMQ, RabbitMQ
from tests.integration.support import RawClient, Relay, SidecarThread, sidecar_config


@pytest.fixture(scope="session")
def amq_relay(activemq: ActiveMQ) -> Iterator[Relay]:
    with SidecarThread(sidecar_config(activemq.stomp_url)) as sidecar:
        yield Relay("activemq", activemq, sidecar)


@pytest.fixture(scope="session")
def rmq_relay(rabbitmq: RabbitMQ) -> Iterator[Relay]:
    with SidecarThread(sidecar_config(rabbitmq.stomp_url)) as sidecar:
        yield Relay("rabbitmq", rabbitmq, sidecar)


@pytest.fixture(params=["activemq", "rabbitmq"])
def relay(request: pytest.FixtureRequest) -> Relay:
    """A sidecar in front of each broker in turn."""
    name = "amq_relay" if request.param == "activemq" else "rmq_relay"
    result: Relay = request.getfixturevalue(name)
    return result


@pytest.fixture(autouse=True)
def _close_raw_clients() -> Iterator[None]:
    yield
    for raw in list(RawClient.open_clients):
        raw.close()
