"""Admission at scale with the default configuration (issue 34), with a real kill -9.

One sidecar process, every memory option at its default (``max_memory_bytes`` 384 MiB,
``max_frame_bytes`` 144 MiB, ``max_sessions`` 1000), in front of an ActiveMQ shared-store
pair. :data:`SESSIONS` producers connect one after another while the earlier ones send
persistent SENDs with receipts (at most 10 unconfirmed each), :data:`CONSUMERS` consumers
receive with ``client-individual`` ACKs, and the primary is killed with SIGKILL once half the
producers are connected (the load is :func:`bench.admission.run_load`; its full size, the
issue's 100,000 messages and the 5,000-session run, is ``python -m bench.admission``). Before
issue 34 the budget's reserves (twice one 144 MiB frame, and 128 KiB per broker leg) refused
newcomers past about 770 busy sessions while the sessions held a tenth of it; now none is
refused, every confirmed SEND is received once, and the figures are printed (``-s``).
"""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from bench.admission import run_load
from testbed.sidecar import SidecarProcess, metric_total
from tests.conftest import ActiveMQPairFactory
from tests.integration.support import unique

#: Producer sessions; with the consumers, the default max_sessions (1000) is not reached.
SESSIONS = 980
#: Consumer sessions.
CONSUMERS = 20
#: SENDs per producer: half after its CONNECTED, half once all are connected (and a probe
#: after the kill for those connected before it).
MESSAGES = 4


@pytest.mark.activemq
@pytest.mark.timeout(400)
def test_a_thousand_busy_sessions_with_the_defaults_through_a_kill9_none_refused(
    tmp_path: Path, activemq_pair: ActiveMQPairFactory
) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 2 * (SESSIONS + CONSUMERS) + 256  # this process's apps and its own files
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))
    primary, backup = activemq_pair(heap_mb=512)
    sidecar = SidecarProcess(
        "admission",
        tmp_path,
        brokers=f"failover:({primary.stomp_url},{backup.stomp_url})",
        options={"log_level": "warning"},  # every limit at its default
    )
    with sidecar:
        sidecar.wait_ready()
        idle = sidecar.rss_kib()
        figures = trio.run(
            lambda: run_load(
                sidecar.address,
                unique("/queue/admission"),
                sessions=SESSIONS,
                messages=MESSAGES,
                consumers=CONSUMERS,
                kill=primary.kill,
            )
        )
        peak = sidecar.peak_rss_kib()
        memory = sidecar.status()["memory"]
        metrics = sidecar.metrics()
    after = sorted(figures.after_kill)
    print(
        f"\n[admission, defaults] {SESSIONS} producers + {CONSUMERS} consumers: refused "
        f"{len(figures.refused)}, confirmed {len(figures.confirmed)}, lost {len(figures.lost)}, "
        f"duplicated {figures.duplicated}; RSS idle {idle / 1024:.0f} MiB, peak "
        f"{peak / 1024:.0f} MiB ({(peak - idle) / (SESSIONS + CONSUMERS):.0f} KiB per session); "
        f"budget peak {memory['peak'] / (1 << 20):.1f} MiB of {memory['limit'] >> 20} MiB; "
        f"{figures.connected_before_kill} sessions connected before the kill, first receipt "
        f"after it within {after[len(after) // 2] if after else 0:.2f} s (median), "
        f"{after[-1] if after else 0:.2f} s (all)"
    )
    assert figures.refused == [], figures.refused[:3]
    assert figures.errors == [], figures.errors[:5]
    assert figures.connected == SESSIONS
    assert 0 < figures.connected_before_kill < SESSIONS  # the kill came midway
    assert len(figures.after_kill) == figures.connected_before_kill
    assert len(figures.confirmed) == SESSIONS * MESSAGES + figures.connected_before_kill
    assert figures.lost == set()
    assert figures.duplicated == 0
    assert memory["refused_total"] == 0
    assert memory["limit"] == 384 << 20  # the default
    # Held, reserved and free add up to the budget, in /status and in the gauges alike.
    assert memory["held"] + memory["reserved"] + memory["free"] == memory["limit"]
    gauges = [
        metric_total(metrics, f"mq_sidecar_memory_{name}_bytes")
        for name in ("held", "reserved", "free", "budget")
    ]
    assert gauges[0] + gauges[1] + gauges[2] == gauges[3] == memory["limit"]


def test_run_refuses_to_start_when_the_open_file_limit_cannot_hold_max_sessions(
    tmp_path: Path,
) -> None:
    """``mq-sidecar run`` with a hard open-file limit of 1024 and ``max_sessions = 5000``:
    exit 1 and one line naming both numbers and the option (no broker is needed to tell)."""
    path = tmp_path / "mq-sidecar.toml"
    path.write_text(
        'brokers = "stomp://127.0.0.1:1"\nlisten = "127.0.0.1:0"\n'
        'admin_listen = "127.0.0.1:0"\nmax_sessions = 5000\n'
    )

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))

    result = subprocess.run(
        [sys.executable, "-m", "proxy", "run", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=low_limit,
        check=False,
    )
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "mq-sidecar: max_sessions (5000) needs 10256 open files (two sockets per session and "
        "256 for the rest), the open-file limit allows 1024 (RLIMIT_NOFILE, hard): lower "
        "max_sessions or raise the limit (ulimit -n, the container's nofile)"
    )
    assert "Traceback" not in result.stderr
