"""RabbitMQ streams on the 3-node cluster, through the sidecar and straight to the nodes (issue 32
part 2; docs/behaviour.md, "Streams"; the broker's facts in docs/brokers.md, "Streams").

One cluster serves the module (the ``cluster``/``all_up`` fixtures of
tests/integration/test_rabbitmq_cluster.py). Each case declares a stream (replicas on all three
nodes: RabbitMQ's default initial cluster size), publishes :data:`BEFORE` messages straight to a
node, lets two consumers read half of them, one through a sidecar process and one stomp.py app
connected straight to a node that tracks its own offset and re-subscribes at ``offset=<last +
1>`` on another node when its connection ends (what RabbitMQ's stream clients do), then injects
the fault, publishes :data:`AFTER` more once the stream has a leader again, and reads to the end.
Per case the figures are printed (published / shown / shown twice / missing, sidecar and
direct); through the sidecar every message is asserted shown once, in offset order, none
missing, no ERROR, and no event but RECONNECTING/FAILOVER.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

import pytest

from testbed.rabbitmq_cluster import RabbitMQCluster
from tests.integration.stream_support import DirectApp, figures
from tests.integration.support import wait_until
from tests.integration.test_rabbitmq_cluster import all_up, cluster, sidecar_for
from tests.integration.test_streams import App, Producer, declare_stream, is_message

__all__ = ["all_up", "cluster"]  # the fixtures, shared by this module's tests

pytestmark = pytest.mark.rabbitmq

#: Messages published before the fault and after it; the consumers read half of BEFORE first.
BEFORE, AFTER = 300, 300
TOTAL = BEFORE + AFTER
#: Seconds a stream may take to have a leader again, a consumer to read everything.
LEADER_WAIT, READ_WAIT = 60.0, 120.0


def wait_leader(rmq: RabbitMQCluster, name: str, alive: set[int]) -> int:
    """The node leading stream ``name`` once it is one of ``alive`` (bounded)."""
    leader: int | None = None

    def elected() -> bool:
        nonlocal leader
        with suppress(Exception):
            leader = rmq.queue_leader(name)
        return leader in alive

    wait_until(elected, LEADER_WAIT)
    assert leader is not None
    return leader


def run_case(
    rmq: RabbitMQCluster,
    workdir: Path,
    label: str,
    *,
    home: int,
    connect: int,
    fault: Callable[[], object],
    alive: set[int],
) -> None:
    """One case: stream led by node ``home``, the sidecar and the direct app on node
    ``connect`` first, ``fault()`` after half of BEFORE was read, AFTER published through a
    node of ``alive`` once the stream has a leader there; figures printed, asserted."""
    stream = declare_stream(rmq.nodes[home], f"s32_{label}_{uuid.uuid4().hex[:6]}")
    name = stream.rpartition("/")[2]
    Producer(rmq.nodes[home], stream).publish(BEFORE)
    nodes = [rmq.nodes[(connect + k) % len(rmq.nodes)] for k in range(len(rmq.nodes))]
    order = [(node.host, node.stomp_port) for node in nodes]
    direct = DirectApp(order, stream)
    with sidecar_for(rmq, workdir, first=connect) as sidecar:
        app = App(sidecar.address, stream, "first")
        app.read(is_message(BEFORE // 2), "half before the fault")
        wait_until(lambda: len(direct.shown) > BEFORE // 2, READ_WAIT)
        started = time.monotonic()
        fault()
        leader = wait_leader(rmq, name, alive)
        producer = Producer(rmq.nodes[min(alive)], stream)
        producer.sent = BEFORE
        producer.publish(AFTER)
        took = time.monotonic() - started
        app.read(is_message(TOTAL - 1), "the last message")
        direct.keep_up(lambda: bool(direct.shown) and direct.shown[-1] == TOTAL - 1, READ_WAIT)
        status = sidecar.status()
        app.client.close()
    direct.close()
    side, twice, missing = figures(app.shown, range(TOTAL))
    d_shown, d_twice, d_missing = figures(direct.shown, range(TOTAL))
    failovers = [s.get("failovers") for s in status["sessions"]]
    print(
        f"\n[stream {label}] published {TOTAL}; sidecar: shown {side}, shown twice {twice}, "
        f"missing {missing}, events {Counter(app.events)}, errors {len(app.errors)}, "
        f"outcomes {Counter((o['command'], o['outcome']) for o in app.outcomes)}; "
        f"direct: shown {d_shown}, shown twice {d_twice}, missing {d_missing}, "
        f"re-subscribes {direct.resubscribes}, errors {direct.errors[:3]}; new leader {leader}, "
        f"fault to republished {took:.1f} s, sessions' failovers {failovers}"
    )
    assert app.errors == []
    assert set(app.events) <= {"RECONNECTING", "FAILOVER"}
    assert app.gaps == []
    assert app.shown == list(range(TOTAL))  # once each, in offset order, none missing


@pytest.mark.parametrize(
    ("label", "home", "killed"),
    [("a", 1, 0), ("b", 2, 2)],
    ids=["connected-node-killed", "leader-killed"],
)
def test_a_stream_consumer_survives_a_kill(
    all_up: RabbitMQCluster, tmp_path: Path, label: str, home: int, killed: int
) -> None:
    """kill -9 of (a) the node the sidecar and the direct app are connected to (node 0; the
    stream is led by node 1), (b) the node that leads the stream (node 2) while they stay
    connected to node 0."""
    run_case(
        all_up,
        tmp_path,
        label,
        home=home,
        connect=0,
        fault=lambda: all_up.kill_node(killed),
        alive={0, 1, 2} - {killed},
    )


def test_a_stream_consumer_survives_a_restart_of_its_node(
    all_up: RabbitMQCluster, tmp_path: Path
) -> None:
    """(c, short) One step of a rolling restart: the node the sidecar is connected to, which
    leads the stream, is stopped (orderly) and started again."""

    def restart() -> None:
        all_up.nodes[0].stop()
        all_up.restart_node(0)

    run_case(all_up, tmp_path, "c1", home=0, connect=0, fault=restart, alive={0, 1, 2})


@pytest.mark.long
def test_a_stream_consumer_survives_a_rolling_restart(
    all_up: RabbitMQCluster, tmp_path: Path
) -> None:
    """(c) Every node stopped and started again in turn (RabbitMQ's upgrade procedure)."""
    run_case(
        all_up,
        tmp_path,
        "c",
        home=0,
        connect=0,
        fault=all_up.rolling_restart,
        alive={0, 1, 2},
    )
