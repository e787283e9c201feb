"""A Spark standalone cluster on 127.0.0.1 for tests and drills: a master, N workers, and the
executors the workers start, each a JVM of its own.

What runs (Spark's standalone-mode docs, "Starting a Cluster Manually"; the distribution is
the one inside the venv's PySpark wheel, :mod:`testbed.spark_home`):

* the master: ``spark-class org.apache.spark.deploy.master.Master --host 127.0.0.1 --port P
  --webui-port W``;
* worker *i*: ``spark-class org.apache.spark.deploy.worker.Worker --host 127.0.0.1 --port ...
  --webui-port ... --cores C --memory M --work-dir DIR spark://127.0.0.1:P``;
* executors: when an application (a ``SparkSession`` built with :meth:`SparkCluster.spark_conf`)
  connects, each worker starts a ``CoarseGrainedExecutorBackend`` JVM, a child of the worker
  JVM in its process group; under it PySpark's daemon (``python -m pyspark.daemon``, which
  makes a process group of its own) forks the Python workers that run the tasks.

``spark-class`` ``exec``s the JVM it builds, so a child's PID is its JVM's PID. Each master and
worker runs in a session and process group of its own, never through the daemonizing ``sbin``
scripts.

Files, all under ``work_dir`` (nothing is written into the venv or the repository):
``conf/`` (``SPARK_CONF_DIR``, empty: Spark's default log4j profile, INFO to stderr),
``logs/master.log`` and ``logs/worker-N.log`` (stdout and stderr of each JVM, appended to
across starts with a marker line per start), ``worker-N/`` (the worker's ``--work-dir``: a
directory per application and executor with the executor's ``stdout`` and ``stderr``),
``local/worker-N/`` (``SPARK_LOCAL_DIRS``: shuffle and block files), ``local/driver/`` (the
driver's ``spark.local.dir``) and ``tmp/`` (``java.io.tmpdir`` of every JVM). ``SPARK_LOG_DIR``
and ``SPARK_PID_DIR``, read only by the ``sbin`` scripts, point at ``logs/``.

Network: every listener on 127.0.0.1 (``--host``, ``SPARK_LOCAL_IP``, ``SPARK_MASTER_HOST``,
the driver's ``spark.driver.host`` / ``bindAddress``); the ports are free ports picked at each
start, and the daemons run with ``spark.port.maxRetries=0``, so a port taken in between fails
the start (with the log) instead of moving silently to the next port. The master's REST
submission server, which Spark 4 opens on the fixed port 6066, is off
(``spark.master.rest.enabled=false``).

Processes: every process of the cluster, down to the Python workers, carries
``TESTBED_SPARK_CLUSTER=<token>`` in its environment (the workers pass their environment to
the executors, the executors to PySpark's daemon), and :meth:`SparkCluster.processes` finds
them by it in ``/proc/PID/environ``. :meth:`SparkCluster.stop` sends SIGTERM to the master,
then to the workers (Spark's ``Worker`` kills its executors when it shuts down), SIGKILLs a
process group still alive after the bound, then SIGKILLs any process still carrying the token
(the PySpark daemons and Python workers live in groups of their own), and returns only when
none is left. As for the brokers (:mod:`testbed.broker`): the orphan guardian SIGKILLs the
master's and workers' groups (the executors with them) if the calling process dies, the master
and workers started from the main thread also get ``PR_SET_PDEATHSIG`` = SIGKILL
(``testbed/_parent_death.py``), and a PySpark daemon exits when its executor's pipe closes.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self

from testbed.broker import (
    _GUARDIAN,
    BrokerError,
    _Child,
    _Children,
    _cleanup,
    _terminate,
    live_processes,
    log_tail,
    proc_stat,
    process_alive,
)
from testbed.probe import free_port
from testbed.spark_home import SparkHome, find_spark_home

__all__ = [
    "ClusterProcess",
    "SparkCluster",
    "SparkClusterError",
    "SparkClusterTimeout",
]

#: The environment variable that marks every process of one cluster (module docstring).
MARKER = "TESTBED_SPARK_CLUSTER"

_MASTER_CLASS = "org.apache.spark.deploy.master.Master"
_WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
_EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"

#: Heap of the master and of each worker JVM (``SPARK_DAEMON_MEMORY``; Spark's default is 1g,
#: far more than a handful of workers and applications need).
_DAEMON_MEMORY = "256m"
#: JVM options of the master and workers: one GC thread and the C1 compiler only, as for the
#: brokers (docs/brokers.md): they idle most of the time on 2 shared cores.
_DAEMON_JVM_OPTIONS = ("-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")

#: ``--memory`` / ``spark.executor.memory`` values accepted here: whole MiB or GiB.
_MEMORY_RE = re.compile(r"^([1-9][0-9]*)([mg])$")
#: An executor's heap must be at least 1.5 x Spark's 300 MiB reserved memory (450 MiB;
#: Spark's UnifiedMemoryManager refuses to start below it): 512m is the smallest round value.
_MIN_EXECUTOR_MIB = 512

#: ``python -I -c`` program that execs ``argv[1:]`` (after ``_parent_death.py`` set the signal).
_EXEC = "import os, sys; os.execv(sys.argv[1], sys.argv[1:])"

#: Seconds the finalizer gives each orderly stop (at interpreter exit or garbage collection).
_CLEANUP_TIMEOUT = 5.0
#: Seconds between two polls of the master's JSON status while starting.
_POLL_INTERVAL = 0.1


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


def _memory_mib(value: str) -> int:
    match = _MEMORY_RE.match(value)
    if match is None:
        raise ValueError(f"memory must be whole MiB or GiB such as '512m' or '1g': {value!r}")
    amount = int(match.group(1))
    return amount * 1024 if match.group(2) == "g" else amount


def _read_proc(pid: int, name: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/{name}").read_bytes()
    except OSError:  # gone, or another user's (EACCES)
        return b""


def _cmdline(pid: int) -> tuple[str, ...]:
    raw = _read_proc(pid, "cmdline")
    return tuple(part.decode(errors="replace") for part in raw.split(b"\0") if part)


def _rss_kib(pid: int) -> int:
    for line in _read_proc(pid, "status").splitlines():
        if line.startswith(b"VmRSS:"):
            return int(line.split()[1])
    return 0


def _marked_pids(token: str) -> list[tuple[int, int]]:
    """``(pid, starttime)`` of every live process whose environment has the cluster's token."""
    needle = f"{MARKER}={token}".encode()
    found = []
    for st in live_processes():
        environ = _read_proc(st.pid, "environ").split(b"\0")
        if needle in environ:
            found.append((st.pid, st.starttime))
    return found


