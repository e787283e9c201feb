"""The drill's outbox mode and its fault modes (issue 17, part 5), pure: options, the fault
plans against fake brokers and a fake sidecar, the sampler's outbox series, the report's
outbox section and fault records, and the PNG with the outbox panel."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import click
import pytest

from pipeline.cli import FaultsParam
from pipeline.drill.options import MASTER, MASTER_WITH_RETRIES, DrillOptions, DrillUsageError
from pipeline.faults import BrokerPair, FaultInjector, Sampler, outbox_taken, sidecar_outbox
from pipeline.report.document import DrillReport
from pipeline.report.notes import fault_notes
from pipeline.report.outbox import STALL_LIMIT, outbox_errors, outbox_summary
from pipeline.report.png import write_png
from pipeline.report.records import FaultRecord
from pipeline.report.timeline import Throughput, Timeline
from testbed.sidecar import Metrics
from tests.pipeline.test_report import _report as report_of

PNG = b"\x89PNG\r\n\x1a\n"


# -- options ----------------------------------------------------------------------------------


def test_fault_modes_plan_one_fault_and_a_master_with_task_retries() -> None:
    today = DrillOptions()
    assert (today.fault_kind, today.fault_count(), today.spark_master()) == ("broker", 1, MASTER)
    down = DrillOptions(outbox=True, faults="all-down")
    assert (down.fault_kind, down.fault_count(), down.fractions()) == ("all-down", 1, (0.4,))
    assert down.spark_master() == MASTER_WITH_RETRIES
    assert down.downtime() == 30.0
    assert down.drain_idle_for_plan() == down.drain_idle + 30.0, "the publish may end mid-outage"
    assert DrillOptions(faults="all-down", down_for=10.0, kill_at=(0.6,)).fractions() == (0.6,)
    killed = DrillOptions(outbox=True, kill_sidecar=True)
    assert (killed.fault_kind, killed.fault_count()) == ("sidecar", 1)
    assert killed.spark_master() == MASTER_WITH_RETRIES
    assert killed.drain_idle_for_plan() == killed.drain_idle
    assert DrillOptions(kill_sidecar=True, outbox=True, master="local[2,3]").spark_master() == (
        "local[2,3]"
    )
    for ok in (down, killed, DrillOptions(outbox=True), DrillOptions(outbox=True, faults=2)):
        ok.validate()


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        (DrillOptions(kill_sidecar=True), "--kill-sidecar needs --outbox"),
        (DrillOptions(kill_sidecar=True, outbox=True, faults=1), "a fault mode of its own"),
        (
            DrillOptions(kill_sidecar=True, outbox=True, faults="all-down"),
            "a fault mode of its own",
        ),
        (
            DrillOptions(kill_sidecar=True, outbox=True, master="local[2]"),
            "needs Spark task retries: --master local[2] has none",
        ),
        (
            DrillOptions(faults="all-down", brokers="stomp://127.0.0.1:1"),
            "--faults all-down needs the drill's own brokers",
        ),
        (DrillOptions(down_for=5.0), "--down-for only applies with --faults all-down"),
        (DrillOptions(faults="all-down", down_for=300.0), "less than the sidecars' reconnect"),
        (DrillOptions(faults="all-down", kill_at=(0.2, 0.5)), "gives 2 point(s) for 1 fault(s)"),
        (DrillOptions(faults="some"), "--faults must be a number or all-down"),
    ],
)
def test_inconsistent_fault_modes_are_refused(options: DrillOptions, problem: str) -> None:
    with pytest.raises(DrillUsageError) as info:
        options.validate()
    assert problem in str(info.value)


def test_every_inconsistency_is_named_at_once() -> None:
    options = DrillOptions(kill_sidecar=True, faults=2, down_for=3.0, master="local[*]")
    with pytest.raises(DrillUsageError) as info:
        options.validate()
    text = str(info.value)
    for problem in ("needs --outbox", "fault mode of its own", "--down-for only", "local[*]"):
        assert problem in text


def test_faults_option_takes_a_count_or_all_down() -> None:
    param = FaultsParam()
    assert param.convert("3", None, None) == 3
    assert param.convert("All-Down", None, None) == "all-down"
    for bad in ("-1", "some"):
        with pytest.raises(click.BadParameter):
            param.convert(bad, None, None)


# -- fault plans with fakes -------------------------------------------------------------------


@dataclass
class FakeProcess:
    """A broker or a sidecar: what the injector calls, recorded in ``log``."""

    name: str
    log: list[str]
    pid: int | None = 100
    port: int = 61613
    host: str = "127.0.0.1"
    stomp_port: int = 61613
    next_pid: int = 200
    starts: int = 0

    def running(self) -> bool:
        return self.pid is not None

    def kill(self) -> None:
        self.log.append(f"kill {self.name}")
        self.pid = None

    def start(self) -> None:
        self.log.append(f"start {self.name}")
        self.starts += 1
        self.pid = self.next_pid

    def wait_ready(self, timeout: float) -> float:
        self.log.append(f"ready {self.name}")
        return 0.0

    def wait_backup(self, timeout: float) -> float:
        self.log.append(f"backup {self.name}")
        return 0.0


def test_all_down_kills_both_brokers_then_restarts_the_serving_one_first() -> None:
    log: list[str] = []
    primary = FakeProcess("amq-primary", log, pid=11, stomp_port=1)
    backup = FakeProcess("amq-backup", log, pid=12, stomp_port=2)
    pair = BrokerPair(cast("Any", primary), cast("Any", backup))
    said: list[str] = []
    faults = FaultInjector(
        (0.4,), 100, pair=pair, pids=(), say=said.append, kind="all-down", down_for=0.0
    )
    faults.check(39)
    assert faults.faults == []
    faults.check(40)
    faults.join(30.0)
    assert log == [
        "kill amq-backup",  # first: it would take the store over
        "kill amq-primary",
        "start amq-primary",
        "ready amq-primary",
        "start amq-backup",
        "backup amq-backup",
    ]
    [record] = faults.records()
    assert (record.kind, record.pid, record.pids, record.broker) == (
        "all-down",
        11,
        (11, 12),
        "amq-primary+amq-backup",
    )
    assert record.restarted
    assert record.restored_at is not None
    assert record.restored_at >= record.at
    assert (pair.serving.name, pair.waiting.name) == ("amq-primary", "amq-backup"), "same roles"
    assert faults.errors == []
    faults.check(90)
    assert len(faults.faults) == 1, "one fault only"


def test_all_down_restarts_nothing_after_stop() -> None:
    log: list[str] = []
    pair = BrokerPair(
        cast("Any", FakeProcess("p", log, pid=1)), cast("Any", FakeProcess("b", log, pid=2))
    )
    faults = FaultInjector(
        (0.5,), 10, pair=pair, pids=(), say=lambda _: None, kind="all-down", down_for=3600.0
    )
    faults.check(5)
    faults.stop()  # the drill's cleanup, e.g. on Ctrl-C during the downtime
    faults.join(30.0)
    assert log == ["kill b", "kill p"]
    [record] = faults.records()
    assert record.restored_at is None
    assert not record.restarted


def test_kill_sidecar_restarts_it_on_the_same_port_and_calls_back() -> None:
    log: list[str] = []
    sidecar = FakeProcess("sidecar-producer", log, pid=77, port=40001, next_pid=78)
    seen: list[Any] = []
    faults = FaultInjector(
        (0.4,),
        1000,
        pair=None,
        pids=(),
        say=lambda _: None,
        kind="sidecar",
        sidecar=cast("Any", sidecar),
        restarted=seen.append,
    )
    faults.check(400)
    faults.join(30.0)
    assert log == ["kill sidecar-producer", "start sidecar-producer", "ready sidecar-producer"]
    assert seen == [sidecar]
    [record] = faults.records()
    assert (record.kind, record.pid, record.new_pid, record.restarted) == ("sidecar", 77, 78, True)
    assert record.broker == "sidecar-producer"
    assert record.downtime is not None
    assert record.downtime >= 0


def test_fault_modes_need_what_they_kill() -> None:
    with pytest.raises(ValueError, match="broker pair"):
        FaultInjector((0.4,), 1, pair=None, pids=(), say=print, kind="all-down")
    with pytest.raises(ValueError, match="sidecar"):
        FaultInjector((0.4,), 1, pair=None, pids=(), say=print, kind="sidecar")


# -- the sampler's outbox series --------------------------------------------------------------


@dataclass
class FakeReader:
    unique: int = 0


@dataclass
class FakeSidecar:
    """``metrics()`` answers the next of ``scrapes`` (an exception is raised)."""

    scrapes: list[Metrics | OSError] = field(default_factory=list)

    def metrics(self, timeout: float = 10.0) -> Metrics:
        scrape = self.scrapes.pop(0)
        if isinstance(scrape, OSError):
            raise scrape
        return scrape


def test_sampler_records_the_outbox_depth_beside_the_sends() -> None:
    sends = iter([10.0, None, 30.0])
    depths = iter([(5.0, 500.0), None, (0.0, 0.0)])
    faults = FaultInjector((), 100, pair=None, pids=(), say=print)
    sampler = Sampler(
        lambda: next(sends),
        cast("Any", FakeReader()),
        100,
        faults,
        progress=False,
        outbox=lambda: next(depths),
    )
    for _ in range(3):
        sampler.sample()
    assert [n for _, n in sampler.samples] == [10.0, 30.0]
    assert [(f, b) for _, f, b in sampler.outbox_samples] == [(5.0, 500.0), (0.0, 0.0)]
    plain = Sampler(lambda: 1.0, cast("Any", FakeReader()), 1, faults, progress=False)
    plain.sample()
    assert plain.outbox_samples == []


def test_outbox_depth_is_read_from_the_producer_metrics() -> None:
    gauges: Metrics = {
        "mq_sidecar_outbox_frames": [({}, 42.0)],
        "mq_sidecar_outbox_bytes": [({}, 4200.0)],
    }
    sidecar = FakeSidecar([gauges, OSError("restarting"), {"mq_sidecar_sessions": [({}, 1.0)]}])
    depth = sidecar_outbox(cast("Any", sidecar))
    assert depth() == (42.0, 4200.0)
    assert depth() is None, "a sidecar that does not answer"
    assert depth() is None, "a sidecar without the outbox's gauges"


def test_outbox_taken_sums_held_and_forwarded_across_a_restart() -> None:
    """The publish series with the outbox: frames held + forwarded; a restarted sidecar's
    counter starts from 0, so the old process's last forwarded count is carried over."""

    def scrape(held: float, forwarded: float) -> Metrics:
        return {
            "mq_sidecar_outbox_frames": [({}, held)],
            "mq_sidecar_outbox_forwarded_total": [({}, forwarded)],
        }

    sidecar = FakeSidecar([scrape(10, 90), OSError("killed"), scrape(40, 0), scrape(5, 60)])
    sidecar_any = cast("Any", sidecar)
    sidecar_any.pid = 100
    taken = outbox_taken(sidecar_any)
    assert taken() == 100.0
    assert taken() is None
    sidecar_any.pid = 200  # restarted: it found 40 frames in outbox_dir
    assert taken() == 130.0
    assert taken() == 155.0


