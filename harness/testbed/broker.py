"""Broker child processes: start, readiness, orderly stop, crash, hang, and orphan cleanup.

Design (facts in docs/brokers.md, "Running them for tests"):

* Every broker is a ``subprocess.Popen`` child of the calling process, never daemonized, with
  stdout and stderr appended to ``log_path``. Each child gets its own session and process
  group (``start_new_session=True``): terminal Ctrl-C does not reach the brokers directly
  (teardown stays under the test bed's control) and a whole group can be killed at once.
* Readiness is a STOMP 1.2 CONNECT answered with CONNECTED (``testbed.probe``).
* Stop is SIGCONT (a suspended broker cannot handle SIGTERM), SIGTERM, ``wait(timeout)``,
  then SIGKILL of the whole group, and it returns only once no process of the group is alive
  any more, so the ports can be bound again at once.
* Nothing is left behind: a ``weakref.finalize`` per broker stops it when the object is
  collected or the interpreter exits normally (``atexit``), and a tiny guardian process
  (``testbed._guardian``) SIGKILLs the groups still registered if this process dies without
  running ``atexit`` (SIGKILL, ``os._exit`` from a pytest-timeout thread).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Self

from testbed.probe import RETRY_INTERVAL, stomp_handshake
from testbed.tls import TlsListener

__all__ = ["BrokerError", "BrokerProcess", "BrokerTimeout", "log_tail"]

#: Broker names become file names, ActiveMQ broker names and Erlang node names.
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$")

#: Seconds given to each orderly stop when cleaning up at interpreter exit or garbage
#: collection (shorter than ``stop()``'s default: a broker busy for minutes may take >2 s).
_CLEANUP_TIMEOUT = 5.0


class BrokerError(RuntimeError):
    """A broker could not be started, did not become ready, or died while starting.

    The message includes the tail of the broker's log file.
    """


class BrokerTimeout(BrokerError, TimeoutError):
    """The broker process is alive but did not answer STOMP CONNECT in time."""


def log_tail(path: Path, *, offset: int = 0, max_bytes: int = 8000, max_lines: int = 40) -> str:
    """Return the last ``max_lines`` lines (at most ``max_bytes`` bytes) of ``path``.

    Only the part from byte ``offset`` on is considered (the current run's output when the
    log is appended to across restarts). Returns a placeholder when the file is missing.
    """
    try:
        with path.open("rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(offset, size - max_bytes))
            data = f.read()
    except OSError as exc:
        return f"<no log: {exc}>"
    lines = data.decode("utf-8", errors="replace").splitlines()
    return "\n".join(lines[-max_lines:])


# --- /proc helpers ---------------------------------------------------------------------


@dataclass(frozen=True)
class ProcStat:
    """The fields of ``/proc/PID/stat`` the test bed uses (proc(5)).

    ``state`` is the one-letter state (``Z`` zombie, ``T`` stopped...); ``starttime`` is in
    clock ticks since boot and tells a PID's incarnations apart.
    """

    pid: int
    comm: str
    state: str
    ppid: int
    pgrp: int
    starttime: int


def proc_stat(pid: int) -> ProcStat | None:
    """Read ``/proc/PID/stat``; ``None`` if the process does not exist (any more)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text(errors="replace")
    except OSError:  # FileNotFoundError, ProcessLookupError (ESRCH while reading)...
        return None
    # "pid (comm) state ppid pgrp session tty_nr tpgid flags ... starttime(22nd field)";
    # comm may contain spaces and parentheses, so split at the last ")".
    head, _, rest = raw.rpartition(")")
    comm = head.partition("(")[2]
    fields = rest.split()
    return ProcStat(
        pid=pid,
        comm=comm,
        state=fields[0],
        ppid=int(fields[1]),
        pgrp=int(fields[2]),
        starttime=int(fields[19]),
    )


def _all_pids() -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def live_processes(*, pgrp: int | None = None, ppid: int | None = None) -> list[ProcStat]:
    """Processes that are not zombies, optionally only those of one group or one parent."""
    found = []
    for pid in _all_pids():
        st = proc_stat(pid)
        if st is None or st.state == "Z":
            continue
        if pgrp is not None and st.pgrp != pgrp:
            continue
        if ppid is not None and st.ppid != ppid:
            continue
        found.append(st)
    return found


