"""mq-sidecar itself as a child process (``python -m proxy run --config FILE``), as in
production, for the fuzz tests, the failover drill and the benchmarks.

A separate process, not a thread of the harness: its memory, CPU and sockets are its own in
``/proc/PID``, a crash is an exit (with the traceback in its own log), and the harness's clients
never compete with it for the GIL.

:class:`SidecarProcess` is a :class:`~testbed.broker.BrokerProcess`: a process group of its own,
a log appended to across restarts with a marker line per start, an orderly stop (SIGTERM, then
SIGKILL after a deadline), stopped at interpreter exit. Its configuration is a TOML file written
from keyword options; every ``MQ_SIDECAR_*`` variable of the caller is removed from its
environment, so the file alone says how it runs (``MQ_SIDECAR_PURE``, the build of the core
and no option, is kept). Ready means either ``/readyz`` answers 200
(``readiness="readyz"``) or a STOMP CONNECT through the sidecar is answered with CONNECTED, so
the broker is reachable too (``readiness="stomp"``).

If the harness dies, the kernel signals the sidecar (``PR_SET_PDEATHSIG``, set by
``testbed/_parent_death.py`` before it execs the sidecar): SIGKILL by default, which the orphan
guardian of :mod:`testbed.broker` backs up, or SIGTERM so that it drains first (the drill).
Linux sends that signal when the *thread* that started the child ends, not the process: a
sidecar started from any thread but the main one (e.g. restarted by the drill's fault thread)
therefore runs without it, watched by the orphan guardian instead (SIGKILL if the harness dies).

Readers: the admin plane (:meth:`~SidecarProcess.get`, :meth:`~SidecarProcess.metrics` parsed by
:func:`parse_metrics`, :meth:`~SidecarProcess.status`), ``/proc`` (CPU seconds, RSS and peak RSS
in KiB, file descriptors, TCP sockets by role) and the log since the last start.
"""

from __future__ import annotations

import collections
import http.client
import importlib.util
import json
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from prometheus_client.parser import text_string_to_metric_families

from testbed.broker import BrokerError, BrokerProcess
from testbed.probe import free_port

__all__ = [
    "Metrics",
    "SidecarError",
    "SidecarProcess",
    "Sockets",
    "metric_total",
    "parse_metrics",
    "toml_value",
]

#: ``{sample name: [(labels, value), ...]}`` of one scrape.
Metrics = dict[str, list[tuple[dict[str, str], float]]]

#: Log records that mean a bug: anything logged at ERROR or CRITICAL.
_ERROR_RECORD = re.compile(r"^\S+ \S+ (?:ERROR|CRITICAL) .*$", re.MULTILINE)
#: The ports of the broker URLs in a ``brokers`` option.
_BROKER_PORT = re.compile(r"://(?:[^@/,()]*@)?[^:/,()]+:(\d+)")


class SidecarError(BrokerError):
    """The sidecar could not start, did not become ready, died, or is not running; the message
    ends with the tail of its log where there is one."""


