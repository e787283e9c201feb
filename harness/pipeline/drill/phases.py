"""One run of the drill as its phases (:class:`Drill`): start the brokers, start the sidecars,
start Spark and load the rows, (the baseline), publish with the planned faults, drain,
settle the faults, verify, report. :meth:`Drill.run` calls them in that order; each says
what it needs and what it produces. Times are seconds (``phases`` and the report's series:
since the publish started), counts are rows or messages."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from pipeline.cluster_faults import ROLLING_TIMEOUT, ClusterFaultInjector
from pipeline.drill.admin import (
    ReadingNode,
    connected_broker,
    metrics_of,
    outbox_emptied,
    session_totals,
    wait_failover_events,
)
from pipeline.drill.context import DrillContext
from pipeline.drill.direct import run_baseline
from pipeline.drill.options import SIDECAR_OPTIONS
from pipeline.drill.results import delivery_fields, timeline_of, write_files
from pipeline.drill.startup import (
    load_rows,
    open_reader,
    open_spark_consumer,
    start_brokers,
    start_sidecars,
    start_spark,
    watch_restarted,
)
from pipeline.drill.streaming import SparkConsumer
from pipeline.drill.transfer import Drained, Published, drain, publish, split_residual
from pipeline.faults import (
    RESTART_TIMEOUT,
    FaultInjector,
    Sampler,
    group_incidents,
    outbox_taken,
    sidecar_outbox,
    sidecar_sends,
)
from pipeline.publish import PublishSettings, SparkProgress
from pipeline.report.document import DrillReport
from pipeline.report.notes import fault_notes
from pipeline.report.outbox import outbox_errors, outbox_summary
from pipeline.report.overhead import BaselineReport, Overhead, overhead
from pipeline.report.timeline import throughput
from pipeline.verify import ConsumingApp, Reconciliation, expected, reconcile
from testbed.sidecar import SidecarProcess, metric_total

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["AtDrainEnd", "Drill", "Traffic"]


@dataclass
class Traffic:
    """What the drill's publish and drain go through: the two sidecars, the publish's
    ``settings`` and Spark's ``progress`` of its job (task attempts retried), the consuming
    app (``reader``: stomp.py, or the streaming consumer), the planned ``faults`` and the
    ``sampler`` that follows the SENDs and the reader every 0.2 s and makes the faults."""

    producer: SidecarProcess
    consumer: SidecarProcess
    settings: PublishSettings
    progress: SparkProgress
    reader: ConsumingApp
    faults: FaultInjector
    sampler: Sampler


@dataclass
class AtDrainEnd:
    """What the sidecars said at the end of the drain, while the reader's session was still
    open: ``hidden``, copies (``duplicates_hidden``) and redeliveries
    (``redeliveries_hidden``) the consumer's sidecar hid; ``outbox``, the producer's
    ``/status`` ``outbox`` object once empty (None without ``--outbox`` or no answer);
    ``unacked``: with ``--consumer spark``, messages of the query's last batch the residual
    check found (in the sink, not yet ACKed when the query stopped: the source ACKs a batch
    once Spark has committed it and asks for the next); ``unacked_earlier``: those it found
    that are in the sink from an earlier batch (their ACKs did not take effect: an error)."""

    hidden: dict[str, int]
    outbox: dict[str, Any] | None = None
    unacked: int = 0
    unacked_earlier: int = 0


class Drill(DrillContext):
    """One run of the drill (:mod:`pipeline.drill`): :meth:`run` returns the report; call
    :meth:`cleanup` afterwards in any case."""

    def run(self) -> DrillReport:
        """The phases in order; returns the report, also written to ``--report`` (JSON) and
        ``--png``. Raises :class:`~pipeline.drill.startup.DrillError` when a broker, a
        sidecar, Spark or the reader does not come up."""
        with self.phase("brokers"):
            brokers = start_brokers(self)
        with self.phase("sidecars"):
            producer, consumer = start_sidecars(self, brokers)
        with self.phase("spark startup"):
            spark = start_spark(self)
        with self.phase("load"):
            df, rows = load_rows(self, spark)
        settings = self.publish_settings(producer)
        base: BaselineReport | None = None
        source: dict[str, bytes] | None = None
        if self.options.baseline:
            base, source = run_baseline(self, spark, df, rows, settings)
        traffic = self.plan(spark, rows, producer, consumer, settings)
        published = self.publish(df, traffic)
        drained, at_end = self.drain(rows, traffic)
        notes, fault_errors = self.settle_faults(traffic.faults)
        with self.phase("verify"):
            result = self.verify(df, traffic, drained, source)
        report = self.report(
            brokers=brokers,
            partitions=df.rdd.getNumPartitions(),
            rows=rows,
            traffic=traffic,
            published=published,
            drained=drained,
            at_end=at_end,
            result=result,
            notes=notes,
            errors=published.errors + drained.errors + fault_errors,
            base=base,
        )
        assert report.timeline is not None
        write_files(self.options, report, report.timeline)
        return report

    def cleanup(self) -> None:
        """Stop everything the drill started, newest first; never raises."""
        self.state.stop_all()

    def publish_settings(self, producer: SidecarProcess) -> PublishSettings:
        """Needs the producer's sidecar; produces the publish's settings (its STOMP port, the
        drill's queue and job, a receipt every ``--receipt-every`` SENDs, at most
        ``--max-in-flight`` outstanding)."""
        return PublishSettings(
            destination=self.destination,
            job=self.job,
            port=producer.port,
            receipt_every=self.options.receipt_every,
            max_in_flight=self.options.max_in_flight,
        )

    def plan(
        self,
        spark: SparkSession,
        rows: int,
        producer: SidecarProcess,
        consumer: SidecarProcess,
        settings: PublishSettings,
    ) -> Traffic:
        """Needs the ``rows`` to publish, the sidecars and the publish's ``settings``; starts
        the consuming app through the consumer's sidecar (``--consumer``: the stomp.py reader
        subscribed, or the streaming query's driver running), plans the faults (at 40 % of
        the rows by default) and makes the sampler that will follow the SENDs (the producer
        sidecar's counter; with ``--outbox`` what its outbox took). Produces the
        :class:`Traffic`."""
        opts = self.options
        reader: ConsumingApp
        if opts.streaming:
            reader = open_spark_consumer(self, self.destination, consumer.port, rows)
        else:
            reader = open_reader(self, self.destination, "127.0.0.1", consumer.port)
        kind = opts.fault_kind
        faults: FaultInjector
        if self.state.rabbitmq is not None:
            # With the stream read, the node under a reader: the one a task reading its range
            # through the consumer's sidecar is connected to; else the producer's.
            reading = ReadingNode(consumer)
            faults = ClusterFaultInjector(
                opts.fractions() if opts.fault_count() else (),
                rows,
                cluster=self.state.rabbitmq,
                queue=self.queue,
                connected=reading if opts.stream else (lambda: connected_broker(producer)),
                say=self.say,
                rolling_at=opts.rolling_restart_at(),
                whose=reading.describe if opts.stream else "the connected node",
            )
        else:
            faults = FaultInjector(
                opts.fractions(),
                rows,
                pair=self.state.pair,
                pids=opts.kill_pids,
                say=self.say,
                kind=kind,
                down_for=opts.downtime(),
                sidecar=producer if kind == "sidecar" else None,
                restarted=lambda sidecar: watch_restarted(self, sidecar),
            )
        self.state.faults = faults
        self.say(
            f"publishing {rows:,} rows to {self.destination} ({_plan(opts.downtime(), faults)})"
        )
        sampler = Sampler(
            outbox_taken(producer) if opts.outbox else sidecar_sends(producer),
            reader,
            rows,
            faults,
            progress=opts.progress,
            outbox=sidecar_outbox(producer) if opts.outbox else None,
        )
        self.state.sampler = sampler
        progress = SparkProgress(spark, rows, self.job)
        return Traffic(producer, consumer, settings, progress, reader, faults, sampler)

    def publish(self, df: DataFrame, traffic: Traffic) -> Published:
        """Phase ``publish``: needs the cached rows ``df`` and the :class:`Traffic`; Spark
        writes every row with the data source through the producer's sidecar while the
        consuming app drains and the sampler makes the planned faults. Produces the
        :class:`Published` (``t0``, the seconds it took, rows sent and confirmed)."""
        return publish(
            self, df, traffic.progress.rows, traffic.settings, traffic.sampler, group=self.job
        )

    def drain(self, rows: int, traffic: Traffic) -> tuple[Drained, AtDrainEnd]:
        """Phase ``drain``: needs the ``rows`` expected and the :class:`Traffic`; waits until
        the reader has them all or nothing came for ``--drain-idle`` seconds (plus the
        downtime with every broker down), reads the consumer's hidden copies and, with
        ``--outbox``, waits (as long) until the producer's outbox is empty, then checks the
        queue with a fresh session. Produces the :class:`~pipeline.drill.transfer.Drained`
        and the :class:`AtDrainEnd`."""
        opts = self.options
        at_end = AtDrainEnd(hidden={"duplicates_hidden": 0, "redeliveries_hidden": 0})

        def before_close() -> None:  # while the reader's session is still there
            if self.state.rabbitmq is not None and opts.rolling_restart_at() is not None:
                # the rolling restart goes on in the drain
                self.say("drain: waiting for the rolling restart to end (reader subscribed)")
                done = traffic.faults.wait_done(ROLLING_TIMEOUT + RESTART_TIMEOUT, published=rows)
                if not done:
                    self.say("drain: the planned faults did not end in time")
            at_end.hidden.update(session_totals(traffic.consumer))
            if opts.outbox:  # the residual check must not race the last forwards
                at_end.outbox = outbox_emptied(traffic.producer, opts.drain_idle_for_plan())

        drained = drain(
            self,
            traffic.reader,
            rows,
            traffic.sampler,
            before_close=before_close,
            check_residual=not opts.stream,  # a stream keeps every message: nothing is left
        )
        if isinstance(traffic.reader, SparkConsumer):
            drained.residual, at_end.unacked, at_end.unacked_earlier = split_residual(
                drained.residual, traffic.reader.snapshot(), traffic.reader.last_batch_ids()
            )
        return drained, at_end

    def settle_faults(self, faults: FaultInjector) -> tuple[list[str], list[str]]:
        """Needs the fault injector after the drain; waits for its follow-ups (a restart, up
        to 120 s plus the downtime) and, after broker kills of the drill's own pair, up to
        60 s for the monitors' FAILOVER events. Produces ``(notes, errors)``: a note when
        fewer faults were made than planned, the injector's errors."""
        notes: list[str] = []
        if len(faults.faults) < len(faults.fractions):
            notes.append(
                f"{len(faults.fractions)} fault(s) planned, {len(faults.faults)} made: the "
                "publish ended before the next one was due"
            )
        faults.join(RESTART_TIMEOUT + self.options.downtime())
        errors = list(faults.errors)
        if faults.kind in ("broker", "node") and self.options.brokers is None:
            wait_failover_events(self.state.monitors, faults.faults)
        return notes, errors

    def verify(
        self,
        df: DataFrame,
        traffic: Traffic,
        drained: Drained,
        source: dict[str, bytes] | None,
    ) -> Reconciliation:
        """Needs the rows ``df``, the reader and the residual check; reconciles every
        message received with the source rows by id and content (``source``: the
        baseline's, else computed from ``df`` with a Spark job). Produces the
        :class:`~pipeline.verify.Reconciliation`."""
        if source is None:
            source = expected(df, self.job)
        received = traffic.reader.snapshot()
        received.merge(drained.residual)
        return reconcile(source, received)

    def report(
        self,
        *,
        brokers: str,
        partitions: int,
        rows: int,
        traffic: Traffic,
        published: Published,
        drained: Drained,
        at_end: AtDrainEnd,
        result: Reconciliation,
        notes: list[str],
        errors: list[str],
        base: BaselineReport | None,
    ) -> DrillReport:
        """Needs everything the phases produced; scrapes both sidecars' replay counters,
        groups the FAILOVER events by fault, builds the timeline and its throughput (msg/s),
        the outbox section and its errors, the fault notes and the overhead against the
        baseline. Produces the :class:`~pipeline.report.document.DrillReport` (not yet
        written)."""
        opts = self.options
        faults = traffic.faults
        metrics = [metrics_of(s) for s in (traffic.producer, traffic.consumer)]
        replayed = sum(int(metric_total(m, "mq_sidecar_replayed_frames_total")) for m in metrics)
        events = [e for m in self.state.monitors for e in m.events("FAILOVER")]
        incidents, _ = group_incidents(events, faults.faults)
        timeline = timeline_of(
            sampler=traffic.sampler,
            reader=traffic.reader,
            residual=drained.residual,
            faults=faults,
            incidents=incidents,
            t0=published.t0,
            publish_end=published.end,
            driver_kills=traffic.reader.kills if isinstance(traffic.reader, SparkConsumer) else (),
        )
        publish_rate, consume_rate = (
            throughput(timeline, "publish"),
            throughput(timeline, "consume"),
        )
        outbox = None
        if opts.outbox:
            outbox = outbox_summary(timeline, str(self.outbox_dir), at_end.outbox)
            errors.extend(outbox_errors(outbox, timeline, faults.records()))
        notes.extend(
            fault_notes(
                timeline,
                faults.records(),
                publish_rate,
                outbox=outbox,
                retried=traffic.progress.retried(),
                duplicates_hidden=at_end.hidden["duplicates_hidden"],
            )
        )
        overheads: dict[str, Overhead] = {}
        if base is not None:
            share = faults.faults[0].fraction if faults.faults else None
            mode = "outbox" if opts.outbox else "sidecar"
            overheads[mode] = overhead(mode, publish_rate, consume_rate, base, share)
            # Issue 18: a third pass on the same partitions (both modes in one run) puts
            # its report's rates in here the same way, under its own mode.
        consumer = self._consumer_section(traffic.reader, at_end, notes, errors)
        if opts.stream:
            consumer["copies_hidden_by_sidecar"] = int(
                metric_total(metrics[1], "mq_sidecar_duplicates_suppressed_total")
            )
            consumer["stream_replicas"] = [i + 1 for i in self.stream_members]
            notes.extend(_stream_notes(consumer))
        self.phases["total"] = time.monotonic() - self.started
        return DrillReport(
            **delivery_fields(rows, published.sent, result, drained.residual),
            faults=faults.records(),
            incidents=incidents,
            publish=publish_rate,
            consume=consume_rate,
            frames_replayed=replayed,
            duplicates_hidden=at_end.hidden["duplicates_hidden"],
            redeliveries_hidden=at_end.hidden["redeliveries_hidden"],
            phases=dict(self.phases),
            reconciliation=result.to_dict(),
            settings=self._settings(brokers, partitions, faults),
            errors=errors,
            notes=notes,
            timeline=timeline,
            baseline=base,
            overhead=overheads,
            outbox=outbox,
            consumer=consumer,
        )

    def _consumer_section(
        self, reader: ConsumingApp, at_end: AtDrainEnd, notes: list[str], errors: list[str]
    ) -> dict[str, Any]:
        """The report's ``consumer`` section; with ``--consumer spark`` also the streaming
        consumer's errors (into ``errors``) and a note on the last batch's messages the
        residual check found unacknowledged (into ``notes``)."""
        if not isinstance(reader, SparkConsumer):
            return {"kind": "stomp", "ack": self.options.ack}
        section = reader.summary()
        section["unacked_last_batch"] = at_end.unacked
        section["unacked_earlier_batches"] = at_end.unacked_earlier
        if at_end.unacked_earlier:
            errors.append(
                f"{at_end.unacked_earlier:,} message(s) already in the sink from an earlier "
                "batch were still on the queue after the query stopped: their ACKs did not "
                "take effect"
            )
        errors.extend(f"streaming consumer: {e}" for e in reader.errors)
        share = self.options.driver_kill_share()
        if share is not None and not reader.kills:
            errors.append(f"the streaming driver was not killed (planned at {share:.0%})")
        if at_end.unacked:
            notes.append(
                f"{at_end.unacked:,} message(s) of the query's last batch were still "
                "unacknowledged when it stopped (the source ACKs a batch once Spark has "
                "committed it and asks for the next one); each is in the sink once, and the "
                "residual check took it"
            )
        return section

    def _settings(self, brokers: str, partitions: int, faults: FaultInjector) -> dict[str, object]:
        """The report's ``settings``: the job, its queue and brokers, Spark's master and
        partitions, the fault plan, the writer's and the reader's settings, the sidecars'
        options and the drill's own."""
        opts = self.options
        return {
            "job": self.job,
            "destination": self.destination,
            "brokers": brokers,
            "master": opts.spark_master(),
            "partitions": partitions,
            "fault_kind": faults.kind,
            "broker": opts.broker,
            "kill_at": list(faults.fractions),
            "down_for": opts.downtime() if faults.kind == "all-down" else None,
            "writer": {
                "receipt_every": opts.receipt_every,
                "max_in_flight": opts.max_in_flight,
            },
            "reader_ack": opts.ack,
            "consumer": opts.consumer,
            "publish": "df.write.format('stomp') (mq_sidecar_spark), id_columns=row, "
            "id_prefix=<job>",
            "publish_series": (
                "the producer sidecar's outbox: frames held + forwarded"
                if opts.outbox
                else "the producer sidecar's relayed SENDs (/metrics)"
            ),
            "sidecar": SIDECAR_OPTIONS,
            "producer_sidecar": self.sidecar_options("producer"),
            "options": {k: str(v) for k, v in asdict(opts).items()},
        }


def _stream_notes(consumer: dict[str, Any]) -> list[str]:
    """With ``--consumer spark-stream``: what the stream read's summary says beyond the
    counts (the copies the stream held, whether the query reached its tail)."""
    notes = [
        f"the stream read {consumer.get('records_read', 0):,} record(s) in its batches (a "
        "batch run again after the driver's restart counted once); the query's "
        f"dropDuplicates(row_id) dropped {consumer.get('copies_dropped', 0):,} copies RabbitMQ "
        "stored at offsets of their own (a sidecar's replay after the node kill, a retried "
        "writer task, or RabbitMQ's own), whose original was in another task's range; the "
        "reading tasks' sidecar hid "
        f"{consumer.get('copies_hidden_by_sidecar', 0):,} within their ranges"
    ]
    if not consumer.get("read_to_tail"):
        notes.append(
            f"the query's last batch ended at offset {consumer.get('end_offset')}, the tail "
            f"its last probe found was {consumer.get('tail_offset')}"
        )
    return notes


def _plan(downtime: float, faults: FaultInjector) -> str:
    """The fault plan for the progress line (``downtime``: seconds every broker stays down
    with ``--faults all-down``)."""
    at = ", ".join(f"{f:.0%}" for f in faults.fractions) or "none"
    if faults.kind == "all-down":
        return f"every broker killed for {downtime:.0f} s at {at}"
    if faults.kind == "sidecar":
        return f"kill -9 of the producer's sidecar at {at}"
    if faults.kind == "node" and isinstance(faults, ClusterFaultInjector) and not faults.rolling:
        return f"kill -9 of the node under a reading task at: {at}"
    if faults.kind == "node":
        *kills, rolling = faults.fractions
        at = ", ".join(f"{f:.0%}" for f in kills) or "none"
        return f"kill -9 of the connected node at: {at}; rolling restart at {rolling:.0%}"
    return f"kill -9 at: {at}"