# -- report -----------------------------------------------------------------------------------


def _timeline(**overrides: Any) -> Timeline:
    values: dict[str, Any] = {
        # 100 msg/s, nothing from 4 s to 10 s (every broker down without the outbox), then
        # 100 msg/s again until 14 s.
        "published": [(float(t), 100.0 * min(t, 4) + 100.0 * max(0, t - 10)) for t in range(15)],
        "consumed": [i / 100 for i in range(800)],
        "publish_end": 14.0,
        "drain_end": 14.0,
        "kills": [4.0],
        "outages": [(4.0, 10.0)],
        "outbox": [(0.0, 0.0, 0.0), (4.0, 0.0, 0.0), (6.0, 300.0, 30_000.0), (9.0, 0.0, 0.0)],
        "fault_kind": "all-down",
    }
    values.update(overrides)
    return Timeline(**values)


def _all_down(restored_at: float | None = 10.0) -> FaultRecord:
    return FaultRecord(
        0,
        "amq-primary+amq-backup",
        11,
        4.0,
        0.4,
        restarted=True,
        kind="all-down",
        pids=(11, 12),
        restored_at=restored_at,
    )


def test_longest_stall_within_a_window() -> None:
    timeline = _timeline()
    # Samples 1 s apart: a publish that never stops shows a "stall" of one sampling step.
    assert timeline.longest_stall(4.0, 10.0) == pytest.approx(6.0)
    assert timeline.longest_stall(0.0, 4.0) == pytest.approx(1.0)
    assert timeline.longest_stall(11.0, 30.0) == pytest.approx(1.0), "clipped to the publish"
    assert timeline.longest_stall(12.0, 30.0) == pytest.approx(1.0)
    assert timeline.longest_stall(20.0, 30.0) == 0.0, "after the publish"
    steady = _timeline(published=[(float(t), 100.0 * t) for t in range(15)])
    assert steady.longest_stall(4.0, 10.0) == pytest.approx(1.0)
    # Every SEND handed over into the outbox at 6 s, the tasks' DISCONNECTs wait until 14 s
    # for the brokers: not a stall.
    spooled = _timeline(published=[(float(t), 100.0 * min(t, 6)) for t in range(15)])
    assert spooled.sends_done() == 6.0
    assert spooled.longest_stall(4.0, 10.0) == pytest.approx(1.0)


