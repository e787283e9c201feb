"""The sidecar under test as a separate process, as in production (``python -m proxy run``):
:class:`testbed.sidecar.SidecarProcess` with the benchmarks' defaults and calling convention.

Configuration goes through a TOML file written into the run's temporary directory; everything
not given keeps the sidecar's defaults (``config/examples/mq-sidecar.toml``), which is what a
production sidecar runs with, except ``log_level = "warning"`` (a benchmark's log would be
mostly per-session lines). Ready means a STOMP CONNECT through the sidecar is answered (the
broker is reachable too). The child is SIGKILLed if the harness dies, so an interrupted
benchmark leaves no sidecar behind.
"""

from __future__ import annotations

import itertools
from pathlib import Path

from bench.procstat import run_ns
from testbed import sidecar
from testbed.sidecar import SidecarError

__all__ = ["SidecarError", "SidecarProcess", "broker_url"]

#: Numbers the sidecars of one benchmark process: logs ``sidecar-N.log`` (bench.run keeps the
#: logs of failed workloads by that pattern).
_numbers = itertools.count(1)


def broker_url(host: str, port: int, vhost: str) -> str:
    """``stomp://host:port`` with the virtual host RabbitMQ needs (``?host=/``)."""
    return f"stomp://{host}:{port}" + (f"?host={vhost}" if vhost == "/" else "")


class SidecarProcess(sidecar.SidecarProcess):
    """``mq-sidecar run`` in a child process on free 127.0.0.1 ports.

    Args:
        brokers: the broker list (a ``stomp://`` or ``failover:(...)`` URL).
        workdir: where the config file and the log (``sidecar-N.log``) go.
        options: more configuration options by their TOML names (``upstream_heartbeat``...).
        vhost: CONNECT ``host`` used by the readiness check (through the sidecar).

    Unlike the base class, :meth:`start` waits until the sidecar is ready, and ``pid`` raises
    :class:`SidecarError` when it is not running.
    """

    def __init__(
        self,
        brokers: str,
        workdir: Path,
        *,
        options: dict[str, object] | None = None,
        vhost: str = "/",
    ) -> None:
        super().__init__(
            f"sidecar-{next(_numbers)}",
            workdir,
            brokers=brokers,
            options={"log_level": "warning", **(options or {})},
            readiness="stomp",
            vhost=vhost,
        )

    @property
    def pid(self) -> int:
        """PID of the sidecar process. Raises SidecarError when it is not running."""
        pid = self._broker_pid()
        if pid is None:
            raise SidecarError(f"sidecar is not running\n{self.log_tail()}")
        return pid

    def start(self, timeout: float = 60.0) -> None:
        """Write the config, start the process, wait until a STOMP CONNECT through it to the
        broker is answered. Raises SidecarError on failure (log tail included)."""
        super().start()
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise

    def alive(self) -> bool:
        """True while the process runs."""
        return self.running()

    def cpu(self) -> float:
        """CPU seconds used so far, every thread, nanosecond resolution
        (:func:`bench.procstat.run_ns`: a synchronous workload of 2,000 round trips is a
        few 10 ms clock ticks of ``/proc/PID/stat``). Raises SidecarError when the sidecar is
        not running."""
        try:
            return run_ns(self.pid) / 1e9
        except ProcessLookupError as exc:
            raise SidecarError(f"sidecar is not running: {exc}") from exc

    def rss(self) -> int:
        """Resident memory now, bytes (``VmRSS``)."""
        return self.rss_kib() * 1024