def process_alive(pid: int, starttime: int | None = None) -> bool:
    """True while ``pid`` exists and is not a zombie (and, if given, has that start time)."""
    st = proc_stat(pid)
    if st is None or st.state == "Z":
        return False
    return starttime is None or st.starttime == starttime


def _listening(port: int) -> bool:
    """True if a TCP socket (IPv4 or IPv6) is in LISTEN state on local ``port`` (proc(5))."""
    wanted = f":{port:04X}"
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            # "sl local_address rem_address st ...": st 0A is TCP_LISTEN.
            if len(fields) > 3 and fields[1].endswith(wanted) and fields[3] == "0A":
                return True
    return False


# --- guardian --------------------------------------------------------------------------


class _Guardian:
    """Parent side of ``testbed._guardian``: one guardian process per Python process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._pid = os.getpid()

    def _pipe(self) -> IO[bytes] | None:
        if self._pid != os.getpid():  # forked child: the pipe belongs to the parent
            self._proc = None
            self._pid = os.getpid()
        if self._proc is None or self._proc.poll() is not None:
            script = Path(__file__).with_name("_guardian.py")
            try:
                self._proc = subprocess.Popen(
                    [sys.executable, "-I", str(script)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
            except OSError:
                return None
        return self._proc.stdin

    def _send(self, line: str) -> None:
        with self._lock:
            pipe = self._pipe()
            if pipe is None:
                return
            try:
                pipe.write(line.encode() + b"\n")
                pipe.flush()
            except (BrokenPipeError, ValueError):
                self._proc = None

    def watch(self, pgid: int) -> None:
        """Have the guardian SIGKILL group ``pgid`` if this process dies first."""
        self._send(f"+{pgid}")

    def forget(self, pgid: int) -> None:
        """Group ``pgid`` is gone; stop watching it."""
        self._send(f"-{pgid}")

    def close(self) -> None:
        """At a normal exit: close the pipe (the guardian kills what is still watched, as on
        any exit) and reap it, so the interpreter does not warn about a running child."""
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is None or self._pid != os.getpid():
            return
        with contextlib.suppress(OSError, ValueError):
            if proc.stdin is not None:
                proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)


_GUARDIAN = _Guardian()
atexit.register(_GUARDIAN.close)


# --- children --------------------------------------------------------------------------


@dataclass
class _Child:
    """One Popen child, leader of its own process group (``pgid == popen.pid``)."""

    label: str
    popen: subprocess.Popen[bytes]

    @property
    def pgid(self) -> int:
        return self.popen.pid


@dataclass
class _Children:
    """The live children of one broker; shared with its finalizer (which must not hold it)."""

    items: list[_Child] = field(default_factory=list)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _wait_group_empty(pgid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while live_processes(pgrp=pgid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def _terminate(child: _Child, timeout: float) -> None:
    """Orderly stop of one child group: SIGCONT, SIGTERM, wait, SIGKILL; reap; forget."""
    popen = child.popen
    if popen.poll() is None:
        _signal_group(child.pgid, signal.SIGCONT)
        with contextlib.suppress(ProcessLookupError):
            popen.send_signal(signal.SIGTERM)
        try:
            popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _signal_group(child.pgid, signal.SIGKILL)
            popen.wait()
    # The leader is reaped; descendants (beam.smp under RabbitMQ's sh wrapper) may not be.
    if not _wait_group_empty(child.pgid, min(timeout, 5.0)):
        _signal_group(child.pgid, signal.SIGCONT)
        _signal_group(child.pgid, signal.SIGKILL)
        _wait_group_empty(child.pgid, 5.0)
    _GUARDIAN.forget(child.pgid)


def _cleanup(children: _Children) -> None:
    """Finalizer: stop every child still registered (newest first)."""
    while children.items:
        child = children.items.pop()
        with contextlib.suppress(Exception):
            _terminate(child, _CLEANUP_TIMEOUT)


# --- base class ------------------------------------------------------------------------


class BrokerProcess:
    """A real broker (or, see ``testbed.sidecar``, the sidecar) run as a child process, for
    tests, the demo, failover drills and benchmarks.

    Files: everything of the instance lives in ``workdir / name`` (created), the log is
    ``workdir / f"{name}.log"`` (appended to across restarts; each start writes a marker
    line). Two instances may share ``workdir`` if their names differ.

    Use as a context manager (``__enter__`` = ``start()`` + ``wait_ready()``, ``__exit__`` =
    ``stop()``) or call the methods directly. Not thread-safe: drive one instance from one
    thread at a time.
    """

    name: str
    host: str = "127.0.0.1"
    stomp_port: int
    workdir: Path
    log_path: Path
    #: STOMP CONNECT ``host`` header to use with this broker.
    vhost: str = "/"
    #: Credentials for STOMP CONNECT (``None``: send no login/passcode header).
    login: str | None = None
    passcode: str | None = None
    #: Whether the orphan guardian SIGKILLs the children if this process dies.
    _guarded: bool = True
    #: The TLS STOMP listener's files and policy, and its port (``None``: no TLS listener).
    tls: TlsListener | None = None
    tls_port: int | None = None

    def __init__(self, name: str, workdir: Path, *, stomp_port: int) -> None:
        if not _NAME_RE.match(name):
            raise ValueError(f"broker name must match {_NAME_RE.pattern}: {name!r}")
        self.name = name
        self.workdir = Path(workdir).absolute()
        self.base_dir = self.workdir / name
        self.log_path = self.workdir / f"{name}.log"
        self.stomp_port = stomp_port
        self._children = _Children()
        self._server: _Child | None = None
        self._log_offset = 0
        self._finalizer = weakref.finalize(self, _cleanup, self._children)

    def __repr__(self) -> str:
        state = "running" if self.running() else "stopped"
        return f"<{type(self).__name__} {self.name} {self.stomp_url} {state}>"

    # -- hooks for subclasses -----------------------------------------------------------

    def _prepare(self) -> None:
        """Write configuration files into ``base_dir`` (called by ``start()``)."""

    def _before_server(self) -> None:
        """Start helper processes the server needs (called by ``start()``)."""

    def _server_command(self) -> list[str]:
        raise NotImplementedError

    def _server_env(self) -> dict[str, str]:
        return dict(os.environ)

    def _broker_pid(self) -> int | None:
        """PID of the process that is the broker (to SIGKILL/SIGSTOP), if running."""
        return self._server.popen.pid if self.running() and self._server else None

    # -- helpers ------------------------------------------------------------------------

    def _spawn(self, label: str, command: list[str], env: dict[str, str]) -> _Child:
        with self.log_path.open("ab") as log:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            log.write(f"\n=== testbed {stamp}: {self.name}: starting {label}: ".encode())
            log.write(shlex.join(command).encode() + b"\n")
            log.flush()
            try:
                popen = subprocess.Popen(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=self.base_dir,
                    env=env,
                    start_new_session=True,
                )
            except OSError as exc:
                raise BrokerError(f"{self.name}: cannot run {command[0]}: {exc}") from exc
        if self._guarded:
            _GUARDIAN.watch(popen.pid)
        child = _Child(label, popen)
        self._children.items.append(child)
        return child

    def _drop(self, child: _Child, timeout: float) -> None:
        _terminate(child, timeout)
        with contextlib.suppress(ValueError):
            self._children.items.remove(child)
        if child is self._server:
            self._server = None

    def _log_since_start(self) -> str:
        try:
            with self.log_path.open("rb") as f:
                f.seek(self._log_offset)
                return f.read().decode("utf-8", errors="replace")
        except OSError:
            return ""

    def _tail(self) -> str:
        return f"--- {self.log_path} (tail) ---\n" + log_tail(
            self.log_path, offset=self._log_offset
        )

    def _require_pid(self) -> int:
        pid = self.pid
        if pid is None:
            raise BrokerError(f"{self.name} is not running")
        return pid

    # -- public API ---------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """PID to signal for a crash or a hang, or ``None`` when not running."""
        return self._broker_pid()

    @property
    def stomp_url(self) -> str:
        """``stomp://HOST:PORT`` of the broker's STOMP listener."""
        return f"stomp://{self.host}:{self.stomp_port}"

    @property
    def stomp_ssl_url(self) -> str:
        """``stomp+ssl://HOST:PORT`` of the broker's TLS STOMP listener (``tls=`` given)."""
        if self.tls_port is None:
            raise BrokerError(f"{self.name} has no TLS listener: pass tls= to the constructor")
        return f"stomp+ssl://{self.host}:{self.tls_port}"

    def running(self) -> bool:
        """True while the broker's server process has not exited (suspended counts)."""
        return self._server is not None and self._server.popen.poll() is None

    def start(self) -> None:
        """Launch the broker (no daemonizing) and return at once; see ``wait_ready()``.

        Raises ``BrokerError`` if it is already running, cannot be launched, or exits at
        once (for instance a bad Java path).
        """
        if self.running():
            raise BrokerError(f"{self.name} is already running (pid {self.pid})")
        if self._server is not None:  # crashed or exited on its own: reap what is left
            self._drop(self._server, _CLEANUP_TIMEOUT)
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self._prepare()
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        self._before_server()
        self._server = self._spawn("server", self._server_command(), self._server_env())
        if self._server.popen.poll() is not None:
            code = self._server.popen.returncode
            raise BrokerError(f"{self.name} exited at once with code {code}\n{self._tail()}")

    def _on_ready(self) -> None:
        """Called once when ``wait_ready()`` succeeds."""

    def wait_ready(self, timeout: float = 60.0) -> float:
        """Wait until the broker answers STOMP CONNECT with CONNECTED (and, with a TLS
        listener, until a socket listens on ``tls_port``); return seconds waited.

        ``timeout`` is in seconds. Raises ``BrokerError`` (with the log tail) if the process
        exits meanwhile, ``BrokerTimeout`` (a ``BrokerError`` and a ``TimeoutError``) when it
        is still alive after ``timeout``.
        """
        if self._server is None:
            raise BrokerError(f"{self.name} is not started: call start() first")
        started = time.monotonic()
        deadline = started + timeout
        last = "no attempt made"
        while True:
            if not self.running():
                code = self._server.popen.returncode if self._server else None
                raise BrokerError(
                    f"{self.name} exited with code {code} before answering STOMP on "
                    f"{self.host}:{self.stomp_port}\n{self._tail()}"
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BrokerTimeout(
                    f"{self.name} did not answer STOMP CONNECT on {self.host}:{self.stomp_port} "
                    f"within {timeout:.1f} s (last: {last})\n{self._tail()}"
                )
            try:
                # Short attempts, so that a death is noticed quickly even if something
                # else accepts connections on the port.
                result = stomp_handshake(
                    self.host,
                    self.stomp_port,
                    timeout=min(remaining, 1.0),
                    vhost=self.vhost,
                    login=self.login,
                    passcode=self.passcode,
                )
            except (OSError, EOFError) as exc:
                last = f"{type(exc).__name__}: {exc}"
            else:
                if result.connected:
                    break
                last = result.describe()
            time.sleep(max(0.0, min(RETRY_INTERVAL, deadline - time.monotonic())))
        if self.tls_port is not None:
            self._wait_tls_port(self.tls_port, deadline, timeout)
        self._on_ready()
        return time.monotonic() - started

    def _wait_tls_port(self, port: int, deadline: float, timeout: float) -> None:
        """Wait until a socket listens on ``port`` (called once the plain listener answers,
        when the TLS one is normally open already).

        Read from ``/proc/net/tcp*``, not by connecting: a connection closed without a TLS
        handshake is logged by the broker as a failed handshake.
        """
        while not _listening(port):
            if not self.running():
                code = self._server.popen.returncode if self._server else None
                raise BrokerError(
                    f"{self.name} exited with code {code} before its TLS listener "
                    f"{self.host}:{port} accepted connections\n{self._tail()}"
                )
            if time.monotonic() >= deadline:
                raise BrokerTimeout(
                    f"{self.name}'s TLS listener {self.host}:{port} did not accept "
                    f"connections within {timeout:.1f} s\n{self._tail()}"
                )
            time.sleep(0.01)

    def stop(self, timeout: float = 15.0) -> None:
        """Stop the broker and its helpers; return once every process of theirs is gone.

        Per process group: SIGCONT (in case it is suspended), SIGTERM, wait up to
        ``timeout`` seconds, then SIGKILL. Idempotent; a no-op when nothing runs.
        """
        while self._children.items:
            self._drop(self._children.items[-1], timeout)
        self._server = None

    def kill(self) -> None:
        """Crash the broker: SIGKILL its process (``pid``), then reap it.

        Helper processes (RabbitMQ's epmd) keep running, as on a real host; ``stop()`` or a
        new ``start()`` deal with them.
        """
        pid = self._require_pid()
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30.0
        while process_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.005)
        if self._server is not None:
            self._drop(self._server, 10.0)

    def suspend(self) -> None:
        """SIGSTOP the broker (a hung broker: TCP still accepts, nothing answers)."""
        os.kill(self._require_pid(), signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT the broker after ``suspend()``."""
        os.kill(self._require_pid(), signal.SIGCONT)

    def __enter__(self) -> Self:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
