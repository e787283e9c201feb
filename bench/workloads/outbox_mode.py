"""Persistent SENDs in outbox mode (issue 17) against the same SENDs direct and through the
sidecar without the outbox, in one run: ``python -m bench.run --only outbox``.

Three targets (:data:`bench.workloads.OUTBOX_TARGETS`) in front of the same broker: the
broker itself ("direct", its own store: KahaDB's journal on ActiveMQ), the shared sidecar
("sidecar": the RECEIPT is the broker's), and a second sidecar process with ``outbox = true``
and ``outbox_dir`` in the run's temporary directory ("outbox": the RECEIPT means the frame is
on the sidecar's local disk, fsynced by the group committer; it reaches the broker later).
Every SEND is persistent with a 1 KiB body. Rows:

- ``outbox-send-sync/persistent`` (msg/s) and ``outbox-receipt-p50`` / ``-p99`` (ms): SEND +
  RECEIPT round trips, one at a time, ``reps`` x n/20 per target in blocks of
  :data:`BLOCK` taken in rotating order (D S O, S O D, O D S...); the rate is round trips
  over their summed time. After each outbox block the harness waits (untimed) until the
  outbox is empty, so its forwarding does not overlap another target's block.
- ``outbox-send-pipelined/persistent`` (n/5 SENDs, receipts, at most 100 unanswered) and
  ``outbox-send-ff/persistent`` (n/2 SENDs without receipts, the last with one), msg/s, the
  targets in rotating order, the median of ``reps``. The clock stops at the last RECEIPT;
  for the outbox the app's DISCONNECT then waits until the sidecar has forwarded everything,
  had it confirmed by the broker and removed it from the outbox (docs/outbox.md): that time
  gives ``outbox_forwarded_msg_s``, the rate end to end.
- ``outbox-broker-down/persistent`` (send-pipelined, n/5): a third sidecar in outbox mode whose
  broker URL points at a closed port, so nothing drains while it fills: the rate at which
  the outbox alone makes SENDs durable, and the disk bytes per frame it holds.

Per outbox row, from the sidecar's ``/status`` ``outbox`` object read before and after:
``commits_per_frame`` (transactions committed, one fsync each, appends and removals alike,
per frame stored), and from ``/proc`` the outbox sidecar's CPU per message (forwarding
included: read after the DISCONNECT). ``outbox_dir_bytes``: the directory's size after the
run (SQLite's WAL keeps its high-water size between checkpoints, so this is about the peak).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import loadgen
from bench.loadgen import Measurement, RawStomp
from bench.report import Row, median
from bench.sidecar import SidecarProcess, broker_url
from bench.workloads import OUTBOX_TARGETS, BrokerCtx, start_sidecar
from bench.workloads.latency import percentile
from testbed import free_port

__all__ = ["BLOCK", "dir_bytes", "run_outbox"]

#: Round trips per block of the send-sync rotation.
BLOCK = 100
#: Seconds to wait for the outbox to empty after a run before calling it a failure.
EMPTY_TIMEOUT = 120.0


def dir_bytes(directory: Path) -> int:
    """Bytes of the regular files directly in ``directory`` (0 when it does not exist)."""
    if not directory.is_dir():
        return 0
    return sum(p.stat().st_size for p in directory.iterdir() if p.is_file())


def _outbox(front: SidecarProcess) -> dict[str, Any]:
    """The ``/status`` ``outbox`` object of a sidecar in outbox mode."""
    got = front.status()["outbox"]
    if not isinstance(got, dict):
        raise loadgen.LoadgenError(f"{front.name}: /status has no outbox object: {got!r}")
    return got


def _wait_empty(front: SidecarProcess, timeout: float = EMPTY_TIMEOUT) -> dict[str, Any]:
    """Poll ``/status`` (every 5 ms) until the outbox holds no frame; its last ``outbox``
    object. Raises LoadgenError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        status = _outbox(front)
        if status["frames"] == 0:
            return status
        if time.monotonic() > deadline:
            raise loadgen.LoadgenError(f"outbox still holds {status['frames']} frames")
        time.sleep(0.005)


