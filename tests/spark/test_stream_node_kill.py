"""The stream read (``stream=true``) with a kill -9 of the RabbitMQ node under a reading task
(issue 33 part 2: "a streaming read with a kill -9 of the RabbitMQ node a task's sidecar is
connected to (cluster) ... every message exactly once in a Parquet sink, none missing").

The bed: the 3-node RabbitMQ cluster of tests/integration/test_rabbitmq_cluster.py (its
``cluster``/``all_up`` fixtures: every node runs before and after the test), a stream with a
replica on each node, declared on node 1 (its leader), and a sidecar process whose broker list
puts node 0 first, so that every session of the read starts on node 0. Spark is the local
session of tests/spark/conftest.py (``local[2,2]``), not the standalone cluster of
tests/pipeline/test_spark_cluster.py: what the kill cuts is the sidecar's connection to the
node, and a task reads through the sidecar on 127.0.0.1 the same way from a local Python
worker as from an executor's; the standalone cluster's five JVMs beside three RabbitMQ nodes
would only add load on 2 cores (the drill, ``--broker rabbitmq-cluster --consumer
spark-stream``, runs this on the standalone cluster).

How a task is caught mid-range: the sidecar's ``/status`` lists each subscription with the
stream offset it last delivered to the app; a task's subscription has the id
``mq-sidecar-spark-stream``. Once one has delivered part of its range, the task's Python worker
(the process that owns the app's end of that session's socket) is stopped with SIGSTOP, so
that it cannot finish the range while the node dies. Once the sidecar got nothing more for
:data:`QUIET` s (a stopped task sends no ACK, so the broker sends no more than the credit it
had), ``/status`` shows the subscription still short of the last offset of the range of the
micro-batch in flight (the checkpoint's ``offsets/``); otherwise the task is let go and another
one caught. Then the node its session is on is killed with SIGKILL, the session fails over
(``/status``: another node, ``failovers`` 1, the subscription live again: the sidecar resumes
it at ``offset=<last + 1>``, docs/behaviour.md, "Streams") and the worker is let go on with
SIGCONT. The read must go on: every message once in the sink, offsets
0..N-1 all there.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from mq_sidecar_spark._stream_io import TASK_SUBSCRIPTION
from mq_sidecar_spark.stream import STREAM_SCHEMA
from pipeline.cluster_faults import node_label
from testbed.rabbitmq_cluster import RabbitMQCluster
from testbed.sidecar import SidecarProcess
from tests.integration.support import wait_until
from tests.integration.test_rabbitmq_cluster import all_up, cluster, sidecar_for
from tests.pipeline.test_spark_cluster import read_at_least
from tests.spark.support import check_exactly_once, new_stream, publish, sink_rows

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

__all__ = ["all_up", "cluster"]  # the fixtures, shared by this module's test

pytestmark = pytest.mark.rabbitmq

#: Messages published, offsets per micro-batch (one task each), the task's ``prefetch-count``
#: (small, so that a stopped task holds most of its range back at the broker: it ACKs every
#: few messages, and the broker sends no more than that credit and the chunk it is in).
TOTAL, PER_BATCH, PREFETCH = 3000, 500, 5
#: Messages published per SEND group whose receipt is awaited before the next: RabbitMQ sends a
#: stream consumer whole chunks whatever its credit (docs/brokers.md, "Streams"), and groups
#: keep chunks small. Measured on one node: 3,000 published at once, a task stopped with
#: ``prefetch`` 50 was still sent 256 more messages (past its range's end); in groups of 10
#: with ``prefetch`` 5, none after it was stopped (3 s watched).
GROUP = 10
#: Seconds without a delivery after which a stopped task's subscription counts as settled.
QUIET = 1.0
#: Bound of each wait (a batch, the failover, the read to the end) on 2 loaded cores, seconds.
WAIT = 120.0


def socket_owners(local_port: int, remote_port: int) -> list[int]:
    """PIDs of PySpark's Python processes (``python -m pyspark.<module>``: its daemon and the
    workers it forks) holding the TCP socket ``127.0.0.1:local_port`` ->
    ``127.0.0.1:remote_port`` (proc(5): the socket's inode in ``/proc/net/tcp``, then the
    processes with an fd on it). Only those processes are looked through: the scan must be
    quick, a task's connection lasts a fraction of a second."""
    inodes: set[str] = set()
    for row in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        cols = row.split()
        local, remote = cols[1].rsplit(":", 1)[1], cols[2].rsplit(":", 1)[1]
        if int(local, 16) == local_port and int(remote, 16) == remote_port:
            inodes.add(f"socket:[{cols[9]}]")
    owners: list[int] = []
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            if b"-m\0pyspark." not in Path(f"/proc/{pid}/cmdline").read_bytes():
                continue
            fds = os.listdir(f"/proc/{pid}/fd")
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") in inodes for fd in fds):
                owners.append(pid)
        except OSError:  # gone, or not ours
            continue
    return owners


