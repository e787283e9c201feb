"""``StompDataSource``: the PySpark data source ``"stomp"`` (Spark 4's Python data source API).

Register it once per SparkSession, then use the short name::

    from mq_sidecar_spark import StompDataSource

    spark.dataSource.register(StompDataSource)
    df.write.format("stomp").option("destination", "/queue/orders").mode("append").save()

The write side is :mod:`mq_sidecar_spark.writer` (options: :mod:`mq_sidecar_spark.options`);
the streaming read side is :mod:`mq_sidecar_spark.reader`, imported only when a query reads.
docs/spark.md is the user's guide.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)

from mq_sidecar_spark._rows import check_schema
from mq_sidecar_spark._stream_options import is_stream_read
from mq_sidecar_spark.errors import OptionError
from mq_sidecar_spark.options import parse_write_options
from mq_sidecar_spark.writer import StompStreamWriter, StompWriter

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

__all__ = ["StompDataSource"]


class StompDataSource(DataSource):
    """The ``stomp`` data source: batch and streaming write, streaming read.

    ``self.options`` is the case-insensitive mapping of the options the user set (Spark's
    ``CaseInsensitiveDict``). Writers are made on the driver: bad options and columns with no
    JSON form raise :class:`~mq_sidecar_spark.errors.OptionError` there, before any task runs.
    """

    @classmethod
    def name(cls) -> str:
        """The short name of ``format("stomp")``."""
        return "stomp"

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """The batch writer for a DataFrame of ``schema``.

        ``overwrite`` (``mode("overwrite")``) is refused: a destination's messages cannot be
        replaced, only added to (use ``mode("append")``). Raises :class:`OptionError`.
        """
        if overwrite:
            raise OptionError(
                "stomp data source: save mode overwrite is not supported (messages sent to a "
                "destination cannot be replaced); use mode('append')"
            )
        options = parse_write_options(self.options, schema)
        check_schema(schema)
        return StompWriter(schema, options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """The streaming writer for a stream of ``schema`` (any output mode: each micro-batch
        is sent as new messages, the batch id in their ids). Raises :class:`OptionError`."""
        options = parse_write_options(self.options, schema, streaming=True)
        check_schema(schema)
        return StompStreamWriter(schema, options)

    def schema(self) -> StructType | str:
        """The schema of a read: ``mq_sidecar_spark.stream.STREAM_SCHEMA`` with
        ``stream=true`` (a RabbitMQ stream), else ``mq_sidecar_spark.reader.READ_SCHEMA`` (a
        queue). Raises :class:`OptionError` for a stream-only option without ``stream=true``."""
        if is_stream_read(self.options):
            from mq_sidecar_spark.stream import STREAM_SCHEMA  # noqa: PLC0415

            return STREAM_SCHEMA
        from mq_sidecar_spark.reader import READ_SCHEMA  # noqa: PLC0415

        return READ_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        """A batch read (``spark.read.format("stomp")``). With ``stream=true``: a range of a
        RabbitMQ stream (:class:`mq_sidecar_spark.stream.StompStreamBatchReader`). A queue is
        refused with one sentence that says what to use, instead of Spark's
        ``NOT_IMPLEMENTED`` traceback: a queue forgets what was acknowledged, so a batch read of
        it could not be repeated (read it with ``spark.readStream``, exactly once into a sink,
        docs/spark.md). Raises :class:`OptionError`."""
        if is_stream_read(self.options):
            from mq_sidecar_spark.stream import StompStreamBatchReader  # noqa: PLC0415

            return StompStreamBatchReader(schema, self.options)
        raise OptionError(
            "stomp data source: batch reads (spark.read) of a queue are not supported: a queue "
            "forgets what was acknowledged, so a read could not be repeated; read it with "
            "spark.readStream.format('stomp') into a sink (docs/spark.md, 'Streaming read'), "
            "or read a RabbitMQ stream with option stream=true"
        )

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """The streaming reader (``spark.readStream.format("stomp")``): of a RabbitMQ stream
        with ``stream=true`` (:class:`mq_sidecar_spark.stream.StompStreamSource`), else of a
        queue (:class:`mq_sidecar_spark.reader.StompStreamReader`)."""
        if is_stream_read(self.options):
            from mq_sidecar_spark.stream import StompStreamSource  # noqa: PLC0415

            return StompStreamSource(schema, self.options)
        from mq_sidecar_spark.reader import StompStreamReader  # noqa: PLC0415

        return StompStreamReader(schema, self.options)