def test_outbox_summary_peak_and_when_it_emptied() -> None:
    status = {"frames": 0, "forwarded_total": 1500, "recovery": {"frames": 7, "clean": True}}
    summary = outbox_summary(_timeline(), "/w/outbox", status)
    assert (summary.peak_frames, summary.peak_bytes, summary.peak_at) == (300, 30_000, 6.0)
    assert (summary.emptied_at, summary.final_frames) == (9.0, 0)
    assert (summary.forwarded_total, summary.recovered_frames, summary.samples) == (1500, 7, 4)
    assert summary.drained
    left = outbox_summary(_timeline(outbox=[(1.0, 0.0, 0.0), (2.0, 5.0, 50.0)]), "/o", None)
    assert (left.emptied_at, left.final_frames, left.forwarded_total) == (None, None, None)
    assert not left.drained, "still holding frames at the last sample"
    never = outbox_summary(_timeline(outbox=[]), "/o", {"frames": 0})
    assert (never.peak_frames, never.peak_at, never.emptied_at, never.drained) == (
        0,
        None,
        None,
        True,
    )


def test_outbox_errors_name_a_stalled_publish_and_frames_left_behind() -> None:
    stalled = _timeline()
    summary = outbox_summary(stalled, "/o", {"frames": 12})
    errors = outbox_errors(summary, stalled, [_all_down()])
    assert len(errors) == 2
    assert "still held 12 frame(s)" in errors[0]
    assert "stalled 6.0 s while every broker was down" in errors[1]
    steady = _timeline(published=[(float(t), 100.0 * t) for t in range(15)])
    assert STALL_LIMIT > 1.0
    assert outbox_errors(outbox_summary(steady, "/o", {"frames": 0}), steady, [_all_down()]) == []