@dataclass(frozen=True)
class Held:
    """A reading task stopped mid-range: its Python worker ``pid``, its session in the sidecar
    (``session_id``, on ``broker``, ``host:port``), the stream offset the sidecar had delivered
    to it last when it was stopped (``offset``) and its range (``start``, ``end``: exclusive),
    that of the micro-batch in flight."""

    pid: int
    session_id: str
    broker: str
    offset: int
    start: int
    end: int


def reading_tasks(status: dict[str, Any]) -> list[tuple[dict[str, Any], int]]:
    """The sessions of ``/status`` with a task's subscription (id :data:`TASK_SUBSCRIPTION`,
    live, a stream offset delivered), each with that offset."""
    sessions = {s["session_id"]: s for s in status.get("sessions", [])}
    found = []
    for sub in status.get("subscriptions", []):
        session = sessions.get(sub.get("session_id"))
        if sub.get("id") != TASK_SUBSCRIPTION or sub.get("stream_offset") is None:
            continue
        if session is None or sub.get("state") != "live" or session.get("state") != "running":
            continue
        found.append((session, int(sub["stream_offset"])))
    return found


def batch_in_flight(checkpoint: Path) -> tuple[int, int] | None:
    """The offset range ``(start, end)`` of the micro-batch logged in the checkpoint's
    ``offsets/`` and not in ``commits/`` (each ``offsets/N`` ends with the source's end offset,
    ``{"stream": ..., "offset": N}``; the first batch starts at 0, ``earliest``), or None."""

    def logged(folder: str) -> set[int]:
        return {int(p.name) for p in (checkpoint / folder).glob("[0-9]*")}

    running = logged("offsets") - logged("commits")
    if len(running) != 1:
        return None
    batch = running.pop()

    def end_of(n: int) -> int:
        return int(
            json.loads((checkpoint / "offsets" / str(n)).read_text().splitlines()[-1])["offset"]
        )

    return (end_of(batch - 1) if batch > 0 else 0), end_of(batch)


def settled_offset(sidecar: SidecarProcess, session_id: str) -> int | None:
    """The stream offset the sidecar delivered last on session ``session_id``'s task
    subscription, once nothing more came for :data:`QUIET` s (its task stopped, the broker
    sends no more than the credit it had and the chunk it was in; at most :data:`WAIT` s);
    None when the session or its subscription is gone."""
    deadline = time.monotonic() + WAIT
    while True:
        subs = session_of(sidecar, session_id).get("subscriptions_list", [])
        tasks = [s for s in subs if s["id"] == TASK_SUBSCRIPTION and s["state"] == "live"]
        if not tasks or tasks[0]["stream_offset"] is None:
            return None
        age = tasks[0]["last_delivery_age_seconds"]
        if (age is not None and age >= QUIET) or time.monotonic() > deadline:
            return int(tasks[0]["stream_offset"])
        time.sleep(0.1)


def hold_reading_task(sidecar: SidecarProcess, query: StreamingQuery, checkpoint: Path) -> Held:
    """Stop (SIGSTOP) the Python worker of a task caught mid-range (module docstring) and
    return it: once its sidecar delivered what the broker still sent it, it had delivered an
    offset of the batch's range and not yet the range's last one. A task caught before or
    after that is let go (SIGCONT) and another one looked for. Fails after :data:`WAIT` s
    (with what it saw), or when the query failed."""
    deadline = time.monotonic() + WAIT
    seen: list[str] = []
    while time.monotonic() < deadline:
        if query.exception() is not None:
            pytest.fail(f"the query failed: {query.exception()}")
        for session, _ in reading_tasks(sidecar.status(timeout=5.0))[:1]:
            app_port = int(str(session["app_address"]).rsplit(":", 1)[1])
            owners = socket_owners(app_port, sidecar.port)
            if len(owners) != 1:  # the task ended meanwhile (its socket is gone)
                seen.append(f"{session['session_id']}: socket owners {owners}")
                continue
            pid = owners[0]
            os.kill(pid, signal.SIGSTOP)
            batch = batch_in_flight(checkpoint)
            offset = settled_offset(sidecar, session["session_id"])
            seen.append(f"{session['session_id']}: offset {offset} of range {batch}")
            if offset is not None and batch is not None and batch[0] <= offset < batch[1] - 1:
                return Held(pid, session["session_id"], session["broker"], offset, *batch)
            os.kill(pid, signal.SIGCONT)
        time.sleep(0.01)
    pytest.fail(f"no task was caught mid-range within {WAIT:.0f} s; seen: {seen[-10:]}")


def session_of(sidecar: SidecarProcess, session_id: str) -> dict[str, Any]:
    """The ``/status`` session ``session_id``, with its subscriptions (``subscriptions_list``);
    empty when it is gone."""
    status = sidecar.status(timeout=5.0)
    for session in status.get("sessions", []):
        if session["session_id"] == session_id:
            subs = [s for s in status.get("subscriptions", []) if s["session_id"] == session_id]
            return {**session, "subscriptions_list": subs}
    return {}


def failed_over(sidecar: SidecarProcess, held: Held) -> Callable[[], bool]:
    """For ``wait_until``: the held task's session runs on another node than ``held.broker``,
    after a failover, its subscription live again."""

    def done() -> bool:
        session = session_of(sidecar, held.session_id)
        subs = session.get("subscriptions_list", [])
        return (
            session.get("state") == "running"
            and session.get("broker") not in (None, held.broker)
            and int(session.get("failovers") or 0) >= 1
            and [s["state"] for s in subs] == ["live"]
        )

    return done


