"""``mq-sidecar drill --broker rabbitmq-cluster --consumer spark-stream`` (issue 33 part 3):
the options and their defaults, the fault plan against a scripted cluster (one kill of the node
under a reading task, no rolling restart), the choice of that node from a sidecar's
``/status``, the driver's progress lines, the report's stream read (tasks per batch,
executors, copies) without Spark; then one short real run on the bed (``long``).
"""

from __future__ import annotations

import datetime
import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from pipeline.cluster_faults import ClusterFaultInjector
from pipeline.drill import admin
from pipeline.drill.options import (
    CLUSTER,
    SPARK_STREAM,
    STREAM_BATCH,
    DrillOptions,
    DrillUsageError,
)
from pipeline.drill.results import timeline_of
from pipeline.drill.stream_read import StreamConsumer, read_summary
from pipeline.drill.streaming import FIRST_BATCH_GRACE, DriverKill
from pipeline.report.document import _stream_lines
from pipeline.report.png import DRIVER_COLOR, DRIVER_KILL, DRIVER_RESTART, draw
from pipeline.report.timeline import Timeline
from pipeline.stream_driver import progress_line
from pipeline.verify import Received
from tests.pipeline.test_cluster_drill import ScriptedCluster
from tests.pipeline.test_drill import _leftovers, _run_drill

STREAM = {"broker": "rabbitmq-cluster", "consumer": SPARK_STREAM}


def test_stream_options_default_to_the_drills_cluster_and_one_node_kill() -> None:
    options = DrillOptions(**cast("Any", STREAM))
    options.validate()
    assert (options.stream, options.streaming, options.rabbitmq_cluster) == (True, True, True)
    assert options.spark_master() == CLUSTER
    assert options.cluster
    assert options.rolling_restart_at() is None
    assert options.fractions() == (0.4,)
    assert options.driver_kill_share() == 0.5
    assert options.batch_rows() == STREAM_BATCH
    assert DrillOptions(**cast("Any", STREAM), read_batch=500).batch_rows() == 500
    assert "max_unacked" not in options.sidecar_options("consumer", Path("/x"))
    local = DrillOptions(**cast("Any", STREAM), master="local[2]")
    assert (local.spark_master(), local.cluster) == ("local[2]", False)
    assert DrillOptions(**cast("Any", STREAM), kill_at=(0.9,)).fractions() == (0.9,), (
        "no rolling restart at 80 % to keep kills below"
    )
    DrillOptions(**cast("Any", STREAM), kill_at=(0.9,)).validate()
    assert DrillOptions(consumer="spark").batch_rows() == 1000


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        (DrillOptions(consumer=SPARK_STREAM), "needs --broker rabbitmq-cluster"),
        (
            DrillOptions(consumer="kafka"),
            "--consumer must be one of stomp, spark, spark-stream",
        ),
        (
            DrillOptions(kill_driver_at=0.5),
            "--kill-driver-at only applies with --consumer spark or spark-stream",
        ),
        (DrillOptions(**cast("Any", STREAM), read_batch=0), "--read-batch must be at least 1"),
    ],
)
def test_bad_stream_options_are_refused(options: DrillOptions, problem: str) -> None:
    with pytest.raises(DrillUsageError, match=problem):
        options.validate()


def test_the_node_under_a_reader_is_killed_and_no_rolling_restart_follows() -> None:
    cluster = ScriptedCluster(leader=0)
    said: list[str] = []
    faults = ClusterFaultInjector(
        (0.4,),
        100,
        cluster=cast("Any", cluster),
        queue="s",
        connected=lambda: "127.0.0.1:5002",  # a task reads through node 3 now
        say=said.append,
        rolling_at=None,
        whose=lambda: "the node under a reading task",  # a function: the kill in a thread
    )
    assert faults.fractions == (0.4,)
    faults.check(40)
    faults.check(60)  # the sampler goes on meanwhile: no second kill
    faults.join(10.0)
    assert faults.wait_done(5.0, published=100)
    assert cluster.log == ["leader s", "kill 2", "restart 2"]
    [kill] = faults.records()
    assert (kill.kind, kill.broker, kill.restarted) == ("node", "drill3", True)
    assert "the node under a reading task, the queue's leader was node 0" in kill.describe()
    assert faults.errors == []