def test_fault_notes_say_what_happened() -> None:
    timeline = _timeline()
    publish = Throughput(60.0, 100.0, 0.0, 100.0)
    [without] = fault_notes(
        timeline, [_all_down()], publish, outbox=None, retried=3, duplicates_hidden=0
    )
    assert "every broker down from t=4.0 s until one served again at t=10.0 s" in without
    assert "0 msg/s meanwhile (100 msg/s before)" in without
    assert "longest stall with rows still to send 6.0 s; 3 Spark task attempt(s)" in without
    assert "without the outbox the writer waits for the brokers' receipts" in without
    assert "got the sidecar's ERROR and Spark ran them again" in without
    [no_retry] = fault_notes(
        timeline, [_all_down()], publish, outbox=None, retried=0, duplicates_hidden=0
    )
    assert "no task failed: the downtime stayed under the sidecar's call_timeout" in no_retry
    summary = outbox_summary(timeline, "/o", {"frames": 0, "recovery": {"frames": 40}})
    [with_outbox] = fault_notes(
        timeline, [_all_down()], publish, outbox=summary, retried=0, duplicates_hidden=0
    )
    assert "the outbox peaked at 300 frame(s) and was empty again at t=9.0 s" in with_outbox
    killed = FaultRecord(
        0,
        "sidecar-producer",
        77,
        4.0,
        0.4,
        restarted=True,
        kind="sidecar",
        pids=(77,),
        restored_at=5.5,
        new_pid=78,
    )
    [note] = fault_notes(
        timeline, [killed], publish, outbox=summary, retried=2, duplicates_hidden=900
    )
    assert "sidecar (pid 77) killed at t=4.0 s, ready again at t=5.5 s" in note
    assert "2 Spark task attempt(s) retried" in note
    assert "hid 900 copies" in note
    assert "found 40 frame(s) in outbox_dir" in note
    broker = FaultRecord(0, "amq-primary", 11, 4.0, 0.4, 500)
    assert (
        fault_notes(timeline, [broker], publish, outbox=None, retried=0, duplicates_hidden=0) == []
    )


