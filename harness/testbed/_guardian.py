"""Orphan guardian: SIGKILLs the test bed's process groups when its parent Python dies.

Run as a separate process (``python -I _guardian.py``) by ``testbed.broker``. It reads lines
from stdin, which is a pipe whose write end only the parent holds:

* ``+PGID`` - a process group to watch (every broker child runs in its own session/group);
* ``-PGID`` - the group was stopped by the parent, forget it.

On EOF (the parent exited, however: normal exit, crash, SIGKILL, ``os._exit`` from a
pytest-timeout thread) every group still watched gets SIGCONT then SIGKILL, so no JVM,
beam.smp or epmd is left behind. ``atexit`` alone does not cover SIGKILL or ``os._exit``.
Standard library only; it must not import ``testbed``.
"""

from __future__ import annotations

import os
import signal
import sys


def _kill_group(pgid: int) -> None:
    for sig in (signal.SIGCONT, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            return


def main() -> None:
    """Serve the ``+PGID`` / ``-PGID`` protocol on stdin until EOF, then kill what is left."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    groups: set[int] = set()
    for raw in sys.stdin:
        line = raw.strip()
        if len(line) < 2 or not line[1:].isdigit():
            continue
        pgid = int(line[1:])
        if line[0] == "+":
            groups.add(pgid)
        elif line[0] == "-":
            groups.discard(pgid)
    for pgid in groups:
        _kill_group(pgid)


if __name__ == "__main__":
    main()
