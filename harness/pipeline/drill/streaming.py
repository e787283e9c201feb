"""The drill's streaming consumer (``--consumer spark``): a Structured Streaming query reading the
queue through the consumer's sidecar into Parquet (:mod:`pipeline.stream_driver`, a driver
process of its own), whose driver the drill kills with SIGKILL midway and starts again on the
same checkpoint.

:class:`SparkConsumer` is the drill's consuming app in that mode (it has what
:class:`pipeline.verify.ConsumingApp` asks): its progress is the driver's progress file (rows
per finished micro-batch), what it received is the Parquet sink (only the files Spark
committed, per the sink's ``_spark_metadata`` log), read with pyarrow: every row by its
``row_id`` and a digest of its body, arriving at its micro-batch's time.

The driver kill (``kill_at``): once the batches have brought that share of the rows, a
watcher thread waits (up to :data:`KILL_WAIT` s) for a batch that Spark has logged in the
checkpoint's ``offsets/`` but not yet in ``commits/`` (the query mid-batch: messages read and
logged, not yet in the sink, not yet ACKed), SIGKILLs the driver's process group, and starts a
new driver at once with the same settings. The new one re-runs that batch from the read log
and goes on; what the broker redelivers is recognised by ``row-id`` (docs/spark.md).
Times are monotonic seconds unless the name says ``wall``.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pipeline.rows import body_digest
from pipeline.verify import Received

__all__ = ["KILL_WAIT", "DriverKill", "SparkConsumer", "StreamError"]

#: Seconds the driver kill waits for a batch in flight before it kills anyway.
KILL_WAIT = 30.0
#: Seconds a driver may take from its start to a running query.
START_TIMEOUT = 180.0
#: Seconds the drain waits longer for the first batch of a restarted driver: its query plans
#: and runs it only once it has executors and their Python workers (on the drill's cluster
#: with 2 loaded cores a new driver's first batch took up to 59 s, and a drain that counted
#: its idle time from the kill gave up 24 s after the restarted query ran: docs/results.md).
FIRST_BATCH_GRACE = 60.0


class StreamError(RuntimeError):
    """The streaming consumer's driver did not start its query, or it failed."""


@dataclass
class DriverKill:
    """One SIGKILL of the driver: ``pid`` killed, ``at_wall`` (Unix s), ``rows_before`` (rows
    its batches had brought), ``mid_batch`` (a batch was logged in ``offsets/`` and not in
    ``commits/``), ``new_pid`` and ``running_after_s`` (seconds from the kill until the new
    driver's query ran)."""

    pid: int
    at_wall: float
    rows_before: int
    mid_batch: bool
    new_pid: int | None = None
    running_after_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """The report's form."""
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(self).items()}


