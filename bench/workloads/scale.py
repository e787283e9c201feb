"""Scale: 1, 100 and 1,000 concurrent sessions, each with a subscription, through one sidecar.

Per session count N (direct first, then through a fresh sidecar):

1. load generator processes (1 below 100 sessions, else 2; :func:`bench.loadgen.scale_worker`)
   open N sessions, at most 50 handshakes in flight, and SUBSCRIBE each (ack auto, with a
   receipt) to its own queue;
2. idle for ``scale_idle_seconds``: the sidecar's RSS (``VmRSS``) and CPU with N idle
   sessions (heart-beats only: the sidecar's defaults, 5 s upstream);
3. transfer: every session sends ``scale_messages / N`` SENDs to its own queue and receives
   them; aggregate msg/s = all messages / wall time; the sidecar's RSS is sampled every 50 ms.

RSS per session = (RSS with N idle sessions - RSS of the freshly started sidecar) / N; the
peak RSS during the transfer gets a row of its own (``-rss-peak``).
CPU per session = the sidecar's CPU for opening and subscribing the N sessions / N.
Goal (issue 7): 1,000 sessions in <= 150 MiB RSS.

1,000 sessions through the sidecar are 1,000 app connections plus 1,000 broker connections:
the harness checks ``RLIMIT_NOFILE`` (raised to the hard limit when needed, see
``bench.run``); ActiveMQ's STOMP connector has no ``maximumConnections`` in testbed's
activemq.xml (ActiveMQ's default: unlimited).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection as Pipe
from typing import Any

from bench.loadgen import LoadgenError, scale_worker
from bench.procstat import RssSampler, wait_cpu_quiet
from bench.report import Goal, Row
from bench.sidecar import SidecarProcess
from bench.workloads import BrokerCtx

__all__ = ["run_scale"]

MIB = 1024 * 1024
#: Handshakes in flight per load generator process.
CONCURRENCY = 50


@dataclass
class _Result:
    connect_s: float
    transfer_s: float
    received: int
    client_cpu_pct: float
    workers: int
    broker_cpu_transfer: float
    sidecar_connect_cpu: float = 0.0
    sidecar_idle_cpu: float = 0.0
    sidecar_transfer_cpu: float = 0.0
    idle_seconds: float = 0.0
    idle_rss: int = 0
    load_rss_max: int = 0


def _recv(pipe: Pipe, timeout: float, what: str) -> dict[str, Any]:
    if not pipe.poll(timeout):
        raise LoadgenError(f"load generator: no answer within {timeout} s ({what})")
    answer: dict[str, Any] = pipe.recv()
    if "error" in answer:
        raise LoadgenError(f"load generator failed ({what}): {answer['error']}")
    return answer


def _run(
    ctx: BrokerCtx, port: int, n: int, per_session: int, sidecar: SidecarProcess | None
) -> _Result:
    st = ctx.settings
    mp = multiprocessing.get_context("spawn")
    workers = 1 if n < 100 else 2
    prefix = ctx.unique(f"scale{n}-{'s' if sidecar else 'd'}")
    pipes: list[Pipe] = []
    procs = []
    base, extra = divmod(n, workers)
    first = 0
    for w in range(workers):
        count = base + (1 if w < extra else 0)
        parent, child = mp.Pipe()
        proc = mp.Process(
            target=scale_worker,
            args=(child,),
            kwargs={
                "port": port,
                "vhost": ctx.vhost,
                "first": first,
                "count": count,
                "dest_prefix": prefix,
                "persistent": False,
                "concurrency": CONCURRENCY,
            },
            daemon=True,
        )
        first += count
        pipes.append(parent)
        procs.append(proc)
    try:
        s_cpu0 = sidecar.cpu() if sidecar else 0.0
        t0 = time.perf_counter()
        for proc in procs:
            proc.start()
        for pipe in pipes:
            _recv(pipe, 600, "open sessions")
        connect_s = time.perf_counter() - t0
        result = _Result(connect_s, 0.0, 0, 0.0, workers, 0.0)
        if sidecar is not None:
            result.sidecar_connect_cpu = sidecar.cpu() - s_cpu0
            wait_cpu_quiet(sidecar.pid, timeout=5.0)
            result.idle_rss = sidecar.rss()
            c0 = sidecar.cpu()
            time.sleep(st.scale_idle_seconds)
            result.idle_seconds = st.scale_idle_seconds
            result.sidecar_idle_cpu = sidecar.cpu() - c0
        ctx.settle()
        sampler = RssSampler(sidecar.pid) if sidecar else None
        s0 = sidecar.cpu() if sidecar else 0.0
        b0 = ctx.broker_cpu()
        t0 = time.perf_counter()
        with sampler if sampler is not None else contextlib.nullcontext():
            for pipe in pipes:
                pipe.send(("transfer", per_session, 300.0))
            answers = [_recv(pipe, 330, "transfer") for pipe in pipes]
        result.transfer_s = time.perf_counter() - t0
        result.broker_cpu_transfer = ctx.broker_cpu() - b0
        if sidecar is not None and sampler is not None:
            result.sidecar_transfer_cpu = sidecar.cpu() - s0
            result.load_rss_max = sampler.max_bytes
        result.received = sum(int(a["received"]) for a in answers)
        client_cpu = sum(float(a["cpu"]) for a in answers)
        result.client_cpu_pct = 100 * client_cpu / result.transfer_s / workers
        for pipe in pipes:
            pipe.send(("close",))
        for pipe in pipes:
            _recv(pipe, 60, "close")
        return result
    finally:
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join(5)


def run_scale(ctx: BrokerCtx) -> list[Row]:
    """Four rows per session count: aggregate throughput, the sidecar's RSS idle and at its
    peak under load, the sidecar's CPU per session."""
    st = ctx.settings
    rows: list[Row] = []
    for n in st.scale_sessions:
        per = max(1, st.scale_messages // n)
        total = per * n
        ctx.settle()
        direct = _run(ctx, ctx.port, n, per, None)
        sidecar = SidecarProcess(ctx.url, ctx.workdir, options=st.sidecar_options, vhost=ctx.vhost)
        sidecar.start()
        try:
            wait_cpu_quiet(sidecar.pid, timeout=5.0)
            baseline = sidecar.rss()
            side = _run(ctx, sidecar.port, n, per, sidecar)
        finally:
            sidecar.stop()
        for r in (direct, side):
            if r.received != total:
                raise LoadgenError(f"{n} sessions: {r.received} of {total} messages received")
        notes = [
            f"{n} session(s), each CONNECTed with one SUBSCRIBE (ack auto) to its own queue, "
            f"{per} non-persistent 1 KiB message(s) each sent and received per session; "
            f"{direct.workers} load generator process(es)"
        ]
        notes.append(
            "through the sidecar each ack:auto subscription is client-individual upstream "
            "with one sidecar ACK per message"
        )
        for label, r in (("direct", direct), ("sidecar", side)):
            if r.client_cpu_pct >= 90:
                notes.append(
                    f"the load generator used {r.client_cpu_pct:.0f}% of a core per process in "
                    f"the {label} run: it may be the bottleneck there"
                )
        tp = Row(
            workload=f"scale-{n}-sessions-throughput",
            broker=ctx.flavor,
            unit="msg/s",
            direct=total / direct.transfer_s,
            sidecar=total / side.transfer_s,
            notes=notes,
        )
        tp.extra = {
            "sessions": n,
            "messages": total,
            "connect_s": {
                "direct": round(direct.connect_s, 2),
                "sidecar": round(side.connect_s, 2),
            },
            "client_cpu_pct": {
                "direct": round(direct.client_cpu_pct),
                "sidecar": round(side.client_cpu_pct),
            },
            "sidecar_cpu_pct": round(100 * side.sidecar_transfer_cpu / side.transfer_s),
            "sidecar_cpu_us_per_msg": round(1e6 * side.sidecar_transfer_cpu / total, 1),
            "broker_cpu_s": {
                "direct": round(direct.broker_cpu_transfer, 2),
                "sidecar": round(side.broker_cpu_transfer, 2),
            },
        }
        rows.append(tp)
        rss = Row(
            workload=f"scale-{n}-sessions-rss",
            broker=ctx.flavor,
            unit="MiB",
            sidecar=side.idle_rss / MIB,
            goal=Goal("sidecar", "<=", 150.0, "<= 150 MiB") if n == 1000 else None,
            notes=["sidecar only: VmRSS with the sessions open and idle"],
        )
        rss.extra = {
            "baseline_mib": round(baseline / MIB, 1),
            "per_session_kib": round((side.idle_rss - baseline) / n / 1024, 1),
        }
        rows.append(rss)
        peak = Row(
            workload=f"scale-{n}-sessions-rss-peak",
            broker=ctx.flavor,
            unit="MiB",
            sidecar=side.load_rss_max / MIB,
            goal=Goal("sidecar", "<=", 150.0, "<= 150 MiB") if n == 1000 else None,
            notes=[
                "sidecar only: the largest VmRSS sampled (every 50 ms) during the transfer; "
                f"the load generator writes each session's {per} message(s) at once, so this "
                "includes what the sidecar holds in flight (confirmation windows, frames "
                "queued both ways)"
            ],
        )
        peak.extra = {
            "baseline_mib": round(baseline / MIB, 1),
            "per_session_kib": round((side.load_rss_max - baseline) / n / 1024, 1),
        }
        rows.append(peak)
        cpu = Row(
            workload=f"scale-{n}-sessions-cpu",
            broker=ctx.flavor,
            unit="ms/sess",
            sidecar=1000 * side.sidecar_connect_cpu / n,
            notes=[
                "sidecar only: CPU to accept, connect upstream and subscribe one session "
                "(run time from /proc/PID/task/*/schedstat, nanoseconds; one session's figure "
                "is one sample); "
                "idle_cpu_pct: the sidecar's CPU with all sessions idle (heart-beats)"
            ],
        )
        cpu.extra = {
            "idle_cpu_pct": round(100 * side.sidecar_idle_cpu / side.idle_seconds, 2),
            "idle_cpu_pct_per_1000_sessions": round(
                100 * side.sidecar_idle_cpu / side.idle_seconds * 1000 / n, 2
            ),
            "transfer_cpu_us_per_msg": round(1e6 * side.sidecar_transfer_cpu / total, 1),
        }
        rows.append(cpu)
    return rows
