"""The stream source's options (``stream=true``): parsed and checked once, on the driver, before
anything connects; a bad option fails the read or the query at its start with one message
naming the option.

Names follow Spark's Kafka source where the meaning is the same (``startingOffsets``,
``endingOffsets``, ``maxRecordsPerTrigger``, ``minRecordsPerTrigger``, ``maxTriggerDelay``,
``failOnDataLoss``, ``minPartitions``); Spark passes every name lower-cased and every value as a
string. The table with defaults and reasons: docs/spark.md, "Stream read".
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from mq_sidecar_spark._read_options import int_option, port_option
from mq_sidecar_spark.errors import OptionError

__all__ = [
    "STREAM_OPTIONS",
    "Position",
    "StreamOptions",
    "is_stream_read",
    "parse_stream_options",
]

#: Options that only a stream read takes: given without ``stream=true`` they are refused.
_STREAM_ONLY = frozenset(
    {
        "startingoffsets",
        "endingoffsets",
        "maxrecordspertrigger",
        "minrecordspertrigger",
        "maxtriggerdelay",
        "failondataloss",
        "minpartitions",
        "maxrecordsperpartition",
        "tail_wait",
    }
)

#: Every option of a stream read (lower-cased, as Spark passes them); any other is refused.
STREAM_OPTIONS = _STREAM_ONLY | {
    "stream",
    "destination",
    "host",
    "port",
    "login",
    "passcode",
    "vhost",
    "prefetch",
    "timeout",
}

#: RabbitMQ's stream destinations that declare nothing (docs/brokers.md, "Streams": a frame to
#: ``/queue/<name>`` without ``x-queue-type:stream`` is refused on a stream).
STREAM_PREFIX = "/amq/queue/"


@dataclass(frozen=True)
class Position:
    """A position given by ``startingOffsets``/``endingOffsets``: ``kind`` is ``earliest``,
    ``latest``, ``offset`` (``value`` the stream offset, from 0) or ``timestamp`` (``value`` ms
    since the epoch)."""

    kind: str
    value: int = 0


@dataclass(frozen=True)
class StreamOptions:
    """The stream read's options, checked. Counts are records, times are seconds.

    ``max_records_per_trigger`` / ``min_records_per_trigger``: None when not set;
    ``max_trigger_delay``: how long a ``minRecordsPerTrigger`` may hold a batch back (Kafka
    source's default, 15 min). ``prefetch``: RabbitMQ's ``prefetch-count`` of each task's
    subscription (required on a stream, docs/brokers.md). ``tail_wait``: how long the driver's
    probe of a position waits for its first message (an empty stream sends none).
    """

    destination: str
    host: str = "127.0.0.1"
    port: int = 61613
    login: str | None = None
    passcode: str | None = field(default=None, repr=False)
    vhost: str | None = None
    starting: Position = Position("latest")
    ending: Position = Position("latest")
    max_records_per_trigger: int | None = None
    min_records_per_trigger: int | None = None
    max_trigger_delay: float = 900.0
    fail_on_data_loss: bool = True
    min_partitions: int = 1
    max_records_per_partition: int = 100_000
    prefetch: int = 1000
    timeout: float = 30.0
    tail_wait: float = 1.0


def is_stream_read(options: Mapping[str, str]) -> bool:
    """Whether ``options`` ask for a stream read: ``stream`` is ``true`` (any case).

    Raises :class:`OptionError` for a ``stream`` value that is not ``true``/``false``, and for a
    stream-only option (``startingOffsets``...) given without ``stream=true``.
    """
    given = {str(k).lower(): str(v) for k, v in options.items()}
    raw = given.get("stream", "false").strip().lower()
    if raw not in ("true", "false"):
        raise OptionError(f"option stream={given['stream']!r}: must be true or false")
    if raw == "false":
        extra = sorted(set(given) & _STREAM_ONLY)
        if extra:
            raise OptionError(
                f"option(s) {', '.join(extra)} apply to a RabbitMQ stream read only: set "
                "stream=true (and a destination /amq/queue/<stream>)"
            )
    return raw == "true"


def _maybe(given: Mapping[str, str], name: str, low: int) -> int | None:
    raw = given.get(name.lower())
    if raw is None:
        return None
    return _int(given, name, low, 0)


def _int(given: Mapping[str, str], name: str, low: int, default: int) -> int:
    return int_option(given, name, default, low, key=name.lower())


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h)?\s*$")
_UNIT = {"ms": 0.001, "s": 1.0, None: 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def _seconds(given: Mapping[str, str], name: str, default: float, high: float) -> float:
    raw = given.get(name.lower())
    if raw is None:
        return default
    match = _DURATION.match(str(raw))
    if match is None:
        raise OptionError(f"option {name}={raw!r}: not a duration (e.g. 500ms, 30s, 5m, 1h)")
    value = float(match.group(1)) * _UNIT[match.group(2)]
    if not 0 < value <= high:
        raise OptionError(f"option {name}={raw!r}: must be more than 0 and at most {high:g} s")
    return value


def _position(given: Mapping[str, str], name: str, default: str, now_ms: int) -> Position:
    raw = str(given.get(name.lower(), default)).strip()
    word = raw.lower()
    if word in ("earliest", "latest"):
        return Position(word)
    if word.startswith("timestamp:"):
        try:
            ms = int(word.removeprefix("timestamp:"))
        except ValueError:
            ms = -1
        if ms < 0:
            raise OptionError(
                f"option {name}={raw!r}: timestamp:<ms> takes milliseconds since the epoch"
            )
        if ms > now_ms:
            raise OptionError(
                f"option {name}={raw!r}: the timestamp is in the future (now is {now_ms} ms "
                "on the driver); no message of the stream can be that late yet"
            )
        return Position("timestamp", ms)
    try:
        offset = int(word)
    except ValueError:
        offset = -1
    if offset < 0:
        raise OptionError(
            f"option {name}={raw!r}: use earliest, latest, a stream offset (an integer from 0) "
            "or timestamp:<ms since the epoch>"
        )
    return Position("offset", offset)


def parse_stream_options(options: Mapping[str, str], *, batch: bool) -> StreamOptions:
    """Check ``options`` (Spark's case-insensitive option map; ``stream=true``) and return them.

    ``batch``: a ``spark.read`` (``endingOffsets`` allowed, the trigger options refused) or a
    ``spark.readStream`` (the reverse: a query's end is its trigger, Spark's Kafka source has
    the same rule).

    Raises :class:`~mq_sidecar_spark.errors.OptionError` naming the option: an unknown option
    (the known ones listed), a destination that is not ``/amq/queue/<name>``, a position that is
    not ``earliest | latest | <offset> | timestamp:<ms>`` or a timestamp in the future (the
    driver's clock), ``startingOffsets=latest`` for a batch read, a number or duration out of
    range, ``minRecordsPerTrigger`` above ``maxRecordsPerTrigger``, ``maxBytesPerTrigger``
    (the driver never reads the records, so it cannot count their bytes).
    """
    given = {str(k).lower(): str(v) for k, v in options.items()}
    if "maxbytespertrigger" in given:
        raise OptionError(
            "option maxBytesPerTrigger is not supported by the stream read: the driver plans "
            "offset ranges without reading the records, so it cannot count their bytes; use "
            "maxRecordsPerTrigger"
        )
    unknown = sorted(set(given) - STREAM_OPTIONS)
    if unknown:
        raise OptionError(
            f"unknown option(s) for the stomp stream read: {', '.join(unknown)} "
            f"(known: {', '.join(sorted(STREAM_OPTIONS))})"
        )
    destination = given.get("destination", "").strip()
    if not destination.startswith(STREAM_PREFIX) or len(destination) == len(STREAM_PREFIX):
        raise OptionError(
            f"option destination={destination!r}: a stream read takes a RabbitMQ stream as "
            f"{STREAM_PREFIX}<name> (a /queue/<name> frame without x-queue-type is refused by "
            "RabbitMQ on a stream; topics, exchanges and ActiveMQ queues have no offsets)"
        )
    now_ms = int(time.time() * 1000)
    if batch:
        for name in ("maxRecordsPerTrigger", "minRecordsPerTrigger", "maxTriggerDelay"):
            if name.lower() in given:
                raise OptionError(f"option {name} applies to spark.readStream only")
        starting = _position(given, "startingOffsets", "earliest", now_ms)
        ending = _position(given, "endingOffsets", "latest", now_ms)
        if starting.kind == "latest":
            raise OptionError(
                "option startingOffsets=latest: a batch read would read nothing; use earliest, "
                "an offset or timestamp:<ms>"
            )
        if ending.kind == "earliest":
            raise OptionError("option endingOffsets=earliest: a batch read would read nothing")
        if starting.kind == ending.kind == "offset" and ending.value < starting.value:
            raise OptionError(
                f"option endingOffsets={ending.value} is before startingOffsets={starting.value}"
            )
    else:
        if "endingoffsets" in given:
            raise OptionError(
                "option endingOffsets applies to spark.read only (a query reads until it is "
                "stopped; trigger(availableNow=True) reads to the tail seen at its start)"
            )
        starting = _position(given, "startingOffsets", "latest", now_ms)
        ending = Position("latest")
    max_trigger = _maybe(given, "maxRecordsPerTrigger", 1)
    min_trigger = _maybe(given, "minRecordsPerTrigger", 1)
    if max_trigger is not None and min_trigger is not None and min_trigger > max_trigger:
        raise OptionError(
            f"option minRecordsPerTrigger={min_trigger} is above maxRecordsPerTrigger="
            f"{max_trigger}: no batch could satisfy both"
        )
    fail_raw = given.get("failondataloss", "true").strip().lower()
    if fail_raw not in ("true", "false"):
        raise OptionError(f"option failOnDataLoss={given['failondataloss']!r}: true or false")
    port = port_option(given)
    min_partitions = _int(given, "minPartitions", 1, 1)
    per_partition = _int(given, "maxRecordsPerPartition", 1, 100_000)
    prefetch = _int(given, "prefetch", 1, 1000)
    return StreamOptions(
        destination=destination,
        host=(given.get("host") or "127.0.0.1").strip(),
        port=port,
        login=given.get("login"),
        passcode=given.get("passcode"),
        vhost=given.get("vhost") or None,
        starting=starting,
        ending=ending,
        max_records_per_trigger=max_trigger,
        min_records_per_trigger=min_trigger,
        max_trigger_delay=_seconds(given, "maxTriggerDelay", 900.0, 86400.0),
        fail_on_data_loss=fail_raw == "true",
        min_partitions=min_partitions,
        max_records_per_partition=per_partition,
        prefetch=prefetch,
        timeout=_seconds(given, "timeout", 30.0, 3600.0),
        tail_wait=_seconds(given, "tail_wait", 1.0, 60.0),
    )
