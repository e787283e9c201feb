"""The drill on its own RabbitMQ cluster (``--broker rabbitmq-cluster``, issue 25 part 6),
pure: options, the fault plan against a scripted cluster (the real one is the drill's own
run: docs/results.md), the attribution of a rolling restart's FAILOVERs, the report's fault
lines and the PNG with both kinds of fault."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest

from pipeline.cluster_faults import ClusterFaultInjector
from pipeline.drill.options import ROLLING_RESTART_AT, DrillOptions, DrillUsageError
from pipeline.faults import Fault, group_incidents
from pipeline.monitor import ObservedEvent
from pipeline.report.notes import fault_notes
from pipeline.report.png import write_png
from pipeline.report.records import FaultRecord
from pipeline.report.timeline import Throughput, Timeline


def test_cluster_options_plan_a_kill_then_the_rolling_restart() -> None:
    options = DrillOptions(broker="rabbitmq-cluster")
    options.validate()
    assert options.rabbitmq_cluster
    assert options.fractions() == (0.4,)
    assert not DrillOptions().rabbitmq_cluster


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        (DrillOptions(broker="kafka"), "--broker must be one of activemq, rabbitmq-cluster"),
        (
            DrillOptions(broker="rabbitmq-cluster", brokers="stomp://127.0.0.1:1", kill_pids=(1,)),
            "drop --brokers",
        ),
        (DrillOptions(broker="rabbitmq-cluster", faults="all-down"), "drop --faults all-down"),
        (DrillOptions(broker="rabbitmq-cluster", baseline=True), "--baseline is not available"),
        (
            DrillOptions(broker="rabbitmq-cluster", kill_at=(ROLLING_RESTART_AT,)),
            "must be below 0.8",
        ),
    ],
)
def test_inconsistent_cluster_options_are_refused(options: DrillOptions, problem: str) -> None:
    with pytest.raises(DrillUsageError, match=problem):
        options.validate()


@dataclass
class ScriptedNode:
    name: str
    stomp_port: int
    pid: int | None
    host: str = "127.0.0.1"


@dataclass
class ScriptedCluster:
    """What the injector calls on ``RabbitMQCluster``, recorded in ``log``."""

    log: list[str] = field(default_factory=list)
    nodes: list[ScriptedNode] = field(
        default_factory=lambda: [ScriptedNode(f"drill{i + 1}", 5000 + i, 100 + i) for i in range(3)]
    )
    leader: int = 1

    def queue_leader(self, queue: str) -> int:
        self.log.append(f"leader {queue}")
        return self.leader

    def kill_node(self, i: int) -> None:
        self.log.append(f"kill {i}")
        self.nodes[i].pid = None

    def restart_node(self, i: int, timeout: float) -> float:
        self.log.append(f"restart {i}")
        self.nodes[i].pid = 200 + i
        return 1.5

    def rolling_restart(self, timeout: float) -> list[float]:
        self.log.append("rolling")
        return [10.0, 11.0, 12.0]


def test_the_connected_node_is_killed_then_the_cluster_restarted_in_turn() -> None:
    cluster = ScriptedCluster()
    said: list[str] = []
    faults = ClusterFaultInjector(
        (0.4,),
        100,
        cluster=cast("Any", cluster),
        queue="q",
        connected=lambda: "127.0.0.1:5001",  # node 2 (index 1) serves the sessions now
        say=said.append,
        rolling_at=0.8,
    )
    faults.check(39)
    assert faults.faults == []
    faults.check(40)
    assert faults.wait_done(0.0) is False, "the rolling restart is still to come"
    faults.join(10.0)
    faults.check(79)
    assert len(faults.faults) == 1
    # The sampler has stopped by the drain's end: wait_done makes what is due itself.
    assert faults.wait_done(10.0, published=80)
    assert cluster.log == ["leader q", "kill 1", "restart 1", "rolling"]
    kill, rolling = faults.records()
    assert (kill.kind, kill.broker, kill.pid, kill.restarted) == ("node", "drill2", 101, True)
    assert "the connected node, leads the queue" in kill.describe()
    assert rolling.kind == "rolling-restart"
    assert rolling.broker == "drill1+drill2+drill3"
    assert rolling.restored_at is not None
    assert "each node down 10.0 s, 11.0 s, 12.0 s" in rolling.describe()
    every_node = ("127.0.0.1:5000", "127.0.0.1:5001", "127.0.0.1:5002")
    assert faults.faults[0].affects == faults.faults[1].affects == every_node
    assert faults.errors == []


def test_a_node_not_leading_the_queue_is_said_so() -> None:
    cluster = ScriptedCluster(leader=2)
    faults = ClusterFaultInjector(
        (0.4,),
        100,
        cluster=cast("Any", cluster),
        queue="q",
        connected=lambda: None,  # unknown: node 1
        say=lambda line: None,
        rolling_at=0.8,
    )
    faults.check(50)
    faults.join(10.0)
    assert cluster.log[:2] == ["leader q", "kill 0"]
    assert "the queue's leader was node 2" in faults.faults[0].detail


def _failover(session: str, ts: float, from_broker: str) -> ObservedEvent:
    body = {
        "event": "FAILOVER",
        "session_id": session,
        "timestamp": ts,
        "outage_ms": 300,
        "from_broker": from_broker,
    }
    return ObservedEvent("consumer", ts, body)


def test_failovers_off_any_node_during_the_rolling_restart_are_attributed_to_it() -> None:
    labels = ("127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3")
    kill = Fault(0, labels[0], "drill1", 9, at=5.0, wall=1000.0, fraction=0.4, kind="node")
    rolling = Fault(
        1, labels[0], "drill1+drill2+drill3", None, 20.0, 1015.0, 0.8, kind="rolling-restart"
    )
    rolling.affects = labels
    events = [
        _failover("a", 1001.0, labels[0]),
        _failover("a", 1020.0, labels[1]),
        _failover("b", 1040.0, labels[2]),
    ]
    incidents, _ = group_incidents(events, [kill, rolling])
    assert [(i.fault, len(i.sessions)) for i in incidents] == [(0, 1), (1, 2)]


def test_png_and_report_show_both_faults(tmp_path: Path) -> None:
    timeline = Timeline(
        published=[(0.0, 0.0), (10.0, 1000.0)],
        consumed=[i / 100 for i in range(1000)],
        publish_end=10.0,
        drain_end=12.0,
        kills=[4.0, 8.0],
        outages=[(4.0, 4.3), (8.0, 11.5)],
        fault_kind="node",
        kill_kinds=["node", "rolling-restart"],
    )
    write_png(tmp_path / "t.png", timeline, "cluster")
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert timeline.to_dict()["kill_kinds"] == ["node", "rolling-restart"]
    assert Timeline(kills=[1.0]).to_dict()["kill_kinds"] == ["broker"]
    record = FaultRecord(1, "drill1+drill2+drill3", None, 8.0, 0.8, kind="rolling-restart")
    assert (
        record.describe() == "rolling restart of drill1, drill2, drill3 from t=8.0 s, 80% published"
    )


def test_the_rolling_restart_is_told_against_the_publish_end() -> None:
    timeline = Timeline(
        published=[(0.0, 0.0), (10.0, 1000.0)],
        consumed=[i / 100 for i in range(1000)],
        publish_end=9.0,
    )
    kill = FaultRecord(0, "drill1", 7, 4.0, 0.4, kind="node", restored_at=6.0)
    rolling = FaultRecord(
        1, "drill1+drill2+drill3", None, 8.0, 0.8, kind="rolling-restart", restored_at=12.0
    )
    rolling = dataclasses.replace(rolling, detail="each node down 1.0 s, 1.0 s, 1.0 s")
    throughput = Throughput(100.0, 100.0, None, None)
    [note] = fault_notes(
        timeline, [kill, rolling], throughput, outbox=None, retried=0, duplicates_hidden=0
    )
    assert note.startswith("rolling restart from t=8.0 s to t=12.0 s (each node down 1.0 s")
    assert "the publish ended during it; the app received 200 message(s) meanwhile" in note