def toml_value(value: object) -> str:
    """``value`` (bool, int, float, str, or a list of them) as a TOML value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string is a JSON string for these values
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")


def parse_metrics(text: str) -> Metrics:
    """Parse a Prometheus text exposition into ``{sample name: [(labels, value)]}``."""
    out: Metrics = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    return out


def metric_total(metrics: Metrics, name: str, **labels: str) -> float:
    """Sum of the samples named ``name`` whose labels include ``labels`` (0 if none)."""
    return sum(
        value
        for sample_labels, value in metrics.get(name, [])
        if all(sample_labels.get(k) == v for k, v in labels.items())
    )


def _runtime_root() -> str | None:
    """The directory holding the ``proxy`` package this interpreter imports (the child gets it
    first on ``PYTHONPATH``, so it runs the same code as the harness)."""
    spec = importlib.util.find_spec("proxy")
    if spec is None or not spec.submodule_search_locations:
        return None
    return str(Path(next(iter(spec.submodule_search_locations))).parent)


@dataclass(frozen=True, slots=True)
class Sockets:
    """The sidecar's established TCP sockets by role: app connections (to the STOMP listener),
    upstream legs (to a broker's port), admin connections, anything else."""

    app: int
    upstream: int
    admin: int
    other: int


class SidecarProcess(BrokerProcess):
    """One mq-sidecar daemon as a child process on free 127.0.0.1 ports.

    Args:
        name: file names: the log is ``workdir/NAME.log``, the configuration
            ``workdir/NAME/mq-sidecar.toml``.
        workdir: the directory for both (created).
        brokers: the ``brokers`` option (a ``stomp://`` or ``failover:(...)`` URL).
        options: more configuration options by their TOML names
            (config/examples/mq-sidecar.toml); ``listen`` and ``admin_listen`` are set here.
        readiness: what :meth:`wait_ready` waits for: ``"stomp"``, a CONNECT through the
            sidecar answered with CONNECTED (with ``vhost`` as its ``host`` header), or
            ``"readyz"``, ``/readyz`` answering 200 (no session is opened).
        parent_death: the signal the sidecar gets if the harness dies: SIGKILL, or SIGTERM to
            let it drain (only when started from the main thread: module docstring).

    ``port`` (``stomp_port``) is the STOMP listener, ``admin_port`` the admin plane.
    """

    def __init__(
        self,
        name: str,
        workdir: Path,
        *,
        brokers: str,
        options: Mapping[str, object] | None = None,
        readiness: Literal["stomp", "readyz"] = "stomp",
        vhost: str = "/",
        parent_death: signal.Signals = signal.SIGKILL,
    ) -> None:
        super().__init__(name, workdir, stomp_port=free_port())
        self.admin_port = free_port()
        self.brokers = brokers
        self.options = dict(options or {})
        self.readiness = readiness
        self.vhost = vhost
        self.parent_death = parent_death
        # The guardian SIGKILLs at once when the harness dies: not for a sidecar meant to drain.
        self._guarded = parent_death == signal.SIGKILL
        self.config_path = self.base_dir / "mq-sidecar.toml"
        self._returncode: int | None = None

    @property
    def port(self) -> int:
        """The STOMP listener's port (``stomp_port``)."""
        return self.stomp_port

    @property
    def address(self) -> tuple[str, int]:
        """The STOMP listener."""
        return (self.host, self.stomp_port)

    @property
    def admin_address(self) -> tuple[str, int]:
        """The admin plane."""
        return (self.host, self.admin_port)

    @property
    def broker_ports(self) -> frozenset[int]:
        """The ports of the brokers in the ``brokers`` option."""
        return frozenset(int(port) for port in _BROKER_PORT.findall(self.brokers))

    @property
    def returncode(self) -> int | None:
        """Exit status of the last run (None while it runs or before the first start)."""
        if self._server is not None:
            return self._server.popen.poll()
        return self._returncode

    # -- BrokerProcess hooks -------------------------------------------------------------

    def _prepare(self) -> None:
        values: dict[str, object] = {
            **self.options,
            "brokers": self.brokers,
            "listen": f"{self.host}:{self.stomp_port}",
            "admin_listen": f"{self.host}:{self.admin_port}",
        }
        lines = [f"# written by testbed.sidecar for {self.name}"]
        lines += [f"{key} = {toml_value(value)}" for key, value in values.items()]
        self.config_path.write_text("\n".join(lines) + "\n")
        self._returncode = None

    def _server_command(self) -> list[str]:
        run = ["-m", "proxy", "run", "--config", str(self.config_path)]
        if threading.current_thread() is not threading.main_thread():
            return [sys.executable, *run]  # no parent-death signal: see the module docstring
        wrapper = str(Path(__file__).with_name("_parent_death.py"))
        return [sys.executable, "-I", wrapper, str(os.getpid()), str(int(self.parent_death)), *run]

    def _server_env(self) -> dict[str, str]:
        # The sidecar's options come from its file only; MQ_SIDECAR_PURE (which build of the
        # core runs, not an option) is kept, so a pure test run runs pure sidecars too.
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("MQ_SIDECAR_") or k == "MQ_SIDECAR_PURE"
        }
        root = _runtime_root()
        if root is not None:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
        return env

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Write the configuration and launch the sidecar (returns at once; see
        :meth:`wait_ready`). Raises :class:`SidecarError` if it is already running, cannot be
        launched or exits at once. From a thread other than the main one the sidecar gets no
        parent-death signal and the orphan guardian watches it (module docstring)."""
        main = threading.current_thread() is threading.main_thread()
        self._guarded = self.parent_death == signal.SIGKILL or not main
        try:
            super().start()
        except SidecarError:
            raise
        except BrokerError as exc:
            raise SidecarError(str(exc)) from None

    def wait_ready(self, timeout: float = 60.0) -> float:
        """Wait until the sidecar is ready (``readiness``); return the seconds waited.

        Raises :class:`SidecarError` (with the log's tail) if the process exits meanwhile or
        is not ready within ``timeout`` seconds.
        """
        if self.readiness == "stomp":
            try:
                return super().wait_ready(timeout)
            except BrokerError as exc:
                raise SidecarError(str(exc)) from None
        if self._server is None:
            raise SidecarError(f"{self.name} is not started: call start() first")
        started = time.monotonic()
        last = "no answer yet"
        while True:
            if not self.running():
                raise SidecarError(
                    f"{self.name} exited with code {self.returncode}\n{self.log_tail()}"
                )
            try:
                status, body = self.get("/readyz", timeout=2.0)
            except OSError as exc:
                last = f"{type(exc).__name__}: {exc}"
            else:
                if status == 200:
                    return time.monotonic() - started
                last = f"{status} {body.decode(errors='replace').strip()}"
            if time.monotonic() - started > timeout:
                raise SidecarError(
                    f"{self.name} not ready within {timeout:.0f} s (last: {last})\n"
                    f"{self.log_tail()}"
                )
            time.sleep(0.05)

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (graceful drain), wait up to ``timeout`` seconds, then SIGKILL; the exit
        status is then :attr:`returncode`. Idempotent."""
        server = self._server
        super().stop(timeout)
        if server is not None:
            self._returncode = server.popen.returncode

    def kill(self) -> None:
        """Crash the sidecar: SIGKILL its process and reap it; :attr:`returncode` is then
        ``-9``. :meth:`start` runs it again on the same ports with the same configuration (the
        same ``outbox_dir``, say), its log appended to with a new start marker."""
        server = self._server
        super().kill()
        if server is not None:
            self._returncode = server.popen.returncode

    # -- the admin plane -----------------------------------------------------------------

    def get(self, path: str, timeout: float = 10.0) -> tuple[int, bytes]:
        """``GET path`` on the admin plane: ``(status, body)``. Raises ``OSError`` when the
        admin plane does not answer (or answers something that is not HTTP)."""
        conn = http.client.HTTPConnection(self.host, self.admin_port, timeout=timeout)
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            return response.status, response.read()
        except http.client.HTTPException as exc:
            raise OSError(f"{self.name} {path}: {exc!r}") from exc
        finally:
            conn.close()

    def metrics(self, timeout: float = 10.0) -> Metrics:
        """One scrape of ``/metrics``, parsed. Raises ``OSError`` if it does not answer 200."""
        status, body = self.get("/metrics", timeout=timeout)
        if status != 200:
            raise OSError(f"{self.name} /metrics answered {status}")
        return parse_metrics(body.decode())

    def status(self, timeout: float = 10.0) -> dict[str, Any]:
        """``/status`` as a dict. Raises ``OSError`` if it does not answer 200."""
        status, body = self.get("/status", timeout=timeout)
        if status != 200:
            raise OSError(f"{self.name} /status answered {status}: {body[:200]!r}")
        result: dict[str, Any] = json.loads(body)
        return result

    # -- /proc -----------------------------------------------------------------------------

    def _live_pid(self) -> int:
        pid = self.pid
        if pid is None:
            raise SidecarError(f"{self.name} is not running\n{self.log_tail()}")
        return pid

    def _status_kib(self, field: str) -> int:
        pid = self._live_pid()
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
        raise ProcessLookupError(f"no {field} in /proc/{pid}/status (zombie?)")

    def cpu_seconds(self) -> float:
        """User + system CPU seconds used so far (``/proc/PID/stat``, every thread)."""
        fields = Path(f"/proc/{self._live_pid()}/stat").read_text().rpartition(")")[2].split()
        # After the ")" state is index 0: utime (field 14 of proc(5)) is 11, stime 12.
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_kib(self) -> int:
        """Resident memory now (``VmRSS``), KiB."""
        return self._status_kib("VmRSS")

    def peak_rss_kib(self) -> int:
        """Highest resident memory so far (``VmHWM``), KiB."""
        return self._status_kib("VmHWM")

    def fd_count(self) -> int:
        """Open file descriptors of the sidecar process."""
        return len(os.listdir(f"/proc/{self._live_pid()}/fd"))

    def sockets(self) -> Sockets:
        """Classify the process' established TCP sockets by the ports at either end
        (listening sockets are not counted)."""
        pid = self._live_pid()
        inodes = set()
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
        brokers = self.broker_ports
        counts = collections.Counter[str]()
        for table in ("tcp", "tcp6"):
            path = Path(f"/proc/{pid}/net/{table}")
            if not path.exists():
                continue
            for row in path.read_text().splitlines()[1:]:
                cols = row.split()
                if len(cols) < 10 or cols[9] not in inodes or cols[3] == "0A":  # 0A: LISTEN
                    continue
                local = int(cols[1].rsplit(":", 1)[1], 16)
                remote = int(cols[2].rsplit(":", 1)[1], 16)
                if local == self.stomp_port:
                    counts["app"] += 1
                elif remote in brokers:
                    counts["upstream"] += 1
                elif local == self.admin_port:
                    counts["admin"] += 1
                else:
                    counts["other"] += 1
        return Sockets(counts["app"], counts["upstream"], counts["admin"], counts["other"])

    # -- the log -----------------------------------------------------------------------------

    def log_text(self) -> str:
        """The sidecar's log since the last start."""
        return self._log_since_start()

    def log_tail(self) -> str:
        """The end of the log since the last start, with a header naming the file."""
        return self._tail()

    def error_log_lines(self) -> list[str]:
        """ERROR/CRITICAL records in the log since the last start (their first lines)."""
        return _ERROR_RECORD.findall(self.log_text())
