"""Rows to STOMP messages: the body, the headers and the deterministic row id.

Everything here is decided by the DataFrame's schema, once per task (:class:`MessageFactory`),
then applied to each row:

* **JSON body** (``body_format=json``): the row as one compact UTF-8 JSON object, columns in
  schema order. Timestamps become ISO 8601 UTC (``2013-01-01T10:00:00Z``; PySpark hands a
  ``timestamp`` column to Python as a naive datetime in the worker's local time zone, which is
  converted), ``timestamp_ntz`` an ISO date-time without zone, dates ISO dates, decimals
  strings, binary base64, NaN and infinities ``null``, arrays lists, maps and structs objects.
  A type with no JSON form here (intervals, variant, user-defined types) is refused on the
  driver (:func:`check_schema`).
* **string / binary body**: the ``body_column``'s value, UTF-8 encoded for a string.
* **row id** (``mq-sidecar-id``, also sent as ``row-id`` for the consuming app, since the
  sidecars hide ``mq-sidecar-id`` from consumers, docs/behaviour.md, "Duplicate detection"):
  ``[<id_prefix>/][b<batch>/]<key>`` with ``id_columns``, where ``<key>`` is the one key
  column's value as text (JSON for several columns, or a non-string one); without
  ``id_columns``, ``[<id_prefix>/][b<batch>/]p<partition>/<digest>[.<n>]``, where ``<digest>``
  is the BLAKE2b-128 of the row's JSON form and ``<n>`` counts earlier rows of the same content
  in the same partition (so equal rows stay distinct messages, and a retried task, which reads
  the same partition, gives every row the same id whatever their order).
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from mq_sidecar_spark.errors import OptionError, RowError

if TYPE_CHECKING:
    from pyspark.sql.types import DataType, StructType

    from mq_sidecar_spark.options import WriteOptions

__all__ = ["DUPLICATE_ID_HEADER", "ROW_ID_HEADER", "MessageFactory", "check_schema"]

#: The sidecar's duplicate-detection header (docs/behaviour.md, "Duplicate detection").
DUPLICATE_ID_HEADER = "mq-sidecar-id"
#: The row id as the consuming app sees it (the sidecars never show ``mq-sidecar-id``).
ROW_ID_HEADER = "row-id"

Converter = Callable[[Any], Any]

_CONTENT_TYPES = {
    "json": "application/json",
    "string": "text/plain;charset=utf-8",
    "binary": "application/octet-stream",
}


def _identity(value: Any) -> Any:
    return value


def _floating(value: Any) -> Any:
    if value is None or math.isfinite(value):
        return value
    return None


def _timestamp(value: Any) -> Any:
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.astimezone()  # naive = the worker's local time (module docstring)
    text: str = value.astimezone(dt.UTC).isoformat()
    return text.replace("+00:00", "Z")


def _isoformat(value: Any) -> Any:
    return None if value is None else value.isoformat()


def _text(value: Any) -> Any:
    return None if value is None else str(value)


def _base64(value: Any) -> Any:
    return None if value is None else base64.b64encode(bytes(value)).decode("ascii")


def _converter(data_type: DataType, where: str) -> Converter:
    """The function giving a value of ``data_type`` its JSON form (module docstring).

    Raises :class:`OptionError` naming ``where`` (the column) for a type with no JSON form.
    """
    from pyspark.sql import types as T  # noqa: PLC0415 (pyspark only where Spark runs)

    simple: tuple[tuple[type[DataType] | tuple[type[DataType], ...], Converter], ...] = (
        ((T.NullType, T.BooleanType, T.StringType, T.CharType, T.VarcharType), _identity),
        ((T.ByteType, T.ShortType, T.IntegerType, T.LongType), _identity),
        ((T.FloatType, T.DoubleType), _floating),
        (T.DecimalType, _text),
        (T.DateType, _isoformat),
        (T.TimestampNTZType, _isoformat),
        (T.TimestampType, _timestamp),
        (T.BinaryType, _base64),
    )
    for kinds, function in simple:
        if isinstance(data_type, kinds):
            return function
    if isinstance(data_type, T.ArrayType):
        element = _converter(data_type.elementType, f"{where}[]")

        def array(value: Any) -> Any:
            return None if value is None else [element(item) for item in value]

        return array
    if isinstance(data_type, T.MapType):
        key = _converter(data_type.keyType, f"{where} key")
        item = _converter(data_type.valueType, f"{where} value")

        def mapping(value: Any) -> Any:
            if value is None:
                return None
            return {_as_text(key(k)): item(v) for k, v in value.items()}

        return mapping
    if isinstance(data_type, T.StructType):
        return _struct_converter(data_type, f"{where}.")
    raise OptionError(
        f"stomp data source: column {where} is of type {data_type.simpleString()}, which has "
        "no JSON form here; cast it (e.g. to string) or leave it out"
    )


def _struct_converter(schema: StructType, prefix: str) -> Converter:
    names = [field.name for field in schema.fields]
    converters = [_converter(field.dataType, prefix + field.name) for field in schema.fields]

    def struct(value: Any) -> Any:
        if value is None:
            return None
        return {name: convert(v) for name, convert, v in zip(names, converters, value, strict=True)}

    return struct


def _as_text(value: Any) -> str:
    """A JSON-form value as header or key text: strings as they are, others as JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def check_schema(schema: StructType) -> None:
    """Raise :class:`OptionError` if a column of ``schema`` has no JSON form (driver side)."""
    _struct_converter(schema, "")


