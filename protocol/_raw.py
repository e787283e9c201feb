"""Frames kept as their wire bytes: :class:`RawFrame`, the unit of the fast lane (issue 18).

Theory of operation
-------------------
A relay that changes two headers of a frame need not decode every header, build a
:class:`Frame` and serialize it again: it can find the few headers it reads, splice the lines
it changes into the bytes it read, and write those bytes on. That is only the same as the
general path (parse, change, :func:`serialize`) when the general path would write back the
bytes it read, so a :class:`RawFrame` exists only for an *ordinary* frame, one whose bytes are
exactly what :func:`serialize` makes of its parsed form, in every version:

* the head is ASCII, with no NUL, CR or backslash (no escape to undo or redo, no CRLF line
  end to drop; ASCII also makes a header's size in characters its size in bytes, which the
  confirmation window counts: :func:`proxy.tracking.window.frame_size`);
* every header line holds exactly one ``:`` (a second one is part of the value, which STOMP
  1.1 and 1.2 escape as ``\\c`` on the way out);
* a ``content-length``, if any, appears once and says ``len(body)`` in canonical decimal
  (:func:`serialize` rewrites it that way and drops repeats); without one the body has no NUL
  (it ends at the first one), so none is added;
* the whole frame is buffered and within the parser's limits, with the head in one header
  line's worth of bytes (the parser's whole-frame test, ``FrameParser._whole_frame``).

Anything else is read by the general parser. Header values changed through a RawFrame must be
*plain* (ASCII, no NUL, CR, LF, ``:`` or backslash) to stay ordinary; for any other value
:meth:`RawFrame.with_header` returns a :class:`Frame` instead, so the caller gets the general
path's result either way. Only the first entry of a header is read (STOMP 1.2 "Repeated Header
Entries"), as :meth:`Frame.get` does; callers that must see a header once use :meth:`count`.

``tests/protocol/test_raw.py`` checks all of this by property: for every byte string the
parser reads as an ordinary frame, the RawFrame's :meth:`to_frame` equals the parsed frame,
``serialize(frame, version)`` equals its bytes in every version, and every splice equals the
Frame operation it stands for followed by :func:`serialize`.
"""

from __future__ import annotations

import re

from ._frame import Command, Frame, trusted_frame
from ._limits import Limits

__all__ = ["RawFrame"]

#: The bytes a frame's ``content-length`` line starts with (after the LF before it).
_CONTENT_LENGTH_KEY = b"\ncontent-length:"
_NUL = 0
#: Frames at least this long are copied out of the read buffer through a memoryview (one copy
#: instead of two; a memoryview costs more than it saves on small frames).
_VIEW_BYTES = 64 * 1024

#: A header line's name or value in an ordinary head: ASCII without NUL, LF, CR, ``:`` or
#: backslash.
_PLAIN = rb"[^\x00\n\r:\\\x80-\xff]*"
#: The header lines of an ordinary head (each ``name:value`` LF, one colon), for one C-level
#: ``fullmatch`` per frame.
ORDINARY_LINES = re.compile(rb"(?:" + _PLAIN + rb":" + _PLAIN + rb"\n)*")
#: A plain text value (str): what a spliced header line may hold.
_PLAIN_TEXT = re.compile(r"[^\x00\n\r:\\\x80-\U0010ffff]*")
_COMMANDS = {command.value.encode("ascii"): command for command in Command}


class _Keys(dict[str, bytes]):
    """Header names as the bytes a lookup searches for (``LF name :``), made once per name
    (``_KEYS[name]``: one C-level lookup on the hot path)."""

    def __missing__(self, name: str) -> bytes:
        if len(self) >= 256:  # names come from the code, not the peer; bounded all the same
            self.clear()
        key = self[name] = b"\n" + name.encode("utf-8") + b":"
        return key


_KEYS = _Keys()
_plain = _PLAIN_TEXT.fullmatch


def is_plain(text: str) -> bool:
    """Whether ``text`` can be spliced into an ordinary head as it is (see the module
    docstring): ASCII without NUL, LF, CR, ``:`` or backslash."""
    return _plain(text) is not None


