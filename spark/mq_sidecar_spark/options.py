"""The write options of the ``stomp`` data source, parsed and checked on the driver.

Spark hands a Python data source its options as a case-insensitive mapping of strings (keys
lower-cased, ``pyspark.sql.datasource.CaseInsensitiveDict``). :func:`parse_write_options` turns
them into a :class:`WriteOptions` (picklable: it travels to the executors inside the writer)
and checks them against the DataFrame's schema, so a mistake fails ``save()`` / ``start()`` on
the driver before any task runs, with one :class:`~mq_sidecar_spark.errors.OptionError` naming
every bad option.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mq_sidecar_spark.errors import OptionError

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

__all__ = [
    "BODY_FORMATS",
    "RESERVED_HEADERS",
    "SPARK_STREAMING_OPTIONS",
    "WRITE_OPTIONS",
    "WriteOptions",
    "parse_write_options",
]

#: Every write option with what it accepts and its default (the text of an unknown-option
#: error lists these names).
WRITE_OPTIONS: Mapping[str, str] = {
    "host": "the sidecar's STOMP host (default 127.0.0.1)",
    "port": "its port, 1-65535 (default 61613)",
    "destination": "the STOMP destination, e.g. /queue/orders (required)",
    "login": "the CONNECT login (default none)",
    "passcode": "the CONNECT passcode (default none)",
    "receipt_every": "ask a receipt on every N-th SEND and the last, N >= 1 (default 100)",
    "max_in_flight": "receipts outstanding at most, >= 1 (default 10)",
    "id_columns": "comma-separated key columns of the row id (default: the row's content)",
    "id_prefix": "text put before every row id, without '/' (default none)",
    "header_columns": "comma-separated columns copied into headers (default none)",
    "body_format": "json (the row, default), string or binary (body_column)",
    "body_column": "the column sent as the body with body_format string or binary",
    "persistent": "true (default) or false: the persistent header",
    "timeout": "seconds to wait for a receipt, the CONNECT or one SEND, > 0 (default 60)",
}

#: Options Spark itself adds to a streaming sink's (``checkpointLocation``, measured with
#: pyspark 4.3): accepted and ignored.
SPARK_STREAMING_OPTIONS = frozenset({"checkpointlocation"})

BODY_FORMATS = ("json", "string", "binary")

#: Headers the writer sets itself (or STOMP 1.2 section "SEND" defines): a header column may
#: not take these names.
RESERVED_HEADERS = frozenset(
    {
        "destination",
        "receipt",
        "content-length",
        "content-type",
        "transaction",
        "persistent",
        "mq-sidecar-id",
        "row-id",
    }
)

#: Spark SQL types a header column may have (their value is sent as text).
_HEADER_TYPES = frozenset(
    {
        "string",
        "boolean",
        "byte",
        "short",
        "integer",
        "long",
        "float",
        "double",
        "decimal",
        "date",
        "timestamp",
        "timestamp_ntz",
    }
)

_TRUE = ("true",)
_FALSE = ("false",)


@dataclass(frozen=True)
class WriteOptions:
    """The checked write options (see :data:`WRITE_OPTIONS`); ``timeout`` in seconds."""

    destination: str
    host: str = "127.0.0.1"
    port: int = 61613
    login: str | None = None
    passcode: str | None = None
    receipt_every: int = 100
    max_in_flight: int = 10
    id_columns: tuple[str, ...] = ()
    id_prefix: str = ""
    header_columns: tuple[str, ...] = ()
    body_format: str = "json"
    body_column: str | None = None
    persistent: bool = True
    timeout: float = 60.0

    @property
    def address(self) -> str:
        """``host:port`` of the sidecar, as the errors name it."""
        return f"{self.host}:{self.port}"


def _columns(text: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in text.split(",") if name.strip())


def _positive_int(name: str, text: str, problems: list[str]) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        problems.append(f"option {name}={text!r}: not an integer")
        return 1
    if value < 1:
        problems.append(f"option {name}={text!r}: must be at least 1")
        return 1
    return value


def parse_write_options(
    options: Mapping[str, str], schema: StructType, *, streaming: bool = False
) -> WriteOptions:
    """Check ``options`` (keys case-insensitive) against ``schema``; return them parsed.

    ``streaming``: also accept the options Spark adds to a streaming sink
    (:data:`SPARK_STREAMING_OPTIONS`). Raises :class:`OptionError` naming every problem: an
    unknown option (with the list of known ones), ``destination`` missing or empty, a value
    out of range or not a number, a column that is not in the schema or has the wrong type
    (``body_column`` must be a string column for ``string``, a binary one for ``binary``; a
    header column a scalar), a header column named like a header the writer sets.
    """
    given = {str(key).lower(): str(value) for key, value in options.items()}
    problems: list[str] = []
    allowed = set(WRITE_OPTIONS) | (SPARK_STREAMING_OPTIONS if streaming else set())
    unknown = sorted(set(given) - allowed)
    if unknown:
        problems.append(
            f"unknown option(s) {', '.join(unknown)}; the stomp writer knows: "
            f"{', '.join(WRITE_OPTIONS)}"
        )
    destination = given.get("destination", "").strip()
    if not destination:
        problems.append("option destination is required (e.g. /queue/orders)")
    host = given.get("host", "127.0.0.1").strip()
    if not host:
        problems.append("option host is empty")
    port = 61613
    if "port" in given:
        port = _positive_int("port", given["port"], problems)
        if port > 65535:
            problems.append(f"option port={given['port']!r}: must be at most 65535")
    receipt_every = _positive_int("receipt_every", given.get("receipt_every", "100"), problems)
    max_in_flight = _positive_int("max_in_flight", given.get("max_in_flight", "10"), problems)
    timeout = 60.0
    if "timeout" in given:
        try:
            timeout = float(given["timeout"].strip())
        except ValueError:
            problems.append(f"option timeout={given['timeout']!r}: not a number of seconds")
        else:
            if not timeout > 0 or timeout == float("inf"):
                problems.append(f"option timeout={given['timeout']!r}: must be > 0 and finite")
                timeout = 60.0
    persistent = True
    if "persistent" in given:
        text = given["persistent"].strip().lower()
        if text not in _TRUE + _FALSE:
            problems.append(f"option persistent={given['persistent']!r}: true or false")
        persistent = text in _TRUE
    id_prefix = given.get("id_prefix", "")
    if "/" in id_prefix:
        problems.append(f"option id_prefix={id_prefix!r}: may not contain '/'")
    fields = {field.name: field.dataType.typeName() for field in schema.fields}
    id_columns = _columns(given.get("id_columns", ""))
    if "id_columns" in given and not id_columns:
        problems.append("option id_columns is empty (leave it out to use the row's content)")
    header_columns = _columns(given.get("header_columns", ""))
    if "header_columns" in given and not header_columns:
        problems.append("option header_columns is empty")
    for option, names in (("id_columns", id_columns), ("header_columns", header_columns)):
        if len(set(names)) != len(names):
            problems.append(f"option {option}={given[option]!r}: a column is named twice")
        missing = [name for name in names if name not in fields]
        if missing:
            problems.append(
                f"option {option}: no column {', '.join(map(repr, missing))} in the "
                f"DataFrame (columns: {', '.join(fields)})"
            )
    for name in header_columns:
        if name.lower() in RESERVED_HEADERS:
            problems.append(
                f"option header_columns: {name!r} is a header the writer sets itself "
                f"({', '.join(sorted(RESERVED_HEADERS))}); rename the column"
            )
        elif name in fields and fields[name] not in _HEADER_TYPES:
            problems.append(
                f"option header_columns: column {name!r} is of type {fields[name]}; a header "
                f"takes a scalar ({', '.join(sorted(_HEADER_TYPES))})"
            )
    body_format = given.get("body_format", "json").strip().lower()
    body_column = given.get("body_column", "").strip() or None
    if body_format not in BODY_FORMATS:
        problems.append(
            f"option body_format={given['body_format']!r}: one of {', '.join(BODY_FORMATS)}"
        )
    elif body_format == "json":
        if body_column is not None:
            problems.append("option body_column is for body_format string or binary, not json")
    elif body_column is None:
        problems.append(f"option body_format={body_format} needs option body_column")
    else:
        wanted = "string" if body_format == "string" else "binary"
        actual = fields.get(body_column)
        if actual is None:
            problems.append(
                f"option body_column: no column {body_column!r} in the DataFrame "
                f"(columns: {', '.join(fields)})"
            )
        elif actual != wanted:
            problems.append(
                f"option body_column: column {body_column!r} is of type {actual}; "
                f"body_format {body_format} needs a {wanted} column"
            )
    if problems:
        raise OptionError("stomp data source: " + "; ".join(problems))
    return WriteOptions(
        destination=destination,
        host=host,
        port=port,
        login=given.get("login"),
        passcode=given.get("passcode"),
        receipt_every=receipt_every,
        max_in_flight=max_in_flight,
        id_columns=id_columns,
        id_prefix=id_prefix,
        header_columns=header_columns,
        body_format=body_format,
        body_column=body_column,
        persistent=persistent,
        timeout=timeout,
    )
