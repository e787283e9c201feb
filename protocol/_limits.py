"""Size limits applied to every frame a parser reads (STOMP 1.2 "Size Limits")."""

from __future__ import annotations

import dataclasses

# Everything in `__all__` gets re-exported as part of the public API of `protocol`.
__all__ = ["Limits"]

# Some precedents for the defaults:
# - ActiveMQ Classic StompWireFormat: MAX_COMMAND_LENGTH 1024, MAX_HEADER_LENGTH 1024 * 10,
#   MAX_HEADERS 1000, MAX_DATA_LENGTH 100 MiB (maxDataLength).
# - FuseSource stompjms StompSocket: MAX_HEADER_LENGTH 1024 * 10, MAX_HEADERS 1024,
#   MAX_DATA_LENGTH 32 MiB.
# - STOMP 1.2 "Size Limits": a server MAY limit frame size, header count and header length, and
#   SHOULD tell the client with an ERROR frame when one is exceeded.
# 16 MiB per frame is generous for messaging and keeps one session's worst case bounded. The
# command line is bounded by max_header_line_bytes too (ActiveMQ uses a separate 1024).


@dataclasses.dataclass(frozen=True, slots=True)
class Limits:
    """Bounds on what a parser accepts (STOMP 1.2 "Size Limits"); exceeding one is a
    RemoteProtocolError whose ERROR frame names the limit.

    Attributes:
        max_frame_bytes: bytes of one frame before its terminating NUL: command line, header
            lines, blank line and body. A ``content-length`` that announces more is refused at
            once. Default 16 MiB.
        max_headers: header entries per frame (repeats count). Default 1000, ActiveMQ's
            ``maxHeaders``.
        max_header_line_bytes: bytes of one command or header line, without its LF or CRLF.
            Default 10240, ActiveMQ's ``maxHeaderLength``.

    Limits are checked as soon as they are known to be exceeded, before the frame is complete, so
    memory stays bounded under garbage. Instances are immutable, so one can be shared (it is the
    default argument of :class:`FrameParser` and :class:`Connection`).

    Raises:
        ValueError: a value is not greater than zero.
        TypeError: a value is not an ``int``.
    """

    max_frame_bytes: int = 16 * 1024 * 1024  # command line + headers + body
    max_headers: int = 1000  # ActiveMQ maxHeaders default
    max_header_line_bytes: int = 10 * 1024  # ActiveMQ maxHeaderLength default 10240

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"Limits.{field.name} must be an int, not {value!r}")
            if value <= 0:
                raise ValueError(f"Limits.{field.name} must be greater than 0, not {value}")
