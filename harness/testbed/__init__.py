"""Real STOMP brokers for tests, the demo and failover drills (stdlib only, synchronous).

``ActiveMQ`` (ActiveMQ Classic 5.17, Debian ``activemq``) and ``RabbitMQ`` (RabbitMQ 3.10 with
rabbitmq_stomp, Debian ``rabbitmq-server``) run as foreground child processes on free
127.0.0.1 ports with their own files under a work directory; ``scripts/setup.sh`` installs
them. The measured facts behind every choice are in docs/brokers.md, "Running them for tests".
"""

from __future__ import annotations

from testbed.activemq import ActiveMQ, activemq_installed, start_activemq_pair
from testbed.broker import BrokerError, BrokerProcess, BrokerTimeout
from testbed.probe import free_port, wait_stomp
from testbed.rabbitmq import RabbitMQ, rabbitmq_installed

__all__ = [
    "ActiveMQ",
    "BrokerError",
    "BrokerProcess",
    "BrokerTimeout",
    "RabbitMQ",
    "activemq_installed",
    "free_port",
    "rabbitmq_installed",
    "start_activemq_pair",
    "wait_stomp",
]
