"""The admin HTTP port against hostile requests over real sockets (issue 7), smaller than the
STOMP run: garbage, valid requests after random mutations, request lines and headers beyond
8 KiB, requests with bodies, pipelined requests, slowloris (the admin plane's 10 s request
timeout: 408), resets mid-request and mid-response, ``GET /events`` readers that reset, and a
storm of more connections than the admin plane's limit of 64, with a well-behaved STOMP
session running (the admin plane must never disturb STOMP traffic).

Then: no traceback or ERROR line, no hang, the statuses each case must get, ``/healthz``
answers 200, no admin connection or event-stream reader left, the STOMP session intact,
file descriptors and RSS back near the baseline.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed import ActiveMQ
from testbed.sidecar import SidecarProcess
from tests.fuzz.driver import fuzz_sidecar, run_http_fuzz
from tests.fuzz.streams import HTTP_KINDS

SEED = int(os.environ.get("MQ_SIDECAR_FUZZ_SEED", "1"))


@pytest.fixture
def sidecar(activemq: ActiveMQ, tmp_path: Path) -> Iterator[SidecarProcess]:
    """A fresh sidecar process in front of the session's ActiveMQ."""
    with fuzz_sidecar("sidecar", tmp_path, brokers=activemq.stomp_url) as process:
        yield process


@pytest.mark.timeout(300)
def test_hostile_http_requests_leave_the_admin_plane_intact(sidecar: SidecarProcess) -> None:
    report = run_http_fuzz(sidecar, seed=SEED, count=80, concurrency=8)
    print(report.text())
    text = report.text()
    assert report.crashed is None, text
    assert report.bad_log_lines == [], text
    assert report.tally.hangs == 0, text
    assert report.tally.wrong == 0, text
    assert report.well_behaved_errors == [], text
    assert report.well_behaved_received == report.well_behaved_sent > 0, text
    assert report.leaks == [], text
    assert report.rss_growth_kib <= report.rss_margin_kib, text
    assert report.tally.cases == 80 + len(HTTP_KINDS) - 1, text  # warm-up + drawn
    assert sidecar.get("/healthz") == (200, b"ok\n")
