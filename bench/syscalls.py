"""System calls per synchronous SEND+RECEIPT round trip, in the sidecar and in a C byte relay:
``.venv/bin/python -m bench.syscalls``.

Issue 18, part 3: the latency of a single round trip is bounded by the process wakeups and
system calls on its path. This starts a broker (``testbed``), the sidecar (``python -m proxy
run``, default options) and ``socat`` (:mod:`bench.relay`) in front of it; for each of the
relay and the sidecar it opens one connection of the load generator, makes ``--warmup``
untimed round trips (one non-persistent 1 KiB SEND with a receipt, awaited) and ``--n``
untraced ones (their wall time and the process's CPU per round trip: run time from
``schedstat``, user and system from ``/proc/PID/stat``), then attaches ``strace -c -f`` to
the process that carries the connection (the sidecar with all its threads; the socat child
forked for the connection), makes ``--n`` round trips, and divides strace's call counts by
``n``; then the same for ``--stream`` fire-and-forget SENDs (written 100 per ``sendall``, as
``bench.run``'s send-ff), per message. ``epoll_wait``/``poll``/``select`` calls are the
wakeup figure (a process blocks in them between two events; trio also calls ``epoll_wait``,
with a zero timeout, once per scheduler pass with tasks runnable). An idle window is traced
last, so what the process does on its own (timers, heart-beats) is printed next to it.

strace slows every system call down (ptrace stops), so only the counts mean anything under
it, never the times. Prints a per-syscall table per round trip and per streamed SEND (relay,
sidecar) and, with ``--show K``, the full trace of the last ``K`` round trips of each; writes
``bench/results/syscalls.json``. Needs ``strace`` (``scripts/setup.sh``) and ptrace rights
(root, or ``kernel.yama.ptrace_scope`` 0).

Examples::

    .venv/bin/python -m bench.syscalls                      # ActiveMQ, 2,000 round trips
    .venv/bin/python -m bench.syscalls --broker rabbitmq --n 500 --show 2
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench import loadgen
from bench.loadgen import RawStomp
from bench.procstat import cpu_split, run_ns
from bench.relay import RelayProcess
from bench.report import write_document
from bench.workloads import BrokerCtx, Settings, bench_broker
from protocol import _native

__all__ = ["WAKEUPS", "Count", "Measured", "main", "parse_summary", "syscall_table"]

#: The system calls a process blocks in while it waits for its next event: one per wakeup.
WAKEUPS = frozenset({"epoll_wait", "epoll_pwait", "epoll_pwait2", "poll", "ppoll", "select"})
WAKEUPS_ALSO = frozenset({"pselect6"})
#: Seconds to wait for strace to report that it attached.
ATTACH_TIMEOUT = 10.0
RESULTS = Path(__file__).parent / "results"


@dataclass
class Count:
    """What strace -c counted for one process over one window: calls and errors per system
    call, the window's units (round trips, or messages of a stream; 0 for an idle window) and
    seconds (wall, under strace)."""

    calls: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    units: int = 0
    seconds: float = 0.0

    def per_unit(self) -> dict[str, float]:
        """Calls per unit by system call (empty for an idle window)."""
        if self.units <= 0:
            return {}
        return {name: calls / self.units for name, calls in self.calls.items()}

    @property
    def total(self) -> int:
        """Calls of every system call."""
        return sum(self.calls.values())

    @property
    def wakeups(self) -> int:
        """Calls of the blocking waits (:data:`WAKEUPS`, ``pselect6``)."""
        return sum(c for n, c in self.calls.items() if n in WAKEUPS or n in WAKEUPS_ALSO)

    def to_json(self) -> dict[str, object]:
        """Per-unit figures as a JSON object."""
        units = max(1, self.units)
        return {
            "units": self.units,
            "per_unit": {k: round(v, 3) for k, v in self.per_unit().items()},
            "errors": self.errors,
            "total_per_unit": round(self.total / units, 3),
            "wakeups_per_unit": round(self.wakeups / units, 3),
            "seconds_under_strace": round(self.seconds, 2),
        }


@dataclass
class Measured:
    """Everything measured on one target: synchronous round trips (``sync``), a
    fire-and-forget stream (``stream``, per message), an idle window (``idle``), the CPU per
    round trip without strace (``cpu_us``: wall, cpu, user, system microseconds) and the full
    trace of a few round trips (``trace``, empty unless asked)."""

    sync: Count
    stream: Count
    idle: Count
    cpu_us: dict[str, float]
    trace: str = ""


def parse_summary(text: str) -> tuple[dict[str, int], dict[str, int]]:
    """Calls and errors by system call from the summary ``strace -c`` writes (its table:
    ``% time seconds usecs/call calls errors syscall``, errors empty when none, a ``total``
    line at the end). Lines that are not table rows are skipped."""
    calls: dict[str, int] = {}
    errors: dict[str, int] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) not in (5, 6) or fields[-1] == "total" or not fields[3].isdigit():
            continue
        try:
            float(fields[0])
        except ValueError:
            continue
        name = fields[-1]
        calls[name] = calls.get(name, 0) + int(fields[3])
        if len(fields) == 6:
            errors[name] = errors.get(name, 0) + int(fields[4])
    return calls, errors


class _Strace:
    """``strace`` attached to ``pids`` (``-f``: all their threads and future children),
    summary (``-c``) or full trace into ``out``; stopped with SIGINT (strace then detaches
    and writes its output)."""

    def __init__(self, pids: list[int], out: Path, *, summary: bool) -> None:
        exe = shutil.which("strace")
        if exe is None:
            raise SystemExit("strace is not installed (scripts/setup.sh)")
        command = [exe, "-f", "-o", str(out)]
        command += ["-c"] if summary else ["-tt", "-s", "48"]
        for pid in pids:
            command += ["-p", str(pid)]
        self.out = out
        self.proc = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )

    def wait_attached(self) -> None:
        """Block until strace reports an attached process (then a short pause for the rest
        of the threads). Raises RuntimeError when it exits first or does not attach in
        :data:`ATTACH_TIMEOUT` seconds."""
        assert self.proc.stderr is not None
        deadline = time.monotonic() + ATTACH_TIMEOUT
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline().decode(errors="replace")
            if "attached" in line:
                time.sleep(0.3)
                return
            if not line and self.proc.poll() is not None:
                break
        self.stop()
        raise RuntimeError("strace did not attach (ptrace rights? kernel.yama.ptrace_scope)")

    def stop(self) -> str:
        """Detach (SIGINT) and return what strace wrote."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.out.read_text(errors="replace") if self.out.exists() else ""


