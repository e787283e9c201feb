"""The drill's first phases: what it starts before it publishes. Its brokers (an ActiveMQ
primary and backup on one shared store, or the ``--brokers`` given), its two sidecars with an
event monitor on each, the Spark session, the rows loaded and cached, and the reading app.
Each function records what it started in ``ctx.state`` as soon as it runs, so that the
cleanup stops it whatever fails later; each raises :class:`DrillError` when what it starts
does not come up."""

from __future__ import annotations

import http.client
import os
import signal
import sys
import threading
from types import FrameType
from typing import TYPE_CHECKING, Any

from pipeline.drill.context import DrillContext
from pipeline.faults import BrokerPair, broker_label
from pipeline.monitor import EventMonitor
from pipeline.verify import Reader
from testbed import BrokerError, activemq_installed, rabbitmq_installed, start_activemq_pair
from testbed.sidecar import SidecarError, SidecarProcess

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "DrillError",
    "load_rows",
    "open_reader",
    "open_spark_consumer",
    "raise_interrupt",
    "spark_target",
    "start_brokers",
    "start_sidecars",
    "start_spark",
    "watch_restarted",
]


class DrillError(RuntimeError):
    """The drill could not set itself up: a broker, a sidecar, Spark or the reader (exit
    status 3)."""


def raise_interrupt(signum: int, frame: FrameType | None) -> None:
    """A signal handler that raises :class:`KeyboardInterrupt` (SIGTERM and, once Spark
    runs, SIGINT: the drill then stops everything it started)."""
    raise KeyboardInterrupt(f"signal {signum}")


def start_brokers(ctx: DrillContext) -> str:
    """Start the drill's ActiveMQ pair in ``workdir/brokers`` (the primary serves, the backup
    waits on the shared KahaDB lock; up to 120 s), or its RabbitMQ cluster
    (:func:`start_rabbitmq_cluster`), or take ``--brokers`` as they are.
    Returns the sidecars' ``brokers`` (a failover URL); sets ``ctx.state.pair``."""
    opts = ctx.options
    if opts.brokers is not None:
        ctx.say(f"using existing brokers {opts.brokers}")
        return opts.brokers
    if opts.rabbitmq_cluster:
        return start_rabbitmq_cluster(ctx)
    if not activemq_installed():
        raise DrillError("ActiveMQ is not installed (Debian package activemq): run setup.sh")
    try:
        primary, backup = start_activemq_pair(
            ctx.workdir / "brokers",
            name="amq",
            heap_mb=opts.broker_heap_mb,
            memory_mb=opts.broker_memory_mb,
            lock_sleep_ms=200,
            timeout=120.0,
        )
    except BrokerError as exc:
        raise DrillError(f"ActiveMQ pair did not start: {exc}") from exc
    ctx.state.brokers = [primary, backup]
    ctx.state.pair = BrokerPair(primary, backup)
    ctx.say(
        f"ActiveMQ {primary.name} pid {primary.pid} serves {broker_label(primary)}; "
        f"{backup.name} pid {backup.pid} waits on the shared KahaDB lock "
        f"({broker_label(backup)})"
    )
    return f"failover:({primary.stomp_url},{backup.stomp_url})"


def start_rabbitmq_cluster(ctx: DrillContext) -> str:
    """``--broker rabbitmq-cluster``: start 3 RabbitMQ nodes clustered in ``workdir/brokers``
    (one private epmd; 15-60 s, up to 300 s) and declare the drill's queue on node 1 as a
    quorum queue, so that node 1 leads it; the drill's destination is ``/amq/queue/NAME``
    (RabbitMQ's name for an existing queue: neither the writer nor the reader declares it
    again). With ``--consumer spark-stream`` the destination is a stream instead, declared on
    node 1 (:data:`pipeline.drill.stream_read.STREAM_HEADERS`), with a replica on each node.
    Returns the failover URL over the nodes, node 1 first; sets ``ctx.state.rabbitmq``."""
    from pipeline.drill.stream_read import STREAM_HEADERS  # noqa: PLC0415
    from testbed.rabbitmq_cluster import QUORUM, RabbitMQCluster  # noqa: PLC0415

    if not rabbitmq_installed():
        raise DrillError("RabbitMQ is not installed (Debian package rabbitmq-server): run setup.sh")
    cluster = RabbitMQCluster("drill", ctx.workdir / "brokers")
    try:
        took = cluster.start(timeout=300.0)
    except BrokerError as exc:
        raise DrillError(f"the RabbitMQ cluster did not start: {exc}") from exc
    ctx.state.rabbitmq = cluster
    kind = "stream" if ctx.options.stream else "quorum queue"
    try:
        cluster.declare_queue(0, ctx.queue, STREAM_HEADERS if ctx.options.stream else QUORUM)
        leader = cluster.queue_leader(ctx.queue)
        members = cluster.queue_members(ctx.queue) if ctx.options.stream else []
    except (BrokerError, OSError, ValueError) as exc:
        raise DrillError(f"the drill's {kind} was not declared: {exc}") from exc
    if ctx.options.stream and len(members) != len(cluster.nodes):
        raise DrillError(
            f"the drill's stream {ctx.queue} has replicas on {members}, not on every node"
        )
    ctx.stream_members = members
    nodes = ", ".join(
        f"{n.name} pid {n.pid} (STOMP {n.host}:{n.stomp_port})" for n in cluster.nodes
    )
    replicas = f", replicas on nodes {', '.join(str(m + 1) for m in members)}" if members else ""
    ctx.say(
        f"RabbitMQ cluster of 3 nodes in {took:.1f} s: {nodes}; {kind} {ctx.queue} "
        f"led by node {None if leader is None else leader + 1}{replicas}"
    )
    return cluster.failover_url(first=0)


