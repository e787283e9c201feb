"""Bytes to events: the incremental STOMP parser (:class:`FrameParser`).

Theory of operation
-------------------
Received bytes go into one ``bytearray``. ``_pos`` is where the unconsumed data starts (a frame
boundary, or the start of the frame being read); every other offset is absolute in the buffer.
Parsing is lazy: ``receive_data`` only appends, ``next_event`` does the work, so a version change
between two ``next_event`` calls applies to everything still buffered.

Reading a frame has three phases:

BETWEEN   at a frame boundary. An LF or a CRLF is a heart-beat, a NUL is skipped; anything
          else starts a frame.
HEAD      one regex search for the blank line that ends the head (``\\n\\r?\\n``), resuming at
          ``_head_scan``. When it is there and the head is ordinary (short, UTF-8, no NUL, every
          line has a ``:``), the head is decoded, split and partitioned by a few C-level calls.
          Otherwise (head incomplete, or anything unusual) the lines are read one at a time
          with ``find(b"\\n")`` resuming at ``_scan``, bounded by the line-length limit, checking
          every limit per line, so limits trip before the frame is complete and errors are precise.
          Both ways read the same thing (a property test feeds every input whole and in pieces).
          Unescaping waits for the end of the frame because it depends on the version.
BODY      with a ``content-length``: wait until that many bytes plus the NUL are buffered (no
          search at all). Without: one ``find(b"\\0")`` resuming at ``_scan``, bounded by the
          frame-size limit.

Every search resumes where the previous one stopped, so each byte is looked at a bounded number
of times whatever the chunking, and parsing is O(bytes received): a whole frame costs one regex
search and at most one ``find``. Consumed bytes are dropped only when the buffer is empty or
when more than half of it (and at least 64 KiB) is consumed, which keeps copying linear too.
The buffer is emptied as soon as ``next_event`` has read all of it (``NEED_DATA`` at a frame
boundary), so an idle connection holds none of its last burst.

Memory of a large frame: its body is copied out of the buffer once (through a ``memoryview``;
``bytes(buf[a:b])`` would copy it twice), and the bytes of a frame of 64 KiB or more are
dropped from the buffer as the frame is returned (same rule as above), so a frame costs about
twice its size while it is parsed and once (its body) after (docs/behaviour.md, "Limits and
bad input").

The whole-frame fast path (``_whole_frame``) reads a frame that is entirely buffered and
ordinary in a few C-level calls; anything else (incomplete, unusual, wrong) goes through the
phases above, which decide.
"""

from __future__ import annotations

import re

from ._errors import (
    LocalProtocolError,
    RemoteProtocolError,
    UnknownCommand,
    frame_too_large,
    line_too_long,
    remote_error,
    shown,
    unknown_command,
)
from ._events import CONNECTION_CLOSED, HEARTBEAT, NEED_DATA, Event
from ._frame import NEVER_ESCAPED, Command, Frame, trusted_frame
from ._headers import unescaped_headers
from ._limits import Limits
from ._raw import RawFrame, command_prefixes, copy_out, frame_end, read_raw
from ._versions import check_version

# Everything in `__all__` gets re-exported as part of the public API of `protocol`.
__all__ = ["FrameParser"]

_COMMANDS_BY_TEXT = {command.value: command for command in Command}
_COMMANDS_BY_BYTES = {command.value.encode("ascii"): command for command in Command}
#: No command is read as a :class:`RawFrame` (``next_event``'s default).
NO_RAW: frozenset[Command] = frozenset()
#: The end of a frame's head: the LF of the last line, then an empty line (LF or CRLF).
_HEAD_END = re.compile(rb"\n\r?\n")
_LF = 10
_CR = 13
_NUL = 0
# Phases of the parser.
_BETWEEN = 0
_HEAD = 1
_BODY = 2
# Don't move buffered bytes for less than this much consumed data.
_COMPACT_BYTES = 64 * 1024


