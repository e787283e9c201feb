"""RabbitMQ streams: where a stream subscription resumes on a new leg (pure).

A RabbitMQ stream (a queue declared ``x-queue-type:stream``, RabbitMQ 3.9+) is an append-only
log. A STOMP consumer names where it starts reading on its SUBSCRIBE, ``x-stream-offset: first
| last | next | offset=<N> | timestamp=<T>`` (default ``next``), and every MESSAGE carries
``x-stream-offset:<N>``, the message's place in the log (0, 1, 2...). An ACK on a stream is
credit, not deletion: nothing is redelivered to a new connection; a new SUBSCRIBE reads again
from the position it names (docs/brokers.md, "Streams", measured on RabbitMQ 3.10.8).

So re-sending the app's SUBSCRIBE unchanged after a reconnect shows the app the log again
(``first``, ``offset=N``, ``timestamp=T``) or skips what was published during the outage
(``next``, ``last``). The session records, per stream subscription, the offset of the last
MESSAGE delivered to the app (:attr:`proxy.tracking.records.Subscription.stream_offset`) and
re-subscribes at :func:`resume_subscribe`: ``offset=<last + 1>``, or the app's own header when
nothing was delivered yet (docs/behaviour.md, "Streams").

When that offset is no longer in the stream (retention removed the segment that held it), the
broker starts the new leg at the first offset it still has (RabbitMQ 3.10.8, measured: a
SUBSCRIBE at ``offset=0`` of a stream truncated to offset 391 gets offset 391 first). The
first MESSAGE of the new leg then names the offsets the app can never see: a
:class:`StreamGap` (:func:`gap_before`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from protocol import Frame

__all__ = [
    "STREAM_OFFSET",
    "StreamGap",
    "gap_before",
    "is_stream_subscribe",
    "parse_offset",
    "resume_subscribe",
]

#: The header of a stream's position: on SUBSCRIBE where to start, on MESSAGE the message's
#: offset (RabbitMQ STOMP plugin, "Stream Support"; measured on 3.10.8).
STREAM_OFFSET: Final = "x-stream-offset"
#: The SUBSCRIBE header that declares (or names) a stream queue (RabbitMQ "Streams").
_QUEUE_TYPE: Final = "x-queue-type"


def is_stream_subscribe(frame: Frame) -> bool:
    """Whether an app's SUBSCRIBE says it reads a stream: it carries ``x-stream-offset`` or
    ``x-queue-type:stream`` (first entries, STOMP 1.2 "Repeated Header Entries"). A SUBSCRIBE
    to an existing stream without either (``/amq/queue/<stream>``) is known as a stream by
    its first MESSAGE instead (:func:`parse_offset` of its ``x-stream-offset``)."""
    return frame.has(STREAM_OFFSET) or frame.get(_QUEUE_TYPE) == "stream"


def parse_offset(value: str) -> int | None:
    """The offset a MESSAGE's ``x-stream-offset`` value names: a decimal integer, at least 0
    (RabbitMQ writes the osiris offset, an unsigned 64-bit number, in decimal). None for
    anything else (a header the app's producer set itself, say): the subscription is then
    treated as a queue (docs/behaviour.md, "Streams", bad input)."""
    if not value.isascii() or not value.isdigit():
        return None
    return int(value)


def resume_subscribe(frame: Frame, last: int | None) -> Frame:
    """The SUBSCRIBE that re-creates a stream subscription on a new leg.

    Args:
        frame: the SUBSCRIBE as first sent upstream (the app's ``x-stream-offset``, if any,
            kept as the app wrote it).
        last: the offset of the last MESSAGE the subscription delivered to the app, or None
            when it delivered none yet.

    Returns ``frame`` with ``x-stream-offset:offset=<last + 1>`` in place of the app's value
    (appended when the app named none: RabbitMQ's default is ``next``), so the new leg starts
    right after what the app was shown, whatever ``first``/``next``/``last``/``timestamp``
    the app asked for at first; ``frame`` unchanged when ``last`` is None (the app's original
    position: nothing it was shown can come again, and ``next``/``last`` miss what was
    published meanwhile, as the app's own position says).
    """
    if last is None:
        return frame
    return frame.with_header(STREAM_OFFSET, f"offset={last + 1}")


@dataclass(frozen=True, slots=True)
class StreamGap:
    """Offsets of a stream subscription the app was never shown and never will be: the new
    leg resumed at ``first`` and its first MESSAGE came at ``last + 1``.

    Retention (``max-length-bytes``, ``max-age``) removes whole segments, and a SUBSCRIBE at
    an offset no longer stored starts at the first one still stored (RabbitMQ 3.10.8,
    measured). Offsets count log entries, not only messages: RabbitMQ also writes one entry
    that is not a message at the start of each segment (measured: the offsets of consecutive
    messages skip one at segment boundaries), so a range may hold fewer messages than
    :attr:`count`, and a range of one or two offsets at a segment boundary may hold none.

    Attributes:
        subscription: the app's subscription id (None: the app gave none, STOMP 1.0).
        destination: the subscription's destination.
        first: the first offset not shown (where the new leg was asked to start).
        last: the last offset not shown (the one before the first MESSAGE of the new leg).
    """

    subscription: str | None
    destination: str
    first: int
    last: int

    @property
    def count(self) -> int:
        """How many offsets the range holds (at least 1)."""
        return self.last - self.first + 1


def gap_before(resumed_at: int, offset: int) -> tuple[int, int] | None:
    """The offsets skipped when a leg asked to resume at ``resumed_at`` delivers ``offset``
    first: ``(resumed_at, offset - 1)``, or None when nothing was skipped (``offset`` is
    ``resumed_at``; one below it is a redelivery, which the session hides)."""
    if offset <= resumed_at:
        return None
    return resumed_at, offset - 1
