"""Size limits applied to every frame a parser reads (STOMP 1.2 "Size Limits")."""

from __future__ import annotations

import dataclasses

# Everything in `__all__` gets re-exported as part of the public API of `protocol`.
__all__ = ["Limits"]

# The defaults are at least what the brokers the sidecar fronts accept themselves, so the
# sidecar never refuses a frame a broker would take (docs/behaviour.md, "Limits and bad input"):
# - ActiveMQ Classic 5.17 StompWireFormat (activemq-stomp, the stomp:// transport): body at
#   most maxDataLength, default MAX_DATA_LENGTH = 100 MiB (a longer content-length is refused at
#   once); maxFrameSize default Long.MAX_VALUE (no bound on the whole frame); header lines of at
#   most MAX_HEADER_LENGTH = 10240 bytes, at most MAX_HEADERS = 1000 headers, command line at
#   most MAX_COMMAND_LENGTH = 1024. The transport options wireFormat.maxDataLength and
#   wireFormat.maxFrameSize change the first two. Each check comes before a byte or header is
#   added, so, measured on 5.17.2, it takes a 104857600-byte body, 1001 header entries and
#   10241-byte lines, and answers one more of each with an ERROR ("The maximum data length was
#   exceeded", "... number of headers ...", "... header length ...") and a close.
# - RabbitMQ 3.10 (rabbit.app): max_message_size = 134217728 (128 MiB, the default since 3.8;
#   at most 512 MiB), checked on the body of every publish: measured on 3.10.8, a 128 MiB body
#   is taken and one byte more is an ERROR "precondition_failed" ("message size 134217729 is
#   larger than configured max size 134217728"). Its STOMP plugin (rabbit_stomp_frame) has no
#   frame, header-count or header-length limit: 5000 headers and a 1 MiB line were taken.
# - A MESSAGE has more headers than its SEND: measured, ActiveMQ adds 5 (message-id, priority,
#   timestamp, expires, subscription), RabbitMQ 3 (message-id, redelivered, subscription), and
#   the sidecar adds mq-sidecar-id. The same limits bound frames from the broker.
# - STOMP 1.2 "Size Limits": a server MAY limit frame size, header count and header length, and
#   SHOULD tell the client with an ERROR frame when one is exceeded.
# So max_frame_bytes is RabbitMQ's 128 MiB body plus 16 MiB for the command and headers (more
# than 1000 lines of 10 KiB). max_headers is twice ActiveMQ's and max_header_line_bytes 64 KiB:
# RabbitMQ has no header bounds to match, but the sidecar keeps them, as a header costs over
# 100 bytes of Python objects however short it is on the wire. The command line is bounded by
# max_header_line_bytes too (ActiveMQ uses a separate 1024).

#: RabbitMQ's default ``max_message_size`` (128 MiB): the largest body either broker takes.
BROKER_MAX_BODY_BYTES = 128 * 1024 * 1024
#: Room for the command and headers of a frame with the largest body (16 MiB).
HEAD_ROOM_BYTES = 16 * 1024 * 1024


@dataclasses.dataclass(frozen=True, slots=True)
class Limits:
    """Bounds on what a parser accepts (STOMP 1.2 "Size Limits"); exceeding one is a
    RemoteProtocolError whose ERROR frame names the limit.

    Attributes:
        max_frame_bytes: bytes of one frame before its terminating NUL: command line, header
            lines, blank line and body. A ``content-length`` that announces more is refused at
            once. Default 144 MiB: RabbitMQ's 128 MiB ``max_message_size`` (ActiveMQ takes
            100 MiB) plus 16 MiB of command and headers.
        max_headers: header entries per frame (repeats count). Default 2000, twice ActiveMQ's
            ``MAX_HEADERS`` (RabbitMQ has no limit).
        max_header_line_bytes: bytes of one command or header line, without its LF or CRLF.
            Default 65536, over six times ActiveMQ's ``MAX_HEADER_LENGTH`` of 10240
            (RabbitMQ has no limit).

    Limits are checked as soon as they are known to be exceeded, before the frame is complete, so
    memory stays bounded under garbage. Instances are immutable, so one can be shared (it is the
    default argument of :class:`FrameParser` and :class:`Connection`).

    Raises:
        ValueError: a value is not greater than zero.
        TypeError: a value is not an ``int``.
    """

    max_frame_bytes: int = BROKER_MAX_BODY_BYTES + HEAD_ROOM_BYTES  # 144 MiB, whole frame
    max_headers: int = 2000  # ActiveMQ takes 1000 (+1); RabbitMQ any number
    max_header_line_bytes: int = 64 * 1024  # ActiveMQ takes 10240 (+1); RabbitMQ any length

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"Limits.{field.name} must be an int, not {value!r}")
            if value <= 0:
                raise ValueError(f"Limits.{field.name} must be greater than 0, not {value}")
