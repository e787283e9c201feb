"""Fixtures of the stomp data source's write tests (issue 26).

* ``spark`` (module): a local SparkSession, ``local[2,2]`` (2 cores; a failed task is retried
  once), with :class:`mq_sidecar_spark.StompDataSource` registered; the JVM's output goes to
  ``spark.log`` in a temporary directory. ~5 s to start on 2 cores. Spark's Python workers
  inherit this process's environment, so they import ``mq_sidecar_spark`` and pyarrow from
  the same ``PYTHONPATH`` (measured: the worker's ``PYTHONPATH`` is Spark's own zips followed
  by ours).
* ``amq_sidecar`` / ``rmq_sidecar`` (module): a real mq-sidecar process
  (:class:`testbed.sidecar.SidecarProcess`) in front of the session's ActiveMQ / RabbitMQ.

A missing pyarrow (Spark's Python data source write path needs it on every worker) or a
``mq_sidecar_spark`` that the workers cannot import FAILS the tests with the fix to apply.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from testbed import ActiveMQ, RabbitMQ
from testbed.sidecar import SidecarProcess

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Sidecar options for the tests: quiet log, fast reconnects.
SIDECAR_OPTIONS: dict[str, object] = {
    "log_level": "warning",
    "retry_interval": 50,
    "max_retry_interval": 500,
    "connect_timeout": 2000,
}


def _require(module: str, fix: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.fail(f"{module} is not importable: {fix}", pytrace=False)


@pytest.fixture(scope="module")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    """A local SparkSession with the stomp data source registered (module docstring)."""
    _require("pyarrow", "Spark's Python data source writes need it (pip install -e spark)")
    _require("mq_sidecar_spark", "pip install -e spark, or put spark/ on PYTHONPATH")
    from mq_sidecar_spark import StompDataSource
    from pipeline.spark import start_spark, stop_spark

    log = tmp_path_factory.mktemp("spark") / "spark.log"
    session = start_spark("mq-sidecar-spark-tests", master="local[2,2]", log_file=log)
    try:
        session.dataSource.register(StompDataSource)
        yield session
    finally:
        stop_spark(session)


def _sidecar(
    name: str, broker: ActiveMQ | RabbitMQ, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SidecarProcess]:
    sidecar = SidecarProcess(
        name,
        tmp_path_factory.mktemp(name),
        brokers=broker.stomp_url,
        options=SIDECAR_OPTIONS,
        vhost=broker.vhost,
    )
    with sidecar:
        yield sidecar


@pytest.fixture(scope="module")
def amq_sidecar(
    activemq: ActiveMQ, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SidecarProcess]:
    """A sidecar process in front of the session's ActiveMQ."""
    yield from _sidecar("amq-sidecar", activemq, tmp_path_factory)


@pytest.fixture(scope="module")
def rmq_sidecar(
    rabbitmq: RabbitMQ, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SidecarProcess]:
    """A sidecar process in front of the session's RabbitMQ."""
    yield from _sidecar("rmq-sidecar", rabbitmq, tmp_path_factory)
