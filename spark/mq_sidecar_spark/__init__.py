"""mq-sidecar-spark: the PySpark data source ``"stomp"``, talking STOMP to a local mq-sidecar.

``spark.dataSource.register(StompDataSource)``, then ``df.write.format("stomp")`` (batch),
``df.writeStream.format("stomp")`` (streaming write) or ``spark.readStream.format("stomp")``
(streaming read). docs/spark.md is the user's guide.

This package imports nothing of the daemon (``proxy``, ``protocol``, ``config``) or of its test
harness (``testbed``, ``pipeline``): it is installed into Spark images on its own.
"""

from __future__ import annotations

from mq_sidecar_spark.errors import (
    OptionError,
    RowError,
    StompConnectError,
    StompConnectionLost,
    StompErrorFrame,
    StompTimeout,
    StompWriteError,
)
from mq_sidecar_spark.options import WRITE_OPTIONS, WriteOptions
from mq_sidecar_spark.source import StompDataSource
from mq_sidecar_spark.writer import StompCommitMessage, StompStreamWriter, StompWriter

__all__ = [
    "WRITE_OPTIONS",
    "OptionError",
    "RowError",
    "StompCommitMessage",
    "StompConnectError",
    "StompConnectionLost",
    "StompDataSource",
    "StompErrorFrame",
    "StompStreamWriter",
    "StompTimeout",
    "StompWriteError",
    "StompWriter",
    "WriteOptions",
]
