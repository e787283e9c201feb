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
from typing import Any

import pytest

from testbed import activemq_installed, rabbitmq_installed
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


def _run_drill(
    tmp_path: Path, *extra: str, rows: int = ROWS, rabbitmq: bool = False
) -> tuple[subprocess.CompletedProcess[str], str]:
    """``mq-sidecar drill --rows ROWS`` with its files in ``tmp_path``; (process, output).
    ``rabbitmq``: the drill's brokers are RabbitMQ's (``extra`` says which), not ActiveMQ."""
    if not (rabbitmq_installed() if rabbitmq else activemq_installed()):
        broker = "RabbitMQ" if rabbitmq else "ActiveMQ"
        pytest.fail(f"{broker} is not installed: run scripts/setup.sh", pytrace=False)
    command = [
        str(MQ_SIDECAR),
        "drill",
        "--rows",
        str(rows),
        "--report",
        str(tmp_path / "report.json"),
        "--png",
        str(tmp_path / "timeline.png"),
        "--workdir",
        str(tmp_path / "work"),
        *extra,
    ]
    proc = subprocess.run(
        command, capture_output=True, text=True, timeout=900, check=False, cwd=tmp_path
    )
    print(proc.stdout)
    return proc, f"stdout:\n{proc.stdout}\nstderr (tail):\n{proc.stderr[-6000:]}"


def _leftovers(work: Path) -> list[str]:
    return [_cmdline(p.pid) for p in live_processes() if str(work) in _cmdline(p.pid)]