def start_sidecars(ctx: DrillContext, brokers: str) -> tuple[SidecarProcess, SidecarProcess]:
    """Start the producer's and the consumer's sidecar in front of ``brokers`` (ready by
    ``/readyz`` within 60 s) and an event monitor on each one's admin port. Returns
    ``(producer, consumer)``."""
    producer, consumer = (
        SidecarProcess(
            f"sidecar-{role}",
            ctx.workdir,
            brokers=brokers,
            options=ctx.sidecar_options(role),
            # Ready = /readyz, which opens no session (the report counts sessions); if
            # the drill dies, its sidecars drain (SIGTERM) rather than vanish.
            readiness="readyz",
            parent_death=signal.SIGTERM,
        )
        for role in ("producer", "consumer")
    )
    ctx.state.sidecars = [producer, consumer]
    try:
        for sidecar in (producer, consumer):
            sidecar.start()
        for sidecar in (producer, consumer):
            sidecar.wait_ready(60.0)
    except (SidecarError, OSError) as exc:
        raise DrillError(f"mq-sidecar did not start: {exc}") from exc
    for sidecar, role in ((producer, "producer"), (consumer, "consumer")):
        monitor = EventMonitor(role, port=sidecar.admin_port)
        ctx.state.monitors.append(monitor)
        try:
            monitor.start()
        except (OSError, http.client.HTTPException) as exc:
            raise DrillError(f"event stream of the {role} sidecar: {exc}") from exc
    outbox = f", outbox in {ctx.outbox_dir}" if ctx.options.outbox else ""
    ctx.say(
        f"mq-sidecar for the producer pid {producer.pid} on 127.0.0.1:{producer.port} "
        f"(admin {producer.admin_port}{outbox}), for the consumer pid {consumer.pid} on "
        f"127.0.0.1:{consumer.port} (admin {consumer.admin_port})"
    )
    return producer, consumer


def watch_restarted(ctx: DrillContext, sidecar: SidecarProcess) -> None:
    """After the producer's sidecar was killed and restarted: watch its events anew (the
    old stream ended with the process). Raises ``OSError`` if its admin port does not
    answer."""
    monitor = EventMonitor("producer", port=sidecar.admin_port)
    ctx.state.monitors.append(monitor)
    monitor.start()


#: Per application on the drill's own cluster (``--master cluster``): two executors of one
#: core each, one on each worker, so that the publishing session and the streaming consumer's
#: driver (two applications at once) each get theirs (one application with every core would
#: leave the other waiting for executors).
CLUSTER_APP_CONF = {
    "spark.executor.cores": "1",
    "spark.executor.memory": "640m",
    "spark.cores.max": "2",
}


def spark_target(ctx: DrillContext) -> tuple[str, dict[str, str]]:
    """The Spark master URL and configuration of the drill's applications (the publishing
    session and the streaming consumer's driver): ``--master cluster`` starts the drill's own
    standalone cluster first (``testbed.spark_cluster.SparkCluster``, 2 workers of 2 cores and
    1536 MiB, in ``workdir/spark-cluster``; up to 120 s; recorded in ``ctx.state.cluster``),
    ``spark://...`` takes that cluster with this interpreter and ``PYTHONPATH`` on its
    executors, a local master is taken as it is. Computed once. Raises :class:`DrillError`
    when the cluster does not start."""
    if ctx.state.target is not None:
        return ctx.state.target
    master = ctx.options.spark_master()
    conf: dict[str, str] = {}
    if ctx.options.cluster:
        from testbed.spark_cluster import SparkCluster  # noqa: PLC0415

        cluster = SparkCluster(
            work_dir=ctx.workdir / "spark-cluster",
            workers=2,
            cores_per_worker=2,
            memory_per_worker="1536m",
        )
        ctx.state.cluster = cluster
        try:
            cluster.start(timeout=120.0)
        except Exception as exc:
            raise DrillError(f"the Spark standalone cluster did not start: {exc}") from exc
        master = cluster.master_url
        conf = {**cluster.spark_conf(), **CLUSTER_APP_CONF}
        ctx.say(
            f"Spark standalone cluster at {master}: master pid {cluster.master_pid()}, workers "
            f"{cluster.worker_pids()} (logs in {cluster.log_dir})"
        )
    elif master.startswith("spark://"):
        python = sys.executable
        conf = {
            "spark.pyspark.python": python,
            "spark.executorEnv.PYSPARK_PYTHON": python,
        }
        if os.environ.get("PYTHONPATH"):
            conf["spark.executorEnv.PYTHONPATH"] = os.environ["PYTHONPATH"]
    ctx.state.target = (master, conf)
    return master, conf


