"""mq-sidecar benchmarks, direct vs through a C byte relay vs through the sidecar:
``.venv/bin/python -m bench.run``.

Starts its own brokers with ``testbed`` (ActiveMQ, RabbitMQ, and fresh ActiveMQ shared-store
pairs for the kill -9 takeovers) on free 127.0.0.1 ports in a temporary directory and stops
them at the end; the sidecar runs as its own process (``python -m proxy run``). Every figure
through the sidecar is measured in the same run as the same workload sent directly to the same
broker, by the same load generator (``bench.loadgen``), and reported as a ratio; the throughput
and latency workloads also run through ``socat`` in front of the same broker (``bench.relay``),
the floor any relay pays on this machine (issue 18). Prints a table and the goals table of
issue 18 (``bench.goals``: figure / relay / sidecar / goal / met?) and writes
``bench/results/latest.json`` (one object per workload and broker) and
``bench/results/latest-meta.json`` (run settings, machine, load generator capacity, timings,
the goals table).

``outbox`` (issue 17, :mod:`bench.workloads.outbox_mode`): persistent SENDs direct, through
the sidecar and through a second sidecar with ``outbox = true``, in rotation; its rows carry
an ``outbox`` figure and are printed again in a table of their own (RECEIPT latency and
throughput, the outbox sidecar's CPU, fsyncs and disk bytes per frame).

Examples::

    .venv/bin/python -m bench.run                            # everything, both brokers
    .venv/bin/python -m bench.run --broker activemq --only latency send-ff
    .venv/bin/python -m bench.run --quick                    # small counts: a smoke run
    .venv/bin/python -m bench.run --broker activemq --only outbox  # persistent SENDs, outbox
    .venv/bin/python -m bench.run --list                     # workload names

A full run takes about 12 minutes on a 2-core machine (the outbox workload: 1-2 per broker).
Never run as a timed test.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import loadgen
from bench.goals import format_goals, goal_lines
from bench.loadgen import RawStomp
from bench.report import Row, print_outbox_table, print_table, write_document, write_json
from bench.workloads import TARGETS, BrokerCtx, Settings, bench_broker
from bench.workloads.failover import run_blackhole, run_kill9, run_reset
from bench.workloads.latency import run_latency
from bench.workloads.outbox_mode import run_outbox
from bench.workloads.scale import run_scale
from bench.workloads.throughput import WORKLOADS, run_throughput
from protocol import _native
from proxy._version import VERSION
from testbed import activemq_installed, rabbitmq_installed

__all__ = ["ALL", "main"]

RESULTS = Path(__file__).parent / "results"

#: Workload names for ``--only``, in run order per broker (``kill9``: ActiveMQ only).
ALL: tuple[str, ...] = (
    *WORKLOADS,
    "latency",
    "outbox",
    "reset",
    "blackhole",
    "scale",
    "kill9",
)
#: Group names for ``--only``.
GROUPS: dict[str, tuple[str, ...]] = {
    "throughput": tuple(WORKLOADS),
    "failover": ("kill9", "reset", "blackhole"),
}


def _option_value(text: str) -> object:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    if "," in text:
        parts = [p.strip() for p in text.split(",")]
        if all(p.lstrip("-").isdigit() for p in parts):
            return [int(p) for p in parts]
    return text


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m bench.run",
        description="mq-sidecar benchmarks: each workload direct and through the sidecar.",
    )
    ap.add_argument("--broker", choices=["activemq", "rabbitmq", "both"], default="both")
    ap.add_argument(
        "--only",
        nargs="+",
        metavar="WORKLOAD",
        help=f"run only these workloads or groups: {', '.join((*ALL, *GROUPS))}",
    )
    ap.add_argument("--quick", action="store_true", help="small counts, one repetition (smoke)")
    ap.add_argument("--n", type=int, help="messages per throughput run (default 20000)")
    ap.add_argument("--reps", type=int, help="repetitions per target (default 3)")
    ap.add_argument("--latency-n", type=int, help="timed round trips per target (default 5000)")
    ap.add_argument("--failover-reps", type=int, help="kill -9 takeovers (default 20)")
    ap.add_argument("--sessions", type=int, nargs="+", help="scale session counts (1 100 1000)")
    ap.add_argument(
        "--persistence",
        choices=["both", "persistent", "non-persistent"],
        default="both",
        help="throughput workloads: which delivery modes",
    )
    ap.add_argument(
        "--sidecar-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="configuration option for every sidecar started (TOML name, e.g. "
        "retry_interval=50); repeatable",
    )
    ap.add_argument("--out", type=Path, default=RESULTS / "latest.json", help="JSON output")
    ap.add_argument("--list", action="store_true", help="list workload names and exit")
    return ap.parse_args(argv)


def _settings(args: argparse.Namespace) -> Settings:
    st = Settings()
    if args.quick:
        st = Settings(
            n=1000,
            reps=1,
            latency_n=300,
            latency_warmup=50,
            failover_reps=2,
            reset_reps=2,
            blackhole_reps=1,
            blackhole_intervals=(500,),
            scale_sessions=(1, 20),
            scale_messages=200,
            scale_idle_seconds=0.5,
            quick=True,
        )
    if args.n is not None:
        st.n = args.n
    if args.reps is not None:
        st.reps = args.reps
    if args.latency_n is not None:
        st.latency_n = args.latency_n
    if args.failover_reps is not None:
        st.failover_reps = args.failover_reps
    if args.sessions:
        st.scale_sessions = tuple(args.sessions)
    st.persistence = {
        "both": (False, True),
        "persistent": (True,),
        "non-persistent": (False,),
    }[args.persistence]
    for item in args.sidecar_option:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--sidecar-option: expected KEY=VALUE, got {item!r}")
        st.sidecar_options[key.strip()] = _option_value(value.strip())
    return st


def _selected(only: list[str] | None) -> list[str]:
    if not only:
        return list(ALL)
    chosen: set[str] = set()
    for name in only:
        if name in GROUPS:
            chosen.update(GROUPS[name])
        elif name in ALL:
            chosen.add(name)
        else:
            raise SystemExit(f"unknown workload {name!r}; known: {', '.join((*ALL, *GROUPS))}")
    return [w for w in ALL if w in chosen]


def _raise_fd_limit(sessions: int) -> dict[str, Any]:
    """Raise RLIMIT_NOFILE's soft limit to the hard one when 1,000 sessions need it: the
    sidecar (a child, inheriting it) holds two sockets per session, the harness's load
    generator processes one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 2 * sessions + 512
    info: dict[str, Any] = {"soft": soft, "hard": hard, "needed": need}
    if soft != resource.RLIM_INFINITY and soft < need:
        new = hard if hard == resource.RLIM_INFINITY else min(hard, max(need, soft))
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        info["raised_to"] = new
        print(f"raised RLIMIT_NOFILE soft limit {soft} -> {new} (hard {hard})", flush=True)
    if hard != resource.RLIM_INFINITY and hard < need:
        info["warning"] = f"hard limit {hard} < {need}: 1,000 sessions may fail (ulimit -Hn)"
    return info


