"""Faults of the drill: the kill -9 of the serving broker, of every broker for a while, or of
the producer's sidecar; the sampler that triggers them, and the grouping of the sidecars'
FAILOVER events by the kill that caused them.

:class:`Sampler` follows a SEND counter (the producer sidecar's ``/metrics``,
:func:`sidecar_sends`; with the outbox what the outbox took, :func:`outbox_taken`; in the
baseline Spark's count of finished tasks, :class:`pipeline.publish.SparkProgress`) and the
reader every :data:`SAMPLE_INTERVAL` seconds: the samples make the publish timeline, drive the
progress bars, and let :class:`FaultInjector` kill the serving broker (SIGKILL) once the planned
share of the rows is published. With the drill's own shared-store pair the injector then
measures the takeover (the other broker answers STOMP CONNECT) and, if more faults are planned,
restarts the killed broker as the new backup before the next kill, so there is always something
to fail over to. With external brokers it SIGKILLs the PIDs it was given.

Two more kinds (:data:`pipeline.report.records.FAULT_KINDS`), one fault each: ``all-down``
SIGKILLs both brokers of the pair (the waiting one first, so that it cannot take over), waits
until ``down_for`` seconds have passed since the kill, starts the one that served again, waits
until it answers STOMP CONNECT (the service is back: ``restored_at``) and then the other as
the backup; ``sidecar`` SIGKILLs the producer's sidecar and starts it again at once on the same
ports and configuration (so the same ``outbox_dir``), ready when ``/readyz`` answers.

With the outbox the sampler also reads the outbox's depth from the same sidecar's
``/metrics`` (:func:`sidecar_outbox`).

:func:`group_incidents` attributes each FAILOVER event to the last kill before it when the
session left the killed broker within :data:`ATTRIBUTION_WINDOW` seconds; other FAILOVERs
(e.g. a heart-beat timeout on an overloaded machine) form "unplanned" incidents.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from pipeline.monitor import ObservedEvent
from pipeline.report.records import FailoverIncident, FaultRecord
from pipeline.verify import ConsumingApp
from testbed import ActiveMQ, BrokerError, wait_stomp
from testbed.sidecar import SidecarProcess, metric_total

__all__ = [
    "ATTRIBUTION_WINDOW",
    "SAMPLE_INTERVAL",
    "BrokerPair",
    "Fault",
    "FaultInjector",
    "FaultKind",
    "Sampler",
    "broker_label",
    "group_incidents",
    "outbox_taken",
    "sidecar_outbox",
    "sidecar_sends",
    "tqdm_class",
]

#: Seconds between two samples of the producer sidecar's SEND counter.
SAMPLE_INTERVAL = 0.2
#: Seconds a fault's FAILOVER events may come after its kill and still be attributed to it.
ATTRIBUTION_WINDOW = 120.0
#: Seconds a killed broker or sidecar may take to serve again after its restart.
RESTART_TIMEOUT = 120.0

#: What a fault kills (module docstring; :data:`pipeline.report.records.FAULT_KINDS`;
#: ``node`` and ``rolling-restart`` are the RabbitMQ cluster's, :mod:`pipeline.cluster_faults`).
FaultKind = Literal["broker", "all-down", "sidecar", "node", "rolling-restart"]


@dataclass
class Fault:
    """One kill as it happened (mutable: the follow-up fills ``takeover_ms``, ``restarted``).

    ``broker``: the killed broker's ``host:port`` label as the sidecars report it (``pid N``
    for an external broker; for ``all-down`` the one that served; for ``sidecar`` the
    sidecar's ``host:port``); ``at``: seconds since the publish started; ``wall``: Unix time
    of the kill; ``fraction``: share of the rows published then; ``kind``: see the module
    docstring; ``pids``: every process killed; ``restored_at``: t when the service was back
    (``all-down``, ``sidecar``; a ``rolling-restart``'s end); ``new_pid``: the restarted
    sidecar's PID; ``detail``: a few words for the report; ``affects``: the other brokers
    (``host:port``) whose FAILOVERs it causes (a rolling restart's nodes).
    """

    index: int
    broker: str  # label host:port
    name: str
    pid: int | None
    at: float
    wall: float
    fraction: float
    takeover_ms: int | None = None
    restarted: bool = False
    kind: FaultKind = "broker"
    pids: tuple[int, ...] = ()
    restored_at: float | None = None
    new_pid: int | None = None
    affects: tuple[str, ...] = ()
    detail: str = ""


@dataclass
class BrokerPair:
    """The drill's own brokers: who serves now and who waits on the store lock."""

    serving: ActiveMQ
    waiting: ActiveMQ


def broker_label(broker: ActiveMQ) -> str:
    """``host:port``: how a sidecar names the broker in events and metrics."""
    return f"{broker.host}:{broker.stomp_port}"


class FaultInjector:
    """Makes the planned faults when their share of the rows is published.

    ``kind`` (module docstring): ``broker`` kills the serving broker (``pair``; or the
    ``pids`` of external brokers, in order), ``all-down`` every broker of ``pair`` for
    ``down_for`` seconds, ``sidecar`` the producer's ``sidecar``, restarted at once;
    ``restarted(sidecar)`` then runs once it is ready again (e.g. to watch its events anew).
    ``check(published)`` is called by the sampler; a kill happens only when the previous
    fault's follow-up (takeover measured, killed broker restarted as backup) is done.
    ``say`` prints a line above the progress bars; :meth:`stop` ends a follow-up early
    (nothing is restarted after it).
    """

    def __init__(
        self,
        fractions: tuple[float, ...],
        rows: int,
        *,
        pair: BrokerPair | None,
        pids: tuple[int, ...],
        say: Callable[[str], None],
        kind: FaultKind = "broker",
        down_for: float = 30.0,
        sidecar: SidecarProcess | None = None,
        restarted: Callable[[SidecarProcess], None] | None = None,
    ) -> None:
        if kind == "all-down" and pair is None:
            raise ValueError("all-down needs the drill's own broker pair")
        if kind == "sidecar" and sidecar is None:
            raise ValueError("a sidecar fault needs the sidecar to kill")
        self.fractions = fractions
        self.rows = rows
        self.pair = pair
        self.pids = pids
        self.say = say
        self.kind: FaultKind = kind
        self.down_for = down_for
        self.sidecar = sidecar
        self.restarted = restarted
        self.faults: list[Fault] = []
        self.errors: list[str] = []
        self.t0 = time.monotonic()
        self._ready = threading.Event()
        self._ready.set()
        self._halt = threading.Event()
        self._threads: list[threading.Thread] = []

    @property
    def pending(self) -> bool:
        """Faults still to make."""
        return len(self.faults) < len(self.fractions)

    def check(self, published: float) -> None:
        """Make the next fault if its share of the rows is published and the last one's
        follow-up is done."""
        i = len(self.faults)
        if i >= len(self.fractions) or published < self.fractions[i] * self.rows:
            return
        if not self._ready.is_set():
            return
        self._ready.clear()
        self._make(i, published / self.rows)

    def _make(self, i: int, fraction: float) -> None:
        """Make fault ``i`` now (``fraction`` of the rows published); its follow-up sets
        ``_ready`` again when done."""
        if self.kind == "all-down":
            self._all_down(i, fraction)
            return
        if self.kind == "sidecar":
            self._kill_sidecar(i, fraction)
            return
        if self.pair is None:
            pid = self.pids[i]
            at, wall = time.monotonic() - self.t0, time.time()
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError as exc:
                self.errors.append(f"kill -9 {pid}: {exc}")
            self.faults.append(Fault(i, f"pid {pid}", "external broker", pid, at, wall, fraction))
            self.say(f"kill -9 pid {pid} at {fraction:.0%} published")
            self._ready.set()
            return
        victim, successor = self.pair.serving, self.pair.waiting
        victim_pid = victim.pid
        at, wall = time.monotonic() - self.t0, time.time()
        victim.kill()
        fault = Fault(i, broker_label(victim), victim.name, victim_pid, at, wall, fraction)
        self.faults.append(fault)
        self.say(
            f"kill -9 {victim.name} (pid {victim_pid}, {broker_label(victim)}), "
            f"{fraction:.0%} published"
        )
        thread = threading.Thread(
            target=self._follow_up, args=(fault, victim, successor), name="fault", daemon=True
        )
        self._threads.append(thread)
        thread.start()

    def _follow_up(self, fault: Fault, victim: ActiveMQ, successor: ActiveMQ) -> None:
        """Measure the takeover; restart the victim as the new backup if faults remain."""
        assert self.pair is not None
        killed = self.t0 + fault.at
        try:
            wait_stomp(successor.host, successor.stomp_port, timeout=120.0)
            fault.takeover_ms = round((time.monotonic() - killed) * 1000)
            self.say(f"{successor.name} took over after {fault.takeover_ms} ms")
            if self.pending:
                victim.start()
                victim.wait_backup(120.0)
                fault.restarted = True
                self.say(f"{victim.name} restarted as the new backup")
            self.pair.serving, self.pair.waiting = successor, victim
        except (BrokerError, TimeoutError, OSError) as exc:
            self.errors.append(f"after kill #{fault.index + 1}: {exc}")
            return  # no further kill: nothing left to fail over to
        self._ready.set()

    def _follow(self, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, name="fault", daemon=True)
        self._threads.append(thread)
        thread.start()

    def _all_down(self, index: int, fraction: float) -> None:
        """SIGKILL both brokers (the waiting one first); the follow-up restarts them."""
        assert self.pair is not None
        serving, waiting = self.pair.serving, self.pair.waiting
        pids = tuple(p for p in (serving.pid, waiting.pid) if p is not None)
        at, wall = time.monotonic() - self.t0, time.time()
        try:
            if waiting.running():
                waiting.kill()  # first: it would take the store over from the serving one
            serving.kill()
        except (BrokerError, OSError) as exc:
            self.errors.append(f"all-down: kill -9: {exc}")
        fault = Fault(
            index,
            broker_label(serving),
            f"{serving.name}+{waiting.name}",
            pids[0] if pids else None,
            at,
            wall,
            fraction,
            kind="all-down",
            pids=pids,
        )
        self.faults.append(fault)
        self.say(
            f"kill -9 of every broker ({serving.name} pid {fault.pid}, {waiting.name}), "
            f"{fraction:.0%} published; down for {self.down_for:.0f} s"
        )
        self._follow(self._bring_back, fault, serving, waiting)

    def _bring_back(self, fault: Fault, first: ActiveMQ, second: ActiveMQ) -> None:
        """After ``down_for`` s since the kill: ``first`` until it serves, ``second`` as backup."""
        killed = self.t0 + fault.at
        if self._halt.wait(max(0.0, killed + self.down_for - time.monotonic())):
            return
        try:
            first.start()
            first.wait_ready(RESTART_TIMEOUT)
            fault.restored_at = time.monotonic() - self.t0
            self.say(
                f"{first.name} restarted and serving {fault.restored_at - fault.at:.1f} s "
                "after the kill"
            )
            if self._halt.is_set():
                return
            second.start()
            second.wait_backup(RESTART_TIMEOUT)
            fault.restarted = True
            self.say(f"{second.name} restarted as the backup")
        except (BrokerError, TimeoutError, OSError) as exc:
            self.errors.append(f"after every broker was killed: restart: {exc}")
            return
        self._ready.set()

    def _kill_sidecar(self, index: int, fraction: float) -> None:
        """SIGKILL the producer's sidecar; the follow-up starts it again at once."""
        sidecar = self.sidecar
        assert sidecar is not None
        pid = sidecar.pid
        at, wall = time.monotonic() - self.t0, time.time()
        try:
            sidecar.kill()
        except (BrokerError, OSError) as exc:
            self.errors.append(f"kill -9 of the sidecar: {exc}")
        fault = Fault(
            index,
            f"{sidecar.host}:{sidecar.port}",
            sidecar.name,
            pid,
            at,
            wall,
            fraction,
            kind="sidecar",
            pids=(pid,) if pid is not None else (),
        )
        self.faults.append(fault)
        self.say(f"kill -9 {sidecar.name} (pid {pid}), {fraction:.0%} published; restarting it")
        self._follow(self._restart_sidecar, fault, sidecar)

    def _restart_sidecar(self, fault: Fault, sidecar: SidecarProcess) -> None:
        """Start ``sidecar`` again (same ports, same configuration) and wait until ready."""
        if self._halt.is_set():
            return
        try:
            sidecar.start()
            sidecar.wait_ready(RESTART_TIMEOUT)
        except (BrokerError, OSError) as exc:
            self.errors.append(f"the killed sidecar did not come back: {exc}")
            return
        fault.restored_at = time.monotonic() - self.t0
        fault.new_pid = sidecar.pid
        fault.restarted = True
        self.say(
            f"{sidecar.name} restarted as pid {fault.new_pid} on 127.0.0.1:{sidecar.port}, "
            f"ready {fault.restored_at - fault.at:.1f} s after the kill"
        )
        if self.restarted is not None:
            try:
                self.restarted(sidecar)
            except Exception as exc:  # the drill's own hook: report, do not kill the thread
                self.errors.append(f"after the sidecar's restart: {exc}")
        self._ready.set()

    def stop(self) -> None:
        """End the follow-ups early: nothing is restarted after this (the drill's cleanup)."""
        self._halt.set()

    def join(self, timeout: float) -> None:
        """Wait for the follow-ups in progress (bounded)."""
        for thread in self._threads:
            thread.join(timeout)

    def wait_done(self, timeout: float, published: float | None = None) -> bool:
        """Wait (at most ``timeout`` seconds) until every planned fault is made and its
        follow-up done, making the faults still due at ``published`` rows meanwhile (the
        sampler, which otherwise makes them, has stopped); False if that did not happen in
        time (or :meth:`stop` was called)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self._halt.is_set():
            if published is not None:
                self.check(published)
            if not self.pending and self._ready.wait(0.2):
                return True
            time.sleep(0.2)
        return not self.pending and self._ready.is_set()

    def records(self) -> list[FaultRecord]:
        """The faults made, as report records."""
        return [
            FaultRecord(
                f.index,
                f.name,
                f.pid,
                round(f.at, 3),
                round(f.fraction, 4),
                f.takeover_ms,
                f.restarted,
                kind=f.kind,
                pids=f.pids,
                restored_at=None if f.restored_at is None else round(f.restored_at, 3),
                new_pid=f.new_pid,
                detail=f.detail,
            )
            for f in self.faults
        ]


def tqdm_class() -> Any:
    """tqdm's progress bar class (a harness dependency; untyped)."""
    from tqdm import tqdm  # noqa: PLC0415

    return tqdm


def sidecar_sends(producer: SidecarProcess) -> Callable[[], float | None]:
    """The SENDs ``producer`` (a sidecar) has relayed to the broker so far, read from its
    ``/metrics`` (None when it does not answer)."""

    def sends() -> float | None:
        try:
            metrics = producer.metrics(timeout=5.0)
        except OSError:
            return None
        return metric_total(
            metrics, "mq_sidecar_relayed_frames_total", direction="app_to_broker", command="SEND"
        )

    return sends


def outbox_taken(producer: SidecarProcess) -> Callable[[], float | None]:
    """The SENDs the outbox of ``producer`` (a sidecar with ``outbox = true``) has taken from
    the app so far: what it holds (``mq_sidecar_outbox_frames``) plus what it forwarded
    (``mq_sidecar_outbox_forwarded_total``), summed across restarts of the process (the
    counter starts from 0 in a new process; the forwards of the old one are carried over as
    last read, at most one sample old). None when it does not answer."""
    carried = 0.0
    last: tuple[int | None, float] = (None, 0.0)

    def taken() -> float | None:
        nonlocal carried, last
        pid = producer.pid
        try:
            metrics = producer.metrics(timeout=5.0)
        except OSError:
            return None
        forwarded = metric_total(metrics, "mq_sidecar_outbox_forwarded_total")
        held = metric_total(metrics, "mq_sidecar_outbox_frames")
        if last[0] is not None and pid != last[0]:
            carried += last[1]
        last = (pid, forwarded)
        return carried + forwarded + held

    return taken


def sidecar_outbox(producer: SidecarProcess) -> Callable[[], tuple[float, float] | None]:
    """The outbox's depth in ``producer`` (a sidecar with ``outbox = true``): ``(frames,
    bytes)`` from its ``/metrics`` (``mq_sidecar_outbox_frames``, ``mq_sidecar_outbox_bytes``);
    None when it does not answer (killed, restarting) or has no outbox gauges."""

    def depth() -> tuple[float, float] | None:
        try:
            metrics = producer.metrics(timeout=5.0)
        except OSError:
            return None
        if "mq_sidecar_outbox_frames" not in metrics:
            return None
        return (
            metric_total(metrics, "mq_sidecar_outbox_frames"),
            metric_total(metrics, "mq_sidecar_outbox_bytes"),
        )

    return depth


class Sampler(threading.Thread):
    """Samples a SEND counter (``published``: None when it did not answer) and the consuming
    app (``reader``: its ``unique``)
    every ``interval`` s: timeline, progress bars (named ``labels``), fault trigger. With
    ``outbox`` (:func:`sidecar_outbox`) it also samples the outbox's depth into
    ``outbox_samples``: ``(t, frames, bytes)``, and shows the frames beside the publish bar."""

    def __init__(
        self,
        published: Callable[[], float | None],
        reader: ConsumingApp,
        rows: int,
        faults: FaultInjector,
        *,
        progress: bool,
        interval: float = SAMPLE_INTERVAL,
        labels: tuple[str, str] = ("publish", "drain"),
        outbox: Callable[[], tuple[float, float] | None] | None = None,
    ) -> None:
        super().__init__(name="sampler", daemon=True)
        self.published = published
        self.reader = reader
        self.rows = rows
        self.faults = faults
        self.interval = interval
        self.outbox = outbox
        self.samples: list[tuple[float, float]] = []
        self.outbox_samples: list[tuple[float, float, float]] = []
        self.t0 = time.monotonic()
        self._halt = threading.Event()
        self.bars: list[Any] = []
        if progress:
            tqdm = tqdm_class()
            common: dict[str, Any] = {
                "total": rows,
                "unit": "msg",
                "unit_scale": True,
                "file": sys.stderr,
                "dynamic_ncols": True,
                "mininterval": 0.5,
            }
            width = max(len(label) for label in labels)
            self.bars = [
                tqdm(desc=label.ljust(width), position=i, **common)
                for i, label in enumerate(labels)
            ]

    def run(self) -> None:
        """The thread: :meth:`sample` every ``interval`` seconds until :meth:`stop`."""
        while not self._halt.wait(self.interval):
            self.sample()

    def sample(self) -> None:
        """Take one sample (also called once more at the end of the publish)."""
        depth = self.outbox() if self.outbox is not None else None
        if depth is not None:
            self.outbox_samples.append((time.monotonic() - self.t0, *depth))
            if self.bars:
                self.bars[0].set_postfix_str(f"outbox {depth[0]:,.0f}", refresh=False)
        published = self.published()
        if published is None:
            return
        self.samples.append((time.monotonic() - self.t0, published))
        self.faults.check(published)
        if self.bars:
            for bar, value in zip(self.bars, (published, self.reader.unique), strict=True):
                bar.update(min(self.rows, int(value)) - bar.n)

    def stop(self) -> None:
        """Stop sampling; bring the bars up to date and close them."""
        self._halt.set()
        if self.is_alive():
            self.join(10.0)
        bars, self.bars = self.bars, []
        if bars:
            published = self.samples[-1][1] if self.samples else 0.0
            for bar, value in zip(bars, (published, self.reader.unique), strict=True):
                bar.update(min(self.rows, int(value)) - bar.n)
                bar.close()


def group_incidents(
    events: list[ObservedEvent], faults: list[Fault]
) -> tuple[list[FailoverIncident], list[tuple[ObservedEvent, int | None]]]:
    """Group FAILOVER events by the fault that caused them (module docstring).

    Returns the incidents (in order of their first event) and each event with the index
    of the fault it was attributed to (None: unplanned).
    """
    assigned: list[tuple[ObservedEvent, int | None]] = []
    for event in sorted(events, key=lambda e: float(e.body.get("timestamp", 0.0))):
        ts = float(event.body.get("timestamp", 0.0))
        owner = None
        for fault in reversed(faults):
            if fault.wall <= ts:
                external = fault.broker.startswith("pid ")  # its host:port is unknown
                left = event.body.get("from_broker")
                if ts - fault.wall <= ATTRIBUTION_WINDOW and (
                    external or left == fault.broker or left in fault.affects
                ):
                    owner = fault.index
                break
        assigned.append((event, owner))
    groups: dict[tuple[int | None, int], list[ObservedEvent]] = {}
    unplanned_group = -1
    last_unplanned: float | None = None
    for event, owner in assigned:
        if owner is None:
            ts = event.received_at
            if last_unplanned is None or ts - last_unplanned > 30.0:
                unplanned_group += 1
            last_unplanned = ts
            groups.setdefault((None, unplanned_group), []).append(event)
        else:
            groups.setdefault((owner, 0), []).append(event)
    incidents = []
    for (owner, _), group in sorted(groups.items(), key=lambda kv: kv[1][0].received_at):
        outages = [int(e.body.get("outage_ms") or 0) for e in group]
        incidents.append(
            FailoverIncident(
                fault=owner,
                from_broker=_most_common(str(e.body.get("from_broker")) for e in group),
                to_broker=_most_common(str(e.body.get("to_broker")) for e in group),
                sessions=tuple(f"{e.sidecar}:{e.body.get('session_id')}" for e in group),
                outage_ms_min=min(outages),
                outage_ms_max=max(outages),
                replayed_frames=sum(int(e.body.get("replayed_frames") or 0) for e in group),
                reattached=sum(1 for e in group if e.body.get("reattached")),
            )
        )
    return incidents, assigned


def _most_common(values: Iterable[str]) -> str:
    return Counter(values).most_common(1)[0][0]
