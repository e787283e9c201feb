"""A local SparkSession for the drill and the tests, and a stop that ends its JVM.

Settings from docs/testing.md, "The failover drill": ``PYSPARK_PYTHON`` is this interpreter (the
Python workers must import ``pipeline`` and stomp.py from this venv), ``SPARK_LOCAL_IP=127.0.0.1``
(no driver on eth0), no UI (no port clashes between parallel runs), no console progress bars,
``spark.sql.shuffle.partitions=2`` (2 cores). With ``log_file`` the JVM's stdout and stderr
(log4j, the Python workers' stderr) go to that file instead of the terminal, and log4j is set
to WARN.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["DEFAULT_CONF", "spark_environment", "start_spark", "stop_spark"]

#: Spark configuration every session here gets (docs/testing.md, "The failover drill").
DEFAULT_CONF: Mapping[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
}

_LOG4J = """\
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss.SSS} %p %c{1}: %m%n
"""


def spark_environment() -> None:
    """Set the environment variables Spark and its Python workers need (see module doc)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    # pyspark 4.3 warns about pandas >= 3 when it probes for pandas; nothing here uses it.
    warnings.filterwarnings(
        "ignore", message="PySpark does not yet fully support pandas", category=FutureWarning
    )


@contextlib.contextmanager
def _output_to(path: Path) -> Iterator[None]:
    """Point file descriptors 1 and 2 at ``path`` while the block runs (children started
    inside inherit it for good); this process's own output is restored afterwards."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with path.open("ab") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)


def start_spark(
    app_name: str,
    *,
    master: str = "local[2]",
    conf: Mapping[str, str] | None = None,
    log_file: Path | None = None,
) -> SparkSession:
    """A new local SparkSession (the JVM starts here: ~5 s on 2 cores).

    ``conf`` adds to or overrides :data:`DEFAULT_CONF`. ``log_file``: where the JVM's output
    goes (see module docstring); None leaves it on the terminal.
    """
    spark_environment()
    from pyspark.sql import SparkSession  # noqa: PLC0415

    builder = SparkSession.builder.master(master).appName(app_name)
    settings = dict(DEFAULT_CONF)
    if log_file is not None:
        log4j = log_file.with_suffix(".log4j2.properties")
        log4j.write_text(_LOG4J)
        settings["spark.driver.extraJavaOptions"] = f"-Dlog4j2.configurationFile=file:{log4j}"
    settings.update(conf or {})
    for key, value in settings.items():
        builder = builder.config(key, value)
    if log_file is None:
        return builder.getOrCreate()
    with _output_to(log_file):
        return builder.getOrCreate()


def stop_spark(spark: SparkSession, timeout: float = 30.0) -> None:
    """Stop the session and end its JVM (the py4j gateway process), within ``timeout`` s.

    ``SparkSession.stop`` leaves the gateway JVM running until this process exits; a later
    session in the same process starts a new one.
    """
    from pyspark import SparkContext  # noqa: PLC0415

    spark.stop()
    gateway = SparkContext._gateway
    if gateway is None:
        return
    proc: subprocess.Popen[bytes] | None = getattr(gateway, "proc", None)
    with contextlib.suppress(Exception):
        gateway.shutdown()
    if proc is not None:
        with contextlib.suppress(OSError):
            if proc.stdin is not None:
                proc.stdin.close()  # the JVM exits when its stdin closes
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    SparkContext._gateway = None
    SparkContext._jvm = None