def _warm_up(ctx: BrokerCtx) -> None:
    """Untimed traffic on every path: the JVM's JIT and the broker's caches warm up before
    the first measured run (direct, relay and sidecar alike)."""
    n = min(ctx.settings.n, 10_000)
    for port in (ctx.target_port(t) for t in TARGETS):
        dest = ctx.unique("warmup")
        c = RawStomp(port, ctx.vhost)
        loadgen.send_fire_and_forget(c, dest, n, persistent=False)
        c.disconnect()
        c = RawStomp(port, ctx.vhost)
        loadgen.consume(c, dest, n, ack="client-individual")
        c.disconnect()


def _note_stomppy(rows: list[Row], capacity: dict[str, Any]) -> None:
    """Say where stomp.py would have been the bottleneck: a consumer row whose direct rate is
    at least 80 % of what stomp.py manages per CPU-second against a null broker (one core)."""
    ref = capacity.get("stomppy_consume_auto", {}).get("msg_per_cpu_s")
    raw = capacity.get("rawstomp_consume_auto", {}).get("msg_per_cpu_s")
    if not ref or not raw:
        return
    for row in rows:
        if row.workload.startswith("consume") and row.direct and row.direct >= 0.8 * ref:
            row.notes.append(
                f"stomp.py tops out at ~{ref:,} msg/s per core consuming (null broker): as the "
                "client it would have been the bottleneck here; the raw-socket load generator "
                f"manages ~{raw:,} msg/s per core"
            )


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3f}"


