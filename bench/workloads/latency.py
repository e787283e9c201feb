"""Latency of SEND+RECEIPT round trips, direct, through a C byte relay and through the sidecar,
and what each adds.

Three connections (direct, through the relay, through the sidecar) each make
``latency_warmup`` untimed round trips, then ``latency_n`` timed ones in blocks of 250 taken
in rotating order (D R S, R S D, S D R...), so drift on a busy machine hits all alike. Every
round trip is one non-persistent 1 KiB SEND with a receipt, timed from before the write to the
RECEIPT's arrival. Percentiles are nearest-rank over the per-round-trip times; added ms =
sidecar - direct (``relay_added_ms``: relay - direct) per percentile. Goals (issue 7): p50
adds <= 0.2 ms, p99 adds <= 1 ms; issue 18's (<= 0.15 / <= 0.8 ms) are in the goals table
(:mod:`bench.goals`)."""

from __future__ import annotations

import math

from bench import loadgen
from bench.loadgen import RawStomp
from bench.report import Goal, Row
from bench.workloads import TARGETS, BrokerCtx

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
    fronts = {t: ctx.front(t) for t in TARGETS}
    dests = {t: ctx.unique(f"latency-{t}") for t in TARGETS}
    clients = {t: RawStomp(ctx.target_port(t), ctx.vhost) for t in TARGETS}
    times: dict[str, list[float]] = {t: [] for t in TARGETS}
    front_cpu = dict.fromkeys(TARGETS, 0.0)
    broker_cpu = dict.fromkeys(TARGETS, 0.0)
    sent = dict.fromkeys(TARGETS, 0)
    try:
        for t, c in clients.items():
            frames, ids = _frames(dests[t], "w", st.latency_warmup)
            loadgen.round_trips(c, frames, ids)
            sent[t] += st.latency_warmup
        ctx.settle()
        block = 0
        while len(times["sidecar"]) < st.latency_n:
            k = block % len(TARGETS)
            size = min(BLOCK, st.latency_n - len(times["sidecar"]))
            for t in TARGETS[k:] + TARGETS[:k]:
                frames, ids = _frames(dests[t], f"b{block}-", size)
                front = fronts[t]
                f0 = front.cpu() if front is not None else 0.0
                b0 = ctx.broker_cpu()
                times[t] += loadgen.round_trips(clients[t], frames, ids)
                if front is not None:
                    front_cpu[t] += front.cpu() - f0
                broker_cpu[t] += ctx.broker_cpu() - b0
                sent[t] += size
            block += 1
    finally:
        for c in clients.values():
            c.disconnect()
    for t, dest in dests.items():
        loadgen.drain(ctx.port, ctx.vhost, dest, sent[t])
    rows = []
    for name, (p, goal) in PERCENTILES.items():
        ms = {t: 1000 * percentile(times[t], p) for t in TARGETS}
        row = Row(
            workload=f"latency-send-receipt-{name}",
            broker=ctx.flavor,
            unit="ms",
            direct=ms["direct"],
            relay=ms["relay"],
            sidecar=ms["sidecar"],
            added_ms=ms["sidecar"] - ms["direct"],
            relay_added_ms=ms["relay"] - ms["direct"],
            goal=goal,
        )
        row.extra = {
            "round_trips": st.latency_n,
            "warmup": st.latency_warmup,
            "persistent": False,
        }
        if name == "p50":
            n = len(times["sidecar"])
            for t in ("relay", "sidecar"):
                row.extra[f"{t}_cpu_us_per_round_trip"] = round(1e6 * front_cpu[t] / n, 1)
            row.extra["broker_cpu_us_per_round_trip"] = {
                t: round(1e6 * broker_cpu[t] / n, 1) for t in TARGETS
            }
            row.extra["mean_ms"] = {t: round(1000 * sum(v) / len(v), 4) for t, v in times.items()}
        if ctx.flavor == "rabbitmq":
            row.notes.append("a RabbitMQ SEND receipt is a publisher confirm (all paths)")
        rows.append(row)
    return rows


def _frames(dest: str, prefix: str, n: int) -> tuple[list[bytes], list[bytes]]:
    ids = [f"{prefix}{i}" for i in range(n)]
    frames = [loadgen.send_frame(dest, persistent=False, receipt=i) for i in ids]
    return frames, [i.encode() for i in ids]