class MessageFactory:
    """Turns one partition's rows into ``(row id, body, headers)`` (module docstring).

    Args:
        schema: the DataFrame's schema (Spark passes it to ``writer()``).
        options: the checked write options.
        partition: the task's partition id (``TaskContext.partitionId()``).
        batch_id: the micro-batch id of a streaming write, None in a batch write.
    """

    def __init__(
        self, schema: StructType, options: WriteOptions, partition: int, batch_id: int | None
    ) -> None:
        self._names = [field.name for field in schema.fields]
        position = {name: i for i, name in enumerate(self._names)}
        self._convert = [_converter(f.dataType, f.name) for f in schema.fields]
        self._json = options.body_format == "json"
        self._body_at = position[options.body_column] if options.body_column else -1
        self._binary = options.body_format == "binary"
        self._keys = [position[name] for name in options.id_columns]
        self._key_names = options.id_columns
        self._headers_at = [(name, position[name]) for name in options.header_columns]
        self._partition = partition
        self._seen: dict[str, int] = {}
        prefix = f"{options.id_prefix}/" if options.id_prefix else ""
        if batch_id is not None:
            prefix += f"b{batch_id}/"
        self._prefix = prefix
        self._base: dict[str, str] = {"content-type": _CONTENT_TYPES[options.body_format]}
        if options.persistent:
            self._base["persistent"] = "true"

    def _where(self, ordinal: int) -> str:
        return f"row {ordinal} of partition {self._partition}"

    def message(self, row: Sequence[Any], ordinal: int) -> tuple[str, bytes, dict[str, str]]:
        """``(row id, body bytes, headers)`` of ``row``, the ``ordinal``-th (0-based) of the
        partition. ``headers`` holds the id headers, ``content-type``, ``persistent`` and the
        non-null header columns. Raises :class:`RowError` naming the row (by id once known,
        else by partition and position): a null id column, a null body column, text that is
        not encodable as UTF-8.
        """
        values = [convert(value) for convert, value in zip(self._convert, row, strict=True)]
        if self._keys:
            key_values = [values[i] for i in self._keys]
            for name, value in zip(self._key_names, key_values, strict=True):
                if value is None:
                    raise RowError(
                        f"{self._where(ordinal)}: id column {name!r} is null, so the row has "
                        "no id (filter such rows out or fill them before writing)"
                    )
            key = _as_text(key_values[0]) if len(key_values) == 1 else _as_text(key_values)
            row_id = self._prefix + key
            document: bytes | None = None
        else:
            document = self._document(values, ordinal)
            digest = hashlib.blake2b(document, digest_size=16).hexdigest()
            seen = self._seen.get(digest, 0)
            self._seen[digest] = seen + 1
            suffix = f".{seen}" if seen else ""
            row_id = f"{self._prefix}p{self._partition}/{digest}{suffix}"
        if self._json:
            body = document if document is not None else self._document(values, ordinal)
        else:
            raw = row[self._body_at]
            if raw is None:
                raise RowError(
                    f"row id {row_id!r} ({self._where(ordinal)}): body column "
                    f"{self._names[self._body_at]!r} is null"
                )
            body = bytes(raw) if self._binary else self._encode(raw, row_id)
        headers = dict(self._base)
        for name, at in self._headers_at:
            if values[at] is not None:
                headers[name] = _as_text(values[at])
        headers[DUPLICATE_ID_HEADER] = row_id
        headers[ROW_ID_HEADER] = row_id
        return row_id, body, headers

    def _document(self, values: list[Any], ordinal: int) -> bytes:
        payload = dict(zip(self._names, values, strict=True))
        try:
            text = json.dumps(payload, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
            return text.encode("utf-8")
        except (TypeError, ValueError) as exc:  # UnicodeEncodeError is a ValueError
            raise RowError(f"{self._where(ordinal)}: cannot be serialised as JSON: {exc}") from exc

    @staticmethod
    def _encode(text: str, row_id: str) -> bytes:
        try:
            return text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise RowError(f"row id {row_id!r}: body is not valid UTF-8 text: {exc}") from exc
