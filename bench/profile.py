"""Where the sidecar spends its CPU: one workload through a sidecar process, sampled by py-spy.

::

    python -m bench.profile                                   # send-ff on ActiveMQ
    python -m bench.profile --broker rabbitmq --workload consume-auto --n 50000
    python -m bench.profile --workload send-sync --n 5000 --raw /tmp/send-sync.txt

It starts its own broker (testbed, free loopback ports, a temporary directory) and a sidecar
with default options (:mod:`bench.sidecar`), runs the workload once directly and once through
the sidecar to warm both up, then once directly and once through the sidecar while
``py-spy record`` samples the sidecar process (only while it runs Python: idle waits are not
sampled). It prints the two rates (one run each: a hint, not a benchmark; ``bench.run`` is the
benchmark), the sidecar's CPU per message split into user and system time, and the functions
with the most samples:

- *self*: samples whose innermost Python frame is the function; C calls made from its lines
  (``socket.send``, ``str.join``...) count there, since py-spy shows Python frames;
- *inclusive*: samples with the function anywhere on the stack (a function that calls itself
  counts once per sample).

``--raw FILE`` keeps py-spy's collapsed stacks (one ``frame;frame;... count`` line per stack)
for a flame graph tool. The workloads are those of :mod:`bench.workloads.throughput`. Needs
py-spy (in the ``test`` extra) and a Linux that lets it read the sidecar's memory (root here).
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.procstat import cpu_split
from bench.workloads import BrokerCtx, Settings, bench_broker
from bench.workloads.throughput import WORKLOADS, Sample, run_once

__all__ = ["hot_functions", "main"]

#: A frame of py-spy's raw output: ``function (file:line)``; the line number is dropped so
#: that the lines of one function add up.
_LINE = re.compile(r":\d+\)$")
#: Frames under which everything runs (the interpreter, click, the CLI): left out of the
#: inclusive table, where they would only say "100%".
_ROOTS = re.compile(
    r"\(<frozen runpy>\)|\(click/|\(proxy/__main__\.py\)|^(run|unrolled_run) \(trio/"
)


def hot_functions(
    collapsed: str, top: int
) -> tuple[int, list[tuple[str, float]], list[tuple[str, float]]]:
    """From py-spy's collapsed stacks: (total samples, the ``top`` functions by self share,
    the ``top`` by inclusive share); shares are fractions of all samples."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.splitlines():
        stack, _, count_text = line.rstrip().rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = [_LINE.sub(")", frame) for frame in stack.split(";")]
        own[frames[-1]] += count
        for frame in set(frames):
            if not _ROOTS.search(frame):
                inclusive[frame] += count
    if not total:
        return 0, [], []
    return (
        total,
        [(f, c / total) for f, c in own.most_common(top)],
        [(f, c / total) for f, c in inclusive.most_common(top)],
    )


def _py_spy() -> str | None:
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.profile",
        description="Profile the sidecar under one workload with py-spy.",
    )
    parser.add_argument("--broker", choices=["activemq", "rabbitmq"], default="activemq")
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="send-ff")
    parser.add_argument("--n", type=int, default=50_000, help="messages (default 50000)")
    parser.add_argument("--persistent", action="store_true", help="persistent messages")
    parser.add_argument("--rate", type=int, default=500, help="py-spy samples per second")
    parser.add_argument("--top", type=int, default=30, help="functions listed per table")
    parser.add_argument("--raw", type=Path, help="keep py-spy's collapsed stacks in this file")
    return parser.parse_args(argv)


def _profiled_run(
    ctx: BrokerCtx, args: argparse.Namespace, py_spy: str, raw: Path
) -> tuple[Sample, float, float]:
    """The sidecar run under py-spy: its sample, user and system CPU seconds of the sidecar."""
    pid = ctx.shared_sidecar().pid
    command = [py_spy, "record", "--pid", str(pid), "--rate", str(args.rate)]
    command += ["--format", "raw", "--output", str(raw), "--nonblocking"]
    spy = subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        time.sleep(1.0)  # py-spy attaches
        if spy.poll() is not None:
            err = spy.stderr.read().decode(errors="replace") if spy.stderr else ""
            raise RuntimeError(f"py-spy exited at once: {err.strip()}")
        user0, sys0 = cpu_split(pid)
        sample = run_once(ctx, "sidecar", args.workload, args.persistent, args.n)
        user1, sys1 = cpu_split(pid)
    finally:
        spy.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
        try:
            spy.wait(60)
        except subprocess.TimeoutExpired:
            spy.kill()
            spy.wait(10)
    return sample, user1 - user0, sys1 - sys0


def main(argv: list[str] | None = None) -> int:
    """Run the profile; returns the exit status (2: py-spy missing or it failed)."""
    args = _parse(argv)
    py_spy = _py_spy()
    if py_spy is None:
        print("py-spy is not installed (it is in the test extra: scripts/setup.sh)")
        return 2
    label = f"{args.workload}/{'persistent' if args.persistent else 'non-persistent'}"
    print(f"profiling the sidecar: {label}, {args.n:,} x 1 KiB on {args.broker}", flush=True)
    with tempfile.TemporaryDirectory(prefix="mq-profile-") as tmp:
        workdir = Path(tmp)
        with bench_broker(args.broker, "profile", workdir) as broker:
            ctx = BrokerCtx(args.broker, broker, workdir, Settings())
            try:
                for target in ("direct", "sidecar"):  # warm-up: JIT, queues, connections
                    run_once(ctx, target, args.workload, args.persistent, args.n // 2)
                direct = run_once(ctx, "direct", args.workload, args.persistent, args.n)
                raw = args.raw or workdir / "py-spy.txt"
                sample, user, system = _profiled_run(ctx, args, py_spy, raw)
            finally:
                ctx.close()
            collapsed = raw.read_text(errors="replace") if raw.exists() else ""
    total, own, inclusive = hot_functions(collapsed, args.top)
    per_msg = 1e6 / args.n
    print(f"direct  {direct.m.rate:10,.0f} msg/s")
    print(
        f"sidecar {sample.m.rate:10,.0f} msg/s ({sample.m.rate / direct.m.rate:.2f}x; py-spy "
        f"slows it a little); sidecar CPU per message: user {user * per_msg:.1f} us, "
        f"system {system * per_msg:.1f} us"
    )
    if not total:
        print("py-spy took no samples")
        return 2
    print(
        f"\n{total:,} samples; self (own lines and the C calls they make; py-spy samples "
        "without stopping the process, so a function in a system call is over-weighted: "
        "the user/system split above is the measure of that):"
    )
    for name, share in own:
        print(f"  {100 * share:5.1f}%  {name}")
    print("inclusive:")
    for name, share in inclusive:
        print(f"  {100 * share:5.1f}%  {name}")
    if args.raw:
        print(f"\ncollapsed stacks: {args.raw}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