def _round_trips(c: RawStomp, dest: str, prefix: str, n: int) -> float:
    """``n`` SEND+RECEIPT round trips on ``c``; their wall seconds."""
    ids = [f"{prefix}{i}" for i in range(n)]
    frames = [loadgen.send_frame(dest, persistent=False, receipt=i) for i in ids]
    t0 = time.perf_counter()
    loadgen.round_trips(c, frames, [i.encode() for i in ids])
    return time.perf_counter() - t0


def _count(pids: list[int], out: Path, work: Callable[[], float], units: int) -> Count:
    """strace -c on ``pids`` while ``work`` runs (it returns its seconds); ``units``: the
    round trips or messages it makes."""
    tracer = _Strace(pids, out, summary=True)
    tracer.wait_attached()
    try:
        seconds = work()
    finally:
        text = tracer.stop()
    calls, errors = parse_summary(text)
    return Count(calls, errors, units, seconds)


def _idle(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def _cpu_per_round_trip(pids: list[int], c: RawStomp, dest: str, n: int) -> dict[str, float]:
    """Wall, CPU (run time, ns resolution), user and system (clock ticks) microseconds per
    round trip of ``pids`` over ``n`` untraced round trips."""
    run0 = sum(run_ns(p) for p in pids)
    split0 = [cpu_split(p) for p in pids]
    seconds = _round_trips(c, dest, "u", n)
    run1 = sum(run_ns(p) for p in pids)
    split1 = [cpu_split(p) for p in pids]
    user = sum(b[0] - a[0] for a, b in zip(split0, split1, strict=True))
    system = sum(b[1] - a[1] for a, b in zip(split0, split1, strict=True))
    return {
        "wall": round(1e6 * seconds / n, 1),
        "cpu": round((run1 - run0) / 1e3 / n, 1),
        "user": round(1e6 * user / n, 1),
        "system": round(1e6 * system / n, 1),
    }


def _measure(ctx: BrokerCtx, target: str, args: argparse.Namespace, workdir: Path) -> Measured:
    """What :class:`Measured` holds, for ``target`` ("relay" or "sidecar")."""
    front = ctx.front(target)
    assert front is not None
    before = set(front.children()) if isinstance(front, RelayProcess) else set()
    c = RawStomp(front.port, ctx.vhost)
    dest = ctx.unique(f"syscalls-{target}")
    sent = 0
    try:
        if isinstance(front, RelayProcess):
            pids = sorted(set(front.children()) - before)
            if len(pids) != 1:
                raise RuntimeError(f"expected one new socat child, found {pids}")
        else:
            pids = [front.pid]
        _round_trips(c, dest, "w", args.warmup)
        sent += args.warmup
        ctx.settle()
        cpu_us = _cpu_per_round_trip(pids, c, dest, args.n)
        sent += args.n
        sync = _count(
            pids,
            workdir / f"{target}-sync.txt",
            lambda: _round_trips(c, dest, f"t{time.monotonic_ns()}-", args.n),
            args.n,
        )
        sent += args.n
        stream = _count(
            pids,
            workdir / f"{target}-stream.txt",
            lambda: loadgen.send_fire_and_forget(c, dest, args.stream, persistent=False).seconds,
            args.stream,
        )
        sent += args.stream
        idle = _count(
            pids, workdir / f"{target}-idle.txt", lambda: _idle(min(sync.seconds, 5.0)), 0
        )
        trace = ""
        if args.show:
            tracer = _Strace(pids, workdir / f"{target}-trace.txt", summary=False)
            tracer.wait_attached()
            try:
                _round_trips(c, dest, "s", args.show)
                sent += args.show
            finally:
                trace = tracer.stop()
    finally:
        c.disconnect()
        loadgen.drain(ctx.port, ctx.vhost, dest, sent)
    return Measured(sync, stream, idle, cpu_us, trace)


def syscall_table(counts: dict[str, Count], unit: str = "round trip") -> str:
    """Calls per ``unit`` by system call, one column per target, most frequent first, then
    the total and the wakeups (:data:`WAKEUPS`)."""
    targets = list(counts)
    per = {t: counts[t].per_unit() for t in targets}
    names = sorted(
        {n for p in per.values() for n in p}, key=lambda n: -max(p.get(n, 0) for p in per.values())
    )
    head = f"{'syscall per ' + unit:<28}" + "".join(f"{t:>10}" for t in targets)
    lines = [head, "-" * len(head)]
    for name in names:
        lines.append(f"{name:<28}" + "".join(f"{per[t].get(name, 0.0):>10.2f}" for t in targets))
    lines.append("-" * len(head))
    for label, attr in (("total", "total"), ("wakeups (epoll/poll/select)", "wakeups")):
        lines.append(
            f"{label:<28}"
            + "".join(
                f"{getattr(counts[t], attr) / max(1, counts[t].units):>10.2f}" for t in targets
            )
        )
    return "\n".join(lines)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m bench.syscalls",
        description="system calls per SEND+RECEIPT round trip: sidecar vs socat relay (strace)",
    )
    ap.add_argument("--broker", choices=["activemq", "rabbitmq"], default="activemq")
    ap.add_argument("--n", type=int, default=2000, help="traced round trips per target")
    ap.add_argument("--warmup", type=int, default=500, help="untimed round trips first")
    ap.add_argument(
        "--stream", type=int, default=10000, help="traced fire-and-forget SENDs per target"
    )
    ap.add_argument("--show", type=int, default=0, metavar="K", help="print a full trace of K")
    ap.add_argument("--out", type=Path, default=RESULTS / "syscalls.json", help="JSON output")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the count; returns the exit status."""
    args = _parse(argv)
    if args.n <= 0:
        raise SystemExit("--n must be positive")
    print(f"syscalls per SEND+RECEIPT on {args.broker}: {args.n} traced round trips", flush=True)
    print(f"sidecar build: {_native.STATUS}", flush=True)
    measured: dict[str, Measured] = {}
    with tempfile.TemporaryDirectory(prefix="mq-syscalls-") as tmp:
        workdir = Path(tmp)
        with bench_broker(args.broker, "syscalls", workdir) as broker:
            ctx = BrokerCtx(args.broker, broker, workdir, Settings())
            try:
                for target in ("relay", "sidecar"):
                    measured[target] = _measure(ctx, target, args, workdir)
            finally:
                ctx.close()
    table = syscall_table({t: m.sync for t, m in measured.items()})
    stream = syscall_table({t: m.stream for t, m in measured.items()}, "ff SEND")
    print(table)
    print(f"\nfire-and-forget, {args.stream} SENDs written {loadgen.BATCH} per sendall:")
    print(stream)
    print()
    for target, m in measured.items():
        rate = m.idle.total / m.idle.seconds if m.idle.seconds else 0.0
        cpu = m.cpu_us
        print(
            f"{target}: without strace {cpu['wall']:.0f} us per round trip, CPU {cpu['cpu']:.1f}"
            f" us (user {cpu['user']:.0f}, system {cpu['system']:.0f}: clock ticks); idle it "
            f"made {rate:.1f} syscalls/s"
        )
    for target, m in measured.items():
        if m.trace:
            print(f"\n{target}, the last {args.show} round trip(s) in full:\n{m.trace}")
    results = {
        "broker": args.broker,
        "sidecar_build": _native.STATUS,
        "round_trips": args.n,
        "stream": args.stream,
        "table": table,
        "stream_table": stream,
        "targets": {
            t: {
                "sync": m.sync.to_json(),
                "stream": m.stream.to_json(),
                "idle_syscalls_per_s": round(m.idle.total / m.idle.seconds, 2)
                if m.idle.seconds
                else None,
                "cpu_us_per_round_trip": m.cpu_us,
            }
            for t, m in measured.items()
        },
    }
    write_document(args.out, results)
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
