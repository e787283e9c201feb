"""The drill's baseline (``--baseline``, issue 18 part 4), without Spark or brokers: the overhead
ratios and their windows, the report's text and JSON (the PNG:
``test_report.py``).
``tests/pipeline/test_drill.py`` runs ``drill --baseline`` end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.baseline import broker_address
from pipeline.drill.options import DrillOptions, DrillUsageError
from pipeline.report.document import DrillReport
from pipeline.report.overhead import BaselineReport, overhead
from pipeline.report.timeline import Throughput, Timeline, reached_at
from tests.pipeline.test_report import _report as drill_report


def _baseline(**overrides: object) -> BaselineReport:
    # 1,000 rows at 200 msg/s (5 s); consumed at 100 msg/s for 4 s, then the rest at once.
    timeline = Timeline(
        published=[(1.0, 200.0), (2.0, 400.0), (3.0, 600.0), (5.0, 1000.0)],
        consumed=[i / 100 for i in range(400)] + [4.5] * 600,
        publish_end=5.0,
        drain_end=5.0,
    )
    values: dict[str, object] = {
        "broker": "127.0.0.1:61613",
        "destination": "/queue/x.baseline",
        "rows": 1000,
        "sent": 1000,
        "received": 1000,
        "unique": 1000,
        "lost": 0,
        "duplicates": 0,
        "mismatched": 0,
        "unexpected": 0,
        "residual": 0,
        "publish": 200.0,
        "consume": 200.0,
        "timeline": timeline,
    }
    values.update(overrides)
    return BaselineReport(**values)  # type: ignore[arg-type]


def test_reached_at_interpolates_between_samples_from_zero() -> None:
    timeline = _baseline().timeline
    assert timeline is not None
    assert reached_at(timeline, 100) == pytest.approx(0.5)
    assert reached_at(timeline, 400) == pytest.approx(2.0)
    assert reached_at(timeline, 800) == pytest.approx(4.0)
    assert reached_at(timeline, 1001) is None


def test_overhead_compares_overall_and_the_same_first_share_of_the_rows() -> None:
    base = _baseline()
    # Through the sidecar: 100 msg/s overall (the kill's outage included), 150 before the
    # kill at 40 % of the rows; consumed 80 overall, 120 before.
    sidecar = overhead(
        "sidecar",
        Throughput(overall=100.0, before=150.0, during=0.0, after=120.0),
        Throughput(overall=80.0, before=120.0, during=0.0, after=90.0),
        base,
        share=0.4,
    )
    # The baseline reached 40 % (400 rows) at t = 2 s: 200 msg/s published, 100 consumed.
    assert sidecar.publish.direct == 200.0
    assert sidecar.publish.ratio == pytest.approx(0.5)
    assert sidecar.publish_before.direct == pytest.approx(200.0)
    assert sidecar.publish_before.ratio == pytest.approx(0.75)
    assert sidecar.consume.ratio == pytest.approx(0.4)
    assert sidecar.consume_before.direct == pytest.approx(100.0)
    assert sidecar.consume_before.ratio == pytest.approx(1.2)
    assert sidecar.summary() == (
        "publish 0.50x overall, 0.75x before the kill; consume 0.40x overall, 1.20x before the kill"
    )
    # Without a kill (--faults 0) there is no before window: overall only.
    no_kill = overhead(
        "sidecar",
        Throughput(100.0, None, None, None),
        Throughput(80.0, None, None, None),
        base,
        None,
    )
    assert no_kill.publish_before.ratio is None
    assert no_kill.summary() == "publish 0.50x overall; consume 0.40x overall"
    assert no_kill.to_dict()["publish"] == {
        "overall": {"direct": 200.0, "through": 100.0, "ratio": 0.5},
        "before": {"direct": None, "through": None, "ratio": None},
    }


def _report(base: BaselineReport) -> DrillReport:
    """A drill report (1,000 rows, a kill at 40 %) with ``base`` and the sidecar's overhead."""
    publish = Throughput(100.0, 150.0, 0.0, 120.0)
    consume = Throughput(80.0, 120.0, 0.0, 90.0)
    return drill_report(
        rows=1000,
        sent=1000,
        received=1000,
        unique=1000,
        publish=publish,
        consume=consume,
        phases={"baseline publish": 5.0, "publish": 10.0},
        baseline=base,
        overhead={"sidecar": overhead("sidecar", publish, consume, base, 0.4)},
    )


def test_report_shows_baseline_rates_and_ratios(tmp_path: Path) -> None:
    report = _report(_baseline())
    assert report.passed
    text = report.format_text()
    assert "baseline      straight to the broker 127.0.0.1:61613 (no sidecar, no fault)" in text
    assert "direct      publish 200, consume 200 msg/s overall; peak backlog 300 messages" in text
    assert "over its first 40% of the rows" in text
    assert "overhead      sidecar / direct: publish 0.50x overall, 0.75x before the kill" in text
    report.write_json(tmp_path / "r.json")
    data = json.loads((tmp_path / "r.json").read_text())
    assert list(data)[:6] == ["rows", "sent", "received", "lost", "duplicates", "failovers"]
    assert data["baseline"]["passed"] is True
    assert data["baseline"]["timeline"]["publish_per_second"] == [200, 200, 200, 200, 200]
    ratios = data["overhead"]["sidecar"]
    assert ratios["share_before"] == 0.4
    assert ratios["publish"]["overall"]["ratio"] == 0.5
    assert ratios["consume"]["before"] == {"direct": 100.0, "through": 120.0, "ratio": 1.2}


def test_a_baseline_that_lost_rows_fails_the_drill() -> None:
    for bad in (_baseline(lost=1), _baseline(duplicates=2), _baseline(errors=["publish failed"])):
        report = _report(bad)
        assert not report.passed
        assert "FAIL" in report.format_text()
    assert (
        "error         baseline: publish failed"
        in _report(_baseline(errors=["publish failed"])).format_text()
    )


def test_report_without_baseline_has_no_baseline_lines() -> None:
    report = _report(_baseline())
    report.baseline, report.overhead = None, {}
    assert "straight to the broker" not in report.format_text()
    assert "overhead" not in report.format_text()
    assert report.to_dict()["baseline"] is None
    assert report.to_dict()["overhead"] == {}


def test_without_a_kill_the_report_compares_overall_only() -> None:
    base = _baseline()
    report = _report(base)
    report.faults = []
    publish, consume = Throughput(100.0, None, None, None), Throughput(80.0, None, None, None)
    report.publish, report.consume = publish, consume
    report.overhead = {"sidecar": overhead("sidecar", publish, consume, base, None)}
    text = report.format_text()
    assert "overhead      sidecar / direct: publish 0.50x overall; consume 0.40x overall" in text
    assert "before the kill" not in text
    assert "(overall: a publish held to the drain's pace" in text


def test_baseline_goes_to_the_first_plain_broker_of_external_brokers() -> None:
    url = "failover:(stomp://127.0.0.1:61700,stomp://127.0.0.1:61701)?retryInterval=100"
    assert broker_address(url) == ("127.0.0.1", 61700)
    with pytest.raises(ValueError, match="behind TLS"):
        broker_address("stomp+ssl://127.0.0.1:61614")
    options = DrillOptions(brokers="stomp+ssl://127.0.0.1:61614", baseline=True)
    with pytest.raises(DrillUsageError, match="--baseline goes straight to the first broker"):
        options.validate()
    DrillOptions(brokers="stomp+ssl://127.0.0.1:61614").validate()  # no baseline: no check
