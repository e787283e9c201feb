"""The drill's options (:class:`DrillOptions`: what ``mq-sidecar drill``'s flags set, with the
defaults they leave, checked by :meth:`DrillOptions.validate`) and the settings the drill
gives its sidecars and Spark (:data:`SIDECAR_OPTIONS`, :data:`ROWS_PER_PARTITION`, the
masters). Durations are seconds unless the name says otherwise; sidecar options are in the
configuration's own units (milliseconds, bytes)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from pipeline.faults import FaultKind

__all__ = [
    "ALL_DOWN",
    "BROKER_KINDS",
    "CLUSTER",
    "CONSUMERS",
    "DOWN_FOR",
    "KILL_DRIVER_AT",
    "KILL_SIDECAR_ID_CACHE",
    "MASTER",
    "MASTER_WITH_RETRIES",
    "RABBITMQ_CLUSTER",
    "ROLLING_RESTART_AT",
    "ROWS_PER_PARTITION",
    "SIDECAR_OPTIONS",
    "SPARK_STREAM",
    "SPARK_UNACKED_FACTOR",
    "STREAM_BATCH",
    "STREAM_PARTITIONS",
    "DrillOptions",
    "DrillUsageError",
]

#: Sidecar options of the drill (names of config/examples/mq-sidecar.toml). Fast retries as
#: in the failover tests; a generous ``call_timeout``, because on a loaded 2-core machine a
#: takeover plus the backup's store recovery must not turn into an ERROR for the writer;
#: unlimited ``initial_connect_attempts``, because a Spark task that starts its session
#: during the outage must wait for the backup, not fail (``reconnect_period`` bounds it).
SIDECAR_OPTIONS: dict[str, object] = {
    "initial_connect_attempts": -1,
    "retry_interval": 50,
    "max_retry_interval": 500,
    "connect_timeout": 5000,
    "call_timeout": 120_000,
    "reconnect_period": 300_000,
    "failover_mode": "transparent",
    "log_level": "info",
}
#: Rows per Spark partition at most (by default). A task that fails and is retried publishes its
#: partition again; the consumer's sidecar recognises the second copies only within its window of
#: the last 20,000 ids of the subscription (docs/behaviour.md, "Duplicate detection"). With 2 cores
#: publishing at once, 10,000-row partitions keep a retried partition's copies inside that window.
ROWS_PER_PARTITION = 10_000
#: The consumer sidecar's ``id_cache_size`` with ``--kill-sidecar``: a Spark task that failed
#: with the producer's sidecar is retried from its partition's first row, so the copies of a
#: partition's first rows come after the rest of it and what the other tasks published
#: meanwhile. The default 20,000 ids let 7,289 copies through on all rows (2 of 34 partitions
#: retried); ten partitions' worth (about 27 MB at most) leaves room for any retry.
KILL_SIDECAR_ID_CACHE = 10 * ROWS_PER_PARTITION


class DrillUsageError(ValueError):
    """Inconsistent options (exit status 2)."""


#: ``--broker``: the drill's own brokers, an ActiveMQ primary and backup on one shared store
#: (``activemq``) or a 3-node RabbitMQ cluster (:data:`RABBITMQ_CLUSTER`).
RABBITMQ_CLUSTER = "rabbitmq-cluster"
BROKER_KINDS = ("activemq", RABBITMQ_CLUSTER)
#: ``--broker rabbitmq-cluster``: share of the rows published at which the rolling restart of
#: the three nodes begins (after the kill(s) of the connected node, at 40 % by default). It
#: lasts longer than the rest of the publish (about 20-40 s a node), so it goes on through the
#: drain, and the drain waits for its end with the reader still subscribed.
ROLLING_RESTART_AT = 0.8

#: ``--faults all-down``: every broker killed for ``--down-for`` seconds.
ALL_DOWN = "all-down"
#: Seconds every broker stays down with ``--faults all-down`` unless ``--down-for`` says.
DOWN_FOR = 30.0
#: Spark master without (``local[2]``) and with task retries (``local[2,4]``: a task may fail
#: 3 times and run a 4th): the sidecar or every broker killed fails the writer's tasks.
MASTER, MASTER_WITH_RETRIES = "local[2]", "local[2,4]"
#: ``--master cluster``: a Spark standalone cluster of the drill's own
#: (``testbed.spark_cluster.SparkCluster``, 2 workers of 1 core), its executors processes of
#: their own.
CLUSTER = "cluster"
#: ``--consumer spark-stream`` (issue 33 part 3): the drill's destination is a RabbitMQ stream
#: (``x-queue-type:stream``, replicas on the 3 nodes of ``--broker rabbitmq-cluster``), read by
#: a Structured Streaming query with the stream source (``stream=true``): offset ranges read by
#: tasks on the executors (:mod:`pipeline.drill.stream_read`).
SPARK_STREAM = "spark-stream"
#: The consuming apps of ``--consumer``: stomp.py (``pipeline.verify.Reader``), a Structured
#: Streaming query of the queue (``pipeline.drill.streaming``) or of the stream
#: (:data:`SPARK_STREAM`).
CONSUMERS = ("stomp", "spark", SPARK_STREAM)
#: ``--consumer spark-stream``: the query's ``maxRecordsPerTrigger`` (``--read-batch`` when
#: given): offsets per micro-batch at most. The query keeps up with the publish, so most
#: batches hold what arrived since the last one (a few thousand); after the driver's restart
#: the batches catch up in steps of this size.
STREAM_BATCH = 20_000
#: ``--consumer spark-stream``: the query's ``minPartitions``: each batch's range is split in
#: at least two tasks, one for each executor of ``--master cluster``.
STREAM_PARTITIONS = 2
#: ``--consumer spark``: the streaming reader's ``max_messages_per_batch`` (``--read-batch``).
#: Every batch's ACKs go out at once when Spark commits it; with batches of 5,000 the consumer
#: sidecar held 9,564-16,522 unconfirmed ACKs when the broker was killed, and twice in three
#: runs on all rows the query got no message after the failover (docs/results.md). Batches of
#: 1,000 (2,744 ACKs in flight at the kill) went through it. The cause was the sidecar's (its
#: relay waited for the write of its ACKs of the hidden redeliveries while ActiveMQ read
#: nothing: fixed in proxy/session/acks.py); one drill with 5,000 passed since (10,000 ACKs in
#: flight at the kill, 15,000 redeliveries hidden: docs/results.md). 1,000 stays for now.
READ_BATCH = 1000
#: ``--consumer spark``: the streaming reader's ``prefetch`` in batches (``--read-batch``). The
#: reader's own default is 2 (10,000 for batches of 5,000), which deadlocked the query after the
#: driver kill on all rows: killed after Spark logged batch N's offsets and before it committed
#: batch N-1 to the source, the restarted driver holds the redeliveries of both batches
#: unacknowledged (logged, not committed by the source) until Spark commits N-1 to the source,
#: which it does only when it builds batch N+1, for which no message can come: the window is
#: full (measured: docs/results.md). A third batch of room lets batch N+1 come. (The reader
#: settles what Spark committed in ``latestOffset`` since the data source's 360a6a6.)
READ_PREFETCH_BATCHES = 3
#: ``--consumer spark``: the consumer sidecar's ``max_unacked`` is this many times the streaming
#: reader's prefetch. The reader holds up to its prefetch window unacknowledged (a logged batch
#: is ACKed only once Spark commits it), and after a failover the sidecar also holds the ACKs
#: the app sent during the outage until the broker redelivers their messages: the default
#: (10,000) must not make the sidecar stop reading the broker for the redeliveries. (It was not
#: the cause of the stalls after a failover with batches of 5,000: see :data:`READ_BATCH`.)
SPARK_UNACKED_FACTOR = 4
#: Share of the rows in the sink at which ``--consumer spark`` kills the query's driver.
KILL_DRIVER_AT = 0.5
#: A local master without task retries: ``local``, ``local[N]``, ``local[*]``.
_LOCAL_NO_RETRIES = re.compile(r"^local(\[(\d+|\*)\])?$")


@dataclass(frozen=True)
class DrillOptions:
    """Options of ``mq-sidecar drill`` (see the command's ``--help``).

    ``faults``: kills of the serving broker to make (None: 1 with the drill's own brokers,
    0 with ``brokers`` or with ``kill_sidecar``), or :data:`ALL_DOWN`: every broker killed
    for ``down_for`` seconds (None: :data:`DOWN_FOR`), then restarted; ``kill_sidecar``: kill
    -9 of the producer's sidecar instead, restarted at once (needs ``outbox``); ``kill_at``:
    share of the rows published at each kill (default 0.4 for one fault, evenly spaced for
    several); ``kill_pids``: with ``brokers``, the PID to SIGKILL at each fault, in order;
    ``outbox``: the producer's sidecar runs with ``outbox = true``, its ``outbox_dir`` in the
    work directory; ``master``: Spark's (None: :data:`MASTER`, or :data:`MASTER_WITH_RETRIES`
    for every broker down or the sidecar killed); ``baseline``: run the publish and drain once
    straight to the broker first (:mod:`pipeline.drill`); ``consumer``: the consuming app,
    ``stomp`` (stomp.py) or ``spark`` (a streaming query whose driver is killed at
    ``kill_driver_at`` of the rows, :meth:`driver_kill_share`; ``read_batch`` its
    ``max_messages_per_batch``); ``master`` may be :data:`CLUSTER`; ``broker``: the drill's
    own brokers (:data:`BROKER_KINDS`; with :data:`RABBITMQ_CLUSTER` the ``faults`` are kills
    of the node the sessions are connected to, followed by a rolling restart at
    :data:`ROLLING_RESTART_AT` of the rows). Durations in seconds.
    """

    rows: int | None = None
    faults: int | str | None = None
    kill_at: tuple[float, ...] = ()
    brokers: str | None = None
    kill_pids: tuple[int, ...] = ()
    report: Path = Path("drill-report.json")
    png: Path = Path("drill-timeline.png")
    workdir: Path | None = None
    keep: bool = False
    master: str | None = None
    destination: str | None = None
    receipt_every: int = 100
    max_in_flight: int = 10
    ack: str = "client-individual"
    drain_idle: float = 60.0
    settle: float = 2.0
    broker_heap_mb: int = 512
    broker_memory_mb: int = 256
    progress: bool = True
    partitions: int | None = None
    baseline: bool = False
    outbox: bool = False
    down_for: float | None = None
    kill_sidecar: bool = False
    consumer: str = "stomp"
    kill_driver_at: float | None = None
    read_batch: int | None = None
    broker: str = "activemq"

    @property
    def rabbitmq_cluster(self) -> bool:
        """``--broker rabbitmq-cluster``: the drill's own 3-node RabbitMQ cluster."""
        return self.broker == RABBITMQ_CLUSTER

    @property
    def cluster(self) -> bool:
        """``--master cluster`` (the default with ``--consumer spark-stream``): the drill
        starts its own Spark standalone cluster (:data:`CLUSTER`)."""
        return self.spark_master() == CLUSTER

    @property
    def streaming(self) -> bool:
        """``--consumer spark`` or ``spark-stream``: a streaming query whose driver is killed."""
        return self.consumer in ("spark", SPARK_STREAM)

    @property
    def stream(self) -> bool:
        """``--consumer spark-stream``: the destination is a RabbitMQ stream
        (:data:`SPARK_STREAM`)."""
        return self.consumer == SPARK_STREAM

    def batch_rows(self) -> int:
        """Rows per micro-batch at most: ``read_batch``, else :data:`READ_BATCH` (the queue
        reader's ``max_messages_per_batch``) or :data:`STREAM_BATCH` (the stream read's
        ``maxRecordsPerTrigger``)."""
        if self.read_batch is not None:
            return self.read_batch
        return STREAM_BATCH if self.stream else READ_BATCH

    def driver_kill_share(self) -> float | None:
        """With ``--consumer spark`` or ``spark-stream``: the share of the rows in the sink at
        which the streaming query's driver is killed (``kill_driver_at``, default
        :data:`KILL_DRIVER_AT`; 0 means never: None)."""
        if not self.streaming:
            return None
        share = KILL_DRIVER_AT if self.kill_driver_at is None else self.kill_driver_at
        return share or None

    @property
    def fault_kind(self) -> FaultKind:
        """``sidecar`` (``kill_sidecar``), ``all-down`` or ``broker`` (pipeline.faults)."""
        if self.kill_sidecar:
            return "sidecar"
        return "all-down" if self.faults == ALL_DOWN else "broker"

    def downtime(self) -> float:
        """Seconds every broker stays down with ``--faults all-down``."""
        return DOWN_FOR if self.down_for is None else self.down_for

    def spark_master(self) -> str:
        """The Spark master: ``master``, else with task retries for the faults that fail
        the writer's tasks (class docstring)."""
        if self.master is not None:
            return self.master
        if self.stream:
            return CLUSTER
        return MASTER if self.fault_kind == "broker" else MASTER_WITH_RETRIES

    def drain_idle_for_plan(self) -> float:
        """Seconds without a message after which the drain gives up: ``drain_idle``, plus
        the planned downtime with every broker down (the publish may end during it)."""
        if self.fault_kind == "all-down":
            return self.drain_idle + self.downtime()
        return self.drain_idle

    def partition_count(self, rows: int) -> int:
        """Spark partitions to publish ``rows`` rows from (see :data:`ROWS_PER_PARTITION`)."""
        if self.partitions is not None:
            return self.partitions
        return max(2, math.ceil(rows / ROWS_PER_PARTITION))

    def fault_count(self) -> int:
        """Faults to make (one for every broker down and for the sidecar killed)."""
        if self.fault_kind != "broker":
            return 1
        if isinstance(self.faults, int):
            return self.faults
        if self.kill_at:
            return len(self.kill_at)
        return 0 if self.brokers else 1

    def rolling_restart_at(self) -> float | None:
        """With ``--broker rabbitmq-cluster``: the share of the rows at which the rolling
        restart begins (:data:`ROLLING_RESTART_AT`); None with ``--consumer spark-stream``,
        whose faults are the kill of the node under a reader and the driver kill."""
        return None if self.stream else ROLLING_RESTART_AT

    def fractions(self) -> tuple[float, ...]:
        """Share of the rows published at each kill, ascending."""
        n = self.fault_count()
        if self.kill_at:
            return tuple(sorted(self.kill_at))
        if n == 1:
            return (0.4,)
        return tuple((i + 1) / (n + 1) for i in range(n))

    def sidecar_options(self, role: str, outbox_dir: Path) -> dict[str, object]:
        """The options of the ``producer``'s or the ``consumer``'s sidecar:
        :data:`SIDECAR_OPTIONS`, and for the producer with ``outbox`` ``outbox = true`` with
        ``outbox_dir``; for the consumer with ``kill_sidecar`` an ``id_cache_size`` of
        :data:`KILL_SIDECAR_ID_CACHE`, with ``--consumer spark`` a ``max_unacked`` of
        :data:`SPARK_UNACKED_FACTOR` times the reader's prefetch."""
        options = dict(SIDECAR_OPTIONS)
        if role == "producer" and self.outbox:
            options["outbox"] = True
            options["outbox_dir"] = str(outbox_dir)
        if role == "consumer" and self.kill_sidecar:
            options["id_cache_size"] = KILL_SIDECAR_ID_CACHE
        if role == "consumer" and self.consumer == "spark":
            options["max_unacked"] = SPARK_UNACKED_FACTOR * self.read_prefetch()
        return options

    def read_prefetch(self) -> int:
        """With ``--consumer spark``: the streaming reader's ``prefetch`` (the broker's window
        of unacknowledged deliveries): :data:`READ_PREFETCH_BATCHES` times ``read_batch``."""
        return READ_PREFETCH_BATCHES * self.batch_rows()

    def validate(self) -> None:
        """Raise :class:`DrillUsageError` naming every inconsistency."""
        problems = self._fault_problems()
        n = self.fault_count()
        if self.rows is not None and self.rows < 1:
            problems.append("--rows must be at least 1")
        if n < 0:
            problems.append("--faults must be 0 or more")
        if self.kill_at and len(self.kill_at) != n:
            problems.append(f"--kill-at gives {len(self.kill_at)} point(s) for {n} fault(s)")
        if any(not 0 < f < 1 for f in self.kill_at):
            problems.append("--kill-at values must be between 0 and 1 (shares of the rows)")
        if self.brokers is None and self.kill_pids:
            problems.append("--kill-pid only applies with --brokers (external brokers)")
        if self.brokers is not None and self.fault_kind == "broker" and n > len(self.kill_pids):
            problems.append(
                f"{n} fault(s) against external brokers need {n} --kill-pid (have "
                f"{len(self.kill_pids)}); the drill only restarts brokers it started itself"
            )
        if self.ack not in ("auto", "client-individual"):
            problems.append("--ack must be auto or client-individual")
        if self.receipt_every < 1 or self.max_in_flight < 1:
            problems.append("--receipt-every and --max-in-flight must be at least 1")
        if self.partitions is not None and self.partitions < 1:
            problems.append("--partitions must be at least 1")
        if self.consumer not in CONSUMERS:
            problems.append(f"--consumer must be one of {', '.join(CONSUMERS)}")
        if self.kill_driver_at is not None:
            if not self.streaming:
                problems.append(
                    f"--kill-driver-at only applies with --consumer spark or {SPARK_STREAM}"
                )
            if not 0 <= self.kill_driver_at < 1:
                problems.append("--kill-driver-at must be 0 (no kill) or a share below 1")
        if self.read_batch is not None and self.read_batch < 1:
            problems.append("--read-batch must be at least 1")
        problems.extend(self._cluster_problems())
        if self.stream and not self.rabbitmq_cluster:
            problems.append(
                f"--consumer {SPARK_STREAM} reads a RabbitMQ stream: it needs --broker "
                f"{RABBITMQ_CLUSTER}"
            )
        master = self.master
        if master is not None and not (
            master == CLUSTER or master.startswith(("local", "spark://"))
        ):
            problems.append(f"--master must be local[...], spark://HOST:PORT or {CLUSTER}")
        if self.baseline and self.brokers is not None:
            from pipeline.baseline import broker_address  # noqa: PLC0415

            try:
                broker_address(self.brokers)
            except ValueError as exc:
                problems.append(str(exc))
        if problems:
            raise DrillUsageError("; ".join(problems))

    def _cluster_problems(self) -> list[str]:
        """The inconsistencies of ``--broker``."""
        if self.broker not in BROKER_KINDS:
            return [f"--broker must be one of {', '.join(BROKER_KINDS)}"]
        if not self.rabbitmq_cluster:
            return []
        problems = []
        if self.brokers is not None:
            problems.append(f"--broker {RABBITMQ_CLUSTER} starts its own nodes: drop --brokers")
        if self.fault_kind != "broker":
            problems.append(
                f"--broker {RABBITMQ_CLUSTER} makes node kills and a rolling restart: drop "
                "--faults all-down and --kill-sidecar"
            )
        if self.baseline:
            problems.append(f"--baseline is not available with --broker {RABBITMQ_CLUSTER}")
        if not self.stream and any(f >= ROLLING_RESTART_AT for f in self.fractions()):
            problems.append(
                f"--kill-at values must be below {ROLLING_RESTART_AT} with --broker "
                f"{RABBITMQ_CLUSTER} (the rolling restart begins there)"
            )
        return problems

    def _fault_problems(self) -> list[str]:
        """The inconsistencies of ``--faults all-down``, ``--down-for``, ``--kill-sidecar``."""
        problems = []
        if isinstance(self.faults, str) and self.faults != ALL_DOWN:
            problems.append(f"--faults must be a number or {ALL_DOWN} (not {self.faults!r})")
        if self.faults == ALL_DOWN and self.brokers is not None:
            problems.append(
                f"--faults {ALL_DOWN} needs the drill's own brokers (it kills and restarts "
                "both), not --brokers"
            )
        if self.down_for is not None and self.fault_kind != "all-down":
            problems.append(f"--down-for only applies with --faults {ALL_DOWN}")
        reconnect_period = float(cast("int", SIDECAR_OPTIONS["reconnect_period"])) / 1000
        if self.down_for is not None and not 0 < self.down_for < reconnect_period:
            problems.append(
                f"--down-for must be more than 0 and less than the sidecars' reconnect_period "
                f"({reconnect_period:.0f} s), after which they give up on the brokers"
            )
        if self.kill_sidecar:
            if not self.outbox:
                problems.append(
                    "--kill-sidecar needs --outbox: without it the killed sidecar keeps "
                    "nothing a restart could forward, so the kill tests Spark's task retries, "
                    "not the sidecar"
                )
            if self.faults not in (None, 0):
                problems.append(
                    "--kill-sidecar is a fault mode of its own: drop --faults (or give 0)"
                )
            if self.kill_pids:
                problems.append("--kill-pid does not apply with --kill-sidecar")
            if self.master is not None and _LOCAL_NO_RETRIES.match(self.master):
                problems.append(
                    f"--kill-sidecar fails the writer's tasks and needs Spark task retries: "
                    f"--master {self.master} has none (use e.g. {MASTER_WITH_RETRIES})"
                )
        return problems
