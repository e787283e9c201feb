"""Real STOMP brokers for tests, the demo and failover drills (synchronous; stdlib, plus trustme
for the TLS listeners).

``ActiveMQ`` (ActiveMQ Classic 5.17, Debian ``activemq``) and ``RabbitMQ`` (RabbitMQ 3.10 with
rabbitmq_stomp, Debian ``rabbitmq-server``) run as foreground child processes on free
127.0.0.1 ports with their own files under a work directory; ``scripts/setup.sh`` installs
them. The measured facts behind every choice are in docs/brokers.md, "Running them for tests".
Both take ``tls=`` (a ``TlsListener``, see ``testbed.tls``) for a TLS STOMP listener too, with
certificates made per run by ``trustme`` (``write_server_files``, ``write_client_files``).
"""

from __future__ import annotations

from testbed.activemq import ActiveMQ, activemq_installed, start_activemq_pair
from testbed.broker import BrokerError, BrokerProcess, BrokerTimeout
from testbed.probe import free_port, wait_stomp
from testbed.rabbitmq import RabbitMQ, rabbitmq_installed
from testbed.spark_cluster import SparkCluster, SparkClusterError
from testbed.tls import TlsClientFiles, TlsListener, write_client_files, write_server_files

__all__ = [
    "ActiveMQ",
    "BrokerError",
    "BrokerProcess",
    "BrokerTimeout",
    "RabbitMQ",
    "SparkCluster",
    "SparkClusterError",
    "TlsClientFiles",
    "TlsListener",
    "activemq_installed",
    "free_port",
    "rabbitmq_installed",
    "start_activemq_pair",
    "wait_stomp",
    "write_client_files",
    "write_server_files",
]