@pytest.mark.activemq
def test_drill_survives_a_kill9_of_the_primary(tmp_path: Path) -> None:
    proc, output = _run_drill(tmp_path)
    assert proc.returncode == 0, output
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["rows"] == ROWS
    assert report["sent"] == ROWS
    assert report["received"] == ROWS
    assert (report["lost"], report["duplicates"]) == (0, 0), output
    [fault] = report["faults"]
    assert fault["takeover_ms"] is not None
    # An unplanned failover (a heart-beat timeout on an overloaded machine) would be listed
    # as its own incident with fault None; the kill's own incident must be there, once.
    # Its sessions: the consumer's, and the writer's of the partition being published at the
    # kill if there was one (the events come from each sidecar's /events, which holds no
    # session of its own; on a loaded machine the kill may fall between two partitions).
    [incident] = [i for i in report["failover_incidents"] if i["fault"] == 0]
    assert any(s.startswith("consumer:") for s in incident["sessions"]), incident
    assert report["failovers"] >= 1
    assert report["residual"] == 0
    assert (tmp_path / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "PASS" in proc.stdout
    assert report["baseline"] is None, "no baseline unless asked for"
    assert _leftovers(tmp_path / "work") == [], "processes left behind"


@pytest.mark.long
@pytest.mark.activemq
def test_drill_baseline_reports_the_sidecar_rates_as_a_share_of_direct(tmp_path: Path) -> None:
    """``--baseline``: the same publish and drain straight to the broker first, then the drill
    with its kill; the report gives both rates and their ratios, overall and before the kill."""
    proc, output = _run_drill(tmp_path, "--baseline")
    assert proc.returncode == 0, output
    report = json.loads((tmp_path / "report.json").read_text())
    assert (report["sent"], report["received"], report["lost"]) == (ROWS, ROWS, 0), output
    base = report["baseline"]
    assert (base["sent"], base["received"], base["unique"]) == (ROWS, ROWS, ROWS), output
    assert (base["lost"], base["duplicates"], base["residual"], base["passed"]) == (0, 0, 0, True)
    assert base["destination"].endswith(".baseline")
    assert min(base["publish"], base["consume"]) > 0
    [fault] = report["faults"]
    ratios = report["overhead"]["sidecar"]
    assert ratios["share_before"] == pytest.approx(fault["fraction"], abs=1e-4)
    for which in ("publish", "consume"):
        for window in ("overall", "before"):
            figure = ratios[which][window]
            assert min(figure["direct"], figure["through"]) > 0, (which, window, figure)
            assert figure["ratio"] == pytest.approx(figure["through"] / figure["direct"], rel=0.01)
    phases = report["phases_s"]
    assert list(phases)[:8] == [
        "brokers",
        "sidecars",
        "spark startup",
        "load",
        "warm-up",
        "baseline publish",
        "baseline drain",
        "baseline verify",
    ]
    assert "overhead      sidecar / direct: publish " in proc.stdout
    assert "before the kill" in proc.stdout
    assert "PASS" in proc.stdout
    assert (tmp_path / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert _leftovers(tmp_path / "work") == [], "processes left behind"


def _check_spark_consumer(report: dict[str, Any], output: str) -> None:
    """Every row once in the streaming consumer's Parquet sink, across both faults: the
    broker's kill -9 (a failover of both sidecars) and the query driver's SIGKILL, restarted
    from its checkpoint."""
    assert (report["rows"], report["sent"], report["unique"]) == (ROWS, ROWS, ROWS), output
    assert (report["lost"], report["duplicates"], report["mismatched"]) == (0, 0, 0), output
    assert report["residual"] == 0, output
    [fault] = report["faults"]
    assert fault["takeover_ms"] is not None
    assert [i for i in report["failover_incidents"] if i["fault"] == 0], output
    consumer = report["consumer"]
    assert consumer["kind"] == "spark"
    [kill] = consumer["driver_kills"]
    assert kill["new_pid"] not in (None, kill["pid"])
    assert 0 < kill["rows_before"] < ROWS, "the driver was killed midway"
    assert kill["running_after_s"] is not None
    assert consumer["errors"] == []


@pytest.mark.long
@pytest.mark.activemq
def test_drill_spark_consumer_survives_the_broker_and_driver_kills(tmp_path: Path) -> None:
    """``--consumer spark`` on ``local[2]``: a Structured Streaming query reads the queue
    through the consumer's sidecar into Parquet (batches of at most 400), its driver process
    killed with SIGKILL at half the rows and restarted on its checkpoint, while the ActiveMQ
    primary is killed at 40 % of the publish: every row once in the sink."""
    proc, output = _run_drill(tmp_path, "--consumer", "spark", "--read-batch", "400")
    assert proc.returncode == 0, output
    report = json.loads((tmp_path / "report.json").read_text())
    _check_spark_consumer(report, output)
    assert report["settings"]["master"] == "local[2]"
    assert "driver pid" in proc.stdout
    assert "PASS" in proc.stdout
    assert _leftovers(tmp_path / "work") == [], "processes left behind"


@pytest.mark.long
@pytest.mark.activemq
def test_drill_on_a_standalone_cluster(tmp_path: Path) -> None:
    """``--master cluster --consumer spark``: the drill starts its own Spark standalone cluster
    (2 workers; the publish's and the streaming query's executors are processes of their own)
    and passes with the broker's kill -9; nothing of the cluster outlives the drill. The
    driver kill is left to the test above (on the cluster it adds about 35 s: the restarted
    driver waits for executors of its own)."""
    proc, output = _run_drill(
        tmp_path,
        "--master",
        "cluster",
        "--consumer",
        "spark",
        "--read-batch",
        "400",
        "--kill-driver-at",
        "0",
    )
    assert proc.returncode == 0, output
    report = json.loads((tmp_path / "report.json").read_text())
    assert (report["rows"], report["sent"], report["unique"]) == (ROWS, ROWS, ROWS), output
    assert (report["lost"], report["duplicates"], report["residual"]) == (0, 0, 0), output
    [fault] = report["faults"]
    assert fault["takeover_ms"] is not None
    assert report["settings"]["master"] == "cluster"
    consumer = report["consumer"]
    assert consumer["master"].startswith("spark://127.0.0.1:")
    assert (consumer["driver_kills"], consumer["errors"]) == ([], [])
    assert "Spark standalone cluster at spark://" in proc.stderr
    assert list((tmp_path / "work" / "spark-cluster").glob("worker-*/app-*/*/stderr")), (
        "no executor ran on the cluster's workers"
    )
    assert _leftovers(tmp_path / "work") == [], "processes left behind"