def _frames(dest: str, prefix: str, n: int) -> tuple[list[bytes], list[bytes]]:
    ids = [f"{prefix}{i}" for i in range(n)]
    frames = [loadgen.send_frame(dest, persistent=True, receipt=i) for i in ids]
    return frames, [i.encode() for i in ids]


def _warm_up(ctx: BrokerCtx, n: int) -> None:
    """Untimed persistent SENDs with receipts on every target (the outbox sidecar's first
    appends create its database; the JIT of the broker warms up)."""
    for target in OUTBOX_TARGETS:
        dest = ctx.unique(f"outbox-warmup-{target}")
        c = RawStomp(ctx.target_port(target), ctx.vhost)
        loadgen.send_pipelined(c, dest, n, persistent=True, window=100)
        c.disconnect()
        loadgen.drain(ctx.port, ctx.vhost, dest, n)


@dataclass
class _Sample:
    """One timed run on one target: the measurement, the front's CPU seconds (None direct),
    and for the outbox: seconds until everything was forwarded, transactions committed,
    frames forwarded, the outbox_dir's size after."""

    m: Measurement
    cpu: float | None = None
    forwarded_s: float | None = None
    commits: int | None = None
    forwarded: int | None = None
    dir_bytes: int | None = None


def _client(name: str) -> Callable[[RawStomp, str, int], Measurement]:
    if name == "send-pipelined":
        return lambda c, d, n: loadgen.send_pipelined(c, d, n, persistent=True, window=100)
    if name == "send-ff":
        return lambda c, d, n: loadgen.send_fire_and_forget(c, d, n, persistent=True)
    raise ValueError(f"unknown outbox workload {name!r}")


def _run_once(ctx: BrokerCtx, target: str, name: str, n: int) -> _Sample:
    """One timed run of ``name`` with ``n`` persistent SENDs against ``target`` on a fresh
    queue, drained and counted after. Raises LoadgenError on a shortfall."""
    dest = ctx.unique(f"outbox-{name}-{target}")
    ctx.settle()
    front = ctx.front(target)
    assert front is None or isinstance(front, SidecarProcess)
    port = ctx.port if front is None else front.port
    outbox = front if target == "outbox" else None
    before = _outbox(outbox) if outbox is not None else None
    c = RawStomp(port, ctx.vhost)
    sample: _Sample
    try:
        f0 = front.cpu() if front is not None else 0.0
        t0 = time.perf_counter()
        sample = _Sample(_client(name)(c, dest, n))
    finally:
        c.disconnect()  # in outbox mode: waits until all was forwarded, confirmed, removed
    if front is not None:
        sample.cpu = front.cpu() - f0
    if outbox is not None and before is not None:
        sample.forwarded_s = time.perf_counter() - t0
        after = _wait_empty(outbox)
        sample.commits = after["commits"] - before["commits"]
        sample.forwarded = after["forwarded_total"] - before["forwarded_total"]
        sample.dir_bytes = dir_bytes(ctx.workdir / "outbox")
    got = loadgen.drain(ctx.port, ctx.vhost, dest, n)
    if got != n:
        raise loadgen.LoadgenError(f"{target} {dest}: {n} messages sent, {got} drained")
    return sample


def _row(ctx: BrokerCtx, workload: str, unit: str, figures: dict[str, float]) -> Row:
    """A row of ``figures`` by target (:data:`OUTBOX_TARGETS`); for ms, ``added_ms`` is
    sidecar - direct."""
    row = Row(
        workload=workload,
        broker=ctx.flavor,
        unit=unit,
        direct=figures["direct"],
        sidecar=figures["sidecar"],
        outbox=figures["outbox"],
    )
    if unit == "ms":
        row.added_ms = figures["sidecar"] - figures["direct"]
    return row


