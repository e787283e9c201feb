"""The processes of a Spark standalone cluster of the test bed (:mod:`testbed.spark_cluster`):
its errors, one process as ``SparkCluster.processes`` lists it, reading ``/proc``, free ports,
and the cleanup that finds every process of a cluster by the environment marker its processes
carry (:data:`MARKER`), down to the Python workers that PySpark's daemon moves into process
groups of their own."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from testbed.broker import (
    BrokerError,
    _Children,
    _cleanup,
    live_processes,
    proc_stat,
    process_alive,
)
from testbed.probe import free_port

__all__ = [
    "EXECUTOR_CLASS",
    "MARKER",
    "ClusterProcess",
    "SparkClusterError",
    "SparkClusterTimeout",
    "cleanup_cluster",
    "cluster_processes",
    "cmdline",
    "distinct_free_ports",
    "kill_marked",
    "marked_pids",
    "memory_mib",
    "rss_kib",
]

#: The environment variable that marks every process of one cluster (module docstring).
MARKER = "TESTBED_SPARK_CLUSTER"
#: ``--memory`` / ``spark.executor.memory`` values accepted here: whole MiB or GiB.
_MEMORY_RE = re.compile(r"^([1-9][0-9]*)([mg])$")
#: Seconds the finalizer gives each orderly stop (at interpreter exit or garbage collection).
_CLEANUP_TIMEOUT = 5.0


class SparkClusterError(BrokerError):
    """The cluster could not start (a JVM exited, a port was taken), is not running, or a
    process of it survived :meth:`SparkCluster.stop`. The message ends with the tails of the
    logs where they help."""


class SparkClusterTimeout(SparkClusterError, TimeoutError):
    """The master or a worker is alive but did not reach the awaited state in time."""


@dataclass(frozen=True)
class ClusterProcess:
    """One live process of a cluster (``/proc``).

    Attributes:
        pid, ppid, pgrp: its PID, its parent's PID and its process group.
        starttime: in clock ticks since boot (tells a PID's incarnations apart).
        role: ``"master"``, ``"worker"``, ``"executor"`` (a CoarseGrainedExecutorBackend JVM),
            ``"python"`` (PySpark's daemon or a Python worker), ``"launcher"`` (the short-lived
            JVM of ``spark-class`` that builds the command line) or ``"other"`` (the
            ``spark-class`` shell before it execs, the ``_parent_death.py`` wrapper).
        rss_kib: resident set size in KiB (``VmRSS``; 0 if unreadable).
        command: the command line (``/proc/PID/cmdline``).
    """

    pid: int
    ppid: int
    pgrp: int
    starttime: int
    role: Literal["master", "worker", "executor", "python", "launcher", "other"]
    rss_kib: int
    command: tuple[str, ...]


def memory_mib(value: str) -> int:
    match = _MEMORY_RE.match(value)
    if match is None:
        raise ValueError(f"memory must be whole MiB or GiB such as '512m' or '1g': {value!r}")
    amount = int(match.group(1))
    return amount * 1024 if match.group(2) == "g" else amount


def read_proc(pid: int, name: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/{name}").read_bytes()
    except OSError:  # gone, or another user's (EACCES)
        return b""


def cmdline(pid: int) -> tuple[str, ...]:
    raw = read_proc(pid, "cmdline")
    return tuple(part.decode(errors="replace") for part in raw.split(b"\0") if part)


def rss_kib(pid: int) -> int:
    for line in read_proc(pid, "status").splitlines():
        if line.startswith(b"VmRSS:"):
            return int(line.split()[1])
    return 0


def marked_pids(token: str) -> list[tuple[int, int]]:
    """``(pid, starttime)`` of every live process whose environment has the cluster's token."""
    needle = f"{MARKER}={token}".encode()
    found = []
    for st in live_processes():
        environ = read_proc(st.pid, "environ").split(b"\0")
        if needle in environ:
            found.append((st.pid, st.starttime))
    return found


def kill_marked(token: str, timeout: float) -> list[int]:
    """Wait up to ``timeout`` seconds for the processes carrying ``token`` to exit (PySpark's
    daemon exits when its executor's pipe closes), SIGKILL those left, wait for them once more
    (at most 5 s); return the PIDs still alive after that (none, normally)."""
    deadline = time.monotonic() + timeout
    while (left := marked_pids(token)) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid, starttime in left:
        if process_alive(pid, starttime):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while (left := marked_pids(token)) and time.monotonic() < deadline:
        time.sleep(0.01)
    return [pid for pid, _ in left]


def cleanup_cluster(children: _Children, token: str) -> None:
    """Finalizer: stop the master and workers still registered, then whatever carries the
    token. Must not hold the :class:`SparkCluster` itself."""
    _cleanup(children)
    with contextlib.suppress(Exception):
        kill_marked(token, _CLEANUP_TIMEOUT)


def distinct_free_ports(count: int) -> list[int]:
    """``count`` different ports that were free on 127.0.0.1 a moment ago (bounded tries)."""
    ports: list[int] = []
    for _ in range(count * 20):
        port = free_port()
        if port not in ports:
            ports.append(port)
        if len(ports) == count:
            return ports
    raise SparkClusterError(f"could not find {count} distinct free ports on 127.0.0.1")


#: The main class of an executor JVM (started by a worker for an application).
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"


def cluster_processes(token: str, master: int | None, workers: set[int]) -> list[ClusterProcess]:
    """Every live process that carries the cluster's ``token`` (:data:`MARKER`), with its role:
    ``master`` and ``workers`` are the PIDs of the master's and the workers' JVMs."""
    found = []
    for pid, _ in marked_pids(token):
        st = proc_stat(pid)
        if st is None:
            continue
        command = cmdline(pid)
        role: Literal["master", "worker", "executor", "python", "launcher", "other"]
        if pid == master:
            role = "master"
        elif pid in workers:
            role = "worker"
        elif EXECUTOR_CLASS in command:
            role = "executor"
        elif "org.apache.spark.launcher.Main" in command:
            role = "launcher"
        elif st.comm.startswith("python") and "_parent_death.py" not in " ".join(command):
            role = "python"
        else:
            role = "other"
        found.append(
            ClusterProcess(
                pid=pid,
                ppid=st.ppid,
                pgrp=st.pgrp,
                starttime=st.starttime,
                role=role,
                rss_kib=rss_kib(pid),
                command=command,
            )
        )
    return found
