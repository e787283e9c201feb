"""mq-sidecar as a real child process for the drill, and readers of its admin plane.

:class:`SidecarProcess` runs ``python -m proxy run --config FILE`` with a TOML file the drill
writes (every option explicit; ``MQ_SIDECAR_*`` variables of the caller are not passed on, so
the drill's sidecars do not depend on the caller's environment), waits for ``/readyz``, and
stops it with SIGTERM (graceful drain), then SIGKILL after a deadline. On Linux the child
gets ``PR_SET_PDEATHSIG`` = SIGTERM, so it drains and exits even if the drill is killed.

:func:`parse_metrics` turns ``/metrics`` into ``{sample name: [(labels, value)]}``.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from prometheus_client.parser import text_string_to_metric_families

from testbed import free_port
from testbed.broker import log_tail

__all__ = ["Metrics", "SidecarError", "SidecarProcess", "metric_total", "parse_metrics"]

#: ``{sample name: [(labels, value), ...]}`` of one scrape.
Metrics = dict[str, list[tuple[dict[str, str], float]]]

_PR_SET_PDEATHSIG = 1


class SidecarError(RuntimeError):
    """The sidecar process could not start, did not become ready, or died."""


def _parent_death_signal() -> Callable[[], None] | None:
    """A ``preexec_fn`` that asks Linux to SIGTERM the child when its parent dies."""
    if not sys.platform.startswith("linux"):
        return None
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return None
    prctl = ctypes.CDLL(libc_name, use_errno=True).prctl  # loaded before the fork
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string is a JSON string for these values
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
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


class SidecarProcess:
    """One mq-sidecar daemon as a child process on free loopback ports.

    Args:
        name: file names in ``workdir`` (``NAME.toml``, ``NAME.log``).
        workdir: directory for the configuration file and the log (created).
        brokers: the ``brokers`` option (failover URL).
        options: further configuration options (names of config/examples/mq-sidecar.toml).

    ``port`` is the STOMP listener, ``admin_port`` the admin plane, both on 127.0.0.1.
    """

    def __init__(
        self, name: str, workdir: Path, brokers: str, options: Mapping[str, object] | None = None
    ) -> None:
        self.name = name
        self.workdir = Path(workdir)
        self.brokers = brokers
        self.options = dict(options or {})
        self.host = "127.0.0.1"
        self.port = free_port()
        self.admin_port = free_port()
        self.config_path = self.workdir / f"{name}.toml"
        self.log_path = self.workdir / f"{name}.log"
        self._popen: subprocess.Popen[bytes] | None = None

    def __repr__(self) -> str:
        return f"<SidecarProcess {self.name} 127.0.0.1:{self.port} pid={self.pid}>"

    @property
    def pid(self) -> int | None:
        """The daemon's PID while it runs."""
        return self._popen.pid if self._popen is not None else None

    def running(self) -> bool:
        """True while the process has not exited."""
        return self._popen is not None and self._popen.poll() is None

    def _write_config(self) -> None:
        values: dict[str, object] = {
            "listen": f"{self.host}:{self.port}",
            "admin_listen": f"{self.host}:{self.admin_port}",
            "brokers": self.brokers,
            **self.options,
        }
        lines = [f"# written by mq-sidecar drill for {self.name}"]
        lines += [f"{key} = {_toml_value(value)}" for key, value in values.items()]
        self.config_path.write_text("\n".join(lines) + "\n")

    def start(self) -> None:
        """Write the configuration and launch the daemon (returns at once)."""
        if self.running():
            raise SidecarError(f"{self.name} is already running")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._write_config()
        env = {k: v for k, v in os.environ.items() if not k.startswith("MQ_SIDECAR_")}
        command = [sys.executable, "-m", "proxy", "run", "--config", str(self.config_path)]
        with self.log_path.open("ab") as log:
            self._popen = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # a terminal's Ctrl-C is the drill's to handle
                preexec_fn=_parent_death_signal(),  # noqa: PLW1509 (before any thread starts)
            )

    def _tail(self) -> str:
        return f"--- {self.log_path} (tail) ---\n{log_tail(self.log_path)}"

    def get(self, path: str, timeout: float = 10.0) -> tuple[int, bytes]:
        """``GET path`` on the admin plane: ``(status, body)``. Raises ``OSError`` when the
        admin plane does not answer."""
        url = f"http://{self.host}:{self.admin_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                return int(response.status), bytes(response.read())
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.read()

    def wait_ready(self, timeout: float = 60.0) -> float:
        """Wait until ``/readyz`` answers 200; return the seconds waited.

        Raises :class:`SidecarError` (with the log's tail) if the process exits or is not
        ready within ``timeout`` seconds.
        """
        started = time.monotonic()
        last = "no answer yet"
        while True:
            if not self.running():
                code = self._popen.returncode if self._popen else None
                raise SidecarError(f"{self.name} exited with code {code}\n{self._tail()}")
            with contextlib.suppress(OSError):
                status, body = self.get("/readyz", timeout=2.0)
                if status == 200:
                    return time.monotonic() - started
                last = f"{status} {body.decode(errors='replace').strip()}"
            if time.monotonic() - started > timeout:
                raise SidecarError(
                    f"{self.name} not ready within {timeout:.0f} s (last: {last})\n{self._tail()}"
                )
            time.sleep(0.05)

    def metrics(self, timeout: float = 10.0) -> Metrics:
        """One scrape of ``/metrics``, parsed. Raises ``OSError`` if it does not answer."""
        status, body = self.get("/metrics", timeout=timeout)
        if status != 200:
            raise OSError(f"{self.name} /metrics answered {status}")
        return parse_metrics(body.decode())

    def status(self, timeout: float = 10.0) -> dict[str, Any]:
        """``/status`` as a dict. Raises ``OSError`` if it does not answer."""
        status, body = self.get("/status", timeout=timeout)
        if status != 200:
            raise OSError(f"{self.name} /status answered {status}")
        result: dict[str, Any] = json.loads(body)
        return result

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM (graceful drain), wait up to ``timeout`` seconds, then SIGKILL; return the
        exit status (None if it was never started). Idempotent."""
        popen = self._popen
        if popen is None:
            return None
        if popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                popen.send_signal(signal.SIGTERM)
            try:
                popen.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(popen.pid, signal.SIGKILL)
                popen.wait()
        return popen.returncode

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
