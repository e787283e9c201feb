"""The drill's baseline (``mq-sidecar drill --baseline``): what the same job does without a
sidecar, so that the report can give the sidecar's rates as a share of it (issue 18, part 4).

Before the real drill, on the same brokers (the serving ActiveMQ, no kill), the same Spark
session and the same cached partitions, the drill publishes the rows with the same writer
(:func:`pipeline.writer.publish`, same receipts and window) pointed at the broker's own STOMP
port, so the receipts are the broker's, while the same verifier (:class:`pipeline.verify.Reader`)
drains the queue straight from the broker; then it reconciles as the drill does. The
baseline uses its own queue (the drill's destination with ``.baseline`` appended) and the
drill's job name, so its rows carry the same ids and bodies.

There is no sidecar to count the SENDs, so each task reports its own count over UDP
(``WriterSettings.progress_port``, one datagram per receipt asked for, i.e. per 100 SENDs)
to a :class:`ProgressListener` here, which the drill's sampler reads as it reads the
producer sidecar's ``/metrics`` in the drill.

:func:`warm_workers` starts Spark's Python workers and imports the writer in them before the
baseline: otherwise the baseline alone would pay for that (about a second), and the drill
after it would find them warm.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import TYPE_CHECKING

from config import ConfigError, parse_broker_url

if TYPE_CHECKING:
    from collections.abc import Iterable

    from pyspark.sql import SparkSession

__all__ = ["ProgressListener", "broker_address", "warm_workers"]


class ProgressListener:
    """Receives the writer's progress datagrams (``"<partition>.<attempt> <sent>"``) on a free
    UDP port of 127.0.0.1 and sums the latest count of every task attempt (a retried task
    counts again, as a sidecar's SEND counter would). Call :meth:`close` at the end."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._socket.bind((host, 0))
        self._socket.settimeout(0.2)
        self.port: int = self._socket.getsockname()[1]
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, name="progress", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._halt.is_set():
            try:
                data = self._socket.recv(512)
            except TimeoutError:
                continue
            except OSError:
                return
            key, _, count = data.decode(errors="replace").partition(" ")
            with contextlib.suppress(ValueError), self._lock:
                self._counts[key] = max(self._counts.get(key, 0), int(count))

    def total(self) -> float:
        """SENDs reported so far, all tasks together."""
        with self._lock:
            return float(sum(self._counts.values()))

    def retried(self) -> int:
        """Task attempts after a task's first (Spark retries of a failed task: each attempt
        reports 0 when it starts)."""
        with self._lock:
            return sum(1 for key in self._counts if not key.endswith(".0"))

    def wait_for(self, count: int, timeout: float) -> bool:
        """Wait (at most ``timeout`` s) until ``count`` SENDs are reported; True if they are.
        The last datagrams of a publish may still be on their way when the job ends."""
        deadline = time.monotonic() + timeout
        while self.total() < count:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True

    def close(self) -> None:
        """Stop receiving and close the socket."""
        self._halt.set()
        self._thread.join(5.0)
        self._socket.close()


def broker_address(brokers: str) -> tuple[str, int]:
    """``(host, port)`` of the first broker of a failover URL (``--brokers``), where the
    baseline publishes and drains. Raises ``ValueError`` for a URL that does not parse or a
    first broker behind TLS (the writer and the reader speak plain STOMP)."""
    try:
        parsed, _ = parse_broker_url(brokers)
    except ConfigError as exc:
        raise ValueError(f"--brokers: {exc}") from exc
    first = parsed[0]
    if first.tls:
        raise ValueError(
            "--baseline goes straight to the first broker of --brokers with plain STOMP; "
            f"{first.host}:{first.port} is behind TLS"
        )
    return first.host, first.port


def warm_workers(spark: SparkSession) -> None:
    """Run one trivial task per core that imports the writer (module docstring)."""
    tasks = max(1, spark.sparkContext.defaultParallelism)

    def load(_: Iterable[int]) -> None:
        import stomp  # noqa: F401, PLC0415

        import pipeline.writer  # noqa: F401, PLC0415

    spark.sparkContext.parallelize(range(tasks), tasks).foreachPartition(load)
