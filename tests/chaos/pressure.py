"""CPU pressure for the soak and the suite (issue 36): busy processes beside the test bed, so
that the sidecar, the brokers and the apps run as on a machine several times slower.

A hog is ``python -c`` spinning until its deadline (bounded in time even if this process dies
without stopping it), pinned to the CPUs given (``os.sched_setaffinity``), stopped by PID.
CLI, for any command (its exit status is returned)::

    .venv/bin/python -m tests.chaos.pressure --hogs 2 -- .venv/bin/python -m pytest tests/...
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence

__all__ = ["cpu_hogs", "main"]

#: A hog: spin until the deadline (seconds) given as its argument.
_SPIN = (
    "import sys, time\n"
    "end = time.monotonic() + float(sys.argv[1])\n"
    "while time.monotonic() < end: pass\n"
)


@contextlib.contextmanager
def cpu_hogs(
    count: int, *, cpus: Sequence[int] | None = None, seconds: float = 7200.0
) -> Iterator[list[int]]:
    """Run ``count`` busy processes (pinned to ``cpus``, all of them when None) for at most
    ``seconds`` while the block runs; yields their PIDs; kills them (SIGKILL) when it ends."""
    hogs: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(count):
            hog = subprocess.Popen([sys.executable, "-c", _SPIN, str(seconds)])
            hogs.append(hog)
            if cpus is not None:
                os.sched_setaffinity(hog.pid, set(cpus))
        yield [h.pid for h in hogs]
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait()


def main(argv: list[str] | None = None) -> int:
    """CLI: run a command beside ``--hogs`` busy processes; its exit status."""
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.pressure", description=__doc__)
    parser.add_argument("--hogs", type=int, default=2, help="busy processes (default 2)")
    parser.add_argument("--cpus", default="", help="CPUs to pin the hogs to, e.g. 0 or 0,1")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ...")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given")
    cpus = [int(c) for c in args.cpus.split(",") if c] or None
    with cpu_hogs(args.hogs, cpus=cpus):
        return subprocess.call(command)


if __name__ == "__main__":
    sys.exit(main())