def _outbox_extra(samples: list[_Sample], n: int) -> dict[str, Any]:
    """The outbox figures of a throughput row (medians over ``samples``)."""
    return {
        "outbox_forwarded_msg_s": round(
            median([n / s.forwarded_s for s in samples if s.forwarded_s])
        ),
        "commits_per_frame": round(median([(s.commits or 0) / n for s in samples]), 4),
        "frames_per_commit": round(median([n / max(1, s.commits or 0) for s in samples]), 2),
        "outbox_forwarded_frames": [s.forwarded for s in samples],
        "outbox_dir_bytes": max(s.dir_bytes or 0 for s in samples),
    }


def _throughput(ctx: BrokerCtx, name: str, fraction: float) -> Row:
    st = ctx.settings
    n = max(50, int(st.n * fraction))
    samples: dict[str, list[_Sample]] = {t: [] for t in OUTBOX_TARGETS}
    k = len(OUTBOX_TARGETS)
    for rep in range(st.reps):
        for target in OUTBOX_TARGETS[rep % k :] + OUTBOX_TARGETS[: rep % k]:
            samples[target].append(_run_once(ctx, target, name, n))
    rates = {t: median([s.m.rate for s in v]) for t, v in samples.items()}
    row = _row(ctx, f"outbox-{name}/persistent", "msg/s", rates)
    row.extra = {
        "count": n,
        "persistent": True,
        "reps": st.reps,
        "samples": {t: [round(s.m.rate) for s in v] for t, v in samples.items()},
        "client_cpu_pct": {
            t: round(max(s.m.client_cpu_pct for s in v)) for t, v in samples.items()
        },
    }
    for target in ("sidecar", "outbox"):
        cpu = median([s.cpu or 0.0 for s in samples[target]])
        row.extra[f"{target}_cpu_us_per_msg"] = round(1e6 * cpu / n, 1)
    row.extra.update(_outbox_extra(samples["outbox"], n))
    return row


def _sync(ctx: BrokerCtx) -> list[Row]:
    """Persistent SEND + RECEIPT round trips, the targets' blocks in rotating order: a
    send-sync rate row and the p50 and p99 RECEIPT latency rows."""
    st = ctx.settings
    total = st.reps * max(50, int(st.n * 0.05))
    outbox = ctx.outbox_sidecar()
    fronts = {t: ctx.front(t) for t in OUTBOX_TARGETS}
    dests = {t: ctx.unique(f"outbox-sync-{t}") for t in OUTBOX_TARGETS}
    clients = {t: RawStomp(ctx.target_port(t), ctx.vhost) for t in OUTBOX_TARGETS}
    times: dict[str, list[float]] = {t: [] for t in OUTBOX_TARGETS}
    cpu = dict.fromkeys(OUTBOX_TARGETS, 0.0)
    before = _outbox(outbox)
    try:
        ctx.settle()
        block = 0
        while len(times["outbox"]) < total:
            k = block % len(OUTBOX_TARGETS)
            size = min(BLOCK, total - len(times["outbox"]))
            for t in OUTBOX_TARGETS[k:] + OUTBOX_TARGETS[:k]:
                frames, ids = _frames(dests[t], f"b{block}-", size)
                front = fronts[t]
                f0 = front.cpu() if front is not None else 0.0
                times[t] += loadgen.round_trips(clients[t], frames, ids)
                if t == "outbox":
                    _wait_empty(outbox)  # its forwarding does not spill into the next block
                if front is not None:
                    cpu[t] += front.cpu() - f0
            block += 1
    finally:
        for c in clients.values():
            c.disconnect()
    after = _wait_empty(outbox)
    for t, dest in dests.items():
        got = loadgen.drain(ctx.port, ctx.vhost, dest, total)
        if got != total:
            raise loadgen.LoadgenError(f"{t} {dest}: {total} messages sent, {got} drained")
    rate = {t: len(v) / sum(v) for t, v in times.items()}
    sync = _row(ctx, "outbox-send-sync/persistent", "msg/s", rate)
    commits = after["commits"] - before["commits"]
    sync.extra = {
        "count": total,
        "persistent": True,
        "block": BLOCK,
        "sidecar_cpu_us_per_msg": round(1e6 * cpu["sidecar"] / total, 1),
        "outbox_cpu_us_per_msg": round(1e6 * cpu["outbox"] / total, 1),
        "commits_per_frame": round(commits / total, 4),
        "outbox_forwarded_frames": after["forwarded_total"] - before["forwarded_total"],
        "mean_ms": {t: round(1000 * sum(v) / len(v), 4) for t, v in times.items()},
    }
    rows = [sync]
    for name, p in (("p50", 50.0), ("p99", 99.0)):
        ms = {t: 1000 * percentile(v, p) for t, v in times.items()}
        row = _row(ctx, f"outbox-receipt-{name}", "ms", ms)
        row.extra = {"round_trips": total, "persistent": True, "block": BLOCK}
        row.extra["outbox_added_ms"] = round(ms["outbox"] - ms["direct"], 4)
        rows.append(row)
    return rows


