"""Throughput with 1 KiB bodies, direct, through a C byte relay and through the sidecar, on one
connection.

Workloads (each persistent and non-persistent):

- ``send-ff``: fire-and-forget SENDs; the clock stops at the RECEIPT of a final SEND;
- ``send-sync``: a receipt on every SEND, awaited before the next;
- ``send-pipelined``: a receipt on every SEND, at most 100 unanswered;
- ``consume-auto``: a queue pre-filled directly with the messages, consumed with ack auto;
- ``consume-client``: the same with ack client-individual, one ACK per message; the clock
  stops at the receipt of the last ACK.

Counts (``n`` = ``Settings.n``, 20,000 by default): n for send-ff and the consumers, n/10 for
send-sync, n/2 for send-pipelined; half of that when persistent (send-pipelined: n/5), since
every persistent message is written to disk and those runs are 5-10x slower.

Fairness: the three targets take turns in rotating order (D R S, R S D, S D R...) with fresh
queues, the same load generator and counts; the median rate of ``reps`` runs per target is
reported with every sample. Queues filled by a SEND run are drained (untimed) before the next
run, so ActiveMQ's producer flow control never kicks in. The CPU used by the sidecar, the relay
(with its forked children), the broker and the load generator is read per run; a client,
relay or sidecar at >= 90 % of a core is named in the notes. A row's ``direct``, ``relay``
and ``sidecar`` are the median rates, ``ratio`` sidecar / direct, ``relay_ratio`` relay /
direct, ``sidecar_vs_relay`` sidecar / relay (issue 18's goal: >= 0.8).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from bench import loadgen
from bench.loadgen import Measurement, RawStomp
from bench.report import Goal, Row, median
from bench.workloads import TARGETS, BrokerCtx

__all__ = ["WORKLOADS", "Sample", "run_once", "run_throughput"]


@dataclass(frozen=True)
class _Spec:
    name: str
    fraction: float  # of Settings.n, non-persistent
    persistent_fraction: float  # of Settings.n, persistent (fsyncs make these runs slow)
    kind: str  # "send" or "consume"
    goal: Goal | None


_RATIO_95 = Goal("ratio", ">=", 0.95, ">= 0.95x direct")
_RATIO_90 = Goal("ratio", ">=", 0.90, ">= 0.90x direct")

#: The throughput workloads by name, in run order.
WORKLOADS: dict[str, _Spec] = {
    s.name: s
    for s in (
        _Spec("send-ff", 1.0, 0.5, "send", _RATIO_90),
        _Spec("send-sync", 0.1, 0.05, "send", None),
        _Spec("send-pipelined", 0.5, 0.2, "send", _RATIO_95),
        _Spec("consume-auto", 1.0, 0.5, "consume", _RATIO_95),
        _Spec("consume-client", 1.0, 0.5, "consume", _RATIO_95),
    )
}

#: Percentage of one core above which a process is called saturated in the notes.
SATURATED_PCT = 90.0


@dataclass
class Sample:
    """One run: the load generator's measurement, and the CPU seconds the relay or sidecar
    in front of the broker (None for a direct run) and the broker used during it."""

    m: Measurement
    front_cpu: float | None
    broker_cpu: float


def _client(name: str, persistent: bool) -> Callable[[RawStomp, str, int], Measurement]:
    if name == "send-ff":
        return lambda c, d, n: loadgen.send_fire_and_forget(c, d, n, persistent=persistent)
    if name == "send-sync":
        return lambda c, d, n: loadgen.send_sync(c, d, n, persistent=persistent)
    if name == "send-pipelined":
        return lambda c, d, n: loadgen.send_pipelined(c, d, n, persistent=persistent, window=100)
    if name == "consume-auto":
        return lambda c, d, n: loadgen.consume(c, d, n, ack="auto")
    if name == "consume-client":
        return lambda c, d, n: loadgen.consume(c, d, n, ack="client-individual")
    raise ValueError(f"unknown throughput workload {name!r}")


def run_once(ctx: BrokerCtx, target: str, name: str, persistent: bool, n: int) -> Sample:
    """One timed run of workload ``name`` with ``n`` messages against ``target`` ("direct",
    "relay" or "sidecar": the shared relay or sidecar of ``ctx``), on a fresh queue (filled
    first for the consumers, drained and counted after the senders). Raises LoadgenError on a
    shortfall."""
    spec = WORKLOADS[name]
    dest = ctx.unique(spec.name)
    if spec.kind == "consume":
        loadgen.fill(ctx.port, ctx.vhost, dest, n, persistent=persistent)
    ctx.settle()
    front = ctx.front(target)
    port = front.port if front is not None else ctx.port
    c = RawStomp(port, ctx.vhost)  # connected (and a relay's child forked) before the clock
    try:
        f0 = front.cpu() if front is not None else 0.0
        b0 = ctx.broker_cpu()
        m = _client(spec.name, persistent)(c, dest, n)
        f1 = front.cpu() if front is not None else 0.0
        b1 = ctx.broker_cpu()
    finally:
        c.disconnect()
    if spec.kind == "send":
        got = loadgen.drain(ctx.port, ctx.vhost, dest, n)
        if got != n:
            raise loadgen.LoadgenError(f"{dest}: {n} messages sent, {got} drained")
    return Sample(m, (f1 - f0) if front is not None else None, b1 - b0)


def _notes(ctx: BrokerCtx, spec: _Spec, persistent: bool) -> list[str]:
    notes: list[str] = []
    rabbit = ctx.flavor == "rabbitmq"
    if rabbit and spec.kind == "send":
        if spec.name == "send-ff":
            notes.append(
                "through the sidecar every SEND to RabbitMQ carries a receipt (a publisher "
                "confirm: RabbitMQ's receipts overtake each other, so they are not cumulative); "
                "the direct run sends none but the last"
            )
        else:
            notes.append(
                "RabbitMQ confirms each receipt on its own (not cumulative); receipts may "
                "arrive out of order on both paths"
            )
    if spec.name == "consume-auto":
        notes.append(
            "through the sidecar an ack:auto subscription is acknowledged upstream by the "
            "sidecar after it wrote the messages to the app, ACKs the direct run does not send: "
            + (
                "one per message (client-individual: a RabbitMQ client ACK would span the "
                "connection)"
                if rabbit
                else "one cumulative client ACK per burst"
            )
        )
    if not rabbit and persistent and spec.name in ("send-sync", "send-pipelined"):
        notes.append(
            "ActiveMQ stores each receipted persistent SEND synchronously, so pipelining "
            "helps little (docs/brokers.md, Receipts)"
        )
    return notes


def run_throughput(
    ctx: BrokerCtx, name: str, persistent: bool, *, on_sample: Callable[[str], None] | None = None
) -> Row:
    """Run workload ``name`` (a key of :data:`WORKLOADS`) ``ctx.settings.reps`` times per
    target (:data:`bench.workloads.TARGETS`) and return its row (msg/s; ratio = sidecar /
    direct of the medians)."""
    spec = WORKLOADS[name]
    st = ctx.settings
    n = max(50, int(st.n * (spec.persistent_fraction if persistent else spec.fraction)))
    samples: dict[str, list[Sample]] = {t: [] for t in TARGETS}
    for rep in range(st.reps):
        order = TARGETS[rep % len(TARGETS) :] + TARGETS[: rep % len(TARGETS)]
        for target in order:
            sample = run_once(ctx, target, name, persistent, n)
            samples[target].append(sample)
            if on_sample is not None:
                on_sample(f"{target} {sample.m.rate:,.0f} msg/s")
    label = "persistent" if persistent else "non-persistent"
    row = Row(
        workload=f"{name}/{label}",
        broker=ctx.flavor,
        unit="msg/s",
        direct=median([s.m.rate for s in samples["direct"]]),
        relay=median([s.m.rate for s in samples["relay"]]),
        sidecar=median([s.m.rate for s in samples["sidecar"]]),
        goal=spec.goal,
        notes=_notes(ctx, spec, persistent),
    )
    client_pct = {t: max(s.m.client_cpu_pct for s in v) for t, v in samples.items()}
    row.extra = {
        "count": n,
        "persistent": persistent,
        "reps": st.reps,
        "samples": {t: [round(s.m.rate) for s in v] for t, v in samples.items()},
    }
    for target in ("relay", "sidecar"):
        cpu_s, pct = _front_cpu(samples[target])
        row.extra[f"{target}_cpu_s"] = round(cpu_s, 3)
        row.extra[f"{target}_cpu_pct"] = round(pct)
        row.extra[f"{target}_cpu_us_per_msg"] = round(1e6 * cpu_s / n, 1)
        if pct >= SATURATED_PCT:
            what = "one trio thread" if target == "sidecar" else "socat copies on one thread"
            row.notes.append(
                f"the {target} used {pct:.0f}% of a core: it is CPU-bound here ({what})"
            )
    row.extra["broker_cpu_s"] = {
        t: round(median([s.broker_cpu for s in v]), 3) for t, v in samples.items()
    }
    row.extra["client_cpu_pct"] = {t: round(p) for t, p in client_pct.items()}
    for target, pct in client_pct.items():
        if pct >= SATURATED_PCT:
            row.notes.append(
                f"the load generator used {pct:.0f}% of a core in a {target} run: it may be "
                "the bottleneck there"
            )
    return row


def _front_cpu(samples: list[Sample]) -> tuple[float, float]:
    """Median CPU seconds of the process in front of the broker over ``samples``, and its
    median percentage of one core."""
    cpu = [s.front_cpu for s in samples if s.front_cpu is not None]
    pct = [
        100 * s.front_cpu / s.m.seconds
        for s in samples
        if s.front_cpu is not None and s.m.seconds > 0
    ]
    return median(cpu), median(pct)
