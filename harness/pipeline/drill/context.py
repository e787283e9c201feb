"""What every phase of a drill shares (:class:`DrillContext`): the options, the work directory,
the job's name and queue, the clock, the progress lines, the phases' durations, and
everything started so far (:class:`Started`), which :meth:`Started.stop_all` stops in any
case at the end."""

from __future__ import annotations

import contextlib
import secrets
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.drill.options import DrillOptions
from pipeline.faults import BrokerPair, FaultInjector, Sampler, tqdm_class
from pipeline.monitor import EventMonitor
from pipeline.verify import ConsumingApp
from testbed import ActiveMQ
from testbed.sidecar import SidecarProcess

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from testbed.rabbitmq_cluster import RabbitMQCluster
    from testbed.spark_cluster import SparkCluster

__all__ = ["DrillContext", "Started"]


@dataclass
class Started:
    """Everything the drill started, each added as soon as it runs, for :meth:`stop_all`."""

    pair: BrokerPair | None = None
    brokers: list[ActiveMQ] = field(default_factory=list)
    sidecars: list[SidecarProcess] = field(default_factory=list)
    monitors: list[EventMonitor] = field(default_factory=list)
    readers: list[ConsumingApp] = field(default_factory=list)
    sampler: Sampler | None = None
    faults: FaultInjector | None = None
    spark: SparkSession | None = None
    cluster: SparkCluster | None = None
    rabbitmq: RabbitMQCluster | None = None
    target: tuple[str, dict[str, str]] | None = None

    def stop_all(self) -> None:
        """Stop everything started, newest first (faults, sampler, clients (the streaming
        consumer's driver within 60 s), Spark, the drill's Spark cluster, sidecars within 30 s
        each, brokers); never raises."""
        if self.faults is not None:
            self.faults.stop()  # restart nothing any more
        if self.sampler is not None:
            with contextlib.suppress(Exception):
                self.sampler.stop()
        for reader in self.readers:
            with contextlib.suppress(Exception):
                reader.close(timeout=5.0)
        for monitor in self.monitors:
            with contextlib.suppress(Exception):
                monitor.close(timeout=5.0)
        if self.faults is not None:
            self.faults.join(30.0)
        if self.spark is not None:
            from pipeline.spark import stop_spark  # noqa: PLC0415

            with contextlib.suppress(Exception):
                stop_spark(self.spark)
        if self.cluster is not None:
            with contextlib.suppress(Exception):
                self.cluster.stop()
        for sidecar in reversed(self.sidecars):
            with contextlib.suppress(Exception):
                sidecar.stop(30.0)
        pair = self.pair
        order = [pair.waiting, pair.serving] if pair is not None else []
        for broker in [*order, *self.brokers]:
            with contextlib.suppress(Exception):
                broker.stop()
        if self.rabbitmq is not None:
            with contextlib.suppress(Exception):
                self.rabbitmq.stop()


class DrillContext:
    """One drill's shared state: ``options``; ``workdir`` (brokers' data, logs, the outbox);
    ``job`` (``drill-<time>-<hex>``, in every row's id) and ``destination`` (its queue:
    ``/queue/QUEUE``, on the RabbitMQ cluster ``/amq/queue/QUEUE``, ``queue`` its name);
    ``started`` (monotonic seconds at the start); ``state`` (:class:`Started`); ``phases``
    (name: seconds, in the order they ran: the report's ``phases``)."""

    def __init__(self, options: DrillOptions, workdir: Path) -> None:
        self.options = options
        self.workdir = workdir
        self.job = f"drill-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
        self.queue = f"mq-sidecar-drill.{self.job}"
        prefix = "/amq/queue/" if options.rabbitmq_cluster else "/queue/"
        self.destination = options.destination or prefix + self.queue
        self.started = time.monotonic()
        self.state = Started()
        self.phases: dict[str, float] = {}
        #: With ``--consumer spark-stream``: the nodes (indexes) with a replica of the stream.
        self.stream_members: list[int] = []

    @property
    def outbox_dir(self) -> Path:
        """The producer sidecar's ``outbox_dir`` (with ``--outbox``): ``workdir/outbox``."""
        return self.workdir / "outbox"

    def sidecar_options(self, role: str) -> dict[str, object]:
        """The options of the ``producer``'s or the ``consumer``'s sidecar
        (:meth:`DrillOptions.sidecar_options` with :attr:`outbox_dir`)."""
        return self.options.sidecar_options(role, self.outbox_dir)

    def say(self, line: str) -> None:
        """A progress line on stderr, with the seconds since the drill started (above the
        progress bars while they show)."""
        text = f"[{time.monotonic() - self.started:7.1f} s] {line}"
        sampler = self.state.sampler
        if sampler is not None and sampler.bars:
            tqdm_class().write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr, flush=True)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the ``with`` block into ``phases[name]`` (seconds), also when it raises."""
        started = time.monotonic()
        try:
            yield
        finally:
            self.phases[name] = time.monotonic() - started
