"""Latency of SEND+RECEIPT round trips, direct vs through the sidecar, and what it adds.

Two connections (one direct, one through the sidecar) each make ``latency_warmup`` untimed
round trips, then ``latency_n`` timed ones in alternating blocks of 250 (direct block, sidecar
block, ...), so drift on a busy machine hits both alike. Every round trip is one
non-persistent 1 KiB SEND with a receipt, timed from before the write to the RECEIPT's
arrival. Percentiles are nearest-rank over the per-round-trip times; added ms = sidecar -
direct per percentile. Goals (issue 7): p50 adds <= 0.2 ms, p99 adds <= 1 ms.
"""

from __future__ import annotations

import math

from bench import loadgen
from bench.loadgen import RawStomp
from bench.report import Goal, Row
from bench.workloads import BrokerCtx

__all__ = ["PERCENTILES", "percentile", "run_latency"]

#: Reported percentiles and their goals on the added milliseconds.
PERCENTILES: dict[str, tuple[float, Goal | None]] = {
    "p50": (50.0, Goal("added_ms", "<=", 0.2, "<= 0.2 ms added")),
    "p99": (99.0, Goal("added_ms", "<=", 1.0, "<= 1 ms added")),
    "p99.9": (99.9, None),
}
BLOCK = 250


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile ``p`` (0-100] of ``values`` (unsorted is fine).

    Raises ValueError on an empty list.
    """
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    # round(): 99.9 / 100 * 1000 is 999.0000000000001 in floating point, not rank 1000.
    rank = max(1, math.ceil(round(p * len(ordered) / 100, 9)))
    return ordered[rank - 1]


def run_latency(ctx: BrokerCtx) -> list[Row]:
    """One row per percentile in :data:`PERCENTILES` (milliseconds)."""
    st = ctx.settings
    sidecar = ctx.shared_sidecar()
    targets = {"direct": ctx.port, "sidecar": sidecar.port}
    dests = {t: ctx.unique(f"latency-{t}") for t in targets}
    clients = {t: RawStomp(port, ctx.vhost) for t, port in targets.items()}
    times: dict[str, list[float]] = {t: [] for t in targets}
    cpu = {"sidecar": 0.0, "broker_direct": 0.0, "broker_sidecar": 0.0}
    sent = dict.fromkeys(targets, 0)
    try:
        for t, c in clients.items():
            frames, ids = _frames(dests[t], "w", st.latency_warmup)
            loadgen.round_trips(c, frames, ids)
            sent[t] += st.latency_warmup
        ctx.settle()
        block = 0
        while len(times["sidecar"]) < st.latency_n:
            order = ("direct", "sidecar") if block % 2 == 0 else ("sidecar", "direct")
            size = min(BLOCK, st.latency_n - len(times["sidecar"]))
            for t in order:
                frames, ids = _frames(dests[t], f"b{block}-", size)
                s0 = sidecar.cpu()
                b0 = ctx.broker_cpu()
                times[t] += loadgen.round_trips(clients[t], frames, ids)
                if t == "sidecar":
                    cpu["sidecar"] += sidecar.cpu() - s0
                cpu[f"broker_{t}"] += ctx.broker_cpu() - b0
                sent[t] += size
            block += 1
    finally:
        for c in clients.values():
            c.disconnect()
    for t, dest in dests.items():
        loadgen.drain(ctx.port, ctx.vhost, dest, sent[t])
    rows = []
    for name, (p, goal) in PERCENTILES.items():
        direct_ms = 1000 * percentile(times["direct"], p)
        sidecar_ms = 1000 * percentile(times["sidecar"], p)
        row = Row(
            workload=f"latency-send-receipt-{name}",
            broker=ctx.flavor,
            unit="ms",
            direct=direct_ms,
            sidecar=sidecar_ms,
            added_ms=sidecar_ms - direct_ms,
            goal=goal,
        )
        row.extra = {
            "round_trips": st.latency_n,
            "warmup": st.latency_warmup,
            "persistent": False,
        }
        if name == "p50":
            n = len(times["sidecar"])
            row.extra["sidecar_cpu_us_per_round_trip"] = round(1e6 * cpu["sidecar"] / n, 1)
            row.extra["broker_cpu_us_per_round_trip"] = {
                t: round(1e6 * cpu[f"broker_{t}"] / n, 1) for t in targets
            }
            row.extra["mean_ms"] = {t: round(1000 * sum(v) / len(v), 4) for t, v in times.items()}
        if ctx.flavor == "rabbitmq":
            row.notes.append("a RabbitMQ SEND receipt is a publisher confirm (both paths)")
        rows.append(row)
    return rows


def _frames(dest: str, prefix: str, n: int) -> tuple[list[bytes], list[bytes]]:
    ids = [f"{prefix}{i}" for i in range(n)]
    frames = [loadgen.send_frame(dest, persistent=False, receipt=i) for i in ids]
    return frames, [i.encode() for i in ids]
