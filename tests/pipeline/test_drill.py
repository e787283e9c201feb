"""``mq-sidecar drill`` end to end, as a user runs it: a subprocess of the installed script.

A sample of the flights table, one real kill -9 of the ActiveMQ primary while Spark
publishes through the sidecar: the drill must exit 0 (nothing lost, nothing duplicated),
write its JSON report and PNG timeline, and leave no process behind.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from testbed import activemq_installed
from testbed.broker import live_processes

MQ_SIDECAR = Path(sys.executable).with_name("mq-sidecar")
#: Rows of the sample: enough for the kill to land mid-publish, small enough for a short run.
ROWS = 4000


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_the_daemon_never_imports_the_pipeline() -> None:
    """``drill`` imports pipeline.drill lazily: ``mq-sidecar run`` must not load PySpark."""
    check = (
        "import sys, proxy.__main__; "
        "loaded = sorted(m for m in ('pyspark', 'pipeline', 'stomp', 'matplotlib') "
        "if m in sys.modules); print(loaded)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", check], capture_output=True, text=True, timeout=60, check=True
    )
    assert proc.stdout.strip() == "[]"


def test_drill_options_are_checked_before_anything_starts(tmp_path: Path) -> None:
    proc = subprocess.run(
        [str(MQ_SIDECAR), "drill", "--kill-pid", "1", "--workdir", str(tmp_path / "w")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert "--kill-pid only applies with --brokers" in proc.stderr
    assert not (tmp_path / "w" / "brokers").exists()


@pytest.mark.activemq
def test_drill_survives_a_kill9_of_the_primary(tmp_path: Path) -> None:
    if not activemq_installed():
        pytest.fail("ActiveMQ is not installed: run scripts/setup.sh", pytrace=False)
    work = tmp_path / "work"
    report_path, png_path = tmp_path / "report.json", tmp_path / "timeline.png"
    command = [
        str(MQ_SIDECAR),
        "drill",
        "--rows",
        str(ROWS),
        "--report",
        str(report_path),
        "--png",
        str(png_path),
        "--workdir",
        str(work),
    ]
    proc = subprocess.run(
        command, capture_output=True, text=True, timeout=900, check=False, cwd=tmp_path
    )
    output = f"stdout:\n{proc.stdout}\nstderr (tail):\n{proc.stderr[-6000:]}"
    print(proc.stdout)
    assert proc.returncode == 0, output
    report = json.loads(report_path.read_text())
    assert report["rows"] == ROWS
    assert report["sent"] == ROWS
    assert report["received"] == ROWS
    assert (report["lost"], report["duplicates"]) == (0, 0), output
    [fault] = report["faults"]
    assert fault["takeover_ms"] is not None
    # An unplanned failover (a heart-beat timeout on an overloaded machine) would be listed
    # as its own incident with fault None; the kill's own incident must be there, once.
    [incident] = [i for i in report["failover_incidents"] if i["fault"] == 0]
    assert len(incident["sessions"]) >= 2, "both sidecars' control sessions moved"
    assert report["failovers"] >= 1
    assert report["residual"] == 0
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "PASS" in proc.stdout
    leftovers = [p for p in live_processes() if str(work) in _cmdline(p.pid)]
    assert leftovers == [], f"processes left behind: {[_cmdline(p.pid) for p in leftovers]}"