class RawFrame:
    """An ordinary frame kept as its wire bytes (module docstring); made by the parser.

    Attributes:
        command: the :class:`Command`.
        data: the frame's bytes, from the command to the terminating NUL (included).
        head_end: the offset in ``data`` of the empty line's LF that ends the head; the
            header lines (each ``name:value`` LF) lie between the command line and it, the
            body from ``head_end + 1`` to the NUL.

    Immutable by convention: every change returns a new frame. Its bytes are what
    :func:`serialize` writes for :meth:`to_frame` in any version (module docstring).
    """

    __slots__ = ("command", "data", "head_end")

    def __init__(self, command: Command, data: bytes, head_end: int) -> None:
        self.command = command
        self.data = data
        self.head_end = head_end

    @classmethod
    def build(cls, command: Command, headers: tuple[tuple[str, str], ...]) -> RawFrame | None:
        """A frame without a body, made by the caller, as bytes: None unless every name and
        value is plain (:func:`is_plain`), when its bytes would depend on the version."""
        lines = [command._value_, "\n"]  # _value_: .value is a slow property in 3.11
        for name, value in headers:
            if _plain(name) is None or _plain(value) is None:
                return None
            lines += (name, ":", value, "\n")
        head = "".join(lines).encode("ascii")
        return cls(command, head + b"\n\0", len(head))

    def __repr__(self) -> str:
        return f"RawFrame(Command.{self.command.name}, {len(self.data)} bytes)"

    @property
    def size(self) -> int:
        """Bytes on the wire, NUL included: :func:`proxy.tracking.window.frame_size` of the
        frame."""
        return len(self.data)

    @property
    def body_length(self) -> int:
        """Bytes of the body, without the NUL."""
        return len(self.data) - self.head_end - 2

    def get(self, name: str, default: str | None = None) -> str | None:
        """The value of the FIRST header called ``name``, or ``default`` (as
        :meth:`Frame.get`; STOMP 1.2 "Repeated Header Entries")."""
        data = self.data
        key = _KEYS[name]
        at = data.find(key, 0, self.head_end)
        if at < 0:
            return default
        start = at + len(key)
        return data[start : data.index(b"\n", start)].decode("ascii")

    def has(self, name: str) -> bool:
        """Whether at least one header is called ``name``."""
        return self.data.find(_KEYS[name], 0, self.head_end) >= 0

    def without(self, name: str) -> RawFrame:
        """A copy without any entry of header ``name`` (as :meth:`Frame.without` with one
        name); ``self`` when there is none."""
        data = self.data
        end = self.head_end
        key = _KEYS[name]
        at = data.find(key, 0, end)
        if at < 0:
            return self
        parts: list[bytes] = []
        start = 0
        removed = 0
        while at >= 0:
            parts.append(data[start : at + 1])  # up to the LF that ends the line before
            line_end = data.index(b"\n", at + 1)
            removed += line_end - at
            start = line_end + 1
            at = data.find(key, line_end, end)
        parts.append(data[start:])
        return RawFrame(self.command, b"".join(parts), end - removed)

    def with_header(self, name: str, value: str) -> RawFrame | Frame:
        """A copy where header ``name`` has exactly one entry, ``value``, placed as
        :meth:`Frame.with_header` places it (where the first entry was, else last).

        Returns a :class:`Frame` (the general path's) when ``name`` or ``value`` is not plain
        (:func:`is_plain`): its bytes would depend on the version's escaping.
        """
        line = f"{name}:{value}\n".encode()
        if ORDINARY_LINES.fullmatch(line) is None:
            return self.to_frame().with_header(name, value)
        data = self.data
        end = self.head_end
        at = data.find(_KEYS[name], 0, end)
        if at < 0:  # the usual case: appended
            return RawFrame(self.command, b"".join((data[:end], line, data[end:])), end + len(line))
        frame = self.without(name)
        data = frame.data
        at += 1  # where the first entry's line started
        return RawFrame(self.command, data[:at] + line + data[at:], frame.head_end + len(line))

    def spliced(self, cut: str | None, add: list[tuple[str, str]]) -> RawFrame | None:
        """A copy without any entry of header ``cut`` (None: none cut) and with the entries
        ``add`` appended, in one copy: ``without(cut)`` then ``with_header`` of each of
        ``add``, when none of them is there already (the caller's to know). None when a name
        or value of ``add`` is not plain (the caller then takes the general path)."""
        lines = "".join([f"{name}:{value}\n" for name, value in add]).encode()
        if ORDINARY_LINES.fullmatch(lines) is None:
            return None
        data = self.data
        end = self.head_end
        if cut is not None:
            key = _KEYS[cut]
            at = data.find(key, 0, end)
            if at >= 0:
                stop = data.index(b"\n", at + 1)
                if data.find(key, stop, end) < 0:  # one entry, the usual case: one copy
                    kept = (data[: at + 1], data[stop + 1 : end], lines, data[end:])
                    return RawFrame(self.command, b"".join(kept), end - stop + at + len(lines))
                frame = self.without(cut)
                data = frame.data
                end = frame.head_end
        return RawFrame(self.command, b"".join((data[:end], lines, data[end:])), end + len(lines))

    def to_frame(self) -> Frame:
        """The :class:`Frame` the general parser reads from :attr:`data` (any version)."""
        data = self.data
        end = self.head_end
        lines = data[: end - 1].decode("ascii").split("\n")
        del lines[0]
        parts = [line.partition(":") for line in lines]
        headers = tuple([(name, value) for name, _, value in parts])
        return trusted_frame(self.command, headers, data[end + 1 : -1])


