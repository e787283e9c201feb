"""The sidecar under test as a separate process, as in production (``python -m proxy run``).

A separate process, not a thread of the harness: the sidecar gets its own interpreter and GIL,
its CPU and memory can be read from ``/proc/PID`` alone, and the load generator never competes
with it for the GIL. Configuration goes through a TOML file (``--config``) written into the
run's temporary directory; everything not given keeps the sidecar's defaults
(``config/examples/mq-sidecar.toml``), which is what a production sidecar runs with.

The child asks the kernel to SIGKILL it if the harness dies (``PR_SET_PDEATHSIG``, set by a tiny
wrapper before ``exec``), so an interrupted benchmark leaves no sidecar behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Self

from bench.procstat import cpu_seconds, rss_bytes
from testbed import free_port, wait_stomp

__all__ = ["SidecarError", "SidecarProcess", "broker_url"]

#: Runs in the child before exec: SIGKILL on the harness's death, then become the sidecar.
_WRAPPER = (
    "import ctypes, os, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL\n"
    "if os.getppid() != int(sys.argv[1]): os._exit(1)  # the harness is already gone\n"
    "os.execv(sys.executable, [sys.executable, *sys.argv[2:]])\n"
)


class SidecarError(RuntimeError):
    """The sidecar did not start, or died; the message ends with the tail of its log."""


def broker_url(host: str, port: int, vhost: str) -> str:
    """``stomp://host:port`` with the virtual host RabbitMQ needs (``?host=/``)."""
    return f"stomp://{host}:{port}" + (f"?host={vhost}" if vhost == "/" else "")


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(str(value))  # a TOML basic string is a JSON string


class SidecarProcess:
    """``mq-sidecar run`` in a child process on a free 127.0.0.1 port.

    Args:
        brokers: the broker list (a ``stomp://`` or ``failover:(...)`` URL).
        workdir: where the config file and the log (``sidecar-N.log``) go.
        options: more configuration options by their TOML names (``upstream_heartbeat``...).
        vhost: CONNECT ``host`` used by the readiness check (through the sidecar).

    Attributes: ``port`` (STOMP), ``pid``, ``log_path``.
    """

    _count = 0

    def __init__(
        self,
        brokers: str,
        workdir: Path,
        *,
        options: dict[str, object] | None = None,
        vhost: str = "/",
    ) -> None:
        SidecarProcess._count += 1
        self.brokers = brokers
        self.port = free_port()
        self.vhost = vhost
        self.options = dict(options or {})
        self.log_path = workdir / f"sidecar-{SidecarProcess._count}.log"
        self.config_path = workdir / f"sidecar-{SidecarProcess._count}.toml"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        """PID of the sidecar process. Raises SidecarError when it is not running."""
        if self._proc is None or self._proc.poll() is not None:
            raise SidecarError(f"sidecar is not running\n{self.log_tail()}")
        return self._proc.pid

    def log_tail(self, lines: int = 30) -> str:
        """The last ``lines`` lines of the sidecar's log (stderr)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "<no sidecar log>"
        return "--- sidecar log (tail) ---\n" + "\n".join(text.splitlines()[-lines:])

    def start(self, timeout: float = 60.0) -> None:
        """Write the config, start the process, wait until a STOMP CONNECT through it to the
        broker is answered. Raises SidecarError on failure (log tail included)."""
        values: dict[str, object] = {
            "listen": f"127.0.0.1:{self.port}",
            "admin_listen": "127.0.0.1:0",
            "brokers": self.brokers,
            "log_level": "warning",
            **self.options,
        }
        self.config_path.write_text(
            "".join(f"{key} = {_toml_value(value)}\n" for key, value in values.items())
        )
        cmd = [
            sys.executable,
            "-c",
            _WRAPPER,
            str(os.getpid()),
            "-m",
            "proxy",
            "run",
            "--config",
            str(self.config_path),
        ]
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        try:
            deadline = time.monotonic() + timeout
            while True:
                if self._proc.poll() is not None:
                    raise SidecarError(
                        f"sidecar exited with code {self._proc.returncode}\n{self.log_tail()}"
                    )
                try:
                    wait_stomp("127.0.0.1", self.port, timeout=1.0, vhost=self.vhost)
                    return
                except TimeoutError:
                    if time.monotonic() > deadline:
                        raise SidecarError(
                            f"sidecar not ready within {timeout} s\n{self.log_tail()}"
                        ) from None
        except BaseException:
            self.stop()
            raise

    def alive(self) -> bool:
        """True while the process runs."""
        return self._proc is not None and self._proc.poll() is None

    def cpu(self) -> float:
        """CPU seconds used so far (``/proc/PID/stat``)."""
        return cpu_seconds(self.pid)

    def rss(self) -> int:
        """Resident memory now, bytes (``VmRSS``)."""
        return rss_bytes(self.pid)

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM (graceful drain), wait up to ``timeout`` s, then SIGKILL. Idempotent."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        self._proc = None

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