def _report(**overrides: Any) -> DrillReport:
    return report_of(**{"faults": [_all_down()], **overrides})


def test_report_has_the_outbox_section_and_what_each_fault_did(tmp_path: Path) -> None:
    timeline = _timeline()
    summary = outbox_summary(timeline, "/w/outbox", {"frames": 0, "forwarded_total": 9})
    report = _report(outbox=summary, timeline=timeline)
    report.write_json(tmp_path / "r.json")
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["outbox"]["peak_frames"] == 300
    assert data["outbox"]["emptied_at"] == 9.0
    assert data["outbox"]["drained"] is True
    [fault] = data["faults"]
    assert (fault["kind"], fault["pids"], fault["restored_at"], fault["downtime_s"]) == (
        "all-down",
        [11, 12],
        10.0,
        6.0,
    )
    assert data["timeline"]["fault_kind"] == "all-down"
    assert data["timeline"]["outbox_frames_per_second"][:10] == [0, 0, 0, 0, 0, 300, 300, 300, 0, 0]
    text = report.format_text()
    assert "every broker down: kill -9 amq-primary+amq-backup (pids 11, 12) at t=4.0 s" in text
    assert "back after 6.0 s" in text
    assert "outbox        peak 300 frame(s) / 30,000 bytes at t=6.0 s, empty again at t=9.0 s" in (
        text
    )
    assert "PASS" in text
    plain = _report(faults=[FaultRecord(0, "amq-primary", 11, 1.0, 0.4, 600)])
    assert json.loads(json.dumps(plain.to_dict()))["outbox"] is None
    assert "kill -9 #1 amq-primary (pid 11) at t=1.0 s, 40% published" in plain.format_text()


@pytest.mark.parametrize("kind", ["all-down", "sidecar", "broker"])
def test_png_has_an_outbox_panel(tmp_path: Path, kind: str) -> None:
    write_png(tmp_path / "o.png", _timeline(fault_kind=kind), "outbox\nsecond line")
    assert (tmp_path / "o.png").read_bytes()[:8] == PNG
    baseline = Timeline(published=[(1.0, 400.0), (2.0, 700.0)], consumed=[0.5] * 700)
    baseline.publish_end = baseline.drain_end = 2.0
    write_png(tmp_path / "b.png", _timeline(fault_kind=kind), "with a baseline", baseline)
    assert (tmp_path / "b.png").read_bytes()[:8] == PNG
