"""Faults of the drill on its own 3-node RabbitMQ cluster (``--broker rabbitmq-cluster``,
issue 25): kill -9 of the node the sessions are connected to, then a rolling restart of every
node (:class:`ClusterFaultInjector`).

The node to kill is the one the producer's sidecar has its sessions on at the moment of the
kill (``/status``: the broker with the most sessions), and the report says whether it led the
drill's quorum queue then (``rabbitmqctl list_queues name leader``, read just before the
kill). The killed node is started again on its ports and data (it rejoins the cluster) before
the next fault. The rolling restart stops and restarts each node in turn, the way RabbitMQ's
upgrade guide does it (:meth:`testbed.rabbitmq_cluster.RabbitMQCluster.rolling_restart`: a
node is stopped only once no quorum queue would lose its majority); its record spans its
whole duration (``restored_at`` is its end). The FAILOVERs of sessions that left any node
after a fault (and before the next) are attributed to it: in a cluster a kill disturbs the
other nodes too (the survivors' STOMP adapter closes publishers while a quorum queue elects
its new leader, docs/brokers.md "A RabbitMQ cluster": the sessions reattach to the node they
were on).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from pipeline.faults import RESTART_TIMEOUT, Fault, FaultInjector
from testbed import BrokerError
from testbed.rabbitmq_cluster import RabbitMQCluster

__all__ = ["ROLLING_TIMEOUT", "ClusterFaultInjector", "node_label"]

#: Seconds the rolling restart of the three nodes may take at most (measured 60-110 s on
#: 2 loaded cores, each node's stop, start and rejoin).
ROLLING_TIMEOUT = 600.0


def node_label(cluster: RabbitMQCluster, i: int) -> str:
    """``host:port`` of node ``i``'s STOMP listener: how a sidecar names it."""
    node = cluster.nodes[i]
    return f"{node.host}:{node.stomp_port}"


class ClusterFaultInjector(FaultInjector):
    """Kills of the connected node at ``fractions`` of the ``rows``, then the rolling restart
    at ``rolling_at`` (module docstring; None: no rolling restart). ``connected()`` names the
    broker (``host:port``) the sessions use now (None: unknown; node 1 is then taken): the
    producer's, or with ``--consumer spark-stream`` a reading task's (``whose`` says which, for
    the fault's detail: a text, or a function called after ``connected()``, which then runs
    in a thread of its own, so that a ``connected()`` that waits for a reader does not hold up
    the sampler; the fault's ``fraction`` is then the share published when it was due, its
    ``at`` the moment of the kill); ``queue`` is the drill's quorum queue or stream (its AMQP
    name).
    ``say`` prints a progress line."""

    def __init__(
        self,
        fractions: tuple[float, ...],
        rows: int,
        *,
        cluster: RabbitMQCluster,
        queue: str,
        connected: Callable[[], str | None],
        say: Callable[[str], None],
        rolling_at: float | None,
        whose: str | Callable[[], str] = "the connected node",
    ) -> None:
        planned = fractions if rolling_at is None else (*fractions, rolling_at)
        super().__init__(planned, rows, pair=None, pids=(), say=say)
        self.kind = "node"
        self.rolling = rolling_at is not None
        self.whose = whose
        self.cluster = cluster
        self.queue = queue
        self.connected = connected

    def _make(self, i: int, fraction: float) -> None:
        if self.rolling and i == len(self.fractions) - 1:
            self._rolling_restart(i, fraction)
        elif callable(self.whose):  # connected() may wait for a reader: not in the sampler
            self._follow(self._kill_connected, i, fraction)
        else:
            self._kill_connected(i, fraction)

    def _node_of(self, label: str | None) -> int:
        for i in range(len(self.cluster.nodes)):
            if node_label(self.cluster, i) == label:
                return i
        return 0

    def _kill_connected(self, index: int, fraction: float) -> None:
        """SIGKILL the node the sessions use; the follow-up starts it again."""
        victim = self._node_of(self.connected())
        try:
            leader = self.cluster.queue_leader(self.queue)
        except (BrokerError, OSError, ValueError) as exc:
            leader = None
            self.errors.append(f"the queue's leader before kill #{index + 1}: {exc}")
        node = self.cluster.nodes[victim]
        pid = node.pid
        at, wall = time.monotonic() - self.t0, time.time()
        try:
            self.cluster.kill_node(victim)
        except (BrokerError, OSError) as exc:
            self.errors.append(f"kill -9 of {node.name}: {exc}")
        leads = "leads the queue" if leader == victim else f"the queue's leader was node {leader}"
        fault = Fault(
            index,
            node_label(self.cluster, victim),
            node.name,
            pid,
            at,
            wall,
            fraction,
            kind="node",
            pids=(pid,) if pid is not None else (),
            detail=f"{self.whose() if callable(self.whose) else self.whose}, {leads}",
            affects=tuple(node_label(self.cluster, i) for i in range(len(self.cluster.nodes))),
        )
        self.faults.append(fault)
        self.say(
            f"kill -9 {node.name} (pid {pid}, {fault.broker}: {fault.detail}), "
            f"{fraction:.0%} published"
        )
        self._follow(self._restart_node, fault, victim)

    def _restart_node(self, fault: Fault, victim: int) -> None:
        """Start the killed node again (it rejoins the cluster) unless the drill stops."""
        if self._halt.is_set():
            return
        try:
            took = self.cluster.restart_node(victim, RESTART_TIMEOUT)
        except (BrokerError, TimeoutError, OSError) as exc:
            self.errors.append(f"after kill #{fault.index + 1}: {fault.name} restart: {exc}")
            return
        fault.restarted = True
        fault.restored_at = time.monotonic() - self.t0
        self.say(f"{fault.name} restarted and rejoined the cluster in {took:.1f} s")
        self._ready.set()

    def _rolling_restart(self, index: int, fraction: float) -> None:
        """Begin the rolling restart; its follow-up restarts the nodes one by one."""
        nodes = self.cluster.nodes
        labels = tuple(node_label(self.cluster, i) for i in range(len(nodes)))
        fault = Fault(
            index,
            labels[0],
            "+".join(n.name for n in nodes),
            None,
            time.monotonic() - self.t0,
            time.time(),
            fraction,
            kind="rolling-restart",
            affects=labels,
        )
        self.faults.append(fault)
        self.say(f"rolling restart of {fault.name} begins, {fraction:.0%} published")
        self._follow(self._roll, fault)

    def _roll(self, fault: Fault) -> None:
        try:
            downtimes = self.cluster.rolling_restart(timeout=ROLLING_TIMEOUT)
        except (BrokerError, TimeoutError, OSError) as exc:
            self.errors.append(f"rolling restart: {exc}")
            return
        fault.restarted = True
        fault.restored_at = time.monotonic() - self.t0
        fault.detail = "each node down " + ", ".join(f"{d:.1f} s" for d in downtimes)
        self.say(
            f"rolling restart done at t={fault.restored_at:.1f} s ({fault.detail}, "
            "in turn, each back and rejoined before the next)"
        )
        self._ready.set()
