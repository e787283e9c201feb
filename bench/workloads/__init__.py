"""The benchmark workloads and what they share: settings and the per-broker context.

Each module turns one part of issue 7 into :class:`bench.report.Row` objects:
``throughput`` (SENDs and consumers, persistent and not), ``latency`` (SEND+RECEIPT round
trips), ``failover`` (kill -9 takeover, reattach after a reset, blackhole detection) and
``scale`` (1 / 100 / 1,000 sessions). Every figure through the sidecar is measured in the same
run as the same workload sent directly to the same broker, with the same load generator
(:mod:`bench.loadgen`); the throughput and latency workloads also measure a C byte relay
(``socat``, :mod:`bench.relay`) in front of the same broker as a third target (issue 18).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.procstat import cpu_seconds, wait_cpu_quiet
from bench.relay import RelayProcess
from bench.sidecar import SidecarError, SidecarProcess, broker_url
from testbed import ActiveMQ, BrokerProcess, RabbitMQ

__all__ = [
    "OUTBOX_TARGETS",
    "TARGETS",
    "BrokerCtx",
    "Front",
    "Settings",
    "bench_broker",
    "start_sidecar",
]

#: The targets of the throughput and latency workloads: the broker itself, the broker behind
#: a C byte relay, the broker behind the sidecar.
TARGETS: tuple[str, ...] = ("direct", "relay", "sidecar")
#: The targets of the outbox workload (:mod:`bench.workloads.outbox_mode`): the broker itself,
#: the broker behind the sidecar, the broker behind a second sidecar with ``outbox = true``.
OUTBOX_TARGETS: tuple[str, ...] = ("direct", "sidecar", "outbox")

#: What stands in front of the broker for a target other than "direct".
Front = SidecarProcess | RelayProcess


def bench_broker(flavor: str, name: str, workdir: Path) -> BrokerProcess:
    """The broker of a benchmark run (not started): ``flavor`` "activemq" with full JIT and
    room for 1,000 connections and queued messages (512 MiB heap, 256 MiB memory limit), or
    "rabbitmq" as the testbed makes it. Raises ValueError for another flavor."""
    if flavor == "activemq":
        return ActiveMQ(name, workdir, heap_mb=512, memory_mb=256, quick_jit=False)
    if flavor == "rabbitmq":
        return RabbitMQ(name, workdir)
    raise ValueError(f"unknown broker flavor {flavor!r}")


def start_sidecar(
    brokers: str, workdir: Path, options: dict[str, object], vhost: str, *, attempts: int = 3
) -> SidecarProcess:
    """A started :class:`SidecarProcess` (arguments as its own). Its ports are picked free
    before it binds them, so on a shared machine another process can take one meanwhile:
    "Address already in use" is tried again with fresh ports, up to ``attempts`` times in all;
    other errors (and the last) raise :class:`bench.sidecar.SidecarError`."""
    for attempt in range(1, attempts + 1):
        sidecar = SidecarProcess(brokers, workdir, options=options, vhost=vhost)
        try:
            sidecar.start()
        except SidecarError as exc:
            if attempt == attempts or "Address already in use" not in str(exc):
                raise
            continue
        return sidecar
    raise SidecarError("no attempt made")  # attempts < 1


@dataclass
class Settings:
    """Counts and repetitions of a run (``bench.run`` fills them from the command line).

    ``n``: messages per throughput run (SEND round-trip workloads use a fraction of it);
    ``reps``: repetitions per target (direct and sidecar alternate, the median is reported);
    ``latency_n``: measured round trips per target (after ``latency_warmup``);
    ``failover_reps``: kill -9 takeovers; ``reset_reps``: connection resets per broker;
    ``blackhole_reps``: blackholes per heart-beat interval in ``blackhole_intervals`` (ms);
    ``scale_sessions``: session counts; ``scale_messages``: messages per scale transfer (spread
    over the sessions); ``persistence``: which of persistent / non-persistent to run;
    ``sidecar_options``: configuration options (TOML names) for every sidecar started.
    """

    n: int = 20_000
    reps: int = 3
    latency_n: int = 5_000
    latency_warmup: int = 500
    failover_reps: int = 20
    reset_reps: int = 10
    blackhole_reps: int = 5
    blackhole_intervals: tuple[int, ...] = (500, 1000)
    scale_sessions: tuple[int, ...] = (1, 100, 1000)
    scale_messages: int = 20_000
    scale_idle_seconds: float = 3.0
    persistence: tuple[bool, ...] = (False, True)
    sidecar_options: dict[str, object] = field(default_factory=dict)
    quick: bool = False


@dataclass
class BrokerCtx:
    """One running broker of a run, and the sidecar process and the relay the throughput and
    latency workloads share (started lazily with :meth:`shared_sidecar` and
    :meth:`shared_relay`)."""

    flavor: str  # "activemq" or "rabbitmq"
    broker: BrokerProcess
    workdir: Path
    settings: Settings
    run_id: str = field(default_factory=lambda: time.strftime("%H%M%S"))
    _sidecar: SidecarProcess | None = None
    _relay: RelayProcess | None = None
    _outbox: SidecarProcess | None = None
    _names: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    @property
    def vhost(self) -> str:
        """CONNECT ``host`` for this broker ("/" on RabbitMQ)."""
        return self.broker.vhost

    @property
    def port(self) -> int:
        """The broker's STOMP port (the direct target)."""
        return self.broker.stomp_port

    @property
    def url(self) -> str:
        """The broker URL for a sidecar (with ``?host=/`` on RabbitMQ)."""
        return broker_url(self.broker.host, self.broker.stomp_port, self.vhost)

    def unique(self, label: str) -> str:
        """A queue name no other run of this benchmark uses."""
        return f"/queue/bench-{self.run_id}-{label}-{next(self._names)}"

    def broker_cpu(self) -> float:
        """CPU seconds of the broker process (the JVM, or beam.smp) so far."""
        pid = self.broker.pid
        return cpu_seconds(pid) if pid is not None else 0.0

    def shared_sidecar(self) -> SidecarProcess:
        """The sidecar in front of this broker with default options (started on first use)."""
        if self._sidecar is None or not self._sidecar.alive():
            if self._sidecar is not None:
                self._sidecar.stop()
            self._sidecar = SidecarProcess(
                self.url, self.workdir, options=self.settings.sidecar_options, vhost=self.vhost
            )
            self._sidecar.start()
        return self._sidecar

    def outbox_options(self, directory: Path) -> dict[str, object]:
        """The options of a sidecar in outbox mode: ``settings.sidecar_options`` with
        ``outbox = true`` and ``outbox_dir = directory``."""
        return {**self.settings.sidecar_options, "outbox": True, "outbox_dir": str(directory)}

    def outbox_sidecar(self) -> SidecarProcess:
        """The second sidecar in front of this broker, in outbox mode (``outbox_dir`` under
        ``workdir/outbox``), started on first use."""
        if self._outbox is None or not self._outbox.alive():
            if self._outbox is not None:
                self._outbox.stop()
            self._outbox = start_sidecar(
                self.url, self.workdir, self.outbox_options(self.workdir / "outbox"), self.vhost
            )
        return self._outbox

    def shared_relay(self) -> RelayProcess:
        """The socat relay in front of this broker (started on first use). Raises
        :class:`bench.relay.RelayError` when socat is missing or does not start."""
        if self._relay is None or not self._relay.alive():
            if self._relay is not None:
                self._relay.stop()
            self._relay = RelayProcess(self.broker.host, self.broker.stomp_port, self.workdir)
            self._relay.start()
        return self._relay

    def front(self, target: str) -> Front | None:
        """What ``target`` (one of :data:`TARGETS` or :data:`OUTBOX_TARGETS`) connects to:
        None for "direct", else the shared relay, sidecar or outbox sidecar. Raises ValueError
        for another target."""
        if target == "direct":
            return None
        if target == "relay":
            return self.shared_relay()
        if target == "sidecar":
            return self.shared_sidecar()
        if target == "outbox":
            return self.outbox_sidecar()
        raise ValueError(f"unknown target {target!r}")

    def target_port(self, target: str) -> int:
        """The port a client of ``target`` connects to."""
        front = self.front(target)
        return self.port if front is None else front.port

    def settle(self) -> None:
        """Wait (bounded) until the broker and the shared sidecars are idle again."""
        pid = self.broker.pid
        if pid is not None:
            wait_cpu_quiet(pid, below=0.1, window=0.2, timeout=2.0)
        for front in (self._sidecar, self._outbox):
            if front is not None and front.alive():
                wait_cpu_quiet(front.pid, below=0.1, window=0.2, timeout=2.0)

    def close(self) -> None:
        """Stop the shared sidecars and relay, if any."""
        if self._sidecar is not None:
            self._sidecar.stop()
            self._sidecar = None
        if self._outbox is not None:
            self._outbox.stop()
            self._outbox = None
        if self._relay is not None:
            self._relay.stop()
            self._relay = None
