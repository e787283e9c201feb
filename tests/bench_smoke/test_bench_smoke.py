"""Smoke test of the benchmark harness (``bench/``): it runs and writes the promised JSON.

NO timing assertions (house rule: benchmarks are separate scripts): the harness runs with
``--quick`` counts against one real ActiveMQ, and only the *shape* of ``latest.json`` is
checked. The pure helpers of the load generator and the report get plain unit tests.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.loadgen import RawStomp, header
from bench.profile import hot_functions
from bench.report import Goal, Row
from bench.workloads.failover import _outage_after
from bench.workloads.latency import percentile
from testbed import activemq_installed

REPO = Path(__file__).resolve().parents[2]
KEYS = {"workload", "broker", "direct", "sidecar", "ratio", "unit"}


def test_header_returns_raw_first_value() -> None:
    frame = b"MESSAGE\nack:ID\\cx-1\nack:second\r\nreceipt-id:r7\r\n\nbody:no"
    assert header(frame, b"ack") == b"ID\\cx-1"  # still escaped: sent back as is in ACK
    assert header(frame, b"receipt-id") == b"r7"
    assert header(frame, b"body") is None  # the body is not a header
    assert header(b"RECEIPT\n\n", b"receipt-id") is None


def test_raw_client_splits_frames_across_reads_and_heartbeats() -> None:
    """The NUL splitter: frames cut anywhere, heart-beat EOLs between them."""
    c = RawStomp.__new__(RawStomp)
    c.port = 0
    c._tail = b""
    chunks = [b"\nMESSAGE\nack:1\n\nxx", b"x\x00\n\r\nRECE", b"IPT\nreceipt-id:9\n\n\x00\n"]
    frames: list[bytes] = []

    class FakeSock:
        def recv(self, _n: int) -> bytes:
            return chunks.pop(0)

    c.sock = FakeSock()  # type: ignore[assignment]
    while chunks:
        frames += c.read_frames()
    assert frames == [b"MESSAGE\nack:1\n\nxxx", b"RECEIPT\nreceipt-id:9\n\n"]


def test_percentile_nearest_rank() -> None:
    values = [float(v) for v in range(1, 1001)]
    assert percentile(values, 50) == 500.0
    assert percentile(values, 99) == 990.0
    assert percentile(values, 99.9) == 999.0
    assert percentile([3.0, 1.0, 2.0], 100) == 3.0
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)


def test_outage_is_the_longest_gap_after_the_fault() -> None:
    # A fault at t=10.0005; one receipt of the old leg arrives just after it; then nothing
    # until 10.8 (recovery): the outage ends at 10.8, not at the late receipt.
    receipts = [10.0, 10.0004, 10.0006, 10.8, 10.801]
    assert _outage_after(receipts, 10.0005) == pytest.approx(0.7995)
    assert _outage_after([1.0, 2.0], 3.0) is None


def test_row_json_ratio_and_goal() -> None:
    row = Row("send-ff/persistent", "activemq", "msg/s", direct=1000.0, sidecar=950.0)
    row.goal = Goal("ratio", ">=", 0.95, ">= 0.95x direct")
    out = row.to_json()
    assert out.keys() >= KEYS
    assert out["ratio"] == 0.95
    assert out["goal_met"] is True
    lat = Row("latency-p50", "rabbitmq", "ms", direct=0.2, sidecar=0.5, added_ms=0.3).to_json()
    assert lat["added_ms"] == 0.3
    assert Row("x", "activemq", "MiB", sidecar=40.0).to_json()["ratio"] is None


@pytest.mark.activemq
def test_quick_run_writes_latest_json(tmp_path: Path) -> None:
    """``python -m bench.run --quick`` on ActiveMQ (send-ff and latency only): exit 0 and one
    object per workload in the promised shape (about 15 s)."""
    if not activemq_installed():
        pytest.fail("ActiveMQ is not installed: run scripts/setup.sh", pytrace=False)
    out = tmp_path / "latest.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.run",
            "--quick",
            "--broker",
            "activemq",
            "--only",
            "send-ff",
            "latency",
            "--out",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads(out.read_text())
    names = {r["workload"] for r in rows}
    assert names == {
        "send-ff/non-persistent",
        "send-ff/persistent",
        "latency-send-receipt-p50",
        "latency-send-receipt-p99",
        "latency-send-receipt-p99.9",
    }
    for r in rows:
        assert r.keys() >= KEYS, r
        assert r["broker"] == "activemq"
        assert r["direct"] > 0
        assert r["sidecar"] > 0
        assert r["ratio"] == pytest.approx(r["sidecar"] / r["direct"], rel=0.01, abs=0.002)
        assert "error" not in r
        if r["unit"] == "ms":
            assert r["added_ms"] == pytest.approx(r["sidecar"] - r["direct"], abs=0.01)
        else:
            assert r["unit"] == "msg/s"
            assert "sidecar_cpu_s" in r
            assert set(r["client_cpu_pct"]) == {"direct", "sidecar"}
    meta = json.loads((tmp_path / "latest-meta.json").read_text())
    assert meta["failures"] == []
    assert "rawstomp_consume_auto" in meta["loadgen"]
    assert "latency-send-receipt-p50" in proc.stdout  # the printed table


def test_hot_functions_add_up_lines_and_leave_out_the_roots() -> None:
    collapsed = (
        "<module> (proxy/__main__.py:3);run (trio/_core/_run.py:9);f (proxy/a.py:10);"
        "g (protocol/b.py:5) 6\n"
        "<module> (proxy/__main__.py:3);run (trio/_core/_run.py:9);f (proxy/a.py:12) 3\n"
        "<module> (proxy/__main__.py:3);run (trio/_core/_run.py:9);f (proxy/a.py:12);"
        "f (proxy/a.py:20) 1\n"
        "garbage line\n"
    )
    total, own, inclusive = hot_functions(collapsed, 10)
    assert total == 10
    assert own == [("g (protocol/b.py)", 0.6), ("f (proxy/a.py)", 0.4)]
    assert inclusive == [("f (proxy/a.py)", 1.0), ("g (protocol/b.py)", 0.6)]


@pytest.mark.activemq
@pytest.mark.skipif(not activemq_installed(), reason="needs ActiveMQ (scripts/setup.sh)")
def test_profile_samples_the_sidecar(tmp_path: Path) -> None:
    raw = tmp_path / "stacks.txt"
    out = subprocess.run(
        [sys.executable, "-m", "bench.profile", "--n", "3000", "--top", "5", "--raw", str(raw)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "sidecar CPU per message: user" in out.stdout
    assert "proxy/" in raw.read_text()  # the sidecar's own frames were sampled