def copy_out(buf: bytearray, start: int, end: int) -> bytes:
    """``bytes(buf[start:end])`` copying a large span once, not twice (slice, then bytes)."""
    if end - start < _VIEW_BYTES:
        return bytes(buf[start:end])
    with memoryview(buf) as view:
        return bytes(view[start:end])


def frame_end(buf: bytearray, pos: int, body_start: int, length: int, limits: Limits) -> int:
    """Where the NUL of a whole buffered frame (starting at ``pos``, its body at
    ``body_start``) is, or -1 when it is not all buffered, lacks the NUL after ``length``
    (its ``content-length``; -1 for none: the first NUL) or is over ``max_frame_bytes``: the
    whole-frame reads' common test, after which the general path decides."""
    if length >= 0:
        end = body_start + length
        if len(buf) <= end or buf[end] != _NUL:
            return -1
    else:
        end = buf.find(b"\0", body_start, pos + limits.max_frame_bytes + 1)
        if end < 0:
            return -1
    return -1 if end - pos > limits.max_frame_bytes else end


#: The bytes each set of fast-lane commands starts with (``COMMAND LF``), made once per set.
_PREFIXES: dict[frozenset[Command], tuple[bytes, ...]] = {}


def command_prefixes(commands: frozenset[Command]) -> tuple[bytes, ...]:
    """``COMMAND LF`` of each of ``commands``: a frame that starts with none of them is not
    read as a RawFrame, which one ``startswith`` tells before :func:`read_raw` looks further."""
    prefixes = _PREFIXES.get(commands)
    if prefixes is None:
        if len(_PREFIXES) >= 64:  # sets come from the code; bounded all the same
            _PREFIXES.clear()
        prefixes = _PREFIXES[commands] = tuple(c.value.encode() + b"\n" for c in commands)
    return prefixes


def read_raw(
    buf: bytearray, pos: int, limits: Limits, commands: frozenset[Command]
) -> RawFrame | None:
    """The fast lane's read: the frame starting at ``pos`` in ``buf`` (a frame boundary, not a
    heart-beat) as a :class:`RawFrame`, if its command is in ``commands`` and it is all
    buffered and ordinary (module docstring), else None. It ends at ``pos +
    len(frame.data)``; nothing is changed either way (``FrameParser`` then reads the frame the
    general way).

    Within ``limits`` as ``FrameParser``'s whole-frame test: the head within
    ``max_header_line_bytes``, at most ``max_headers`` header lines, the frame within
    ``max_frame_bytes``; a frame near a limit is left to the general path, which decides.
    """
    head_end = buf.find(b"\n\n", pos, pos + limits.max_header_line_bytes + 2)
    if head_end < 0:
        return None
    command_end = buf.find(b"\n", pos, head_end + 1)
    command = _COMMANDS.get(bytes(buf[pos:command_end]))
    if command is None or command not in commands:
        return None
    if (
        ORDINARY_LINES.fullmatch(buf, command_end + 1, head_end + 1) is None
        or buf.count(b"\n", command_end + 1, head_end + 1) > limits.max_headers
    ):
        return None
    body_start = head_end + 2
    at = buf.find(_CONTENT_LENGTH_KEY, command_end, head_end)
    if at >= 0:
        start = at + len(_CONTENT_LENGTH_KEY)
        stop = buf.find(b"\n", start, head_end + 1)
        digits = bytes(buf[start:stop])
        if (
            not digits.isdigit()
            or len(digits) > 12
            or (digits[0] == 0x30 and len(digits) > 1)  # "007": serialize writes "7"
            or buf.find(_CONTENT_LENGTH_KEY, stop, head_end) >= 0  # repeated
        ):
            return None
        end = frame_end(buf, pos, body_start, int(digits), limits)
    else:
        end = frame_end(buf, pos, body_start, -1, limits)
    if end < 0:
        return None
    return RawFrame(command, copy_out(buf, pos, end + 1), head_end + 1 - pos)