def _kill_marked(token: str, timeout: float) -> list[int]:
    """Wait up to ``timeout`` seconds for the processes carrying ``token`` to exit (PySpark's
    daemon exits when its executor's pipe closes), SIGKILL those left, wait for them once more
    (at most 5 s); return the PIDs still alive after that (none, normally)."""
    deadline = time.monotonic() + timeout
    while (left := _marked_pids(token)) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid, starttime in left:
        if process_alive(pid, starttime):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while (left := _marked_pids(token)) and time.monotonic() < deadline:
        time.sleep(0.01)
    return [pid for pid, _ in left]


def _cleanup_cluster(children: _Children, token: str) -> None:
    """Finalizer: stop the master and workers still registered, then whatever carries the
    token. Must not hold the :class:`SparkCluster` itself."""
    _cleanup(children)
    with contextlib.suppress(Exception):
        _kill_marked(token, _CLEANUP_TIMEOUT)


def _distinct_free_ports(count: int) -> list[int]:
    """``count`` different ports that were free on 127.0.0.1 a moment ago (bounded tries)."""
    ports: list[int] = []
    for _ in range(count * 20):
        port = free_port()
        if port not in ports:
            ports.append(port)
        if len(ports) == count:
            return ports
    raise SparkClusterError(f"could not find {count} distinct free ports on 127.0.0.1")


