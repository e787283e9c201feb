"""The Spark distribution that ships inside the PySpark wheel of this interpreter's venv.

PySpark 4 installs a complete Spark runtime in its package directory: the jars (``jars/``),
the launcher scripts (``bin/spark-class``, which builds the ``java`` command line with
``org.apache.spark.launcher.Main`` and then ``exec``s it) and no ``conf/``. That directory is
``SPARK_HOME`` for :mod:`testbed.spark_cluster`: the test bed runs a standalone master and
workers from it (Spark's standalone-mode docs, "Starting a Cluster Manually": ``spark-class``
with the ``Master`` and ``Worker`` classes). It is located without importing ``pyspark``
(``importlib.util.find_spec``), so the test bed stays cheap to import.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SparkHome", "SparkHomeError", "find_spark_home"]


class SparkHomeError(RuntimeError):
    """No usable Spark distribution: PySpark is not installed in this interpreter's
    environment, or its package lacks ``bin/spark-class`` or ``jars/``."""


@dataclass(frozen=True)
class SparkHome:
    """A Spark distribution directory.

    Attributes:
        path: ``SPARK_HOME`` (absolute), e.g. ``.venv/lib/python3.11/site-packages/pyspark``.
        spark_class: ``path / "bin" / "spark-class"``, the launcher of any Spark JVM class.
        version: the distribution's version (``pyspark/version.py``), e.g. ``"4.3.0"``;
            empty when that file does not say.
    """

    path: Path
    spark_class: Path
    version: str


def _version(package: Path) -> str:
    """``__version__`` from ``package / "version.py"`` (read as text, not imported)."""
    try:
        text = (package / "version.py").read_text()
    except OSError:
        return ""
    for line in text.splitlines():
        name, sep, value = line.partition("=")
        if sep and name.partition(":")[0].strip() == "__version__":  # may be annotated
            return value.strip().strip("\"'")
    return ""


def find_spark_home() -> SparkHome:
    """The Spark distribution of the ``pyspark`` package this interpreter would import.

    Raises :class:`SparkHomeError` if ``pyspark`` cannot be found, or its directory has no
    executable ``bin/spark-class`` or no ``jars/`` directory (a PySpark older than 3 or a
    broken install: ``scripts/setup.sh`` installs PySpark 4).
    """
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise SparkHomeError("pyspark is not installed in this environment: run scripts/setup.sh")
    path = Path(next(iter(spec.submodule_search_locations))).absolute()
    spark_class = path / "bin" / "spark-class"
    if not os.access(spark_class, os.X_OK):
        raise SparkHomeError(f"{spark_class} is missing or not executable")
    if not (path / "jars").is_dir():
        raise SparkHomeError(f"{path} has no jars/ directory: not a Spark distribution")
    return SparkHome(path=path, spark_class=spark_class, version=_version(path))
