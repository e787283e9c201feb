"""The floor of a Python relay on trio, beside the sidecar: ``.venv/bin/python -m bench.floor``.

Issue 18 asks for what bounds a goal that is not met. The C relay (``socat``, ``bench.run``)
sets the floor of any relay on this machine; this sets the floor of one written the way the
sidecar is (Python, trio, a task per leg): :mod:`bench.trio_relay`, two tasks and two sockets
per session and no STOMP work. For each of the trio relay and the sidecar (default options,
each a fresh process in front of the same broker) it measures, in one run:

1. the process's RSS (``VmRSS``) fresh, after one connection was relayed;
2. CPU per synchronous round trip: ``--n`` round trips (one non-persistent 1 KiB SEND with a
   receipt, awaited) after ``--warmup``, the process's run time from ``schedstat``
   (nanoseconds) per round trip, and the wall time per round trip;
3. the RSS with ``--sessions`` idle sessions open (each CONNECTed, one SUBSCRIBE with a
   receipt to its own queue), read ``--idle`` seconds after the last one, and the RSS per
   session over the fresh process.

Prints a table and writes ``bench/results/floor.json``. What is the sidecar's own (its STOMP
work, window, session state, metrics) is the difference between the two columns.
"""

from __future__ import annotations

import argparse
import contextlib
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import loadgen
from bench.loadgen import RawStomp
from bench.procstat import rss_bytes, run_ns, wait_cpu_quiet
from bench.report import write_document
from bench.trio_relay import TrioRelayProcess
from bench.workloads import BrokerCtx, Settings, bench_broker
from protocol import Command, Frame, _native, serialize

__all__ = ["main"]

RESULTS = Path(__file__).parent / "results"
MIB = 1024 * 1024
TARGETS = ("trio-relay", "sidecar")


def _round_trip_cpu(pid: int, c: RawStomp, dest: str, n: int, prefix: str) -> dict[str, float]:
    """``n`` SEND+RECEIPT round trips on ``c``: wall and CPU microseconds per round trip of
    process ``pid`` (run time, ns resolution)."""
    ids = [f"{prefix}{i}" for i in range(n)]
    frames = [loadgen.send_frame(dest, persistent=False, receipt=i) for i in ids]
    run0, t0 = run_ns(pid), time.perf_counter()
    loadgen.round_trips(c, frames, [i.encode() for i in ids])
    seconds, run1 = time.perf_counter() - t0, run_ns(pid)
    return {"wall_us": round(1e6 * seconds / n, 1), "cpu_us": round((run1 - run0) / 1e3 / n, 1)}


def _idle_sessions(port: int, ctx: BrokerCtx, count: int) -> list[RawStomp]:
    """``count`` sessions, each CONNECTed and SUBSCRIBEd (with a receipt) to its own queue."""
    sessions: list[RawStomp] = []
    try:
        for i in range(count):
            c = RawStomp(port, ctx.vhost)
            sessions.append(c)
            headers = {"id": "0", "destination": ctx.unique(f"floor-idle{i}"), "ack": "auto"}
            frame = Frame.build(Command.SUBSCRIBE, {**headers, "receipt": "s"})
            c.send(serialize(frame, "1.2"))
            c.wait_receipt(b"s")
    except BaseException:
        _close(sessions)
        raise
    return sessions


def _close(sessions: list[RawStomp]) -> None:
    for c in sessions:
        with contextlib.suppress(OSError):
            c.close()


def _measure(ctx: BrokerCtx, target: str, args: argparse.Namespace) -> dict[str, Any]:
    """The figures of one target, a fresh process of it started and stopped here."""
    front: Any
    if target == "sidecar":
        front = ctx.shared_sidecar()
    else:
        front = TrioRelayProcess(ctx.broker.host, ctx.broker.stomp_port, ctx.workdir)
        front.start()
    try:
        pid = front.pid
        c = RawStomp(front.port, ctx.vhost)
        dest = ctx.unique(f"floor-{target}")
        try:
            time.sleep(0.5)
            fresh = rss_bytes(pid)
            _round_trip_cpu(pid, c, dest, args.warmup, "w")
            ctx.settle()
            wait_cpu_quiet(pid, below=0.1, window=0.2, timeout=2.0)
            sync = _round_trip_cpu(pid, c, dest, args.n, "m")
        finally:
            c.disconnect()
            loadgen.drain(ctx.port, ctx.vhost, dest, args.warmup + args.n)
        sessions = _idle_sessions(front.port, ctx, args.sessions)
        try:
            time.sleep(args.idle)
            idle = rss_bytes(pid)
        finally:
            _close(sessions)
    finally:
        if target == "sidecar":
            ctx.close()
        else:
            front.stop()
    return {
        "rss_fresh_mib": round(fresh / MIB, 1),
        "rss_idle_mib": round(idle / MIB, 1),
        "rss_per_session_kib": round((idle - fresh) / 1024 / args.sessions, 1),
        **sync,
    }


def _table(figures: dict[str, dict[str, Any]], sessions: int) -> str:
    rows = [
        ("RSS, fresh (MiB)", "rss_fresh_mib"),
        (f"RSS, {sessions:,} idle sessions (MiB)", "rss_idle_mib"),
        ("RSS per idle session (KiB)", "rss_per_session_kib"),
        ("CPU per SEND+RECEIPT round trip (us)", "cpu_us"),
        ("wall per round trip (us)", "wall_us"),
    ]
    lines = [f"{'figure':<40}" + "".join(f"{t:>12}" for t in figures)]
    lines.append("-" * len(lines[0]))
    for label, key in rows:
        lines.append(f"{label:<40}" + "".join(f"{f[key]:>12}" for f in figures.values()))
    return "\n".join(lines)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.floor", description=__doc__)
    parser.add_argument("--broker", choices=("activemq", "rabbitmq"), default="activemq")
    parser.add_argument("--n", type=int, default=3000, help="measured round trips per target")
    parser.add_argument("--warmup", type=int, default=500, help="untimed round trips first")
    parser.add_argument("--sessions", type=int, default=1000, help="idle sessions per target")
    parser.add_argument("--idle", type=float, default=3.0, help="seconds idle before the RSS")
    parser.add_argument("--out", type=Path, default=RESULTS / "floor.json")
    args = parser.parse_args(argv)
    if min(args.n, args.warmup, args.sessions) <= 0 or args.idle < 0:
        parser.error("--n, --warmup and --sessions must be positive, --idle not negative")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run both targets; returns the exit status."""
    args = _parse(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 3 * args.sessions + 512  # the harness's sockets and the target's two per session
    if soft != resource.RLIM_INFINITY and soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    print(f"floor on {args.broker}: sidecar build {_native.STATUS}", flush=True)
    figures: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="mq-floor-") as tmp:
        workdir = Path(tmp)
        with bench_broker(args.broker, "floor", workdir) as broker:
            ctx = BrokerCtx(args.broker, broker, workdir, Settings())
            try:
                for target in TARGETS:
                    figures[target] = _measure(ctx, target, args)
                    print(f"{target}: {figures[target]}", flush=True)
            finally:
                ctx.close()
    table = _table(figures, args.sessions)
    print(table)
    write_document(
        args.out,
        {
            "broker": args.broker,
            "sidecar_build": _native.STATUS,
            "round_trips": args.n,
            "sessions": args.sessions,
            "idle_seconds": args.idle,
            "targets": figures,
            "table": table,
        },
    )
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