def _broker_down(ctx: BrokerCtx, n: int) -> Row:
    """Persistent pipelined SENDs into a sidecar in outbox mode whose broker is a closed
    port: nothing drains, so the outbox's own rate and its disk bytes per frame held."""
    directory = ctx.workdir / "outbox-down"
    dead = broker_url("127.0.0.1", free_port(), ctx.vhost)
    sidecar = start_sidecar(dead, ctx.workdir, ctx.outbox_options(directory), ctx.vhost)
    try:
        empty = dir_bytes(directory)
        before = _outbox(sidecar)
        c = RawStomp(sidecar.port, ctx.vhost)
        try:
            f0 = sidecar.cpu()
            m = loadgen.send_pipelined(c, ctx.unique("outbox-down"), n, persistent=True)
            cpu = sidecar.cpu() - f0
        finally:
            c.disconnect()  # answered by the sidecar itself: no broker, all is durable
        after = _outbox(sidecar)
        held = after["frames"] - before["frames"]
        if held != n:
            raise loadgen.LoadgenError(f"outbox (broker down) holds {held} of {n} frames")
        size = dir_bytes(directory)
    finally:
        sidecar.stop()
    frame = len(loadgen.send_frame("/queue/x", persistent=True))
    row = Row(
        workload="outbox-broker-down/persistent",
        broker=ctx.flavor,
        unit="msg/s",
        outbox=m.rate,
    )
    row.extra = {
        "count": n,
        "persistent": True,
        "outbox_cpu_us_per_msg": round(1e6 * cpu / n, 1),
        "commits_per_frame": round((after["commits"] - before["commits"]) / n, 4),
        "outbox_frame_bytes_held": after["bytes"],
        "outbox_dir_bytes": size,
        "disk_bytes_per_frame": round((size - empty) / n),
        "wire_bytes_per_send": frame,
    }
    row.notes.append(
        "no broker: the outbox only fills; its files (outbox.db + WAL) over the frames held"
    )
    return row


def run_outbox(ctx: BrokerCtx) -> list[Row]:
    """The outbox workload's rows (module docstring): send-sync with its p50/p99 RECEIPT
    latency, send-pipelined and send-ff (all persistent), and the broker-down run."""
    st = ctx.settings
    _warm_up(ctx, min(st.n // 5, 2_000))
    rows = _sync(ctx)
    rows.append(_throughput(ctx, "send-pipelined", 0.2))
    rows.append(_throughput(ctx, "send-ff", 0.5))
    rows.append(_broker_down(ctx, max(50, int(st.n * 0.2))))
    broker = (
        "a publisher confirm: on disk in its message store"
        if ctx.flavor == "rabbitmq"
        else "synced in KahaDB's journal"
    )
    for row in rows:
        row.notes.append(
            "outbox: the RECEIPT means stored and fsynced on the sidecar's disk, not yet at "
            f"the broker; direct and sidecar: the broker's RECEIPT ({broker})"
        )
    return rows
