"""The non-frame events a parser or connection returns from ``next_event()``.

Each is a class with one module-level instance (``HEARTBEAT``, ``NEED_DATA``,
``CONNECTION_CLOSED``); all instances of a class are equal, so both ``event is HEARTBEAT`` and
``match event: case HeartBeat(): ...`` work. Don't subclass these.
"""

from __future__ import annotations

import dataclasses
from typing import TypeAlias

from ._frame import Frame

# Everything in `__all__` gets re-exported as part of the public API of `protocol`.
__all__ = [
    "CONNECTION_CLOSED",
    "HEARTBEAT",
    "NEED_DATA",
    "ConnectionClosed",
    "Event",
    "HeartBeat",
    "NeedData",
]


@dataclasses.dataclass(frozen=True, slots=True, repr=False)
class HeartBeat:
    """Event: one EOL (LF or CRLF) received between frames (STOMP 1.2 "Heart-beating").

    Every EOL outside a frame is one heart-beat, including EOLs right after a frame's NUL.
    """

    def __repr__(self) -> str:
        return "HEARTBEAT"


@dataclasses.dataclass(frozen=True, slots=True, repr=False)
class NeedData:
    """Event: no complete event is buffered; call ``receive_data()`` with more bytes."""

    def __repr__(self) -> str:
        return "NEED_DATA"


@dataclasses.dataclass(frozen=True, slots=True, repr=False)
class ConnectionClosed:
    """Event: the peer closed its side (``receive_data(b"")``) at a frame boundary.

    Returned again by every later ``next_event()`` call.
    """

    def __repr__(self) -> str:
        return "CONNECTION_CLOSED"


#: The one :class:`HeartBeat` instance returned by parsers.
HEARTBEAT = HeartBeat()
#: The one :class:`NeedData` instance returned by parsers.
NEED_DATA = NeedData()
#: The one :class:`ConnectionClosed` instance returned by parsers.
CONNECTION_CLOSED = ConnectionClosed()

#: What ``next_event()`` returns.
Event: TypeAlias = Frame | HeartBeat | NeedData | ConnectionClosed