def start_spark(ctx: DrillContext) -> SparkSession:
    """Start the Spark session on the options' master (:func:`spark_target`; its JVM log in
    ``workdir/spark.log``; about 5 s, more with a cluster's executors) and register the
    ``stomp`` data source; from then on SIGINT raises KeyboardInterrupt."""
    from pipeline.publish import register  # noqa: PLC0415
    from pipeline.spark import start_spark as start_session  # noqa: PLC0415

    log = ctx.workdir / "spark.log"
    master, conf = spark_target(ctx)
    try:
        spark = start_session("mq-sidecar-drill", master=master, conf=conf, log_file=log)
        register(spark)
    except Exception as exc:
        raise DrillError(f"Spark did not start (log: {log}): {exc}") from exc
    ctx.state.spark = spark
    if threading.current_thread() is threading.main_thread():
        # PySpark's own SIGINT handler cancels the jobs through py4j from inside the
        # handler, which fails ("reentrant call") while the main thread waits on py4j;
        # the drill's cleanup stops Spark anyway.
        signal.signal(signal.SIGINT, raise_interrupt)
    ctx.say(f"Spark {spark.version} {master} started (JVM log: {log})")
    return spark


def load_rows(ctx: DrillContext, spark: SparkSession) -> tuple[DataFrame, int]:
    """Extract the flights CSV into ``workdir/data`` (the first ``--rows`` rows), load it,
    repartition it by row id (:meth:`DrillOptions.partition_count`) and cache it. Returns
    the DataFrame and its rows."""
    from pipeline.rows import (  # noqa: PLC0415
        FLIGHTS_ROWS,
        ROW_COLUMN,
        extract_flights,
        load_flights,
    )

    csv = extract_flights(ctx.workdir / "data", ctx.options.rows)
    wanted = min(ctx.options.rows or FLIGHTS_ROWS, FLIGHTS_ROWS)
    partitions = ctx.options.partition_count(wanted)
    df = load_flights(spark, csv).repartition(partitions, ROW_COLUMN)
    df = df.cache()
    rows = df.count()
    ctx.say(f"loaded {rows:,} rows of {csv.name} into {partitions} cached partitions")
    return df, rows


def open_reader(ctx: DrillContext, destination: str, host: str, port: int) -> Reader:
    """The consuming app, subscribed to ``destination`` at ``host:port`` with the options'
    ``ack`` mode."""
    reader = Reader(destination, host=host, port=port, ack=ctx.options.ack)
    ctx.state.readers.append(reader)
    try:
        reader.start()
    except Exception as exc:  # ReadError, stomp.py's ConnectFailedException
        raise DrillError(f"the reader could not subscribe: {exc}") from exc
    return reader


def open_spark_consumer(ctx: DrillContext, destination: str, port: int, rows: int) -> Any:
    """The streaming consumer (``--consumer spark``, :mod:`pipeline.drill.streaming`) of
    ``destination`` through the consumer's sidecar on ``port``, expecting ``rows`` rows, its
    files in ``workdir/consumer``; started (its query runs). Raises :class:`DrillError` if
    its query does not run."""
    from pipeline.drill.options import STREAM_PARTITIONS  # noqa: PLC0415
    from pipeline.drill.stream_read import StreamConsumer  # noqa: PLC0415
    from pipeline.drill.streaming import SparkConsumer, StreamError  # noqa: PLC0415

    master, conf = spark_target(ctx)
    settings: dict[str, Any] = {
        "host": "127.0.0.1",
        "port": port,
        "workdir": ctx.workdir / "consumer",
        "master": master,
        "conf": conf,
        "rows": rows,
        "kill_at": ctx.options.driver_kill_share(),
        "batch_rows": ctx.options.batch_rows(),
        "say": ctx.say,
    }
    consumer: SparkConsumer
    if ctx.options.stream:
        consumer = StreamConsumer(destination, partitions=STREAM_PARTITIONS, **settings)
    else:
        consumer = SparkConsumer(destination, prefetch=ctx.options.read_prefetch(), **settings)
    ctx.state.readers.append(consumer)
    try:
        consumer.start()
    except (StreamError, OSError) as exc:
        raise DrillError(f"the streaming consumer did not start: {exc}") from exc
    assert consumer.proc is not None
    what = "the stream (stream=true, tasks on the executors)" if ctx.options.stream else ""
    ctx.say(
        f"streaming consumer: driver pid {consumer.proc.pid} ({master}) reads {destination} "
        f"{what}{' ' if what else ''}into Parquet ({consumer.sink}); executors import "
        f"{', '.join(consumer.packages) or 'mq_sidecar_spark from the driver PYTHONPATH'}"
    )
    return consumer
