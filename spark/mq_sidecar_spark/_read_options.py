"""The streaming reader's options: parsed and checked once, on the driver, before anything
connects (a bad option fails the query at its start with one message naming the option).

Option names are case-insensitive (Spark passes a case-insensitive map); every value is a string,
as Spark gives it. The table with defaults and reasons: docs/spark.md, "Streaming read".
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, urlparse

from mq_sidecar_spark.errors import OptionError

__all__ = ["READ_OPTIONS", "ReadOptions", "parse_read_options"]

#: Every option the streaming reader takes; any other is refused (a typo must not be ignored).
READ_OPTIONS = frozenset(
    {
        "host",
        "port",
        "destination",
        "login",
        "passcode",
        "vhost",
        "checkpoint_location",
        "max_messages_per_batch",
        "max_bytes_per_batch",
        "prefetch",
        "id_header",
        "id_cache_size",
        "subscription_headers",
        "timeout",
    }
)


@dataclass(frozen=True)
class ReadOptions:
    """The reader's options, checked. Sizes are counts or bytes, ``timeout`` is seconds.

    ``prefetch`` is the broker's window of unacknowledged deliveries (ActiveMQ
    ``activemq.prefetchSize``, RabbitMQ ``prefetch-count``); it must exceed
    ``max_messages_per_batch``: the messages of the batch Spark runs stay unacknowledged until
    it is committed, and only the rest of the window receives the next batch meanwhile (twice
    the batch lets it be full).
    """

    destination: str
    checkpoint_location: Path
    host: str = "127.0.0.1"
    port: int = 61613
    login: str | None = None
    passcode: str | None = field(default=None, repr=False)
    vhost: str | None = None
    max_messages_per_batch: int = 5000
    max_bytes_per_batch: int = 64 * 1024 * 1024
    prefetch: int = 10000
    id_header: str | None = None
    id_cache_size: int = 20000
    subscription_headers: Mapping[str, str] = field(default_factory=dict)
    timeout: float = 30.0

    @property
    def log_directory(self) -> Path:
        """Where this source keeps its read log: ``<checkpoint_location>/sources/
        mq-sidecar-stomp/<destination, percent-quoted>``."""
        name = quote(self.destination, safe="")
        return self.checkpoint_location / "sources" / "mq-sidecar-stomp" / name


def int_option(
    options: Mapping[str, str], name: str, default: int, low: int, *, key: str | None = None
) -> int:
    """The integer option ``name`` (looked up as ``key``, default ``name``: Spark hands a
    Python data source its option names lower-cased), ``default`` when absent. Raises
    :class:`OptionError` naming it when it is not an integer or below ``low``."""
    raw = options.get(name if key is None else key)
    if raw is None:
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise OptionError(f"option {name}={raw!r}: not an integer") from None
    if value < low:
        raise OptionError(f"option {name}={value}: must be at least {low}")
    return value


def port_option(options: Mapping[str, str]) -> int:
    """The option ``port`` (default 61613); raises :class:`OptionError` outside 1-65535."""
    port = int_option(options, "port", 61613, 1)
    if port > 65535:
        raise OptionError(f"option port={port}: must be 1-65535")
    return port


def _local_path(raw: str) -> Path:
    parsed = urlparse(raw)
    if parsed.scheme in ("", "file"):
        path = Path(parsed.path if parsed.scheme == "file" else raw)
        if not path.is_absolute():
            path = Path.cwd() / path
        return path
    raise OptionError(
        f"option checkpoint_location={raw!r}: the read log is written with local file I/O on "
        "the driver (fsync); give a local or mounted path (file:/... or /...), not "
        f"{parsed.scheme}://"
    )


def parse_read_options(options: Mapping[str, str]) -> ReadOptions:
    """Check ``options`` (Spark's case-insensitive option map) and return them parsed.

    Raises :class:`~mq_sidecar_spark.errors.OptionError` (a ``ValueError``) naming the option:
    an unknown option, a missing ``destination`` or ``checkpoint_location`` (a Python data
    source is not told the query's checkpoint location in Spark 4: ``DataSource.__init__`` gets
    the options only), a number out of range, a ``prefetch`` not above
    ``max_messages_per_batch``, ``subscription_headers`` that is not a JSON object of strings
    or that sets ``ack``/``id``/``destination``/a prefetch header.
    """
    given = {str(k).lower(): v for k, v in options.items()}
    unknown = sorted(set(given) - READ_OPTIONS)
    if unknown:
        raise OptionError(
            f"unknown option(s) for the stomp streaming read: {', '.join(unknown)} "
            f"(known: {', '.join(sorted(READ_OPTIONS))})"
        )
    destination = (given.get("destination") or "").strip()
    if not destination:
        raise OptionError("option destination is required (e.g. /queue/orders)")
    checkpoint = (given.get("checkpoint_location") or "").strip()
    if not checkpoint:
        raise OptionError(
            "option checkpoint_location is required: pass the same path as the query's "
            "writeStream checkpointLocation (the reader keeps its read log under it; Spark "
            "does not tell a Python data source where the checkpoint is)"
        )
    max_messages = int_option(given, "max_messages_per_batch", 5000, 1)
    prefetch = int_option(given, "prefetch", max(10000, 2 * max_messages), 2)
    if prefetch <= max_messages:
        raise OptionError(
            f"option prefetch={prefetch} must be larger than max_messages_per_batch="
            f"{max_messages} (twice as large lets every batch be full): a batch's messages stay "
            "unacknowledged until Spark commits it, and only the rest of the window receives "
            "the next batch meanwhile"
        )
    headers: dict[str, str] = {}
    raw_headers = given.get("subscription_headers")
    if raw_headers:
        try:
            parsed = json.loads(raw_headers)
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in parsed.items()
        ):
            raise OptionError(
                f"option subscription_headers={raw_headers!r}: must be a JSON object of strings"
            )
        reserved = {"ack", "id", "destination", "activemq.prefetchsize", "prefetch-count"}
        clash = sorted(k for k in parsed if k.lower() in reserved)
        if clash:
            raise OptionError(
                f"option subscription_headers sets {', '.join(clash)}: the reader sets those "
                "itself (use the prefetch option for the window)"
            )
        headers = parsed
    timeout_raw = given.get("timeout")
    timeout = 30.0
    if timeout_raw is not None:
        try:
            timeout = float(timeout_raw)
        except ValueError:
            raise OptionError(f"option timeout={timeout_raw!r}: not a number of seconds") from None
        if not 0 < timeout <= 3600:
            raise OptionError(f"option timeout={timeout}: must be in (0, 3600] seconds")
    id_header = (given.get("id_header") or "").strip() or None
    return ReadOptions(
        destination=destination,
        checkpoint_location=_local_path(checkpoint),
        host=(given.get("host") or "127.0.0.1").strip(),
        port=port_option(given),
        login=given.get("login"),
        passcode=given.get("passcode"),
        vhost=given.get("vhost") or None,
        max_messages_per_batch=max_messages,
        max_bytes_per_batch=int_option(given, "max_bytes_per_batch", 64 * 1024 * 1024, 1),
        prefetch=prefetch,
        id_header=id_header,
        id_cache_size=int_option(given, "id_cache_size", 20000, 1),
        subscription_headers=headers,
        timeout=timeout,
    )
