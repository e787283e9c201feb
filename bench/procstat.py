"""CPU time and resident memory of a process, read from ``/proc`` (proc(5)); Linux only.

Used to report what the sidecar, the broker and the load generator cost per workload: CPU
seconds are ``utime + stime`` of ``/proc/PID/stat`` (all threads of the process, clock ticks)
or, where a run is too short for 10 ms ticks, the run time of ``/proc/PID/task/*/schedstat``
(nanoseconds: :func:`run_ns`); memory is ``VmRSS`` of ``/proc/PID/status``.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path

__all__ = ["RssSampler", "cpu_seconds", "cpu_split", "rss_bytes", "run_ns", "wait_cpu_quiet"]

#: Clock ticks per second of ``/proc/PID/stat`` times.
_CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds used so far by process ``pid`` (every thread).

    Resolution is one clock tick (10 ms with the usual ``CLK_TCK`` of 100). Raises
    ``ProcessLookupError`` when the process does not exist.
    """
    user, system = cpu_split(pid)
    return user + system


def cpu_split(pid: int) -> tuple[float, float]:
    """``(user, system)`` CPU seconds used so far by process ``pid`` (see :func:`cpu_seconds`)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError as exc:
        raise ProcessLookupError(f"no process {pid}: {exc}") from exc
    # Fields after the last ")" (comm may contain spaces): state is index 0, so field k of
    # proc(5) (1-based) is index k - 3: utime (14) -> 11, stime (15) -> 12.
    fields = raw.rpartition(")")[2].split()
    return int(fields[11]) / _CLK_TCK, int(fields[12]) / _CLK_TCK


def run_ns(pid: int) -> int:
    """Nanoseconds process ``pid`` has run on a CPU, all threads (the first field of
    ``/proc/PID/task/TID/schedstat``). Raises ProcessLookupError when it does not exist."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError as exc:
        raise ProcessLookupError(f"no process {pid}: {exc}") from exc
    total = 0
    for tid in tasks:
        with contextlib.suppress(OSError):
            total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
    return total


def rss_bytes(pid: int) -> int:
    """Resident set size of process ``pid`` in bytes (``VmRSS``).

    Raises ``ProcessLookupError`` when the process does not exist (or is a zombie, which has
    no ``VmRSS`` line).
    """
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError as exc:
        raise ProcessLookupError(f"no process {pid}: {exc}") from exc
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise ProcessLookupError(f"process {pid} has no VmRSS (zombie?)")


class RssSampler:
    """Sample a process's RSS in a background thread; ``max_bytes`` is the largest seen.

    Use as a context manager around the phase to watch. ``interval`` is in seconds.
    """

    def __init__(self, pid: int, interval: float = 0.05) -> None:
        self.pid = pid
        self.interval = interval
        self.max_bytes = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.max_bytes = max(self.max_bytes, rss_bytes(self.pid))
                self.samples += 1
            except ProcessLookupError:
                return
            self._stop.wait(self.interval)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(5.0)
        with contextlib.suppress(ProcessLookupError):  # a last sample at the end of the phase
            self.max_bytes = max(self.max_bytes, rss_bytes(self.pid))


def wait_cpu_quiet(
    pid: int, *, below: float = 0.05, window: float = 0.3, timeout: float = 5.0
) -> None:
    """Wait until ``pid`` used less than ``below`` of a core over ``window`` seconds.

    Lets a process finish background work (a JVM's GC, a sidecar sending ACKs) before the next
    measurement starts. Gives up silently after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before = cpu_seconds(pid)
        time.sleep(window)
        if (cpu_seconds(pid) - before) / window < below:
            return
