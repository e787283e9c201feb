"""A RabbitMQ 3.10 cluster of N nodes (default 3) on 127.0.0.1 as a test broker (issue 25).

Facts in docs/brokers.md, "A RabbitMQ cluster":

* One private epmd (``PrivateEpmd``, a foreground child on a free port, its PID known) serves
  every node: each node is a ``testbed.rabbitmq.RabbitMQ`` built with ``shared_epmd=True``
  (``ERL_EPMD_PORT`` is that port for the server and for every CLI call, with
  ``ERL_FLAGS=-start_epmd false`` so that no ``epmd -daemon`` can ever appear) and the same
  Erlang cookie, written into each node's own ``HOME``.
* Nodes are ``NAME1@localhost`` ... ``NAMEn@localhost``, each with its own STOMP, AMQP and
  distribution ports. Node 1 starts alone; nodes 2..n join it the way the RabbitMQ clustering
  guide says: ``rabbitmqctl stop_app``, ``reset``, ``join_cluster NAME1@localhost``,
  ``start_app``.
* A node is crashed with SIGKILL of its ``beam.smp`` (``kill_node``) and started again on the
  same ports and data directory (``restart_node``), where it rejoins the cluster by itself;
  ``rolling_restart`` stops and restarts each node in turn, waiting before each stop until
  no quorum queue would lose its majority (``rabbitmq-queues
  check_if_node_is_quorum_critical``, as RabbitMQ's upgrade guide does).
* ``stop()`` stops the nodes, then the epmd, and checks that no process of the cluster is
  left (any process whose environment names the cluster's ``ERL_EPMD_PORT``).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from testbed.broker import BrokerError, BrokerProcess, BrokerTimeout, _listening
from testbed.probe import free_port
from testbed.rabbitmq import RabbitMQ

__all__ = ["CLASSIC", "QUORUM", "PrivateEpmd", "RabbitMQCluster", "cluster_leftovers"]

#: The STOMP headers that declare a quorum queue (RabbitMQ STOMP plugin guide, "Queue
#: Arguments"); sent on SUBSCRIBE and SEND alike, so either may create it.
QUORUM = {"x-queue-type": "quorum", "durable": "true", "auto-delete": "false"}
#: A durable classic queue: it lives on the node where it was declared (its home node).
CLASSIC = {"x-queue-type": "classic", "durable": "true", "auto-delete": "false"}


def _epmd_binary() -> str:
    found = shutil.which("epmd")
    if found is None:
        copies = sorted(Path("/usr/lib/erlang").glob("erts-*/bin/epmd"))
        if not copies:
            raise BrokerError("epmd not found (package erlang-base); run scripts/setup.sh")
        found = str(copies[-1])
    return found


def cluster_leftovers(epmd_port: int) -> list[int]:
    """PIDs of live processes whose environment has ``ERL_EPMD_PORT=<epmd_port>``.

    Every process a ``RabbitMQCluster`` starts (the epmd, the nodes' ``sh`` wrappers and
    ``beam.smp``, CLI calls, and any ``epmd -daemon`` one of them might have spawned) carries
    that variable, so after ``stop()`` this list must be empty. Processes whose environment
    cannot be read (another user's) are not listed.
    """
    wanted = f"ERL_EPMD_PORT={epmd_port}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if state != "Z" and wanted in environ.split(b"\0"):
            found.append(int(entry))
    return found


class PrivateEpmd(BrokerProcess):
    """One epmd as a foreground child on ``127.0.0.1:port`` (``epmd -port P -address
    127.0.0.1``), started and stopped by PID like a broker.

    ``start()`` returns once it accepts TCP (within 10 s, else ``BrokerError``). It speaks no
    STOMP: ``stomp_port`` is the epmd port only because the base class wants one.
    """

    def __init__(self, name: str, workdir: Path, *, port: int | None = None) -> None:
        super().__init__(name, workdir, stomp_port=port if port is not None else free_port())

    @property
    def port(self) -> int:
        """The epmd port (``ERL_EPMD_PORT`` of every node and CLI call of the cluster)."""
        return self.stomp_port

    def _server_command(self) -> list[str]:
        return [_epmd_binary(), "-port", str(self.port), "-address", "127.0.0.1"]

    def _server_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ERL_")}
        env["ERL_EPMD_PORT"] = str(self.port)
        return env

    def start(self) -> None:
        """Launch epmd and wait (up to 10 s) until it accepts TCP; ``BrokerError`` if not."""
        super().start()
        self.wait_ready(10.0)

    def wait_ready(self, timeout: float = 10.0) -> float:
        """Wait until epmd accepts TCP on ``port``; return seconds waited. ``BrokerError`` if
        it exits, ``BrokerTimeout`` after ``timeout`` seconds."""
        started = time.monotonic()
        while True:
            if not self.running():
                raise BrokerError(f"{self.name} exited\n{self._tail()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1.0).close()
                return time.monotonic() - started
            except OSError:
                if time.monotonic() - started > timeout:
                    raise BrokerTimeout(
                        f"{self.name}: epmd did not listen on {self.port}\n{self._tail()}"
                    ) from None
                time.sleep(0.01)


class RabbitMQCluster:
    """``nodes`` RabbitMQ 3.10 nodes (STOMP plugin) clustered on 127.0.0.1, one private epmd.

    Args:
        name: prefix of the node names (``NAME1`` ... ``NAMEn``, node ``NAMEi@localhost``) and
            of their files under ``workdir`` (``workdir/NAMEi/``, log ``workdir/NAMEi.log``;
            the epmd's ``workdir/NAME-epmd.log``). Letters, digits, ``_`` and ``-``.
        workdir: the directory for all of it (created).
        nodes: how many nodes, at least 1.

    ``nodes`` holds the ``RabbitMQ`` node objects (``stomp_port``, ``pid`` of beam.smp,
    ``kill()``, ``start()``, ``wait_ready()``, ``rabbitmqctl()``...), index 0 being the node
    the others joined. Use as a context manager (``start()`` / ``stop()``). Not thread-safe.
    Start of 3 nodes to a formed cluster: 14-29 s on 2 shared cores (measured).
    """

    def __init__(self, name: str, workdir: Path, nodes: int = 3) -> None:
        if nodes < 1:
            raise ValueError(f"a cluster needs at least one node, not {nodes}")
        self.name = name
        self.workdir = Path(workdir).absolute()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.epmd = PrivateEpmd(f"{name}-epmd", self.workdir)
        cookie = secrets.token_hex(16).upper()
        self.nodes: list[RabbitMQ] = [
            RabbitMQ(
                f"{name}{i + 1}",
                self.workdir,
                epmd_port=self.epmd.port,
                shared_epmd=True,
                cookie=cookie,
            )
            for i in range(nodes)
        ]

    def __repr__(self) -> str:
        ports = ",".join(str(n.stomp_port) for n in self.nodes)
        return f"<RabbitMQCluster {self.name} stomp ports {ports} epmd {self.epmd.port}>"

    # -- lifecycle ----------------------------------------------------------------------

    def start(self, timeout: float = 300.0) -> float:
        """Start the epmd and every node, join nodes 2..n to node 1, and return once the
        cluster lists every node as running; return the seconds it took.

        ``timeout`` (seconds) bounds the whole start. Raises ``BrokerError`` (with the log
        tail of the node concerned) or ``BrokerTimeout``; whatever was started is stopped
        again before it raises.
        """
        started = time.monotonic()
        deadline = started + timeout
        try:
            self.epmd.start()
            for node in self.nodes:  # all boot at once; joining needs each one up
                node.start()
            for node in self.nodes:
                node.wait_ready(max(1.0, deadline - time.monotonic()))
            first = self.nodes[0]
            for node in self.nodes[1:]:
                left = max(10.0, deadline - time.monotonic())
                node.rabbitmqctl("stop_app", timeout=left)
                node.rabbitmqctl("reset", timeout=left)
                node.rabbitmqctl("join_cluster", first.node, timeout=left)
                node.rabbitmqctl("start_app", timeout=left)
                node.wait_ready(max(1.0, deadline - time.monotonic()))
            self.wait_running(range(len(self.nodes)), max(1.0, deadline - time.monotonic()))
        except BaseException:
            self.stop()
            raise
        return time.monotonic() - started

    def stop(self, timeout: float = 30.0) -> None:
        """Stop every node (orderly: SIGTERM, then SIGKILL after ``timeout`` seconds), then the
        epmd; then wait up to 10 s until no process of the cluster is left
        (``cluster_leftovers``). Raises ``BrokerError`` naming the PIDs if some are.
        Idempotent."""
        for node in reversed(self.nodes):
            with contextlib.suppress(Exception):
                node.stop(timeout)
        self.epmd.stop(timeout)
        deadline = time.monotonic() + 10.0
        left = cluster_leftovers(self.epmd.port)
        while left and time.monotonic() < deadline:
            time.sleep(0.05)
            left = cluster_leftovers(self.epmd.port)
        if left or _listening(self.epmd.port):
            raise BrokerError(
                f"{self.name}: processes left after stop() (ERL_EPMD_PORT={self.epmd.port}): "
                f"{left}, epmd port listening: {_listening(self.epmd.port)}"
            )

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- faults -------------------------------------------------------------------------

    def kill_node(self, i: int) -> None:
        """Crash node ``i`` (0-based): SIGKILL of its beam.smp, reaped. The others go on."""
        self.nodes[i].kill()

    def restart_node(self, i: int, timeout: float = 180.0) -> float:
        """Start node ``i`` again (same ports and data: it rejoins the cluster) and wait
        until it answers STOMP and another node lists it as running; return seconds taken.

        Raises ``BrokerError``/``BrokerTimeout`` after ``timeout`` seconds.
        """
        started = time.monotonic()
        node = self.nodes[i]
        node.start()
        node.wait_ready(timeout)
        self.wait_running([i], max(1.0, timeout - (time.monotonic() - started)))
        return time.monotonic() - started

    def rolling_restart(self, timeout: float = 600.0, pause: float = 0.0) -> list[float]:
        """Stop (orderly) and restart each node in turn, 1 to n, as an upgrade would; return
        the seconds each node was down (stop to STOMP-ready and listed as running).

        Before stopping a node, waits until ``rabbitmq-queues check_if_node_is_quorum_critical``
        passes on it (no quorum queue would lose its majority: RabbitMQ's upgrade guide);
        ``pause`` seconds are waited after each node is back. ``timeout`` (seconds) bounds the
        whole; ``BrokerError``/``BrokerTimeout`` otherwise.
        """
        deadline = time.monotonic() + timeout
        downtimes = []
        for i, node in enumerate(self.nodes):
            self._wait_not_quorum_critical(i, deadline)
            down = time.monotonic()
            node.stop()
            self.restart_node(i, max(1.0, deadline - time.monotonic()))
            downtimes.append(time.monotonic() - down)
            time.sleep(pause)
        return downtimes

    # -- queries ------------------------------------------------------------------------

    def running_nodes(self) -> list[int]:
        """Indexes of the nodes whose process runs (not necessarily clustered yet)."""
        return [i for i, node in enumerate(self.nodes) if node.running()]

    def _cli(self, tool: str, args: tuple[str, ...], timeout: float) -> str:
        """Run ``tool -n NODE ARGS`` through the first running node; its stdout."""
        running = self.running_nodes()
        if not running:
            raise BrokerError(f"{self.name}: no node runs")
        return self.nodes[running[0]].cli(tool, *args, timeout=timeout)

    def cluster_status(self, timeout: float = 60.0) -> dict[str, object]:
        """``rabbitmqctl cluster_status --formatter json`` through a running node, parsed
        (keys ``disk_nodes``, ``running_nodes``, ``partitions``...)."""
        result: dict[str, object] = json.loads(
            self._cli("rabbitmqctl", ("cluster_status", "--formatter", "json"), timeout)
        )
        return result

    def wait_running(self, indexes: Iterable[int], timeout: float = 120.0) -> None:
        """Wait until ``cluster_status`` lists the nodes of ``indexes``
        as running; ``BrokerTimeout`` after ``timeout`` seconds."""
        wanted = {self.nodes[i].node for i in indexes}
        deadline = time.monotonic() + timeout
        last: object = None
        while True:
            try:
                running = self.cluster_status(timeout=max(5.0, deadline - time.monotonic()))
                last = running.get("running_nodes")
                if isinstance(last, list) and wanted <= set(last):
                    return
            except (BrokerError, subprocess.TimeoutExpired, ValueError) as exc:
                last = exc
            if time.monotonic() > deadline:
                raise BrokerTimeout(f"{self.name}: {sorted(wanted)} not running (last: {last})")
            time.sleep(0.5)

    def _wait_not_quorum_critical(self, i: int, deadline: float) -> None:
        node = self.nodes[i]
        while True:
            try:
                node.cli("rabbitmq-queues", "check_if_node_is_quorum_critical", timeout=60.0)
                return
            except (BrokerError, subprocess.TimeoutExpired) as exc:
                last = str(exc)
            if time.monotonic() > deadline:
                raise BrokerTimeout(f"{node.node} stays quorum critical: {last}")
            time.sleep(1.0)

    def list_queues(self, *items: str, timeout: float = 60.0) -> list[dict[str, object]]:
        """``rabbitmqctl list_queues ITEMS --formatter json`` through a running node: one dict
        per queue of the default vhost (keys: the info items, e.g. ``name``, ``type``,
        ``leader``, ``members``, ``pid``)."""
        out = self._cli(
            "rabbitmqctl", ("list_queues", "-q", "--formatter", "json", *items), timeout
        )
        rows: list[dict[str, object]] = json.loads(out) if out.strip() else []
        return rows

    def _index_of(self, erlang_node: str) -> int | None:
        for i, node in enumerate(self.nodes):
            if node.node == erlang_node:
                return i
        return None

    def queue_leader(self, queue: str) -> int | None:
        """Index of the node that leads quorum queue ``queue`` (its AMQP name: ``/queue/x``
        is ``x``), from ``rabbitmqctl list_queues name leader``; ``None`` if the queue does
        not exist or has no leader now."""
        for row in self.list_queues("name", "type", "leader"):
            if row.get("name") == queue:
                leader = row.get("leader")
                return self._index_of(leader) if isinstance(leader, str) else None
        return None

    def queue_members(self, queue: str) -> list[int]:
        """Indexes of the nodes with a replica of quorum queue or stream ``queue`` (its AMQP
        name), from ``rabbitmqctl list_queues name members``; empty if it does not exist."""
        for row in self.list_queues("name", "members"):
            if row.get("name") == queue:
                members = row.get("members")
                names = members if isinstance(members, list) else []
                found = (self._index_of(str(m)) for m in names)
                return sorted(i for i in found if i is not None)
        return []

    def queue_home(self, queue: str) -> int | None:
        """Index of the node a classic queue ``queue`` lives on (its home node), found by
        ``rabbitmqctl list_queues --local name`` on each running node (``--local``: the queues
        whose process runs on that node; the JSON formatter shows a queue's ``pid`` without its
        node's name); ``None`` if no running node hosts it (its home node is down, or it does
        not exist)."""
        for i in self.running_nodes():
            node = self.nodes[i]
            try:
                out = node.rabbitmqctl(
                    "list_queues", "--local", "-q", "--formatter", "json", "name"
                )
            except BrokerError:
                continue
            rows = json.loads(out) if out.strip() else []
            if any(row.get("name") == queue for row in rows):
                return i
        return None

    def declare_queue(
        self, i: int, queue: str, headers: dict[str, str], timeout: float = 30.0
    ) -> None:
        """Declare ``/queue/QUEUE`` the STOMP way through a stomp.py connection straight to
        node ``i``: a SUBSCRIBE carrying ``headers`` (e.g. :data:`QUORUM`; its ``ack`` mode
        from ``headers["ack"]``, ``auto`` without), then UNSUBSCRIBE;
        the queue stays (declare it with ``auto-delete:false``). With RabbitMQ's default
        ``client-local`` locator, a quorum queue's leader (a classic queue's home) is then
        node ``i`` (RabbitMQ STOMP plugin guide, "Queue Arguments"). Raises ``BrokerError``
        when the node does not confirm both frames within ``timeout`` seconds."""
        import stomp  # noqa: PLC0415 (a harness dependency; the broker classes need none)

        node = self.nodes[i]
        receipts: dict[str, threading.Event] = {"d": threading.Event(), "u": threading.Event()}
        errors: list[str] = []

        class Listener(stomp.ConnectionListener):  # type: ignore[misc]
            def on_receipt(self, frame: Any) -> None:
                event = receipts.get(frame.headers.get("receipt-id", ""))
                if event is not None:
                    event.set()

            def on_error(self, frame: Any) -> None:
                errors.append(str(frame.headers.get("message", frame.body)))

        conn = stomp.Connection([(node.host, node.stomp_port)], vhost="/", heartbeats=(0, 0))
        conn.set_listener("declare", Listener())
        try:
            conn.connect(wait=True)
            for command, receipt in (("subscribe", "d"), ("unsubscribe", "u")):
                if command == "subscribe":
                    conn.subscribe(
                        f"/queue/{queue}",
                        id="d",
                        ack=headers.get("ack", "auto"),
                        headers={
                            **{k: v for k, v in headers.items() if k != "ack"},
                            "receipt": receipt,
                        },
                    )
                else:
                    conn.unsubscribe(id="d", headers={"receipt": receipt})
                if not receipts[receipt].wait(timeout) or errors:
                    raise BrokerError(
                        f"{node.node}: /queue/{queue} not declared: {errors or 'no receipt'}"
                    )
        finally:
            with contextlib.suppress(Exception):
                conn.disconnect()

    def failover_url(self, first: int = 0, **options: object) -> str:
        """The sidecar's ``brokers`` URL for the cluster, node ``first`` first and the others
        in order after it: ``failover:(stomp://127.0.0.1:P1,...)?nested.host=/&randomize=
        false&OPTION=VALUE...`` (config/_url.py syntax; ``nested.host=/`` is the vhost every
        node needs as CONNECT ``host``)."""
        n = len(self.nodes)
        order = [self.nodes[(first + k) % n] for k in range(n)]
        entries = ",".join(f"stomp://{node.host}:{node.stomp_port}" for node in order)
        query = ["nested.host=/", "randomize=false"]
        query += [f"{key}={_url_value(value)}" for key, value in options.items()]
        return f"failover:({entries})?" + "&".join(query)


def _url_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