class SparkConsumer:
    """The streaming consumer of ``destination`` through the sidecar at ``host:port``
    (module docstring), its files in ``workdir`` (``checkpoint/``, ``sink/``, ``progress.jsonl``,
    ``driver.log``, ``spark-driver.log``).

    ``master``/``conf``: the Spark master and configuration of its driver; ``rows``: rows
    expected; ``kill_at``: share of ``rows`` after which the driver is killed and restarted
    (None: never); ``batch_rows``: ``max_messages_per_batch``; ``prefetch``: the reader's
    ``prefetch``; ``say``: progress lines. Call
    :meth:`start`, then :meth:`close` in any case."""

    def __init__(
        self,
        destination: str,
        *,
        host: str,
        port: int,
        workdir: Path,
        master: str,
        conf: dict[str, str],
        rows: int,
        kill_at: float | None,
        batch_rows: int = 5000,
        prefetch: int = 10000,
        say: Any = print,
    ) -> None:
        self.destination, self.host, self.port = destination, host, port
        self.workdir = workdir
        self.rows = rows
        self.kill_at = kill_at
        self.say = say
        self.checkpoint = workdir / "checkpoint"
        self.sink = workdir / "sink"
        self.progress_file = workdir / "progress.jsonl"
        self.stop_file = workdir / "stop"
        self.log = workdir / "driver.log"
        self.cfg: dict[str, Any] = {
            "master": master,
            "conf": conf,
            "log": str(workdir / "spark-driver.log"),
            "out": str(self.sink),
            "checkpoint": str(self.checkpoint),
            "progress": str(self.progress_file),
            "stop": str(self.stop_file),
            "options": {
                "host": host,
                "port": port,
                "destination": destination,
                "checkpoint_location": str(self.checkpoint),
                "id_header": "row-id",
                "max_messages_per_batch": batch_rows,
                "prefetch": prefetch,
                "timeout": 120,
            },
        }
        self.proc: subprocess.Popen[bytes] | None = None
        self.kills: list[DriverKill] = []
        self.errors: list[str] = []
        self.started_wall: list[float] = []
        self._batches: dict[int, tuple[int, float]] = {}
        #: The progress file's line of each micro-batch (its last run) and where the executors
        #: imported the data source from (a ``started`` line's ``package``, when it says).
        self.lines: dict[int, dict[str, Any]] = {}
        self.packages: list[str] = []
        self._starts: list[tuple[int, float]] = []
        self._offset = 0
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._watcher: threading.Thread | None = None
        self.last_at: float | None = None

    # -- the driver process ---------------------------------------------------------------

    def _spawn(self) -> subprocess.Popen[bytes]:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.stop_file.unlink(missing_ok=True)
        with self.log.open("ab") as log:
            return subprocess.Popen(
                [sys.executable, "-m", "pipeline.stream_driver", json.dumps(self.cfg)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=os.environ.copy(),
            )

    def _wait_running(self, proc: subprocess.Popen[bytes]) -> None:
        """Wait until ``proc`` wrote its ``started`` line (bounded by START_TIMEOUT)."""
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            self._read_progress()
            if any(pid == proc.pid for pid, _ in self._started()):
                return
            if proc.poll() is not None:
                raise StreamError(
                    f"the streaming driver exited with {proc.returncode} before its query ran "
                    f"(log {self.log}): {self._log_tail()}"
                )
            if time.monotonic() > deadline:
                raise StreamError(f"no running query within {START_TIMEOUT:.0f} s (log {self.log})")
            time.sleep(0.1)

    def _started(self) -> list[tuple[int, float]]:
        with self._lock:
            return list(self._starts)

    def _log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-1500:]
        except OSError:
            return ""

    def start(self) -> None:
        """Start the driver and wait until its query runs (up to 180 s), then the watcher.
        Raises :class:`StreamError` if the query does not run."""
        self.proc = self._spawn()
        self._wait_running(self.proc)
        self._watcher = threading.Thread(target=self._watch, name="stream-watch", daemon=True)
        self._watcher.start()

    def _read_progress(self) -> None:
        """Take the progress file's new lines into the batch table."""
        try:
            with self.progress_file.open() as f:
                f.seek(self._offset)
                text = f.read()
        except FileNotFoundError:
            return
        complete = text[: text.rfind("\n") + 1]
        self._offset += len(complete.encode())
        now_wall, now = time.time(), time.monotonic()
        with self._lock:
            for line in complete.splitlines():
                with contextlib.suppress(ValueError):
                    item = json.loads(line)
                    if "started" in item:
                        self._starts.append((int(item["pid"]), float(item["started"])))
                        if item.get("package"):
                            self.packages.append(str(item["package"]))
                        continue
                    self.lines[int(item["batch"])] = item
                    if int(item["rows"]) > 0:
                        at = now - (now_wall - float(item["wall"]))
                        self._batches[int(item["batch"])] = (int(item["rows"]), at)
                        self.last_at = max(self.last_at or at, at)

    def _watch(self) -> None:
        """The watcher thread: follow the progress, make the planned driver kill, notice a
        driver that ended on its own."""
        while not self._halt.wait(0.2):
            self._read_progress()
            proc = self.proc
            if proc is not None and proc.poll() is not None and not self._halt.is_set():
                self.errors.append(
                    f"the streaming driver pid {proc.pid} exited with {proc.returncode} on its "
                    f"own: {self._log_tail()[-500:]}"
                )
                return
            if (
                self.kill_at is not None
                and not self.kills
                and self.unique >= self.kill_at * self.rows
            ):
                try:
                    self._kill_and_restart()
                except StreamError as exc:
                    self.errors.append(str(exc))
                    return

    def _in_flight(self) -> bool:
        offsets = {p.name for p in (self.checkpoint / "offsets").glob("[0-9]*")}
        commits = {p.name for p in (self.checkpoint / "commits").glob("[0-9]*")}
        return bool(offsets - commits)

    def _kill_and_restart(self) -> None:
        proc = self.proc
        assert proc is not None
        deadline = time.monotonic() + KILL_WAIT
        while not self._in_flight() and time.monotonic() < deadline and not self._halt.is_set():
            time.sleep(0.01)
        mid = self._in_flight()
        rows = self.unique
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        killed_at, wall = time.monotonic(), time.time()
        proc.wait(30)
        kill = DriverKill(proc.pid, wall, rows, mid)
        self.kills.append(kill)
        self.say(
            f"streaming driver pid {proc.pid} killed (SIGKILL of its process group) after "
            f"{rows:,} rows{', mid-batch' if mid else ', between batches'}; restarting it on "
            "the same checkpoint"
        )
        self.proc = self._spawn()
        kill.new_pid = self.proc.pid
        self._wait_running(self.proc)
        kill.running_after_s = time.monotonic() - killed_at
        self.say(f"streaming driver pid {self.proc.pid} runs again ({kill.running_after_s:.1f} s)")

    # -- what the drill asks of a consuming app -------------------------------------------

    @property
    def unique(self) -> int:
        """Rows the finished micro-batches brought (a batch re-run after the kill counts
        once)."""
        with self._lock:
            return sum(rows for rows, _ in self._batches.values())

    def wait_for(self, count: int, *, idle: float, timeout: float) -> bool:
        """Wait until the sink holds ``count`` distinct rows; False when no batch came for
        ``idle`` seconds (a restarted driver's query running counts as progress, and its first
        batch gets :data:`FIRST_BATCH_GRACE` s more) or after ``timeout``."""
        started = time.monotonic()
        checked = 0.0
        while True:
            now = time.monotonic()
            if self.unique >= count and now - checked > 2.0:
                checked = now
                if len(self.snapshot().counts) >= count:
                    return True
            last = max(self.last_at or started, started)
            for kill in self.kills:  # the restart is progress; its first batch has a grace
                back = kill.at_wall + (kill.running_after_s or 0.0) + FIRST_BATCH_GRACE
                last = max(last, now - (time.time() - back))
            if now - started >= timeout or now - last >= idle or self.errors:
                return False
            time.sleep(0.1)

    def settle(self, quiet: float, *, timeout: float) -> None:
        """Wait until no batch brought rows for ``quiet`` seconds (at most ``timeout``)."""
        started = time.monotonic()
        while True:
            now = time.monotonic()
            if now - max(self.last_at or started, started) >= quiet or now - started >= timeout:
                return
            time.sleep(min(0.1, quiet))

    def snapshot(self) -> Received:
        """What the Parquet sink holds (committed files only), as :class:`Received`."""
        pq: Any = importlib.import_module("pyarrow.parquet")  # Spark's own dependency here
        received = Received()
        offset = time.monotonic() - time.time()
        for path in self._committed_files():
            table = pq.read_table(path, columns=["row_id", "body", "batch_time"])
            ids = table.column("row_id").to_pylist()
            bodies = table.column("body").to_pylist()
            times = table.column("batch_time").to_pylist()
            for mid, body, batch_time in zip(ids, bodies, times, strict=True):
                at = batch_time
                if at is not None and at.tzinfo is None:  # Parquet INT96: UTC, read naive
                    at = at.replace(tzinfo=datetime.UTC)
                when = at.timestamp() + offset if at is not None else 0.0
                received.record(mid, body_digest(body or b""), when)
        received.arrivals.sort()
        return received

    def sink_pairs(self, first: str, second: str) -> list[tuple[Any, Any]]:
        """The sink's columns ``first`` and ``second``, row by row (committed files only)."""
        pq: Any = importlib.import_module("pyarrow.parquet")
        rows: list[tuple[Any, Any]] = []
        for path in self._committed_files():
            table = pq.read_table(path, columns=[first, second])
            rows.extend(
                zip(
                    table.column(first).to_pylist(),
                    table.column(second).to_pylist(),
                    strict=True,
                )
            )
        return rows

    def last_batch_ids(self) -> set[str]:
        """The row ids of the sink's last micro-batch (the rows with the latest
        ``batch_time``)."""
        rows = self.sink_pairs("batch_time", "row_id")
        if not rows:
            return set()
        last = max(at for at, _ in rows if at is not None)
        return {mid for at, mid in rows if at == last}

    def _committed_files(self) -> list[Path]:
        """The Parquet files the sink's ``_spark_metadata`` log lists (Spark's committed
        output; a file of a batch that was killed is not in it)."""
        meta = self.sink / "_spark_metadata"
        files: set[str] = set()
        if not meta.is_dir():
            return []
        for entry in sorted(meta.iterdir(), key=lambda p: p.name):
            if entry.name.startswith("."):
                continue
            for line in entry.read_text().splitlines()[1:]:  # the first line is "v1"
                with contextlib.suppress(ValueError):
                    item = json.loads(line)
                    path = item["path"].removeprefix("file://").removeprefix("file:")
                    if item.get("action", "add") == "add":
                        files.add(path)
                    else:
                        files.discard(path)
        return [Path(p) for p in sorted(files)]

    def close(self, timeout: float = 60.0) -> None:
        """Stop the watcher, ask the driver to stop its query (the ``stop`` file) and wait
        up to ``timeout`` s; SIGKILL its process group if it does not end. Never raises."""
        self._halt.set()
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join(KILL_WAIT + START_TIMEOUT + 10)
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        self.stop_file.touch()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
            self.errors.append(f"the streaming driver did not stop within {timeout:.0f} s")
        self._read_progress()

    def summary(self) -> dict[str, Any]:
        """The report's ``consumer`` section: batches, driver kills, the files."""
        with self._lock:
            batches = len(self._batches)
        return {
            "kind": "spark",
            "query": "readStream.format('stomp') -> Parquet",
            "batches": batches,
            "max_messages_per_batch": self.cfg["options"].get("max_messages_per_batch"),
            "prefetch": self.cfg["options"].get("prefetch"),
            "master": self.cfg["master"],
            "driver_kills": [k.to_dict() for k in self.kills],
            "kill_at": self.kill_at,
            "checkpoint": str(self.checkpoint),
            "sink": str(self.sink),
            "errors": list(self.errors),
        }