def _keep_logs(workdir: Path, keep: Path) -> list[str]:
    """Copy the sidecar logs under ``workdir`` that report an error to ``keep``; their new
    paths. The run's temporary directory is deleted at the end, the logs of a failure are
    what the lead needs to see."""
    kept = []
    for log in sorted(workdir.rglob("sidecar-*.log")):
        text = log.read_text(errors="replace")
        if " ERROR " in text or "Traceback" in text:
            keep.mkdir(parents=True, exist_ok=True)
            target = keep / f"{log.parent.name}-{log.name}"
            shutil.copyfile(log, target)
            kept.append(str(target))
    return kept


def _attempt(
    rows: list[Row],
    failures: list[str],
    label: str,
    where: tuple[str, Path, Path],
    fn: Callable[[], list[Row]],
) -> None:
    """Run one workload; on failure keep going and record a row with the error.

    ``where``: (broker name, the broker's work directory, where to keep failure logs).
    """
    broker, workdir, keep = where
    t0 = time.monotonic()
    print(f"[{broker}] {label} ...", flush=True)
    try:
        got = fn()
    except Exception as exc:
        detail = f"{type(exc).__name__}: {exc}"
        print(f"[{broker}] {label} FAILED: {detail}", flush=True)
        traceback.print_exc()
        kept = _keep_logs(workdir, keep)
        if kept:
            detail += f" (sidecar logs: {', '.join(kept)})"
            print(f"[{broker}] sidecar logs kept: {', '.join(kept)}", flush=True)
        failures.append(f"{broker} {label}: {detail}")
        rows.append(Row(workload=label, broker=broker, unit="-", error=detail[:2000]))
        return
    if any(row.extra.get("failed_reps") for row in got):
        kept = _keep_logs(workdir, keep)
        for row in got:
            if row.extra.get("failed_reps") and kept:
                row.notes.append(f"sidecar logs of the failures: {', '.join(kept)}")
    for row in got:
        ratio = "-" if row.ratio is None else f"{row.ratio:.3f}"
        relay = "" if row.relay is None else f"relay {_num(row.relay)}, "
        outbox = "" if row.outbox is None else f", outbox {_num(row.outbox)}"
        print(
            f"[{broker}]   {row.workload}: direct {_num(row.direct)}, {relay}sidecar "
            f"{_num(row.sidecar)}{outbox} {row.unit}, ratio {ratio}",
            flush=True,
        )
    print(f"[{broker}] {label} done in {time.monotonic() - t0:.1f} s", flush=True)
    rows.extend(got)


def _run_broker(
    ctx: BrokerCtx, *, selected: list[str], rows: list[Row], failures: list[str], keep: Path
) -> None:
    flavor = ctx.flavor
    st = ctx.settings
    where = (flavor, ctx.workdir, keep)
    try:
        if any(w in WORKLOADS for w in selected):

            def warm() -> list[Row]:
                _warm_up(ctx)
                return []

            _attempt(rows, failures, "warm-up", where, warm)
        for name in (w for w in selected if w in WORKLOADS):
            for persistent in st.persistence:

                def one(name: str = name, persistent: bool = persistent) -> list[Row]:
                    return [run_throughput(ctx, name, persistent)]

                label = f"{name}/{'persistent' if persistent else 'non-persistent'}"
                _attempt(rows, failures, label, where, one)
        if "latency" in selected:
            _attempt(rows, failures, "latency", where, lambda: run_latency(ctx))
        if "outbox" in selected:
            _attempt(rows, failures, "outbox", where, lambda: run_outbox(ctx))
        ctx.close()  # the shared sidecar and relay are not needed any more
        if "reset" in selected:
            _attempt(rows, failures, "reattach-after-reset", where, lambda: [run_reset(ctx)])
        if "blackhole" in selected:
            _attempt(rows, failures, "blackhole", where, lambda: run_blackhole(ctx))
        if "scale" in selected:
            _attempt(rows, failures, "scale", where, lambda: run_scale(ctx))
    finally:
        ctx.close()