class StatusSidecar:
    """What :func:`admin.reading_broker` reads of a sidecar: ``/status`` answers in turn."""

    def __init__(self, *answers: list[dict[str, Any]]) -> None:
        self.answers = list(answers)

    def status(self, timeout: float = 5.0) -> dict[str, Any]:
        sessions = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        brokers: dict[str, int] = {}
        for s in sessions:
            brokers[s["broker"]] = brokers.get(s["broker"], 0) + 1
        return {
            "sessions": sessions,
            "brokers": [{"broker": b, "sessions": n} for b, n in brokers.items()],
        }


def _session(broker: str, frames: int, subscriptions: int = 1) -> dict[str, Any]:
    return {
        "state": "running",
        "broker": broker,
        "subscriptions": subscriptions,
        "frames_to_app": frames,
    }


def test_the_reading_broker_is_the_busiest_subscribed_session() -> None:
    probe, task = _session("127.0.0.1:1", 3), _session("127.0.0.1:2", 900)
    idle = _session("127.0.0.1:3", 5000, subscriptions=0)
    first = admin.ReadingNode(cast("Any", StatusSidecar([probe, idle], [probe, task, idle])))
    assert first() == "127.0.0.1:2"
    assert first.describe() == "the node under a reading task (900 messages read on its session)"
    probes = StatusSidecar([probe, probe, idle])
    only_probes = admin.ReadingNode(cast("Any", probes), timeout=0.2)
    assert only_probes() == "127.0.0.1:1", "no reader within the wait: the most sessions"
    assert only_probes.describe().startswith("no reading task seen within 0 s")


def test_a_progress_line_takes_the_sources_offsets_and_the_copies_dropped() -> None:
    progress = {
        "batchId": 4,
        "numInputRows": 2500,
        "durationMs": {"triggerExecution": 1800, "latestOffset": 250},
        "sources": [
            {
                "startOffset": '{"stream": "/amq/queue/s", "offset": 1000}',
                "endOffset": {"stream": "/amq/queue/s", "offset": 3500},
                "latestOffset": None,
            }
        ],
        "stateOperators": [{"customMetrics": {"numDroppedDuplicateRows": 7}}],
    }
    line = progress_line(42, progress)
    assert {k: line[k] for k in ("pid", "batch", "rows", "duration_ms", "dropped")} == {
        "pid": 42,
        "batch": 4,
        "rows": 2500,
        "duration_ms": 1800,
        "dropped": 7,
    }
    assert (line["start"], line["end"], line["latest"]) == (1000, 3500, None)
    queue = progress_line(1, {"batchId": 0, "numInputRows": 0, "sources": [{}]})
    assert (queue["start"], queue["dropped"], queue["duration_ms"]) == (None, 0, 0)


def _t(second: int) -> datetime.datetime:
    return datetime.datetime(2026, 11, 29, 3, 0, second)


def test_the_stream_reads_summary_and_its_report_lines() -> None:
    batches = [
        {"batch": 0, "rows": 0, "duration_ms": 300, "end": 0, "latest": 0, "dropped": 0},
        {"batch": 1, "rows": 300, "duration_ms": 2000, "end": 300, "latest": 300, "dropped": 0},
        {"batch": 2, "rows": 102, "duration_ms": 2000, "end": 402, "latest": 402, "dropped": 2},
    ]
    tasks = (
        [(_t(1), "111:0:0")] * 150
        + [(_t(1), "222:1:0")] * 150
        + [(_t(3), "111:0:0")] * 40
        + [(_t(3), "222:1:1")] * 60
    )
    summary = read_summary(batches, tasks)
    assert summary["records_read"] == 402
    assert summary["copies_dropped"] == 2
    assert (summary["end_offset"], summary["tail_offset"], summary["read_to_tail"]) == (
        402,
        402,
        True,
    )
    assert summary["tasks_per_batch"] == {"2": 2}
    assert summary["task_retries"] == 1
    assert summary["batch_seconds"] == 4.0
    assert summary["rows_per_second"] == 100.0
    assert summary["executors"] == [
        {"jvm_pid": "111", "rows": 190, "share": 0.475, "tasks": 2, "rows_per_second": 47.5},
        {"jvm_pid": "222", "rows": 210, "share": 0.525, "tasks": 2, "rows_per_second": 52.5},
    ]
    behind = read_summary([{"batch": 0, "rows": 5, "end": 5, "latest": 9}], [])
    assert behind["read_to_tail"] is False
    assert behind["executors"] == []
    section = {
        "kind": "spark-stream",
        "master": "spark://127.0.0.1:7077",
        "batches": 3,
        "max_records_per_trigger": 20000,
        "stream_replicas": [1, 2, 3],
        "copies_hidden_by_sidecar": 5,
        **summary,
    }
    lines = "\n".join(_stream_lines(section))
    assert "stream replicas on nodes 1, 2, 3" in lines
    assert "per batch with rows: 2 task(s) in 2 batch(es); 1 task attempt(s) past the first" in (
        lines
    )
    assert "copies dropped by the query 2, hidden by the sidecar 5" in lines
    assert "JVM pid 111: 190 rows (48%) in 2 task(s), 48 rows/s" in lines


