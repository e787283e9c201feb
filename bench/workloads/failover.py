"""Failover: what an app sees through the sidecar, next to what the broker itself needs.

- ``failover-kill9-takeover``: ``failover_reps`` times, a fresh ActiveMQ shared-store
  pair (lock poll 200 ms), a sidecar in front of both, an app session sending persistent
  SENDs each with a receipt awaited; the primary gets kill -9. *Sidecar*: the app's outage,
  from the kill to the first receipt after it (the end of the longest gap between receipts
  after the kill). *Direct*: the broker's own takeover, from the kill to the backup
  answering a STOMP CONNECT (polled every 5 ms from the same instant). Added ms is the
  median of the per-repetition differences. The FAILOVER event's own ``outage_ms`` (loss
  detected -> session restored) is reported too.
- ``reattach-after-reset``: a fault proxy (``tests/faultproxy.py``) between sidecar and
  broker resets the upstream connection ``reset_reps`` times under the same app load.
  *Sidecar*: the reset to the first receipt after it. *Direct*: what an app without a
  sidecar needs at least after a reset: a new TCP connection, CONNECT/CONNECTED and one
  SEND+RECEIPT (no backoff).
- ``blackhole-detect-hbNms``: the proxy stops forwarding (sockets stay open) with
  ``upstream_heartbeat = [N, N]`` and ``heartbeat_grace`` 2.0. *Sidecar*: from the blackhole
  to the RECONNECTING event at the app. *Direct* column: the configured bound N x grace (not a
  measurement; the detection may come up to N/2 earlier, since the broker is asked for beats
  every N/2 ms; RabbitMQ rounds beats up to whole seconds, so below 1000 ms its bound is
  1000 x grace).

The sidecars keep their default reconnect policy (``retry_interval`` 100 ms, multiplier 2,
full jitter) unless ``Settings``-level options are given (``bench.run --sidecar-option``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import loadgen
from bench.loadgen import AppLog, LoadgenError, RawStomp
from bench.report import Row, median
from bench.sidecar import SidecarError, SidecarProcess, broker_url
from bench.workloads import BrokerCtx, Settings
from testbed import BrokerError, BrokerProcess, start_activemq_pair
from testbed.probe import stomp_handshake
from tests.faultproxy import FaultProxy

__all__ = ["run_blackhole", "run_kill9", "run_reset"]

EVENTS = "/mq-sidecar/events"
#: Seconds any single wait of these workloads may take before the repetition fails.
WAIT = 60.0
#: Poll interval of the broker's own takeover measurement, seconds.
POLL = 0.005


def _stats(values: list[float]) -> dict[str, float]:
    return {
        "min": round(min(values), 1),
        "median": round(median(values), 1),
        "max": round(max(values), 1),
    }


def _outage_after(receipts: list[float], t0: float) -> float | None:
    """Seconds from ``t0`` to the end of the longest gap between receipts after ``t0``."""
    before = [r for r in receipts if r <= t0]
    after = [r for r in receipts if r > t0]
    if not after:
        return None
    seq = [before[-1] if before else t0, *after]
    best = max(range(1, len(seq)), key=lambda i: seq[i] - seq[i - 1])
    return seq[best] - t0


def _subscribe_events(c: RawStomp) -> None:
    c.send(loadgen.subscribe_frame(EVENTS, "events", "auto", receipt="events"))
    c.wait_receipt(b"events")


class _App:
    """An app session through a sidecar: SENDs with receipts in a thread, events recorded."""

    def __init__(self, port: int, vhost: str, dest: str) -> None:
        self.client = RawStomp(port, vhost)
        _subscribe_events(self.client)
        self.log = AppLog()
        self.stop = threading.Event()
        self.thread = threading.Thread(
            target=loadgen.app_loop_until,
            args=(self.client, dest, self.stop, self.log),
            name="bench-app",
            daemon=True,
        )
        self.thread.start()

    def receipts(self, after: float = 0.0) -> int:
        """Receipts received so far (those that arrived after ``after``, perf_counter)."""
        with self.log.lock:
            return sum(1 for r in self.log.receipts if r > after)

    def _wait(self, done: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            if self.log.error is not None:
                raise LoadgenError(f"app session failed: {self.log.error}")
            if time.monotonic() > deadline:
                raise LoadgenError(f"timed out after {timeout} s waiting for {what}")
            time.sleep(0.002)

    def wait_receipts(self, count: int, *, after: float = 0.0, timeout: float = WAIT) -> None:
        """Wait until ``count`` receipts arrived after ``after``; LoadgenError on failure."""
        self._wait(lambda: self.receipts(after) >= count, timeout, f"{count} receipts")

    def wait_events(self, kind: str, count: int, *, timeout: float = WAIT) -> dict[str, Any]:
        """Wait for the ``count``-th event of ``kind``; return it."""
        return self.log.wait_event(kind, count, timeout)

    def close(self) -> None:
        """Stop the sending thread and close the connection (idempotent)."""
        self.stop.set()
        self.thread.join(WAIT)
        self.client.close()


class _TakeoverPoll:
    """From ``start()`` on, try a STOMP CONNECT to ``broker`` every 5 ms in a thread;
    ``answered`` is the ``perf_counter`` time of the first CONNECTED."""

    def __init__(self, broker: BrokerProcess) -> None:
        self.broker = broker
        self.answered: float | None = None
        self._go = threading.Event()
        self._thread = threading.Thread(target=self._run, name="takeover-poll", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self._go.wait()
        deadline = time.monotonic() + WAIT
        b = self.broker
        while time.monotonic() < deadline:
            try:
                if stomp_handshake(b.host, b.stomp_port, timeout=1.0, vhost=b.vhost).connected:
                    self.answered = time.perf_counter()
                    return
            except (OSError, EOFError):
                pass
            time.sleep(POLL)

    def start(self) -> None:
        """Start polling now."""
        self._go.set()

    def join(self) -> float:
        """Wait for the answer; its time. LoadgenError if the broker never answered."""
        self._go.set()
        self._thread.join(WAIT + 5)
        if self.answered is None:
            raise LoadgenError(f"{self.broker.name} did not answer STOMP CONNECT in {WAIT} s")
        return self.answered


def _kill9_once(rep_dir: Path, options: dict[str, object]) -> tuple[float, float, float]:
    """One takeover: (app outage s, broker takeover s, FAILOVER event outage_ms)."""
    primary, backup = start_activemq_pair(rep_dir, name="fo", lock_sleep_ms=200)
    sidecar: SidecarProcess | None = None
    app: _App | None = None
    try:
        sidecar = SidecarProcess(
            f"failover:({primary.stomp_url},{backup.stomp_url})",
            rep_dir,
            options=options,
            vhost=primary.vhost,
        )
        sidecar.start()
        app = _App(sidecar.port, primary.vhost, "/queue/bench-kill9")
        app.wait_receipts(50)
        poll = _TakeoverPoll(backup)
        t_kill = time.perf_counter()
        poll.start()
        primary.kill()
        app.wait_receipts(20, after=t_kill)
        answered = poll.join()
        event = app.wait_events("FAILOVER", 1)
        app.close()
        outage = _outage_after(app.log.receipts, t_kill)
        if outage is None:
            raise LoadgenError("no receipt after the kill")
        if event.get("to_broker") != f"{backup.host}:{backup.stomp_port}":
            raise LoadgenError(f"FAILOVER went to {event.get('to_broker')}, not the backup")
        return outage, answered - t_kill, float(event["outage_ms"])
    finally:
        if app is not None:
            app.close()
        if sidecar is not None:
            sidecar.stop()
        backup.stop()
        primary.stop()


def run_kill9(workdir: Path, st: Settings) -> Row:
    """kill -9 takeovers of an ActiveMQ shared-store primary (``st.failover_reps`` pairs)."""
    options = st.sidecar_options
    outages: list[float] = []
    takeovers: list[float] = []
    added: list[float] = []
    event_outages: list[float] = []
    failed: list[str] = []
    for rep in range(st.failover_reps):
        rep_dir = workdir / f"kill9-{rep}"
        rep_dir.mkdir(parents=True)
        try:
            outage, takeover, event_outage = _kill9_once(rep_dir, options)
        except (LoadgenError, SidecarError, BrokerError) as exc:
            # One failed takeover is a finding (reported), not a reason to stop measuring.
            failed.append(f"rep {rep}: {type(exc).__name__}: {exc}"[:600])
            if 2 * len(failed) > st.failover_reps:
                raise LoadgenError(f"most takeovers failed: {failed}") from exc
            continue
        outages.append(1000 * outage)
        takeovers.append(1000 * takeover)
        added.append(1000 * (outage - takeover))
        event_outages.append(event_outage)
    row = Row(
        workload="failover-kill9-takeover",
        broker="activemq",
        unit="ms",
        direct=median(takeovers),
        sidecar=median(outages),
        added_ms=median(added),
        notes=[
            "direct: the broker's own takeover, kill -9 -> the backup answers STOMP CONNECT "
            "(polled every 5 ms); sidecar: the app's outage, kill -9 -> first SEND receipt "
            "after it (persistent SENDs, each receipt awaited); medians of "
            f"{st.failover_reps} fresh shared-store pairs (lock poll 200 ms)",
            "sidecar reconnect policy: "
            + (", ".join(f"{k}={v}" for k, v in options.items()) or "the defaults")
            + " (retry_interval 100 ms doubling, full jitter, unless set)",
        ],
    )
    if failed:
        row.notes.append(
            f"{len(failed)} of {st.failover_reps} takeovers FAILED (the app session got an "
            "ERROR or no receipt): see failed_reps; the figures are over the others"
        )
    row.extra = {
        "reps": st.failover_reps,
        "failed_reps": failed,
        "broker_takeover_ms": _stats(takeovers),
        "app_outage_ms": _stats(outages),
        "added_ms_stats": _stats(added),
        "failover_event_outage_ms": _stats(event_outages),
        "per_rep": [
            {"takeover_ms": round(t, 1), "outage_ms": round(o, 1)}
            for t, o in zip(takeovers, outages, strict=True)
        ],
    }
    return row


def run_reset(ctx: BrokerCtx) -> Row:
    """Reattach after a connection reset, ``reset_reps`` times on one sidecar session."""
    st = ctx.settings
    options = st.sidecar_options
    outages: list[float] = []
    event_outages: list[float] = []
    direct: list[float] = []
    dest = ctx.unique("reset")
    with FaultProxy((ctx.broker.host, ctx.port)) as proxy:
        sidecar = SidecarProcess(
            broker_url("127.0.0.1", proxy.port, ctx.vhost),
            ctx.workdir,
            options=options,
            vhost=ctx.vhost,
        )
        sidecar.start()
        app: _App | None = None
        try:
            app = _App(sidecar.port, ctx.vhost, dest)
            for rep in range(1, st.reset_reps + 1):
                app.wait_receipts(30, after=time.perf_counter())
                t0 = time.perf_counter()
                proxy.reset()
                event = app.wait_events("FAILOVER", rep)
                app.wait_receipts(10, after=t0)
                outage = _outage_after(app.log.receipts, t0)
                assert outage is not None
                outages.append(1000 * outage)
                event_outages.append(float(event["outage_ms"]))
                if not event.get("reattached"):
                    raise LoadgenError(f"expected a reattach, got {event}")
            sent = app.receipts()
            app.close()
            app = None
        finally:
            if app is not None:
                app.close()
            sidecar.stop()
    # The direct baseline: reconnect + CONNECT + one receipted SEND, no backoff.
    base_dest = ctx.unique("reset-direct")
    for _ in range(st.reset_reps):
        t0 = time.perf_counter()
        c = RawStomp(ctx.port, ctx.vhost)
        c.send(loadgen.send_frame(base_dest, persistent=True, receipt="one"))
        c.wait_receipt(b"one")
        direct.append(1000 * (time.perf_counter() - t0))
        c.disconnect()
    loadgen.drain(ctx.port, ctx.vhost, base_dest, st.reset_reps)
    loadgen.drain(ctx.port, ctx.vhost, dest, 2 * sent + 100, idle=1.0)  # replays may add copies
    row = Row(
        workload="reattach-after-reset",
        broker=ctx.flavor,
        unit="ms",
        direct=median(direct),
        sidecar=median(outages),
        added_ms=median(outages) - median(direct),
        notes=[
            "sidecar: connection reset (RST from a fault proxy) -> first SEND receipt after it, "
            "the app's connection staying up; direct: what an app needs at least without a "
            "sidecar: new TCP connection + CONNECT + one SEND receipt, no backoff",
            "the sidecar's first retry waits 0-100 ms (retry_interval 100, full jitter)"
            if "retry_interval" not in options
            else f"sidecar options: {options}",
        ],
    )
    row.extra = {
        "reps": st.reset_reps,
        "app_outage_ms": _stats(outages),
        "failover_event_outage_ms": _stats(event_outages),
        "direct_reconnect_ms": _stats(direct),
    }
    return row


def _blackhole_once(
    proxy: FaultProxy, log: AppLog, rep: int, bound_ms: float
) -> tuple[float, float]:
    """Blackhole, wait for RECONNECTING #rep, pass through again, wait for FAILOVER #rep.
    Returns (ms to the event's arrival at the app, ms to the event's own timestamp)."""
    t0 = time.perf_counter()
    wall0 = time.time()
    proxy.blackhole()
    try:
        event = log.wait_event("RECONNECTING", rep, 3 * bound_ms / 1000 + 10)
    finally:
        proxy.pass_through()
    log.wait_event("FAILOVER", rep, WAIT)
    return 1000 * (event["_arrived"] - t0), 1000 * (event["timestamp"] - wall0)


def run_blackhole(ctx: BrokerCtx) -> list[Row]:
    """Detection of a blackholed broker, per heart-beat interval in ``blackhole_intervals``."""
    st = ctx.settings
    grace = 2.0
    rows = []
    for interval in st.blackhole_intervals:
        detections: list[float] = []
        event_lag: list[float] = []
        with FaultProxy((ctx.broker.host, ctx.port)) as proxy:
            sidecar = SidecarProcess(
                broker_url("127.0.0.1", proxy.port, ctx.vhost),
                ctx.workdir,
                options={
                    **st.sidecar_options,
                    "upstream_heartbeat": [interval, interval],
                    "heartbeat_grace": grace,
                    "connect_timeout": 2000,
                },
                vhost=ctx.vhost,
            )
            sidecar.start()
            app = RawStomp(sidecar.port, ctx.vhost)
            log = AppLog()
            stop = threading.Event()
            watcher = threading.Thread(
                target=loadgen.watch_events, args=(app, stop, log), daemon=True
            )
            try:
                _subscribe_events(app)
                watcher.start()
                for rep in range(1, st.blackhole_reps + 1):
                    # Let heart-beats flow on the (new) leg first, for a varying time.
                    time.sleep(interval / 1000 * (1.0 + 0.37 * (rep % 3)))
                    detection, lag = _blackhole_once(proxy, log, rep, interval * grace)
                    detections.append(detection)
                    event_lag.append(lag)
            finally:
                stop.set()
                watcher.join(5)
                app.close()
                sidecar.stop()
        bound_ms = interval * grace
        notes = []
        if ctx.flavor == "rabbitmq" and interval < 1000:
            notes.append(
                "RabbitMQ rounds heart-beats up to whole seconds (docs/brokers.md, Heart-beats): "
                "its CONNECTED insists on 1000 ms, so the sidecar's bound becomes "
                f"1000 x {grace} = {1000 * grace:.0f} ms"
            )
        row = Row(
            workload=f"blackhole-detect-hb{interval}ms",
            broker=ctx.flavor,
            unit="ms",
            direct=bound_ms,
            sidecar=median(detections),
            notes=[
                f"direct column: the configured bound heart-beat {interval} ms x grace {grace} "
                "(not a measurement); sidecar: blackhole -> RECONNECTING event at the app; "
                f"the broker is asked for beats every {interval // 2} ms, so detection may come "
                "up to that much before the bound",
                *notes,
            ],
        )
        row.extra = {
            "reps": st.blackhole_reps,
            "effective_bound_ms": (
                max(interval, 1000) * grace if ctx.flavor == "rabbitmq" else bound_ms
            ),
            "detection_ms": _stats(detections),
            "event_timestamp_ms": _stats(event_lag),
        }
        rows.append(row)
    return rows
