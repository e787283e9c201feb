"""The running sidecar against hostile client byte streams over real sockets (issue 7).

A real ``python -m proxy run`` in front of the real ``activemq`` fixture broker (see
:mod:`tests.fuzz.driver` for why a process and not a thread). Seeded cases from
:mod:`tests.fuzz.streams`: random garbage, valid sessions after random mutations, header
lines, header counts and frames beyond the limits, content-length lies, a million heart-beat
EOLs and thousands of tiny SENDs in one connection, slowloris CONNECTs (the config's
``handshake_timeout`` is 1.5 s), resets mid-frame (SO_LINGER 0), connection storms, eight
connections at a time. Alongside, a well-behaved stomp.py session SENDs with receipts,
receives and ACKs throughout.

Then: the sidecar is alive and logged no traceback or ERROR line; no connection hung; valid
and over-limit cases got the answers they must; the well-behaved session saw no ERROR and
every message; ``/status``, ``mq_sidecar_upstream_connected`` and the process' own sockets
show the well-behaved session and nothing else (then nothing once it leaves); file
descriptors and RSS are back near the baseline taken after a warm-up of one case per kind.

``MQ_SIDECAR_FUZZ_SEED`` changes the seed (default 1); ``python -m tests.fuzz.run`` runs
the same code for minutes (``--replay N`` plays one case again).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed import ActiveMQ
from testbed.sidecar import SidecarProcess
from tests.fuzz.driver import fuzz_sidecar, run_stomp_fuzz
from tests.fuzz.streams import STOMP_KINDS, Scale

SEED = int(os.environ.get("MQ_SIDECAR_FUZZ_SEED", "1"))


@pytest.fixture
def sidecar(activemq: ActiveMQ, tmp_path: Path) -> Iterator[SidecarProcess]:
    """A fresh sidecar process in front of the session's ActiveMQ."""
    with fuzz_sidecar("sidecar", tmp_path, brokers=activemq.stomp_url) as process:
        yield process


@pytest.mark.timeout(300)
def test_hostile_streams_leave_the_sidecar_intact(sidecar: SidecarProcess) -> None:
    report = run_stomp_fuzz(
        sidecar,
        seed=SEED,
        count=120,
        concurrency=8,
        scale=Scale(heartbeats=1_000_000, tiny_sends=5_000, storm=40),
    )
    print(report.text())
    text = report.text()
    assert report.crashed is None, text
    assert report.bad_log_lines == [], text
    assert report.tally.hangs == 0, text
    assert report.tally.wrong == 0, text
    assert report.well_behaved_errors == [], text
    assert report.well_behaved_sent > 0, text
    assert report.well_behaved_received == report.well_behaved_sent, text
    assert report.leaks == [], text
    assert report.rss_growth_kib <= report.rss_margin_kib, text
    assert report.tally.cases == 120 + len(STOMP_KINDS) - 1, text  # warm-up + drawn