def _consumer(tmp_path: Path) -> StreamConsumer:
    """A stream consumer of 4 rows (not started), its files in ``tmp_path/consumer``."""
    return StreamConsumer(
        "/amq/queue/s",
        host="127.0.0.1",
        port=61613,
        workdir=tmp_path / "consumer",
        master="spark://127.0.0.1:1",
        conf={},
        rows=4,
        kill_at=0.5,
        batch_rows=1000,
        partitions=2,
    )


def test_the_stream_consumer_reads_the_stream_with_its_options(tmp_path: Path) -> None:
    pa: Any = pytest.importorskip("pyarrow")
    pq: Any = pytest.importorskip("pyarrow.parquet")
    consumer = _consumer(tmp_path)
    assert consumer.cfg["stream"] is True
    options = consumer.cfg["options"]
    assert (options["stream"], options["startingOffsets"], options["minPartitions"]) == (
        "true",
        "earliest",
        2,
    )
    assert options["maxRecordsPerTrigger"] == 1000
    assert "checkpoint_location" not in options, "not an option of the stream read"
    sink = tmp_path / "consumer" / "sink"
    (sink / "_spark_metadata").mkdir(parents=True)
    table = pa.table(
        {
            "row_id": ["j/1", "j/2", "j/3", "j/4"],
            "offset": [0, 1, 2, 3],
            "body": [b"1", b"2", b"3", b"4"],
            "batch_time": [_t(1)] * 4,
            "task": ["7:0:0", "7:0:0", "8:1:0", "8:1:0"],
        }
    )
    pq.write_table(table, sink / "part-0.parquet")
    entry = {"path": f"file://{sink / 'part-0.parquet'}", "action": "add"}
    (sink / "_spark_metadata" / "0").write_text("v1\n" + json.dumps(entry) + "\n")
    progress = {"pid": 5, "batch": 0, "rows": 4, "wall": 1.0, "end": 4, "latest": 4}
    consumer.progress_file.write_text(
        json.dumps({"pid": 5, "started": 0.5, "package": "/w/spark/x.py"})
        + "\n"
        + json.dumps(progress)
        + "\n"
    )
    consumer._read_progress()
    assert consumer.unique == 4
    assert len(consumer.snapshot().counts) == 4
    summary = consumer.summary()
    assert summary["kind"] == "spark-stream"
    assert summary["package_on_executors"] == ["/w/spark/x.py"]
    assert summary["tasks_per_batch"] == {"2": 1}
    assert [e["rows"] for e in summary["executors"]] == [2, 2]
    assert summary["read_to_tail"] is True
    assert summary["batch_log"] == [
        {
            "batch": 0,
            "pid": 5,
            "rows": 4,
            "start": None,
            "end": 4,
            "latest": 4,
            "duration_ms": None,
            "dropped": None,
        }
    ]


#: Rows of the short run: enough for the node kill (at 40 %) and the driver kill (at half the
#: rows in the sink) to land while the query reads.
ROWS = 6000


@pytest.mark.long
@pytest.mark.rabbitmq
def test_drill_stream_survives_the_node_and_driver_kills(tmp_path: Path) -> None:
    """The drill on 6,000 rows (2.5-4.5 minutes on 2 loaded cores): the RabbitMQ cluster, a stream
    with a replica on each node, the drill's standalone Spark cluster, kill -9 of the node
    under a reading task at 40 % of the publish, the query's driver killed at half the rows
    and restarted on its checkpoint: every row once in the sink; nothing outlives the drill."""
    proc, output = _run_drill(
        tmp_path,
        "--broker",
        "rabbitmq-cluster",
        "--consumer",
        SPARK_STREAM,
        "--no-progress",
        rows=ROWS,
        rabbitmq=True,
    )
    assert proc.returncode == 0, output
    report = json.loads((tmp_path / "report.json").read_text())
    assert (report["rows"], report["sent"], report["unique"]) == (ROWS, ROWS, ROWS), output
    assert (report["lost"], report["duplicates"]) == (0, 0), output
    [kill] = report["faults"]
    assert kill["kind"] == "node"
    assert "reading task" in kill["detail"]  # a reader, or none seen within the wait
    consumer = report["consumer"]
    assert consumer["kind"] == SPARK_STREAM
    assert consumer["master"].startswith("spark://127.0.0.1:")
    assert consumer["stream_replicas"] == [1, 2, 3]
    assert len(consumer["driver_kills"]) == 1
    assert consumer["errors"] == []
    assert consumer["read_to_tail"] is True
    assert len(consumer["executors"]) >= 2, "both executors read"
    root = Path(__file__).resolve().parents[2]
    assert all(p.startswith(str(root / "spark")) for p in consumer["package_on_executors"]), (
        consumer["package_on_executors"]
    )
    assert _leftovers(tmp_path / "work") == [], "processes left behind"


