"""The drill's options, fault attribution, throughput windows and report files (pure)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.drill.options import DrillOptions, DrillUsageError
from pipeline.faults import Fault, group_incidents
from pipeline.monitor import ObservedEvent
from pipeline.report.document import DrillReport
from pipeline.report.png import write_png
from pipeline.report.records import FaultRecord
from pipeline.report.timeline import Throughput, Timeline, throughput


def test_default_plan_is_one_kill_at_40_percent_or_none_with_external_brokers() -> None:
    assert DrillOptions().fractions() == (0.4,)
    assert DrillOptions(faults=0).fractions() == ()
    assert DrillOptions(faults=3).fractions() == (0.25, 0.5, 0.75)
    assert DrillOptions(kill_at=(0.7, 0.2)).fractions() == (0.2, 0.7)
    assert DrillOptions(brokers="stomp://127.0.0.1:1").fault_count() == 0


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        (DrillOptions(kill_pids=(1,)), "--kill-pid only applies with --brokers"),
        (DrillOptions(brokers="stomp://127.0.0.1:1", faults=1), "need 1 --kill-pid"),
        (DrillOptions(faults=2, kill_at=(0.5,)), "gives 1 point(s) for 2 fault(s)"),
        (DrillOptions(kill_at=(1.5,)), "between 0 and 1"),
        (DrillOptions(rows=0), "--rows must be at least 1"),
    ],
)
def test_inconsistent_options_are_refused(options: DrillOptions, problem: str) -> None:
    with pytest.raises(DrillUsageError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        options.validate()


def _event(sidecar: str, session: str, ts: float, outage: int, **body: object) -> ObservedEvent:
    return ObservedEvent(
        sidecar,
        received_at=ts,
        body={
            "event": "FAILOVER",
            "session_id": session,
            "timestamp": ts,
            "outage_ms": outage,
            "from_broker": "127.0.0.1:1",
            "to_broker": "127.0.0.1:2",
            "replayed_frames": 10,
            **body,
        },
    )


def test_failover_events_are_grouped_by_the_kill_that_caused_them() -> None:
    kill = Fault(0, "127.0.0.1:1", "amq-primary", 99, at=5.0, wall=1000.0, fraction=0.4)
    events = [
        _event("producer", "a-1", 1001.0, 700),
        _event("consumer", "b-1", 1001.2, 900, replayed_frames=5),
        _event("producer", "a-2", 500.0, 2000),  # before any kill: unplanned
        _event("consumer", "b-2", 1002.0, 100, from_broker="127.0.0.1:7"),  # another broker
    ]
    incidents, assigned = group_incidents(events, [kill])
    planned = [i for i in incidents if i.fault == 0]
    assert len(planned) == 1
    assert planned[0].sessions == ("producer:a-1", "consumer:b-1")
    assert (planned[0].outage_ms_min, planned[0].outage_ms_max) == (700, 900)
    assert planned[0].replayed_frames == 15
    assert sum(1 for i in incidents if i.fault is None) == 2
    assert len(assigned) == 4


def test_throughput_before_during_and_after_a_kill() -> None:
    # 100 msg/s for 10 s, nothing during the outage 4..5 s, 200 msg/s afterwards.
    samples = [(0.0, 0.0), (4.0, 400.0), (5.0, 400.0), (10.0, 1400.0)]
    timeline = Timeline(
        published=samples,
        consumed=[i / 100 for i in range(400)] + [5 + i / 200 for i in range(1000)],
        publish_end=10.0,
        drain_end=10.0,
        kills=[4.0],
        outages=[(4.0, 5.0)],
    )
    publish = throughput(timeline, "publish")
    assert publish == Throughput(overall=140.0, before=100.0, during=0.0, after=200.0)
    consume = throughput(timeline, "consume")
    assert consume.before == pytest.approx(100.0, abs=1)
    assert consume.during == 0.0
    no_fault = throughput(Timeline(published=samples, publish_end=10.0), "publish")
    assert (no_fault.overall, no_fault.before, no_fault.during, no_fault.after) == (
        140.0,
        None,
        None,
        None,
    )


def _report(**overrides: object) -> DrillReport:
    values: dict[str, object] = {
        "rows": 10,
        "sent": 10,
        "received": 10,
        "unique": 10,
        "lost": 0,
        "duplicates": 0,
        "mismatched": 0,
        "unexpected": 0,
        "residual": 0,
        "faults": [FaultRecord(0, "amq-primary", 99, 1.0, 0.4, 600, False)],
        "incidents": [],
        "publish": Throughput(10.0, 10.0, 0.0, 10.0),
        "consume": Throughput(10.0, 10.0, 0.0, 10.0),
        "frames_replayed": 3,
        "duplicates_hidden": 1,
        "redeliveries_hidden": 2,
        "phases": {"publish": 1.0, "total": 2.0},
        "reconciliation": {},
        "settings": {},
    }
    values.update(overrides)
    return DrillReport(**values)  # type: ignore[arg-type]


def test_report_passes_only_when_every_row_arrived_once(tmp_path: Path) -> None:
    good = _report()
    assert good.passed
    assert "PASS" in good.format_text()
    for bad in (_report(lost=1), _report(duplicates=1), _report(sent=9), _report(errors=["x"])):
        assert not bad.passed
        assert "FAIL" in bad.format_text()
    good.write_json(tmp_path / "r.json")
    data = json.loads((tmp_path / "r.json").read_text())
    assert list(data)[:6] == ["rows", "sent", "received", "lost", "duplicates", "failovers"]
    assert data["faults"][0]["takeover_ms"] == 600


def test_png_timeline_is_written(tmp_path: Path) -> None:
    timeline = Timeline(
        published=[(0.0, 0.0), (2.0, 200.0), (3.0, 300.0)],
        consumed=[i / 100 for i in range(300)],
        publish_end=3.0,
        drain_end=3.2,
        kills=[1.0],
        outages=[(1.0, 1.5)],
    )
    write_png(tmp_path / "t.png", timeline, "test")
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # With --baseline: the baseline's curves on the same axes, a two-line title.
    baseline = Timeline(published=[(1.0, 400.0), (2.0, 700.0)], consumed=[0.5] * 700)
    baseline.publish_end = baseline.drain_end = 2.0
    write_png(tmp_path / "b.png", timeline, "test\nsidecar / direct", baseline)
    assert (tmp_path / "b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    per_second = timeline.to_dict()
    assert per_second["publish_per_second"] == [100, 100, 100]
    assert per_second["consume_per_second"] == [100, 100, 100, 0]
