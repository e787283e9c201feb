"""Regression tests: the sidecar bugs the fuzzers found (tests/fuzz/reproducers.py), each
played once more against a real ``python -m proxy run`` in front of a real ActiveMQ. A try
fails when the sidecar answered wrongly or logged an ERROR (an internal error)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed import ActiveMQ
from testbed.sidecar import SidecarProcess
from tests.fuzz.driver import fuzz_sidecar
from tests.fuzz.reproducers import REPRODUCERS

pytestmark = pytest.mark.activemq


@pytest.fixture(scope="module")
def sidecar(
    activemq: ActiveMQ, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SidecarProcess]:
    work: Path = tmp_path_factory.mktemp("repro")
    with fuzz_sidecar("sidecar", work, brokers=activemq.stomp_url) as sc:
        yield sc


@pytest.mark.parametrize("name", sorted(REPRODUCERS))
def test_fuzz_finding_stays_fixed(sidecar: SidecarProcess, name: str) -> None:
    before = len(sidecar.log_text())
    wrong = REPRODUCERS[name](sidecar)
    time.sleep(1.0)  # the session ends and logs after the exchange
    logged = re.findall(
        r"^\S+ \S+ (?:ERROR|CRITICAL) .*$", sidecar.log_text()[before:], re.MULTILINE
    )
    assert wrong is None, wrong
    assert not logged, logged