class FrameParser:
    """Incremental STOMP parser: bytes in (:meth:`receive_data`), events out (:meth:`next_event`).

    Args:
        limits: size bounds (:class:`Limits`).
        version: the STOMP version whose header escaping applies (``"1.0"`` until negotiated).

    Rules (STOMP 1.2 "STOMP Frames", "Value Encoding", "Heart-beating", "Size Limits"):

    * Each LF or CRLF between frames (also right after a frame's NUL) is one ``HEARTBEAT``.
    * A NUL between frames is skipped: not in STOMP 1.2's grammar, but ActiveMQ 5.17 and
      RabbitMQ 3.10 skip it (measured, tests/differential: test_stray_nul_before_a_command).
    * Command and header lines end in LF; one trailing CR is stripped in every version.
    * Headers are split on the first ``:`` and decoded as UTF-8; they are unescaped per
      ``version``, except in CONNECT, STOMP and CONNECTED frames.
    * With a ``content-length`` header (the first one counts; a non-negative decimal integer),
      exactly that many body bytes are read, NUL bytes included, and a NUL must follow them.
      Without one the body ends at the first NUL.
    * Frames are O(bytes received) to parse for any chunking.

    After a :class:`RemoteProtocolError` the parser stays broken: every later :meth:`next_event`
    raises the same error again, and received data is discarded. But an unknown command's frame
    is read whole within the limits and consumed (:class:`UnknownCommand`): reading goes on.
    """

    __slots__ = (
        "_body_start",
        "_buf",
        "_command",
        "_content_length",
        "_discarding",
        "_eof",
        "_error",
        "_escapes",
        "_frame_start",
        "_head_scan",
        "_limits",
        "_line_start",
        "_phase",
        "_pos",
        "_raw_headers",
        "_scan",
        "_unknown",
        "_version",
    )

    def __init__(self, limits: Limits = Limits(), *, version: str = "1.0") -> None:  # noqa: B008
        self._limits = limits
        self._version = check_version(version)
        self._buf = bytearray()
        self._pos = 0
        self._scan = 0
        self._phase = _BETWEEN
        self._frame_start = 0
        self._head_scan = 0
        self._line_start = 0
        self._body_start = 0
        self._command: Command | None = None
        self._unknown: bytes | None = None  # the command line of an unknown command's frame
        self._raw_headers: list[tuple[str, str]] = []
        self._escapes = False  # a backslash was seen in this frame's headers
        self._content_length = -1
        self._eof = False
        self._discarding = False
        self._error: RemoteProtocolError | None = None

    @property
    def version(self) -> str:
        """The STOMP version used to unescape headers of frames not returned yet.

        Raises:
            ValueError: (on assignment) a version not in :data:`VERSIONS`.
        """
        return self._version

    @version.setter
    def version(self, value: str) -> None:
        self._version = check_version(value)

    def receive_data(self, data: bytes) -> None:
        """Buffer bytes read from the peer; ``b""`` means the peer closed its side (EOF).

        Raises:
            LocalProtocolError: non-empty ``data`` after EOF.
        """
        if self._error is not None:
            return
        if not data:
            self._eof = True
            return
        if self._eof:
            raise LocalProtocolError("received data after EOF")
        if self._discarding:
            return
        pos = self._pos
        buf = self._buf
        if pos:
            if pos == len(buf):
                buf.clear()
                self._shift(pos)
            elif pos >= _COMPACT_BYTES and 2 * pos >= len(buf):
                del buf[:pos]
                self._shift(pos)
        buf += data

    def frame_in_progress(self) -> tuple[int, int]:
        """Bytes the frame being read holds now and will hold: ``(buffered, total)``.

        ``buffered``: bytes received and not yet returned as events (0 between frames with
        nothing buffered). ``total``: the whole frame's size once its head is read and it
        has a ``content-length``, else -1 (head incomplete, or a body that ends at its NUL).
        For a reader that budgets memory before it reads on; never does work.
        """
        buffered = len(self._buf) - self._pos
        if self._phase == _BODY and self._content_length >= 0:
            return buffered, self._body_start + self._content_length + 1 - self._frame_start
        return buffered, -1

    def discard_rest(self) -> None:
        """Read nothing more: drop what is buffered and every byte received from now on;
        only EOF still counts (``next_event`` returns ``NEED_DATA``, then
        ``CONNECTION_CLOSED``). For a server after the client's DISCONNECT: ActiveMQ 5.17 and
        RabbitMQ 3.10 close the connection after it and never read what follows (measured:
        a second DISCONNECT gets no answer). Call it between frames."""
        self._discarding = True
        self._buf.clear()
        self._shift(self._pos)

    def _shift(self, by: int) -> None:
        self._pos -= by
        self._scan -= by
        self._frame_start -= by
        self._head_scan -= by
        self._line_start -= by
        self._body_start -= by

    def next_event(self) -> Event:
        """Parse and return the next event: a :class:`Frame`, ``HEARTBEAT``, ``NEED_DATA`` or
        ``CONNECTION_CLOSED`` (EOF at a frame boundary; returned again on later calls).

        Raises:
            RemoteProtocolError: malformed input, a limit exceeded (as soon as it is known), or
                EOF inside a frame. Its ``error_frame`` says what was wrong.
        """
        event = self.next_fast_event(NO_RAW)
        assert not isinstance(event, RawFrame)
        return event

    def next_fast_event(self, raw: frozenset[Command]) -> Event | RawFrame:
        """:meth:`next_event`, with the frames of the commands in ``raw`` as a
        :class:`RawFrame` (their bytes) when they are ordinary (``protocol._raw``); any other
        frame of them comes as a :class:`Frame`, read the general way.

        Raises:
            RemoteProtocolError: as :meth:`next_event`.
        """
        if self._error is not None:
            raise RemoteProtocolError(str(self._error), error_frame=self._error.error_frame)
        try:
            return self._next_event(raw)
        except UnknownCommand:
            raise  # the frame is consumed: reading goes on after it
        except RemoteProtocolError as exc:
            self._break(exc)
            raise

    def _break(self, exc: RemoteProtocolError) -> None:
        """Stay broken with ``exc``: drop what is buffered, discard what arrives later.

        Also called by :class:`Connection` when a frame the parser accepted breaks a
        connection-level rule, so a broken connection never buffers again (bounded memory for
        a peer that keeps sending after its error).
        """
        self._error = exc
        self._buf = bytearray()
        self._raw_headers = []

    def _next_event(self, raw: frozenset[Command]) -> Event | RawFrame:
        buf = self._buf
        if self._phase == _BETWEEN:
            pos = self._pos
            size = len(buf)
            while pos < size and buf[pos] == _NUL:
                pos += 1  # a stray NUL between frames is skipped, as brokers do
            self._pos = pos
            if pos >= size:
                if pos:
                    # Everything buffered was read: release it now, not at the next
                    # receive_data (a connection waiting for its peer holds no burst).
                    buf.clear()
                    self._shift(pos)
                return CONNECTION_CLOSED if self._eof else NEED_DATA
            first = buf[pos]
            if first == _LF:
                self._pos = pos + 1
                return HEARTBEAT
            if first == _CR:
                if pos + 1 >= size:
                    self._check_eof()
                    return NEED_DATA
                if buf[pos + 1] == _LF:
                    self._pos = pos + 2
                    return HEARTBEAT
            if raw and buf.startswith(command_prefixes(raw), pos):
                raw_frame = read_raw(buf, pos, self._limits, raw)
                if raw_frame is not None:
                    end = pos + len(raw_frame.data)
                    self._pos = end
                    if end - pos > _COMPACT_BYTES:
                        self._release(buf)
                    return raw_frame
            frame = self._whole_frame(buf, pos)
            if frame is not None:
                return frame
            self._phase = _HEAD
            self._frame_start = self._line_start = self._scan = self._head_scan = pos
            self._command = None
            self._unknown = None
            self._raw_headers = []
            self._escapes = False
        if self._phase == _HEAD and not self._read_head(buf):
            return NEED_DATA
        return self._read_body(buf)

    def _whole_frame(self, buf: bytearray, pos: int) -> Frame | None:
        """Fast path: the frame starting at ``pos`` if it is all buffered and ordinary.

        Ordinary: the head ends at the first LF LF within ``max_header_line_bytes``, is
        UTF-8 without CR or NUL, has a known command, a ``:`` on every header line, no more
        than ``max_headers`` lines and a valid ``content-length`` if any; the body's end is
        buffered and the frame is within ``max_frame_bytes``. Then the frame costs a few
        C-level calls and no parser state changes. Otherwise it returns None having changed
        nothing, and the careful phase-by-phase path reads the same bytes and decides (waits
        for more, or raises the precise error), so both paths always agree. An undefined
        escape sequence raises here, as it would at the end of the careful path.
        """
        limits = self._limits
        head_end = buf.find(b"\n\n", pos, pos + limits.max_header_line_bytes + 2)
        if head_end < 0:
            return None
        try:
            text = buf[pos:head_end].decode("utf-8")
        except UnicodeDecodeError:
            return None
        if "\r" in text or "\0" in text:
            return None
        lines = text.split("\n")
        command = _COMMANDS_BY_TEXT.get(lines[0])
        if command is None or len(lines) > limits.max_headers + 1:
            return None
        del lines[0]
        parts = [line.partition(":") for line in lines]
        headers = tuple([(name, value) for name, colon, value in parts if colon])
        if len(headers) != len(parts):
            return None
        body_start = head_end + 2
        length = -1
        if "content-length:" in text:
            for name, value in headers:
                if name == "content-length":
                    if not (value.isascii() and value.isdigit()) or len(value) > 12:
                        return None
                    length = int(value)
                    break
        end = frame_end(buf, pos, body_start, length, limits)
        if end < 0:
            return None
        if "\\" in text and self._version != "1.0" and command not in NEVER_ESCAPED:
            headers = unescaped_headers(headers, self._version)
        frame = trusted_frame(command, headers, copy_out(buf, body_start, end))
        self._pos = end + 1
        if end - pos >= _COMPACT_BYTES:
            self._release(buf)
        return frame

    def _check_eof(self) -> None:
        if self._eof:
            raise remote_error(
                "connection closed in the middle of a frame",
                "The peer closed the connection before sending the NUL that ends the frame.",
            )

    def _read_head(self, buf: bytearray) -> bool:
        """Read the command and header lines; True once the blank line ending them was read."""
        max_frame = self._limits.max_frame_bytes
        frame_start = self._frame_start
        line_start = self._line_start
        search_from = line_start - 1 if line_start > frame_start else line_start
        search_from = max(search_from, self._head_scan)
        match = _HEAD_END.search(buf, search_from, frame_start + max_frame + 1)
        if match is None:
            self._head_scan = max(search_from, len(buf) - 2)  # a match may straddle chunks
        if not (
            match is not None and self._read_whole_head(buf, line_start, match.start(), match.end())
        ) and not self._read_lines(buf):
            return False
        self._content_length = self._find_content_length()
        if self._content_length >= 0 and (
            self._body_start + self._content_length - frame_start > max_frame
        ):
            raise frame_too_large(self._limits.max_frame_bytes)
        self._phase = _BODY
        self._scan = self._body_start
        return True

    def _read_whole_head(self, buf: bytearray, start: int, lf: int, body_start: int) -> bool:
        """Fast path: the lines in ``buf[start:lf]`` are all that is left of the head.

        Parses them with a few C-level calls when nothing is unusual; returns False without
        changing any state otherwise (a long head, bad UTF-8, a NUL, a line without ``:``, an
        unknown command, too many headers), and :meth:`_read_lines` then reads the same bytes line
        by line and raises the precise error, so both paths always agree.
        """
        limits = self._limits
        if lf - start > limits.max_header_line_bytes:
            return False  # some line might be too long: let the careful path look
        if body_start - self._frame_start > limits.max_frame_bytes:
            return False
        if lf < start:
            lines: list[str] = []  # the blank line follows a line that was already read
            escapes = False
        else:
            try:
                text = buf[start:lf].decode("utf-8")
            except UnicodeDecodeError:
                return False
            if "\0" in text:
                return False
            lines = text.split("\n")
            escapes = "\\" in text
            if "\r" in text:
                lines = [line[:-1] if line.endswith("\r") else line for line in lines]
        command = self._command
        if command is None:
            if self._unknown is not None:
                return False  # the careful path reads the rest of an unknown frame
            command = _COMMANDS_BY_TEXT.get(lines[0])
            if command is None:
                return False
            del lines[0]
        headers = self._raw_headers
        if len(headers) + len(lines) > limits.max_headers:
            return False
        parts = [line.partition(":") for line in lines]
        if not all(colon for _, colon, _ in parts):
            return False
        headers += [(name, value) for name, _, value in parts]
        if escapes:
            self._escapes = True
        self._command = command
        self._line_start = self._scan = self._body_start = body_start
        return True

    def _read_lines(self, buf: bytearray) -> bool:
        """Consume complete command/header lines one by one; True once the blank line was read.

        Checks every limit on each line, and on the incomplete last line, as soon as possible.
        """
        limits = self._limits
        max_line = limits.max_header_line_bytes
        max_frame = limits.max_frame_bytes
        frame_start = self._frame_start
        while True:
            line_start = self._line_start
            size = len(buf)
            if line_start < size and buf[line_start] == _NUL:
                raise remote_error(
                    "unexpected NUL byte where a command or header line should start",
                    "Every frame needs a blank line between its headers and its body, even "
                    "when the body is empty (STOMP 1.2 'STOMP Frames').",
                )
            lf = buf.find(b"\n", self._scan, line_start + max_line + 2)
            if lf < 0:
                pending = size - line_start
                if size and buf[size - 1] == _CR:
                    pending -= 1  # may be the CR of a CRLF
                if pending > max_line:
                    raise line_too_long(self._limits.max_header_line_bytes)
                if size - frame_start > max_frame:
                    raise frame_too_large(self._limits.max_frame_bytes)
                self._check_eof()
                self._scan = size
                return False
            end = lf - 1 if lf > line_start and buf[lf - 1] == _CR else lf
            if end - line_start > max_line:
                raise line_too_long(self._limits.max_header_line_bytes)
            if lf + 1 - frame_start > max_frame:
                raise frame_too_large(self._limits.max_frame_bytes)
            self._line_start = self._scan = lf + 1
            if self._command is None and self._unknown is None:
                raw = bytes(buf[line_start:end])
                command = _COMMANDS_BY_BYTES.get(raw)
                if command is None:
                    self._unknown = raw  # read on to the frame's end (UnknownCommand)
                else:
                    self._command = command
            elif end == line_start:
                self._body_start = lf + 1
                return True
            else:
                self._add_header_line(buf, line_start, end)

    def _add_header_line(self, buf: bytearray, start: int, end: int) -> None:
        headers = self._raw_headers
        max_headers = self._limits.max_headers
        if len(headers) >= max_headers:
            raise remote_error(
                f"too many headers (more than {max_headers})",
                f"This server accepts at most {max_headers} header entries per frame.",
            )
        try:
            line = buf[start:end].decode("utf-8")
        except UnicodeDecodeError:
            raise remote_error(
                "header line is not valid UTF-8",
                f"STOMP headers are UTF-8 text (STOMP 1.2 'Value Encoding'); the line read "
                f"'{shown(buf[start:end])}'.",
            ) from None
        name, colon, value = line.partition(":")
        if not colon:
            raise remote_error(
                f"header line without ':': '{shown(buf[start:end])}'",
                "Each header line is 'name:value' (STOMP 1.2 'STOMP Frames').",
            )
        headers.append((name, value))
        if "\\" in line:
            self._escapes = True

    def _find_content_length(self) -> int:
        for name, value in self._raw_headers:
            if name == "content-length":
                if not (value.isascii() and value.isdigit()):
                    raise remote_error(
                        f"invalid content-length header '{value[:40]}'",
                        "content-length must be a non-negative decimal integer "
                        "(STOMP 1.2 'Header content-length').",
                    )
                digits = value.lstrip("0")
                if len(digits) > len(str(self._limits.max_frame_bytes)):
                    # Longer than any frame we accept; and int() refuses more than 4300
                    # digits (ValueError, sys.get_int_max_str_digits), so never convert it.
                    raise frame_too_large(self._limits.max_frame_bytes)
                return int(digits or "0")
        return -1

    def _read_body(self, buf: bytearray) -> Event:
        body_start = self._body_start
        length = self._content_length
        if length >= 0:
            end = body_start + length
            if len(buf) <= end:
                self._check_eof()
                return NEED_DATA
            if buf[end] != _NUL:
                raise remote_error(
                    f"frame not terminated by NUL after content-length {length} bytes",
                    "When a frame has a content-length header, exactly that many body bytes "
                    "must be followed by a NUL byte (STOMP 1.2 'Header content-length').",
                )
        else:
            limit = self._frame_start + self._limits.max_frame_bytes + 1
            end = buf.find(b"\0", self._scan, limit)
            if end < 0:
                size = len(buf)
                if size >= limit:
                    raise frame_too_large(self._limits.max_frame_bytes)
                self._check_eof()
                self._scan = size
                return NEED_DATA
        if self._unknown is not None:
            raise self._unknown_frame(buf, end)
        body = copy_out(buf, body_start, end)
        command = self._command
        assert command is not None
        frame = trusted_frame(command, self._unescape_headers(command), body)
        self._past_frame(buf, end)
        return frame

    def _past_frame(self, buf: bytearray, end: int) -> None:
        """The frame whose NUL is at ``end`` is read: the parser is between frames again."""
        self._pos = end + 1
        self._phase = _BETWEEN
        self._raw_headers = []
        self._command = None
        self._unknown = None
        if end - self._frame_start >= _COMPACT_BYTES:
            self._release(buf)

    def _unknown_frame(self, buf: bytearray, end: int) -> UnknownCommand:
        """The :class:`UnknownCommand` of the frame whose NUL is at ``end``, consumed."""
        raw = self._unknown
        assert raw is not None
        receipt = next((v for k, v in self._raw_headers if k == "receipt"), None)
        data = bytes(buf[self._frame_start : end + 1])
        self._past_frame(buf, end)
        return unknown_command(raw, data, receipt)

    def _release(self, buf: bytearray) -> None:
        """After a large frame: drop the consumed bytes now if they are most of the buffer
        (the rule of :meth:`receive_data`), so its bytes are not held next to its body."""
        pos = self._pos
        if 2 * pos >= len(buf):
            if pos == len(buf):
                buf.clear()
            else:
                del buf[:pos]
            self._shift(pos)

    def _unescape_headers(self, command: Command) -> tuple[tuple[str, str], ...]:
        raw = self._raw_headers
        version = self._version
        if not self._escapes or version == "1.0" or command in NEVER_ESCAPED:
            return tuple(raw)
        return unescaped_headers(raw, version)
