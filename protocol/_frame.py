"""STOMP frames as immutable values: the :class:`Command` enum and :class:`Frame`.

A frame is a command, an ordered tuple of ``(name, value)`` headers and a body of bytes
(STOMP 1.2 "STOMP Frames"). Headers are kept exactly as they came: in order, with repeats.
STOMP 1.2 "Repeated Header Entries" says only the first entry of a repeated header is used and
the later ones are history, so :meth:`Frame.get` returns the first entry while forwarding the
frame keeps them all. Header values are stored unescaped (their logical form); escaping is a
wire concern handled by the codec.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping
from typing import Any, TypedDict, Unpack

# Everything in `__all__` gets re-exported as part of the public API of `protocol`.
__all__ = ["CLIENT_COMMANDS", "SERVER_COMMANDS", "Command", "Frame"]


class Command(enum.StrEnum):
    """The STOMP commands of versions 1.0, 1.1 and 1.2 (STOMP 1.2 "Client Frames", "Server Frames").

    ``STOMP`` (a synonym of ``CONNECT``) and ``NACK`` exist only since STOMP 1.1. A command is a
    ``str``, so ``Command.SEND == "SEND"``.
    """

    CONNECT = "CONNECT"
    STOMP = "STOMP"
    CONNECTED = "CONNECTED"
    SEND = "SEND"
    SUBSCRIBE = "SUBSCRIBE"
    UNSUBSCRIBE = "UNSUBSCRIBE"
    ACK = "ACK"
    NACK = "NACK"
    BEGIN = "BEGIN"
    COMMIT = "COMMIT"
    ABORT = "ABORT"
    DISCONNECT = "DISCONNECT"
    MESSAGE = "MESSAGE"
    RECEIPT = "RECEIPT"
    ERROR = "ERROR"


#: Commands a client may send (STOMP 1.2 "Client Frames", plus CONNECT/STOMP).
CLIENT_COMMANDS: frozenset[Command] = frozenset(
    {
        Command.CONNECT,
        Command.STOMP,
        Command.SEND,
        Command.SUBSCRIBE,
        Command.UNSUBSCRIBE,
        Command.ACK,
        Command.NACK,
        Command.BEGIN,
        Command.COMMIT,
        Command.ABORT,
        Command.DISCONNECT,
    }
)

#: Commands a server may send (STOMP 1.2 "Server Frames", plus CONNECTED).
SERVER_COMMANDS: frozenset[Command] = frozenset(
    {Command.CONNECTED, Command.MESSAGE, Command.RECEIPT, Command.ERROR}
)

#: Frames whose headers are never escaped nor unescaped, in any version: the version is not
#: negotiated yet when they travel (STOMP 1.2 "Value Encoding": "The CONNECT and CONNECTED
#: frames do not escape the carriage return, line feed or colon octets").
NEVER_ESCAPED: frozenset[Command] = frozenset({Command.CONNECT, Command.STOMP, Command.CONNECTED})

#: Header values hidden by ``repr(frame)`` so credentials never reach a log line.
_SECRET_HEADERS = frozenset({"passcode"})
#: How many body bytes ``repr(frame)`` shows before it truncates.
_REPR_BODY_BYTES = 64

HeaderItems = tuple[tuple[str, str], ...]


class _FrameChanges(TypedDict, total=False):
    command: Command
    headers: HeaderItems
    body: bytes


@dataclasses.dataclass(frozen=True, slots=True, repr=False)
class Frame:
    """One STOMP frame (STOMP 1.2 "STOMP Frames").

    Attributes:
        command: the :class:`Command`.
        headers: ordered ``(name, value)`` pairs, repeats kept, values unescaped (logical form).
        body: the body bytes, without the terminating NUL.

    Frames are immutable and compare by value. ``repr()`` truncates long bodies and hides the
    ``passcode`` header.

    Raises:
        TypeError: ``command`` is not a :class:`Command`, ``headers`` is not a tuple of
            ``(str, str)`` tuples, or ``body`` is not ``bytes``.
    """

    command: Command
    headers: HeaderItems = ()
    body: bytes = b""

    def __post_init__(self) -> None:
        if not isinstance(self.command, Command):
            raise TypeError(f"Frame.command must be a Command, not {self.command!r}")
        headers = self.headers
        if not isinstance(headers, tuple):
            raise TypeError(f"Frame.headers must be a tuple of (str, str) tuples, not {headers!r}")
        for item in headers:
            if not (
                isinstance(item, tuple)
                and len(item) == 2
                and isinstance(item[0], str)
                and isinstance(item[1], str)
            ):
                raise TypeError(f"each header must be a (str, str) tuple, not {item!r}")
        if not isinstance(self.body, bytes):
            raise TypeError(f"Frame.body must be bytes, not {type(self.body).__name__}")

    @classmethod
    def build(
        cls,
        command: Command,
        headers: Mapping[str, str] | Iterable[tuple[str, str]] = (),
        body: bytes = b"",
    ) -> Frame:
        """Build a frame from a mapping or any iterable of ``(name, value)`` pairs.

        ``Frame.build(Command.SEND, {"destination": "/queue/a"}, b"hi")``. A mapping gives its
        items in iteration order; an iterable may repeat names.

        Raises:
            TypeError: as for the constructor.
        """
        # Any: unpack each item as Python does, whatever the iterable holds (a compiled build
        # would check for tuples first); the constructor checks the pairs it gets.
        items: Iterable[Any] = headers.items() if isinstance(headers, Mapping) else headers
        return cls(command, tuple((name, value) for name, value in items), body)

    @staticmethod
    def unchecked(command: Command, headers: HeaderItems, body: bytes) -> Frame:
        """Build a frame without the constructor's type checks, for hot paths: only for a
        ``command``, ``(str, str)`` header pairs and ``bytes`` body the caller knows are
        well-typed (taken from a checked frame, or strings it made itself)."""
        return trusted_frame(command, headers, body)

    def get(self, name: str, default: str | None = None) -> str | None:
        """Return the value of the FIRST header called ``name`` (case-sensitive), or ``default``.

        STOMP 1.2 "Repeated Header Entries": only the first entry is used.
        """
        for key, value in self.headers:
            if key == name:
                return value
        return default

    def get_all(self, name: str) -> tuple[str, ...]:
        """Return the values of every header called ``name``, in order (may be empty)."""
        return tuple([value for key, value in self.headers if key == name])

    def has(self, name: str) -> bool:
        """Return True when at least one header is called ``name``."""
        # A plain loop: any() over a generator costs 4x as much on a hot path.
        for key, _ in self.headers:  # noqa: SIM110
            if key == name:
                return True
        return False

    def with_header(self, name: str, value: str) -> Frame:
        """Return a copy where header ``name`` has exactly one entry, ``value``.

        The new entry takes the position of the first existing ``name`` entry and every later
        entry of ``name`` is dropped; when there is none it is appended.
        """
        out: list[tuple[str, str]] = []
        placed = False
        for item in self.headers:
            if item[0] != name:
                out.append(item)
            elif not placed:
                out.append((name, value))
                placed = True
        if not placed:
            out.append((name, value))
        if not (isinstance(name, str) and isinstance(value, str)):
            raise TypeError(f"each header must be a (str, str) tuple, not {(name, value)!r}")
        # The other entries come from a checked frame: skip the constructor's checks (hot path).
        return trusted_frame(self.command, tuple(out), self.body)

    def without(self, *names: str) -> Frame:
        """Return a copy with every entry of each of ``names`` removed."""
        if len(names) == 1:
            (name,) = names
            headers = tuple([h for h in self.headers if h[0] != name])
        else:
            drop = frozenset(names)
            headers = tuple([h for h in self.headers if h[0] not in drop])
        return trusted_frame(self.command, headers, self.body)  # a subset of a checked frame

    def replace(self, **changes: Unpack[_FrameChanges]) -> Frame:
        """Return a copy with ``command``, ``headers`` and/or ``body`` replaced.

        Same validation as the constructor (:func:`dataclasses.replace`).
        """
        return dataclasses.replace(self, **changes)

    def __reduce__(self) -> tuple[type[Frame], tuple[Command, HeaderItems, bytes]]:
        # copy and pickle make the frame again through the constructor, in both builds: a
        # compiled frozen dataclass cannot be restored field by field (docs/architecture.md,
        # "The compiled core").
        return (Frame, (self.command, self.headers, self.body))

    def __repr__(self) -> str:
        headers = tuple(
            (name, "<hidden>" if name in _SECRET_HEADERS else value) for name, value in self.headers
        )
        body = self.body
        if len(body) <= _REPR_BODY_BYTES:
            body_repr = repr(body)
        else:
            body_repr = f"{body[:_REPR_BODY_BYTES]!r}...<{len(body)} bytes>"
        return f"Frame(Command.{self.command.name}, headers={headers!r}, body={body_repr})"


_set = object.__setattr__


def trusted_frame(command: Command, headers: HeaderItems, body: bytes) -> Frame:
    """Build a Frame without the type checks: only for values the parser built itself."""
    # Frame.__new__, not object.__new__: the same allocation for the Python class, and the one
    # a mypyc-compiled Frame accepts (docs/architecture.md, "The compiled core").
    frame = Frame.__new__(Frame)
    _set(frame, "command", command)
    _set(frame, "headers", headers)
    _set(frame, "body", body)
    return frame