def test_a_restarted_drivers_first_batch_gets_a_grace(tmp_path: Path) -> None:
    """The drain's idle time counts from when the restarted driver's query ran, plus
    :data:`FIRST_BATCH_GRACE` (the full run that counted it from the kill gave up 24 s after
    the restarted query ran, its first batch still waiting for executors)."""
    consumer = _consumer(tmp_path)
    started = time.monotonic()
    assert consumer.wait_for(4, idle=0.2, timeout=5.0) is False
    assert time.monotonic() - started < 2.0, "no batch for the idle time: given up"
    consumer.kills.append(DriverKill(1, time.time() - 100.0, 2, True, 2, running_after_s=50.0))
    started = time.monotonic()
    assert consumer.wait_for(4, idle=0.2, timeout=1.0) is False
    assert time.monotonic() - started >= 1.0, "within the grace: waited until the timeout"
    assert FIRST_BATCH_GRACE > 100.0 - 50.0 - 1.0


def test_the_timeline_png_marks_the_driver_kill_and_its_restart() -> None:
    """A driver killed 8 s into the publish whose restarted query ran 5 s later: the timeline
    holds (8, 13) (the kill's Unix time taken to the publish's t = 0), the JSON report says
    so, and the PNG draws it as a broker kill is drawn: a line at the kill and the time until
    the restart shaded, one legend entry each; a driver that never ran again is shaded to the
    drain's end."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgb
    from matplotlib.patches import Rectangle

    t0 = time.monotonic() - 20.0  # the publish started 20 s ago
    kill = DriverKill(7, time.time() - 12.0, 300, True, 8, running_after_s=5.0)
    arrivals = [t0 + i / 100 for i in range(1500)]
    timeline = timeline_of(
        sampler=cast(
            "Any", SimpleNamespace(samples=[(0.0, 0.0), (15.0, 1500.0)], outbox_samples=[])
        ),
        reader=cast("Any", SimpleNamespace(snapshot=lambda: Received(arrivals=arrivals))),
        residual=Received(),
        faults=cast("Any", SimpleNamespace(faults=[], kind="node")),
        incidents=[],
        t0=t0,
        publish_end=15.0,
        driver_kills=[kill],
    )
    [(at, back)] = timeline.driver_kills
    assert at == pytest.approx(8.0, abs=0.5)
    assert back == pytest.approx(at + 5.0)
    assert timeline.to_dict()["driver_kills"] == [[round(at, 3), round(at + 5.0, 3)]]

    def drawn(timeline: Timeline) -> tuple[list[str], list[float], list[tuple[float, float]]]:
        """The legend's entries, the driver kill's line (x) and shaded spans (from, to)."""
        fig = draw(timeline, "driver kill")
        try:
            ax = fig.axes[0]
            box = ax.get_legend()
            assert box is not None
            legend = [text.get_text() for text in box.get_texts()]
            xs = [
                float(x)
                for line in ax.get_lines()
                if line.get_color() == DRIVER_COLOR
                for x in cast("list[float]", line.get_xdata())
            ]
            spans = [
                (p.get_x(), p.get_x() + p.get_width())
                for p in ax.patches
                if isinstance(p, Rectangle) and p.get_facecolor()[:3] == to_rgb(DRIVER_COLOR)
            ]
        finally:
            plt.close(fig)
        return legend, xs, spans

    legend, xs, spans = drawn(timeline)
    assert (legend.count(DRIVER_KILL), legend.count(DRIVER_RESTART)) == (1, 1)
    assert xs == [at, at]
    assert spans == [(at, back)]
    timeline.driver_kills = [(at, None), (16.0, 17.0)]
    legend, xs, spans = drawn(timeline)
    assert (legend.count(DRIVER_KILL), legend.count(DRIVER_RESTART)) == (1, 1), "labelled once"
    assert spans == [(at, timeline.drain_end), (16.0, 17.0)]
