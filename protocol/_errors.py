"""Protocol errors, split h11-style into "we misused the API" and "the peer broke STOMP".

:class:`RemoteProtocolError` carries the ERROR frame to answer with (STOMP 1.2 "ERROR": a short
``message`` header, an optional longer explanation in the body), so a server can tell the peer
what went wrong before it closes the connection.
"""

from __future__ import annotations

from ._frame import Command, Frame

# Everything in `__all__` gets re-exported as part of the public API of `protocol`.
__all__ = ["LocalProtocolError", "ProtocolError", "RemoteProtocolError", "UnknownCommand"]

#: Longest ``message`` header we put in an ERROR frame, in characters.
_MAX_MESSAGE_CHARS = 200


class ProtocolError(Exception):
    """Abstract base of the STOMP protocol errors; catch it to catch both kinds.

    Raises:
        TypeError: when instantiated directly (use :class:`LocalProtocolError` or
            :class:`RemoteProtocolError`).
    """

    def __init__(self, message: str) -> None:
        if type(self) is ProtocolError:
            raise TypeError(
                "ProtocolError is abstract; raise LocalProtocolError or RemoteProtocolError"
            )
        super().__init__(message)


class LocalProtocolError(ProtocolError):
    """We misused the API: a frame we may not send now, or a header the version can't carry.

    Nothing was written when this is raised, and the connection's state is unchanged.
    """


class RemoteProtocolError(ProtocolError):
    """The peer broke the STOMP protocol; the connection is unusable afterwards.

    Args:
        message: a short, one-line description (it becomes the ERROR frame's ``message`` header).
        error_frame: the ERROR frame to answer with. Default:
            ``Frame(ERROR, (("message", message), ("content-type", "text/plain")), body)``
            whose body is a longer explanation in UTF-8.

    Attributes:
        error_frame: the suggested ERROR frame (STOMP 1.2 "ERROR"); always an ERROR frame.

    Raises:
        ValueError: ``error_frame`` is not an ERROR frame.
    """

    error_frame: Frame

    def __init__(self, message: str, *, error_frame: Frame | None = None) -> None:
        super().__init__(message)
        if error_frame is None:
            error_frame = build_error_frame(message)
        elif error_frame.command is not Command.ERROR:
            raise ValueError(f"error_frame must be an ERROR frame, not {error_frame.command}")
        self.error_frame = error_frame


class UnknownCommand(RemoteProtocolError):
    """A whole frame whose command STOMP does not define (``FROB``, ``send``), read to its NUL
    within the limits and consumed, so that reading can go on after it.

    Brokers differ on it (measured): RabbitMQ 3.10 answers ``ERROR Bad command`` and reads
    on, ActiveMQ 5.17 answers ``ERROR Unknown STOMP action`` and closes. So a server may answer
    it and keep the connection: :class:`FrameParser` raises it without breaking, and
    :class:`Connection` in SERVER role without entering ERROR (the caller decides). In CLIENT
    role (a server sent it) it breaks the connection like any :class:`RemoteProtocolError`.

    Attributes:
        command: the command line as received (UTF-8, undecodable bytes replaced).
        data: the frame's bytes as received, from its command line to its NUL.
        receipt: its first ``receipt`` header, not unescaped; None without one.
    """

    def __init__(
        self, message: str, *, error_frame: Frame, command: str, data: bytes, receipt: str | None
    ) -> None:
        super().__init__(message, error_frame=error_frame)
        self.command = command
        self.data = data
        self.receipt = receipt


def one_line(text: str) -> str:
    """``text`` squeezed to one line of at most 200 characters (for a ``message`` header)."""
    text = " ".join(text.split())
    if len(text) > _MAX_MESSAGE_CHARS:
        text = text[: _MAX_MESSAGE_CHARS - 3] + "..."
    return text


def build_error_frame(message: str, detail: str = "") -> Frame:
    """The ERROR frame for a peer's protocol violation: short ``message``, longer body."""
    body = f"{message}\n"
    if detail:
        body += f"\n{detail}\n"
    body += (
        "\nThe STOMP frames received on this connection broke the protocol "
        "(STOMP 1.2 specification); the connection will be closed.\n"
    )
    return Frame(
        Command.ERROR,
        (("message", one_line(message)), ("content-type", "text/plain")),
        body.encode("utf-8"),
    )


def remote_error(message: str, detail: str = "") -> RemoteProtocolError:
    """A :class:`RemoteProtocolError` whose ERROR frame body carries ``detail``."""
    return RemoteProtocolError(message, error_frame=build_error_frame(message, detail))


def line_too_long(limit: int) -> RemoteProtocolError:
    """A command or header line over ``limit`` bytes (``max_header_line_bytes``)."""
    return remote_error(
        f"header line too long (more than {limit} bytes)",
        f"This server accepts command and header lines of at most {limit} bytes.",
    )


def frame_too_large(limit: int) -> RemoteProtocolError:
    """A frame over ``limit`` bytes (``max_frame_bytes``: command, headers and body)."""
    return remote_error(
        f"frame too large (more than {limit} bytes)",
        f"This server accepts frames of at most {limit} bytes (command, headers and body).",
    )


def shown(raw: bytes | bytearray, limit: int = 40) -> str:
    """A short printable rendering of wire bytes for an error message."""
    text = bytes(raw[:limit]).decode("utf-8", "replace")
    text = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text)
    return text + ("..." if len(raw) > limit else "")


def unknown_command(raw: bytes, data: bytes, receipt: str | None) -> UnknownCommand:
    """The :class:`UnknownCommand` of a frame read whole: its command line ``raw``, its bytes
    ``data`` (command line to NUL), its first ``receipt`` header."""
    message = f"unknown command '{shown(raw)}'"
    error_frame = build_error_frame(
        message,
        "STOMP commands are CONNECT, STOMP, SEND, SUBSCRIBE, UNSUBSCRIBE, ACK, NACK, BEGIN, "
        "COMMIT, ABORT, DISCONNECT (client) and CONNECTED, MESSAGE, RECEIPT, ERROR (server), "
        "in upper case.",
    )
    return UnknownCommand(
        message,
        error_frame=error_frame,
        command=raw.decode("utf-8", "replace"),
        data=data,
        receipt=receipt,
    )