class SparkCluster:
    """A Spark standalone master and ``workers`` workers on 127.0.0.1 (module docstring).

    Args:
        work_dir: every file of the cluster goes below it (created; module docstring).
        workers: number of worker JVMs (at least 1).
        cores_per_worker: ``--cores`` of each worker; the executor a worker starts gets all
            of them (``spark.executor.cores``, :meth:`spark_conf`), so a worker runs one
            executor at a time.
        memory_per_worker: ``--memory`` of each worker, the memory it may give its executors,
            and ``spark.executor.memory`` (the executor JVM's heap): ``"512m"`` or more, whole
            MiB (``m``) or GiB (``g``). The master and workers themselves get a 256 MiB heap.
        env: extra environment variables for the master and workers, and so for the
            executors and their Python workers (a worker passes its environment on); they
            override the ones set here, except the cluster's marker.

    Use as a context manager (``with SparkCluster(work_dir=d) as cluster:`` starts it and
    stops it) or call :meth:`start` and :meth:`stop`. Not thread-safe: drive one instance from
    one thread at a time.

    Raises ``ValueError`` for bad arguments and :class:`testbed.spark_home.SparkHomeError`
    when the venv has no Spark distribution.
    """

    host = "127.0.0.1"

    def __init__(
        self,
        *,
        work_dir: Path,
        workers: int = 2,
        cores_per_worker: int = 1,
        memory_per_worker: str = "1g",
        env: Mapping[str, str] | None = None,
    ) -> None:
        if workers < 1 or cores_per_worker < 1:
            raise ValueError("workers and cores_per_worker must be at least 1")
        if _memory_mib(memory_per_worker) < _MIN_EXECUTOR_MIB:
            raise ValueError(
                f"memory_per_worker must be at least {_MIN_EXECUTOR_MIB}m (an executor's heap "
                f"needs 1.5 x Spark's 300 MiB reserved memory): {memory_per_worker!r}"
            )
        self.work_dir = Path(work_dir).absolute()
        self.workers = workers
        self.cores_per_worker = cores_per_worker
        self.memory_per_worker = memory_per_worker
        self.env = dict(env or {})
        self.home: SparkHome = find_spark_home()
        #: This cluster's value of the ``TESTBED_SPARK_CLUSTER`` marker.
        self.token = uuid.uuid4().hex
        #: Seconds the last successful :meth:`start` took (``None`` before).
        self.start_seconds: float | None = None
        self.master_port = 0
        self.webui_port = 0
        self._worker_ports: list[tuple[int, int]] = []
        self._children = _Children()
        self._master: _Child | None = None
        self._workers: list[_Child] = []
        self._finalizer = weakref.finalize(self, _cleanup_cluster, self._children, self.token)

    def __repr__(self) -> str:
        state = f"running at {self.master_url}" if self.running() else "stopped"
        return f"<SparkCluster {self.workers} workers {state}>"

    # -- paths and environment -------------------------------------------------------------

    @property
    def conf_dir(self) -> Path:
        """``SPARK_CONF_DIR`` of the master and workers (empty)."""
        return self.work_dir / "conf"

    @property
    def log_dir(self) -> Path:
        """Where ``master.log`` and ``worker-N.log`` are."""
        return self.work_dir / "logs"

    @property
    def tmp_dir(self) -> Path:
        """``java.io.tmpdir`` of every JVM of the cluster (executors included)."""
        return self.work_dir / "tmp"

    def worker_dir(self, index: int) -> Path:
        """``--work-dir`` of worker ``index`` (1-based): the executors' directories and logs."""
        return self.work_dir / f"worker-{index}"

    def _local_dir(self, name: str) -> Path:
        return self.work_dir / "local" / name

    def _log_path(self, label: str) -> Path:
        return self.log_dir / f"{label}.log"

    def _base_env(self) -> dict[str, str]:
        """The caller's environment without its ``SPARK_*`` variables (another install's
        ``SPARK_HOME`` or ``SPARK_CONF_DIR`` must not steer this cluster)."""
        return {k: v for k, v in os.environ.items() if not k.startswith("SPARK_")}

    def _daemon_env(self, worker: int | None) -> dict[str, str]:
        """Environment of the master (``worker=None``) or of worker ``worker`` (Spark's
        standalone-mode docs, "Cluster Launch Scripts", for the ``SPARK_*`` variables)."""
        java_options = [
            *_DAEMON_JVM_OPTIONS,
            f"-Djava.io.tmpdir={self.tmp_dir}",
            "-Djava.net.preferIPv4Stack=true",
            "-Dspark.port.maxRetries=0",
        ]
        env = self._base_env()
        env.update(
            {
                "SPARK_HOME": str(self.home.path),
                "SPARK_CONF_DIR": str(self.conf_dir),
                "SPARK_LOG_DIR": str(self.log_dir),
                "SPARK_PID_DIR": str(self.log_dir),
                "SPARK_LOCAL_IP": self.host,
                "SPARK_MASTER_HOST": self.host,
                "SPARK_PUBLIC_DNS": self.host,
                "SPARK_DAEMON_MEMORY": _DAEMON_MEMORY,
                "SPARK_DAEMON_JAVA_OPTS": " ".join(java_options),
                "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
                "PYSPARK_PYTHON": sys.executable,
            }
        )
        if worker is not None:
            env["SPARK_WORKER_DIR"] = str(self.worker_dir(worker))
            env["SPARK_LOCAL_DIRS"] = str(self._local_dir(f"worker-{worker}"))
        env.update(self.env)
        env[MARKER] = self.token
        return env

    def _command(self, main_class: str, *args: str) -> list[str]:
        """``spark-class MAIN_CLASS ARGS``, behind ``_parent_death.py`` (SIGKILL when this
        process dies) when called from the main thread: Linux sends the signal when the
        *thread* that started the child ends (see testbed.sidecar)."""
        command = [str(self.home.spark_class), main_class, *args]
        if threading.current_thread() is not threading.main_thread():
            return command
        wrapper = str(Path(__file__).with_name("_parent_death.py"))
        pdeath = [wrapper, str(os.getpid()), str(int(signal.SIGKILL))]
        return [sys.executable, "-I", *pdeath, "-I", "-c", _EXEC, *command]

    def _spawn(self, label: str, command: list[str], env: dict[str, str]) -> _Child:
        with self._log_path(label).open("ab") as log:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            log.write(f"\n=== testbed {stamp}: {label}: starting: {' '.join(command)}\n".encode())
            log.flush()
            try:
                popen = subprocess.Popen(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=self.work_dir,
                    env=env,
                    start_new_session=True,
                )
            except OSError as exc:
                raise SparkClusterError(f"cannot run {command[0]}: {exc}") from exc
        _GUARDIAN.watch(popen.pid)
        child = _Child(label, popen)
        self._children.items.append(child)
        return child

    def _tails(self) -> str:
        labels = ["master"] + [f"worker-{i}" for i in range(1, len(self._workers) + 1)]
        return "".join(
            f"\n--- {self._log_path(label)} (tail) ---\n"
            + log_tail(self._log_path(label), max_lines=15)
            for label in labels
        )

    # -- state -----------------------------------------------------------------------------

    @property
    def master_url(self) -> str:
        """``spark://127.0.0.1:<port>`` of the master. Raises :class:`SparkClusterError`
        before the first :meth:`start`."""
        if not self.master_port:
            raise SparkClusterError("the cluster was never started: no master URL yet")
        return f"spark://{self.host}:{self.master_port}"

    @property
    def webui_url(self) -> str:
        """``http://127.0.0.1:<port>`` of the master's web UI (its JSON status is ``/json/``)."""
        if not self.webui_port:
            raise SparkClusterError("the cluster was never started: no web UI yet")
        return f"http://{self.host}:{self.webui_port}"

    def running(self) -> bool:
        """True while the master and every worker JVM are alive."""
        children = [self._master, *self._workers] if self._master else []
        return len(children) == 1 + self.workers and all(
            child.popen.poll() is None for child in children
        )

    def master_state(self, timeout: float = 10.0) -> dict[str, Any]:
        """The master's JSON status (``GET /json/`` on its web UI): ``url``, ``status``
        (``ALIVE``), ``workers`` (each with ``id``, ``host``, ``port``, ``cores``, ``memory`` in
        MiB, ``state``), ``aliveworkers``, ``activeapps``... ``timeout`` in seconds. Raises
        ``OSError`` if the master does not answer 200 with a JSON object."""
        conn = http.client.HTTPConnection(self.host, self.webui_port, timeout=timeout)
        try:
            conn.request("GET", "/json/")
            response = conn.getresponse()
            body = response.read()
        except http.client.HTTPException as exc:
            raise OSError(f"master /json/: {exc!r}") from exc
        finally:
            conn.close()
        if response.status != 200:
            raise OSError(f"master /json/ answered {response.status}: {body[:200]!r}")
        try:
            state = json.loads(body)
        except ValueError as exc:
            raise OSError(f"master /json/ is not JSON: {body[:200]!r}") from exc
        if not isinstance(state, dict):
            raise OSError(f"master /json/ is not a JSON object: {body[:200]!r}")
        return state

    def _master_alive(self, state: Mapping[str, Any]) -> bool:
        return state.get("status") == "ALIVE" and state.get("url") == self.master_url

    def _registered(self, state: Mapping[str, Any]) -> bool:
        alive = {
            (w.get("host"), w.get("port"))
            for w in state.get("workers", [])
            if isinstance(w, dict) and w.get("state") == "ALIVE"
        }
        return all((self.host, port) in alive for port, _ in self._worker_ports)

    def _await(
        self, what: str, ready: Callable[[Mapping[str, Any]], bool], deadline: float, total: float
    ) -> None:
        """Poll the master's JSON status until ``ready(state)``; raise if a JVM exits or at
        ``deadline`` (``time.monotonic()``; ``total`` is the whole start's bound, seconds)."""
        last = "no answer yet"
        while True:
            for child in (self._master, *self._workers):
                if child is not None and child.popen.poll() is not None:
                    raise SparkClusterError(
                        f"{child.label} exited with code {child.popen.returncode} while "
                        f"waiting for {what}{self._tails()}"
                    )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SparkClusterTimeout(
                    f"no {what} within {total:.1f} s (last: {last}){self._tails()}"
                )
            try:
                state = self.master_state(timeout=min(remaining, 2.0))
            except OSError as exc:
                last = f"{type(exc).__name__}: {exc}"
            else:
                if ready(state):
                    return
                last = (
                    f"{state.get('url')} {state.get('status')}, "
                    f"{state.get('aliveworkers')} alive workers"
                )
            time.sleep(max(0.0, min(_POLL_INTERVAL, deadline - time.monotonic())))

    # -- lifecycle -------------------------------------------------------------------------

    def start(self, timeout: float = 120.0) -> None:
        """Start the master, wait until it is ALIVE, start every worker, and return once each
        worker is registered with the master as ALIVE (its JSON status), all within ``timeout``
        seconds (a JVM starts in about 3 s on 2 idle cores).

        Raises :class:`SparkClusterError` (with the logs' tails) if the cluster is running
        already or a JVM exits while starting, :class:`SparkClusterTimeout` at the bound;
        whatever was started is stopped first.
        """
        if self.running():
            raise SparkClusterError(f"already running at {self.master_url}")
        self.stop()  # what is left of a run whose JVMs died on their own
        started = time.monotonic()
        deadline = started + timeout
        for path in (self.conf_dir, self.log_dir, self.tmp_dir, self._local_dir("driver")):
            path.mkdir(parents=True, exist_ok=True)
        ports = _distinct_free_ports(2 + 2 * self.workers)
        self.master_port, self.webui_port = ports[0], ports[1]
        self._worker_ports = [(ports[2 + 2 * i], ports[3 + 2 * i]) for i in range(self.workers)]
        try:
            self._master = self._spawn(
                "master",
                self._command(
                    _MASTER_CLASS,
                    *("--host", self.host),
                    *("--port", str(self.master_port)),
                    *("--webui-port", str(self.webui_port)),
                ),
                self._daemon_env(None),
            )
            self._await("ALIVE master", self._master_alive, deadline, timeout)
            for index, (port, webui) in enumerate(self._worker_ports, start=1):
                for path in (self.worker_dir(index), self._local_dir(f"worker-{index}")):
                    path.mkdir(parents=True, exist_ok=True)
                command = self._command(
                    _WORKER_CLASS,
                    *("--host", self.host),
                    *("--port", str(port)),
                    *("--webui-port", str(webui)),
                    *("--cores", str(self.cores_per_worker)),
                    *("--memory", self.memory_per_worker),
                    *("--work-dir", str(self.worker_dir(index))),
                    self.master_url,
                )
                self._workers.append(
                    self._spawn(f"worker-{index}", command, self._daemon_env(index))
                )
            self._await("registration of every worker", self._registered, deadline, timeout)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - started

    def stop(self, timeout: float = 30.0) -> None:
        """Stop every process of the cluster; return once none is left (by PID).

        The master first (a master that outlives a worker's executors asks the workers for
        new ones), then every worker at once (Spark's ``Worker`` kills its executors as it
        shuts down): SIGTERM, wait, SIGKILL of the JVM's process group (its executors with
        it) once ``timeout`` (seconds, for the whole stop) is spent; then SIGKILL of any
        process still carrying the cluster's marker (PySpark daemons and Python workers).
        Idempotent. Raises :class:`SparkClusterError` naming the PIDs of processes that
        survived (none should: SIGKILL cannot be ignored).
        """
        deadline = time.monotonic() + timeout
        if self._master is not None:
            self._stop_child(self._master, deadline)
            self._master = None
        for child in self._workers:
            if child.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    child.popen.send_signal(signal.SIGTERM)
        for child in self._workers:
            self._stop_child(child, deadline)
        self._workers = []
        survivors = _kill_marked(self.token, max(0.5, deadline - time.monotonic()))
        if survivors:
            raise SparkClusterError(f"processes of the cluster survived SIGKILL: {survivors}")

    def _stop_child(self, child: _Child, deadline: float) -> None:
        _terminate(child, max(0.5, deadline - time.monotonic()))
        with contextlib.suppress(ValueError):
            self._children.items.remove(child)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- processes -------------------------------------------------------------------------

    def master_pid(self) -> int | None:
        """PID of the master JVM, or ``None`` when it is not running."""
        if self._master is None or self._master.popen.poll() is not None:
            return None
        return self._master.popen.pid

    def worker_pids(self) -> list[int]:
        """PIDs of the worker JVMs now running, in worker order."""
        return [child.popen.pid for child in self._workers if child.popen.poll() is None]

    def executor_pids(self) -> list[int]:
        """PIDs of the ``CoarseGrainedExecutorBackend`` JVMs now running as children of the
        workers (there are none while no application is connected), ascending."""
        workers = set(self.worker_pids())
        return sorted(
            st.pid
            for st in live_processes()
            if st.ppid in workers and _EXECUTOR_CLASS in _cmdline(st.pid)
        )

    def kill_executor(self, *, pid: int | None = None) -> int:
        """SIGKILL one executor JVM (``pid``, or the lowest PID of :meth:`executor_pids`) and
        return its PID once it is gone (reaped by its worker), at most 10 s later.

        Its tasks fail; the driver reschedules them, and the master asks the worker for a new
        executor (Spark's standalone-mode docs: the master relaunches failed executors, up to
        ``spark.deploy.maxExecutorRetries`` in a row). Raises :class:`SparkClusterError` if no
        executor runs or ``pid`` is not one, :class:`SparkClusterTimeout` if it does not die.
        """
        executors = self.executor_pids()
        if pid is None:
            if not executors:
                raise SparkClusterError("no executor is running (is an application connected?)")
            pid = executors[0]
        elif pid not in executors:
            raise SparkClusterError(f"{pid} is not an executor of this cluster: {executors}")
        st = proc_stat(pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10.0
        while st is not None and process_alive(pid, st.starttime):
            if time.monotonic() >= deadline:
                raise SparkClusterTimeout(f"executor {pid} still alive 10 s after SIGKILL")
            time.sleep(0.01)
        return pid

    def processes(self) -> list[ClusterProcess]:
        """Every live process of the cluster (it carries the marker), by PID."""
        master = self.master_pid()
        workers = set(self.worker_pids())
        found = []
        for pid, _ in _marked_pids(self.token):
            st = proc_stat(pid)
            if st is None:
                continue
            command = _cmdline(pid)
            role: Literal["master", "worker", "executor", "python", "launcher", "other"]
            if pid == master:
                role = "master"
            elif pid in workers:
                role = "worker"
            elif _EXECUTOR_CLASS in command:
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
                    rss_kib=_rss_kib(pid),
                    command=command,
                )
            )
        return found

    # -- applications ----------------------------------------------------------------------

    def spark_conf(self) -> dict[str, str]:
        """The configuration a ``SparkSession`` needs to run on this cluster, e.g.
        ``pipeline.spark.start_spark(name, master=cluster.master_url,
        conf=cluster.spark_conf())``. Raises :class:`SparkClusterError` before :meth:`start`.

        From Spark's configuration and standalone-mode docs:

        * ``spark.master``; the driver on loopback (``spark.driver.host``,
          ``spark.driver.bindAddress``; the executors bind to 127.0.0.1 through their
          worker's ``SPARK_LOCAL_IP``, also passed as ``spark.executorEnv.SPARK_LOCAL_IP``);
        * one executor per worker: ``spark.executor.cores`` = ``cores_per_worker``,
          ``spark.executor.memory`` = ``memory_per_worker`` (the worker's ``--memory``),
          ``spark.cores.max`` = all cores; with 2 workers of 1 core and 1g, two executors fit
          a 2-core, 24 GiB machine with room for the driver and the brokers;
        * the scheduler waits (up to 60 s) for every executor to register before the first
          job (``spark.scheduler.minRegisteredResourcesRatio`` = 1.0), so the first tasks run on
          all workers, not on whichever executor came first;
        * Python: the executors run this interpreter (``sys.executable``: the venv's) for
          their Python workers (``spark.pyspark.python``, ``spark.executorEnv.PYSPARK_PYTHON``),
          with this process's ``PYTHONPATH`` (or that of ``env``) in
          ``spark.executorEnv.PYTHONPATH``, so they import the same modules as the driver
          (a worktree's ``pipeline``, not the venv's installed copy);
        * files: the executors' ``java.io.tmpdir`` and the driver's ``spark.local.dir`` in
          ``work_dir``; no driver UI (``spark.ui.enabled``).
        """
        python = sys.executable
        conf = {
            "spark.master": self.master_url,
            "spark.driver.host": self.host,
            "spark.driver.bindAddress": self.host,
            "spark.executor.cores": str(self.cores_per_worker),
            "spark.executor.memory": self.memory_per_worker,
            "spark.cores.max": str(self.cores_per_worker * self.workers),
            "spark.scheduler.minRegisteredResourcesRatio": "1.0",
            "spark.scheduler.maxRegisteredResourcesWaitingTime": "60s",
            "spark.pyspark.python": python,
            "spark.pyspark.driver.python": python,
            "spark.executorEnv.PYSPARK_PYTHON": python,
            "spark.executorEnv.SPARK_LOCAL_IP": self.host,
            "spark.executor.extraJavaOptions": (
                f"-Djava.io.tmpdir={self.tmp_dir} -Djava.net.preferIPv4Stack=true"
            ),
            "spark.local.dir": str(self._local_dir("driver")),
            "spark.ui.enabled": "false",
        }
        pythonpath = self.env.get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
        if pythonpath:
            conf["spark.executorEnv.PYTHONPATH"] = pythonpath
        return conf