def main(argv: list[str] | None = None) -> int:
    """Run the selected benchmarks; returns the exit status (1 if any workload failed)."""
    args = _parse(argv)
    if args.list:
        for name in ALL:
            print(name)
        for group, members in GROUPS.items():
            print(f"{group}: {' '.join(members)}")
        return 0
    st = _settings(args)
    selected = _selected(args.only)
    flavors = ["activemq", "rabbitmq"] if args.broker == "both" else [args.broker]
    started = time.time()
    t0 = time.monotonic()
    meta: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "argv": sys.argv[1:] if argv is None else argv,
        "settings": dict(vars(st)),
        "workloads": selected,
        "brokers": flavors,
        "sidecar_version": VERSION,
        # the compiled core or the sources: the sidecar child decides as this process did
        "sidecar_build": _native.STATUS,
        "machine": {
            "cpus": os.cpu_count(),
            "loadavg_start": os.getloadavg(),
            "python": platform.python_version(),
            "kernel": platform.release(),
        },
        "fd_limit": _raise_fd_limit(max(st.scale_sessions) if "scale" in selected else 0),
    }
    print(f"mq-sidecar benchmarks: {', '.join(selected)} on {', '.join(flavors)}", flush=True)
    print(f"sidecar build: {_native.STATUS}", flush=True)
    cap_n = 5_000 if st.quick else 50_000
    try:
        meta["loadgen"] = loadgen.measure_capacity(cap_n, stomppy=not st.quick)
        print(f"load generator capacity (null broker): {json.dumps(meta['loadgen'])}", flush=True)
    except Exception as exc:
        meta["loadgen"] = {"error": f"{type(exc).__name__}: {exc}"}
    rows: list[Row] = []
    failures: list[str] = []
    keep = args.out.parent / "logs" / time.strftime("%Y%m%d-%H%M%S", time.localtime(started))
    with tempfile.TemporaryDirectory(prefix="mq-bench-") as tmp:
        base = Path(tmp)
        for flavor in flavors:
            installed = activemq_installed() if flavor == "activemq" else rabbitmq_installed()
            if not installed:
                failures.append(f"{flavor} is not installed (scripts/setup.sh)")
                print(f"[{flavor}] not installed: skipped", flush=True)
                continue
            workdir = base / flavor
            workdir.mkdir()
            per_broker = [w for w in selected if w != "kill9"]
            if per_broker:
                broker = bench_broker(flavor, "bench", workdir)
                print(f"[{flavor}] starting the broker ...", flush=True)
                try:
                    with broker:
                        ctx = BrokerCtx(flavor, broker, workdir, st)
                        _run_broker(
                            ctx, selected=per_broker, rows=rows, failures=failures, keep=keep
                        )
                except Exception as exc:
                    failures.append(f"{flavor}: {type(exc).__name__}: {exc}")
                    traceback.print_exc()
            if flavor == "activemq" and "kill9" in selected:
                (base / "kill9").mkdir()

                def kill9() -> list[Row]:
                    return [run_kill9(base / "kill9", st)]

                where = ("activemq", base / "kill9", keep)
                _attempt(rows, failures, "failover-kill9-takeover", where, kill9)
    _note_stomppy(rows, meta["loadgen"])
    duration = time.monotonic() - t0
    meta["duration_s"] = round(duration, 1)
    meta["machine"]["loadavg_end"] = os.getloadavg()
    meta["failures"] = failures
    print()
    meta["table"] = print_table(rows)
    if any(r.outbox is not None for r in rows):
        print()
        meta["outbox_table"] = print_outbox_table(rows)
    goals = goal_lines([r for r in rows if r.error is None])
    meta["goals"] = [g.to_json() for g in goals]
    print()
    print(format_goals(goals), flush=True)
    print(f"\n{len(rows)} rows in {duration / 60:.1f} min; written to {args.out}")
    if failures:
        print(f"{len(failures)} failure(s):\n  " + "\n  ".join(failures))
    write_json(args.out, rows)
    meta_path = args.out.with_name(args.out.stem + "-meta.json")
    write_document(meta_path, meta)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
