"""The compiled core against the pure-Python one, in one run: ``python -m bench.native``.

Two parts (docs/architecture.md, "The compiled core"):

* **micro**: parsing and serialising typical frames, a server :class:`protocol.Connection`
  receiving SENDs and sending MESSAGEs, and the confirmation window's append and confirm,
  each timed in a child process of the compiled build and one with ``MQ_SIDECAR_PURE=1``,
  alternating, best of ``--micro-reps`` rounds per build (nanoseconds per operation);
* **sidecar**: the throughput workloads of :mod:`bench.workloads.throughput` through two
  sidecar processes in front of one broker, one compiled and one pure (checked in
  ``/proc/PID/maps``: the compiled one maps ``protocol/_core__mypyc``), repetitions
  alternating, median of ``--reps``: the sidecar's CPU (user + system) per message.

It prints both tables with the ratio pure / compiled (above 1: the compiled build is
faster) and writes ``bench/results/native.json``. Needs the compiled build (scripts/setup.sh).

::

    .venv/bin/python -m bench.native                                 # both parts, ActiveMQ
    .venv/bin/python -m bench.native --micro-only
    .venv/bin/python -m bench.native --workloads send-ff consume-auto --n 20000 --reps 5
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench.report import write_document
from bench.sidecar import SidecarProcess
from bench.workloads import BrokerCtx, Settings, bench_broker
from bench.workloads.throughput import WORKLOADS, run_once
from protocol import Command, Connection, Frame, FrameParser, Role, _native, serialize
from proxy.tracking.window import ConfirmationWindow

__all__ = ["main"]

RESULTS = Path(__file__).parent / "results"
PURE_ENV = "MQ_SIDECAR_PURE"
_BODY = b"x" * 1024


# -- micro ------------------------------------------------------------------------------------


def _micro_cases() -> dict[str, tuple[Callable[[int], None], int]]:
    """name -> (run ``n`` operations, default ``n``)."""
    send = Frame.build(
        Command.SEND,
        {
            "destination": "/queue/bench",
            "persistent": "true",
            "receipt": "r-1234",
            "mq-sidecar-id": "job-7-p3-r12345",
            "content-type": "application/json",
        },
        _BODY,
    )
    message = Frame.build(
        Command.MESSAGE,
        {
            "destination": "/queue/bench",
            "message-id": "ID:host-40123-1700000000000-1:1:1:1:4242",
            "subscription": "sub-0",
            "ack": "ID:host-40123-1700000000000-1:1:1:1:4242",
            "priority": "4",
            "timestamp": "1700000000000",
            "expires": "0",
            "persistent": "true",
            "mq-sidecar-id": "job-7-p3-r12345",
            "content-length": "1024",
        },
        _BODY,
    )
    batch = 100

    def parse(frame: Frame) -> Callable[[int], None]:
        data = serialize(frame, "1.2") * batch

        def run(n: int) -> None:
            for _ in range(n // batch):
                parser = FrameParser(version="1.2")
                parser.receive_data(data)
                for _ in range(batch):
                    parser.next_event()

        return run

    def serialize_(frame: Frame) -> Callable[[int], None]:
        def run(n: int) -> None:
            for _ in range(n):
                serialize(frame, "1.2")

        return run

    def connected_server() -> Connection:
        conn = Connection(Role.SERVER, judge_frames=False)
        connect = Frame.build(Command.CONNECT, {"accept-version": "1.2", "host": "/"})
        conn.receive_data(serialize(connect, "1.0"))
        conn.next_event()
        conn.send(Frame.build(Command.CONNECTED, {"version": "1.2"}))
        return conn

    def connection_receive(n: int) -> None:
        data = serialize(send, "1.2") * batch
        for _ in range(n // batch):
            conn = connected_server()
            conn.receive_data(data)
            for _ in range(batch):
                conn.next_event()

    def connection_send(n: int) -> None:
        conn = connected_server()
        for _ in range(n):
            conn.send(message)

    def window(n: int) -> None:
        # As a session of fire-and-forget SENDs: a receipt every 100th frame confirms those
        # before it.
        win = ConfirmationWindow(1 << 30, receipt_prefix="s-r")
        for i in range(n):
            last = i % batch == batch - 1
            entry = win.append(send, app_receipt=None, want_receipt=last, now=0.0)
            if last and entry.receipt is not None:
                win.confirm(entry.receipt)

    return {
        "parse SEND (1 KiB, 5 headers)": (parse(send), 200_000),
        "parse MESSAGE (1 KiB, 10 headers)": (parse(message), 200_000),
        "serialize SEND": (serialize_(send), 200_000),
        "serialize MESSAGE": (serialize_(message), 200_000),
        "Connection: receive a SEND": (connection_receive, 200_000),
        "Connection: send a MESSAGE": (connection_send, 200_000),
        "window: append (+ confirm per 100)": (window, 200_000),
    }


def _micro_child(scale: float) -> None:
    """Time every case once (after a warm-up) and print ``{name: ns per op}`` as JSON."""
    out: dict[str, Any] = {"status": _native.STATUS, "ns": {}}
    for name, (run, default) in _micro_cases().items():
        n = max(1000, int(default * scale))
        run(n // 10)
        started = time.perf_counter()
        run(n)
        out["ns"][name] = (time.perf_counter() - started) / n * 1e9
    print(json.dumps(out))


def _child_env(pure: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != PURE_ENV}
    if pure:
        env[PURE_ENV] = "1"
    return env


def run_micro(reps: int, scale: float) -> dict[str, Any]:
    """Best ns per op of each case in each build, ``reps`` alternating child processes each."""
    best: dict[str, dict[str, float]] = {"compiled": {}, "pure": {}}
    status: dict[str, str] = {}
    for rep in range(reps):
        order = ("compiled", "pure") if rep % 2 == 0 else ("pure", "compiled")
        for build in order:
            out = subprocess.run(
                [sys.executable, "-m", "bench.native", "--micro-child", f"--scale={scale}"],
                capture_output=True,
                text=True,
                check=True,
                env=_child_env(build == "pure"),
                cwd=Path(__file__).resolve().parents[1],
            )
            got = json.loads(out.stdout)
            status[build] = got["status"]
            for name, ns in got["ns"].items():
                best[build][name] = min(ns, best[build].get(name, float("inf")))
    if not status["compiled"].startswith("compiled"):
        raise SystemExit(f"no compiled build to compare: {status['compiled']}")
    rows = [
        {
            "case": name,
            "compiled_ns": round(best["compiled"][name]),
            "pure_ns": round(best["pure"][name]),
            "ratio": round(best["pure"][name] / best["compiled"][name], 2),
        }
        for name in best["compiled"]
    ]
    print(f"\nmicro: ns per operation, best of {reps} runs per build")
    print(f"  {'case':38} {'compiled':>9} {'pure':>9} {'pure/compiled':>14}")
    for row in rows:
        print(
            f"  {row['case']:38} {row['compiled_ns']:>9,} {row['pure_ns']:>9,} "
            f"{row['ratio']:>13.2f}x"
        )
    return {"status": status, "reps": reps, "rows": rows}


# -- sidecar ----------------------------------------------------------------------------------


@contextlib.contextmanager
def _environ(name: str, value: str | None) -> Iterator[None]:
    """``os.environ[name]`` set (or removed) for the block: a sidecar takes its build from
    the environment it is started in."""
    old = os.environ.get(name)
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def _maps_compiled_core(pid: int) -> bool:
    return "_core__mypyc" in Path(f"/proc/{pid}/maps").read_text()


def run_sidecars(flavor: str, workloads: list[str], n: int, reps: int) -> dict[str, Any]:
    """Sidecar CPU per message of each workload through a compiled and a pure sidecar."""
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="mq-bench-native-") as tmp:
        workdir = Path(tmp)
        broker = bench_broker(flavor, "native", workdir)
        print(f"\n[{flavor}] starting the broker and two sidecars ...", flush=True)
        with broker:
            settings = Settings(n=n, reps=reps)
            ctxs: dict[str, BrokerCtx] = {}
            for build in ("compiled", "pure"):
                ctx = BrokerCtx(flavor, broker, workdir, settings)
                with _environ(PURE_ENV, "1" if build == "pure" else None):
                    sidecar = SidecarProcess(ctx.url, workdir, vhost=ctx.vhost)
                    sidecar.start()
                ctx._sidecar = sidecar
                if _maps_compiled_core(sidecar.pid) != (build == "compiled"):
                    raise SystemExit(f"the {build} sidecar runs the other build")
                ctxs[build] = ctx
            try:
                for name in workloads:
                    count = max(100, int(n * WORKLOADS[name].fraction))
                    for build in ("compiled", "pure"):  # warm-up, untimed
                        run_once(ctxs[build], "sidecar", name, False, min(count, 5000))
                    cpu: dict[str, list[float]] = {"compiled": [], "pure": []}
                    rate: dict[str, list[float]] = {"compiled": [], "pure": []}
                    for rep in range(reps):
                        order = ("compiled", "pure") if rep % 2 == 0 else ("pure", "compiled")
                        for build in order:
                            sample = run_once(ctxs[build], "sidecar", name, False, count)
                            assert sample.front_cpu is not None
                            cpu[build].append(round(sample.front_cpu / count * 1e6, 2))
                            rate[build].append(sample.m.rate)
                    row: dict[str, Any] = {
                        "workload": f"{name}/non-persistent",
                        "messages": count,
                        "compiled_us_per_msg": round(statistics.median(cpu["compiled"]), 1),
                        "pure_us_per_msg": round(statistics.median(cpu["pure"]), 1),
                        "compiled_msg_per_s": round(statistics.median(rate["compiled"])),
                        "pure_msg_per_s": round(statistics.median(rate["pure"])),
                        "samples_us_per_msg": cpu,
                    }
                    row["ratio"] = round(row["pure_us_per_msg"] / row["compiled_us_per_msg"], 2)
                    rows.append(row)
                    print(
                        f"[{flavor}]   {row['workload']}: sidecar CPU {row['compiled_us_per_msg']}"
                        f" us/msg compiled, {row['pure_us_per_msg']} pure ({row['ratio']:.2f}x); "
                        f"{row['compiled_msg_per_s']:,} vs {row['pure_msg_per_s']:,} msg/s",
                        flush=True,
                    )
            finally:
                for ctx in ctxs.values():
                    ctx.close()
    print(f"\nsidecar CPU per message ({flavor}, 1 KiB, median of {reps} runs per build)")
    print(f"  {'workload':32} {'compiled':>9} {'pure':>9} {'pure/compiled':>14}")
    for row in rows:
        print(
            f"  {row['workload']:32} {row['compiled_us_per_msg']:>6} us {row['pure_us_per_msg']:>6}"
            f" us {row['ratio']:>13.2f}x"
        )
    return {"broker": flavor, "reps": reps, "n": n, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.native", description=__doc__.split("\n")[0])
    ap.add_argument("--micro-only", action="store_true", help="only the micro benchmarks")
    ap.add_argument("--micro-reps", type=int, default=5, help="child processes per build")
    ap.add_argument("--scale", type=float, default=1.0, help="micro operation counts x this")
    ap.add_argument("--broker", choices=["activemq", "rabbitmq"], default="activemq")
    ap.add_argument(
        "--workloads",
        nargs="+",
        default=["send-ff", "send-pipelined", "send-sync", "consume-auto", "consume-client"],
        help="throughput workloads (bench.workloads.throughput), non-persistent",
    )
    ap.add_argument("--n", type=int, default=20_000, help="messages per run (x the workload's)")
    ap.add_argument("--reps", type=int, default=3, help="runs per build, alternating")
    ap.add_argument("--out", type=Path, default=RESULTS / "native.json")
    ap.add_argument("--micro-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.micro_child:
        _micro_child(args.scale)
        return 0
    result: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "loadavg_start": os.getloadavg(),
        "micro": run_micro(args.micro_reps, args.scale),
    }
    if not args.micro_only:
        result["sidecar"] = run_sidecars(args.broker, args.workloads, args.n, args.reps)
    result["loadavg_end"] = os.getloadavg()
    write_document(args.out, result)
    print(f"\nwritten to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