def node_at(rmq: RabbitMQCluster, label: str) -> int:
    """The index of the node whose STOMP listener is ``label`` (``host:port``)."""
    labels = [node_label(rmq, i) for i in range(len(rmq.nodes))]
    assert label in labels, f"{label} is no node of the cluster ({labels})"
    return labels.index(label)


@pytest.mark.long
def test_stream_read_with_the_node_under_a_task_killed_every_message_once(
    spark: SparkSession, all_up: RabbitMQCluster, tmp_path: Path
) -> None:
    """3,000 messages of a stream (replicas on the 3 nodes, led by node 1) read with
    ``stream=true`` in micro-batches of at most 500 offsets (one task each, ``prefetch`` 5)
    through a sidecar whose broker list puts node 0 first, into Parquet. A task is stopped
    mid-range (module docstring), the node its sidecar session is on is killed with SIGKILL,
    the session fails over to another node and resumes the subscription, the task goes on:
    each message is once in the sink, offsets 0-2,999 all there, and the node killed was the
    one under the task (node 0, the broker list's first)."""
    rmq = all_up
    first = 0
    stream = new_stream(rmq.nodes[1])
    name = stream.rpartition("/")[2]
    checkpoint, out = tmp_path / "checkpoint", tmp_path / "out"
    with sidecar_for(rmq, tmp_path / "sidecar", first=first) as sidecar:
        for group in range(0, TOTAL, GROUP):
            publish(sidecar.address, stream, range(group, min(group + GROUP, TOTAL)))
        members, leader = rmq.queue_members(name), rmq.queue_leader(name)
        query = (
            spark.readStream.format("stomp")
            .option("stream", "true")
            .option("port", str(sidecar.port))
            .option("destination", stream)
            .option("startingOffsets", "earliest")
            .option("maxRecordsPerTrigger", str(PER_BATCH))
            .option("prefetch", str(PREFETCH))
            .option("tail_wait", "10s")
            .option("timeout", f"{WAIT:.0f}s")
            .load()
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(checkpoint))
            .trigger(processingTime="200 milliseconds")
            .start()
        )
        started = time.monotonic()
        held: Held | None = None
        try:
            wait_until(read_at_least(query, PER_BATCH), timeout=WAIT)  # a batch done, then one held
            held = hold_reading_task(sidecar, query, checkpoint)
            killed = node_at(rmq, held.broker)
            killed_pid = rmq.nodes[killed].pid
            kill_at = time.monotonic()
            rmq.kill_node(killed)  # SIGKILL, then reaped
            wait_until(failed_over(sidecar, held), timeout=WAIT)
            moved = session_of(sidecar, held.session_id)
            failover_took = time.monotonic() - kill_at
            os.kill(held.pid, signal.SIGCONT)
            wait_until(read_at_least(query, TOTAL), timeout=WAIT)
            batches = [p for p in query.recentProgress if p.numInputRows > 0]
        finally:
            if held is not None:
                os.kill(held.pid, signal.SIGCONT)
            query.stop()
    assert held is not None
    rows = sink_rows(spark, out, STREAM_SCHEMA)
    resumed = moved["subscriptions_list"][0]
    print(
        f"\n[stream read, node kill] {TOTAL} messages (stream on nodes {members}, led by node "
        f"{leader}) in {len(batches)} batches; task (pid {held.pid}) stopped at offset "
        f"{held.offset} of its range {held.start}-{held.end - 1}, on node {killed} ({held.broker}, "
        f"beam pid {killed_pid}) killed; its session on {moved['broker']} "
        f"{failover_took:.1f} s later (failovers {moved['failovers']}, subscription "
        f"{resumed['state']} at offset {resumed['stream_offset']}, redeliveries hidden "
        f"{moved['redeliveries_hidden']}); {len(rows)} rows in the "
        f"sink, {time.monotonic() - started:.1f} s"
    )
    assert killed == first, "the task's session was on the broker list's first node"
    assert sorted(members) == [0, 1, 2]
    assert not rmq.nodes[killed].running()
    check_exactly_once(rows, range(TOTAL))
    assert sorted(int(r["offset"]) for r in rows) == list(range(TOTAL))
    assert all(p.numInputRows <= PER_BATCH for p in batches)
    ranges = [(_offset(p, "startOffset"), _offset(p, "endOffset")) for p in batches]
    assert (held.start, held.end) in ranges, "the held task's range was a batch's"
    assert held.start <= held.offset < held.end - 1, "the task was stopped mid-range"


def _offset(progress: Any, key: str) -> int:
    """The stream offset of a progress report's source ``key`` (``startOffset``/``endOffset``:
    JSON ``{"stream": ..., "offset": N}``; the first batch's ``startOffset`` is ``null``: 0,
    ``earliest`` of a new stream)."""
    value = json.loads(getattr(progress.sources[0], key) or "null")
    return 0 if value is None else int(value["offset"])
