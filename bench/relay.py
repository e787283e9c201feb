"""A C byte relay in front of the broker: the floor any relay pays on this machine.

``socat`` (Debian's package, ``scripts/setup.sh``) listens on a free 127.0.0.1 port and copies
bytes both ways to the broker's STOMP port without reading them: the same extra loopback hops
and process wakeups as the sidecar, none of its STOMP work. The benchmarks measure it in the
same run as direct and sidecar (issue 18, part 5), so "the sidecar keeps 0.8 of what a relay
keeps" compares two relays on the same box at the same moment.

Mode: ``fork`` (one listening socat; each accepted connection is copied by a forked child
that exits with it), so one relay serves every connection of a run the way the shared sidecar
does. The fork is paid once per connection, before the benchmarks start their clocks and CPU
readings (a connection is opened first), so per-message figures do not include it; docs/
results.md compares it with a single-connection socat. Both legs set ``TCP_NODELAY`` as the
sidecar does (trio's default). ``-b 65536``: socat copies up to 64 KiB per read (its default is
8 KiB), about what the sidecar reads per wakeup.

CPU: the listener's own times, its reaped children's (``cutime``/``cstime`` of
``/proc/PID/stat``, clock ticks) and every live child's run time in nanoseconds
(``/proc/PID/schedstat`` of each thread, found through ``/proc/PID/task/*/children``), so the
copying done in forked children is counted while they run and after they exit. The live
children are read in nanoseconds because socat copies a 1 KiB message in well under a
microsecond: a 20,000-message run costs it about one 10 ms clock tick.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from bench.procstat import cpu_seconds, rss_bytes, run_ns
from testbed.probe import free_port

__all__ = ["RelayError", "RelayProcess", "children", "socat_path"]

#: Bytes socat reads and writes at most per transfer (``-b``).
BLOCK_SIZE = 65536
_CLK_TCK = os.sysconf("SC_CLK_TCK")
_PR_SET_PDEATHSIG = 1


class RelayError(RuntimeError):
    """socat is missing, did not start, or died."""


def socat_path() -> str | None:
    """Path of the ``socat`` executable, None when it is not installed."""
    return shutil.which("socat")


def children(pid: int) -> list[int]:
    """PIDs of the live children of process ``pid`` (every thread's ``children`` file of
    ``/proc/PID/task``); empty when the process is gone."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        with contextlib.suppress(OSError):
            out += [int(c) for c in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
    return out


def _reaped_children_cpu(pid: int) -> float:
    """``cutime + cstime`` of ``/proc/PID/stat``: CPU seconds of children already waited for."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError as exc:
        raise ProcessLookupError(f"no process {pid}: {exc}") from exc
    fields = raw.rpartition(")")[2].split()
    # proc(5) fields 16 and 17 (1-based), index k - 3 after the command.
    return (int(fields[13]) + int(fields[14])) / _CLK_TCK


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))


class RelayProcess:
    """``socat`` relaying 127.0.0.1:``port`` to the broker at ``broker_host``:``broker_port``.

    Args:
        broker_host: the broker's address (127.0.0.1 on this machine).
        broker_port: the broker's STOMP port.
        workdir: where socat's log (``relay-PORT.log``, its stderr) goes.

    The child is SIGKILLed if the harness dies (``PR_SET_PDEATHSIG``), so an interrupted
    benchmark leaves no relay behind. Use :meth:`start` / :meth:`stop` or ``with``.
    """

    def __init__(self, broker_host: str, broker_port: int, workdir: Path) -> None:
        self.broker_host = broker_host
        self.broker_port = broker_port
        self.workdir = workdir
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        """PID of the listening socat. Raises RelayError when it is not running."""
        if self._proc is None or self._proc.poll() is not None:
            raise RelayError("the relay is not running")
        return self._proc.pid

    def command(self, port: int) -> list[str]:
        """The socat command line for listening port ``port``. Raises RelayError when socat
        is not installed."""
        exe = socat_path()
        if exe is None:
            raise RelayError("socat is not installed (scripts/setup.sh)")
        return [
            exe,
            "-b",
            str(BLOCK_SIZE),
            f"TCP-LISTEN:{port},bind=127.0.0.1,fork,reuseaddr,nodelay",
            f"TCP:{self.broker_host}:{self.broker_port},nodelay",
        ]

    def start(self, timeout: float = 10.0) -> None:
        """Start socat on a free port and wait (at most ``timeout`` seconds) until it accepts
        connections. Raises RelayError if it exits or never listens (its log included)."""
        for _attempt in range(3):  # another process may take the free port first
            self.port = free_port()
            log = self.workdir / f"relay-{self.port}.log"
            with log.open("wb") as err:
                self._proc = subprocess.Popen(
                    self.command(self.port),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                    preexec_fn=_die_with_parent,  # noqa: PLW1509 - the harness is one thread here
                )
            if self._wait_listening(timeout):
                return
            self.stop()
        raise RelayError(f"socat did not start: {log.read_text(errors='replace')[-2000:]}")

    def _wait_listening(self, timeout: float) -> bool:
        """True once the listening socket is in ``/proc/net/tcp`` (a probe connection would
        fork a child and open a broker connection)."""
        assert self._proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                return False
            with socket.socket() as probe:
                try:
                    probe.bind(("127.0.0.1", self.port))
                except OSError:
                    return True  # bound by socat
            time.sleep(0.02)
        return False

    def alive(self) -> bool:
        """True while the listening socat runs."""
        return self._proc is not None and self._proc.poll() is None

    def children(self) -> list[int]:
        """PIDs of the forked socats copying a connection now."""
        return children(self.pid)

    def cpu(self) -> float:
        """CPU seconds used so far by the listener and every child it forked, live or exited
        (``/proc``). Raises RelayError when the relay is not running."""
        pid = self.pid
        total = cpu_seconds(pid) + _reaped_children_cpu(pid)
        for child in children(pid):
            with contextlib.suppress(ProcessLookupError):  # exited between the two reads
                total += run_ns(child) / 1e9
        return total

    def rss(self) -> int:
        """Resident memory of the listener and its live children, bytes (``VmRSS``)."""
        total = rss_bytes(self.pid)
        for child in self.children():
            with contextlib.suppress(ProcessLookupError):
                total += rss_bytes(child)
        return total

    def stop(self) -> None:
        """Stop socat and its children (SIGTERM, then SIGKILL after 5 s)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        kids = children(proc.pid)
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        for kid in kids:  # a forked child outlives its listener until its connection ends
            with contextlib.suppress(ProcessLookupError):
                os.kill(kid, signal.SIGTERM)

    def __enter__(self) -> RelayProcess:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
