"""The stream read's STOMP 1.2 connection to the sidecar: read on the caller's own thread, with
no receiver thread and no stomp.py (:mod:`mq_sidecar_spark._stream_io` opens one per task and
one per probe of a position).

Why not :class:`~mq_sidecar_spark._link.Link`: a task reads a range as fast as the sidecar
relays it, and with stomp.py every MESSAGE cost the task's process about 31 us of CPU, measured
(``python -m bench.spark_stream``, cProfile and py-spy): stomp.py's parse (a regular expression
substitution per header, about 20 us), the handoff from its receiver thread to the task's (a
queue and a wake-up per MESSAGE, the two threads taking turns on the GIL), and the task's own
work. The parse here splits each frame with ``bytes.find`` and ``str.partition`` on the
MESSAGEs of one ``recv`` at a time, on the thread that uses them.

What it speaks is what a stream read needs, STOMP 1.2 ("Frames and Headers", "Value Encoding",
"Repeated Header Entries"): CONNECT/CONNECTED (``heart-beat:0,0``, so no heart-beats either way);
SUBSCRIBE and DISCONNECT with a RECEIPT waited for; MESSAGEs, with or without
``content-length``, header values unescaped (``\\r``, ``\\n``, ``\\c``, ``\\\\``; any other
escape is a malformed frame), the first entry of a repeated header kept; ACK; ERROR. A line may
end in ``\\r\\n``; EOLs between frames are skipped.

Every wait is bounded by ``timeout`` (the socket's timeout, set per wait: a ``recv`` with nothing
to read, a ``sendall`` the sidecar does not read, the CONNECTED, a RECEIPT) or by the caller's
``wait``. A frame that is not complete after :data:`MAX_FRAME` bytes ends the connection. Raises
the errors of :mod:`mq_sidecar_spark.errors` with :class:`~mq_sidecar_spark._link.Link`'s texts.
"""

from __future__ import annotations

import collections
import contextlib
import socket
import time

from ._link import Delivery, error_frame, refused, write_blocked, write_failed
from ._stream_options import StreamOptions
from .errors import StompConnectError, StompConnectionLost, StompErrorFrame, StompTimeout

__all__ = ["MAX_FRAME", "StreamLink"]

#: Bytes one frame may take at most before it is complete (the sidecar's own limit,
#: ``max_frame_bytes``, is far below: 10 MiB by default).
MAX_FRAME = 64 << 20
#: Bytes asked of the socket per ``recv``: a few hundred MESSAGEs of 100 bytes.
RECV_BYTES = 1 << 18
#: Seconds the DISCONNECT's RECEIPT is waited for at most (never longer than ``timeout``).
DISCONNECT_WAIT = 5.0
#: Seconds an ERROR frame may trail a failed socket write (the sidecar writes its ERROR, then
#: closes; the write may see the close first).
ERROR_GRACE = 2.0
#: The receipt id of the DISCONNECT.
_BYE = "mq-sidecar-spark-disconnect"
#: STOMP 1.2 "Value Encoding": the escapes of a header, and what each stands for.
_ESCAPES = {"r": "\r", "n": "\n", "c": ":", "\\": "\\"}
#: A frame as parsed: its command, headers (the first entry of each name) and body.
Frame = tuple[str, dict[str, str], bytes]


class MalformedFrame(StompConnectionLost):
    """The sidecar sent bytes that are no STOMP 1.2 frame (the connection is closed)."""


def _unescape(text: str) -> str:
    """``text`` with STOMP 1.2's header escapes decoded; raises :class:`MalformedFrame` on an
    escape the spec does not define."""
    parts = text.split("\\")
    out = [parts[0]]
    at = 1
    while at < len(parts):
        part = parts[at]
        if part == "" and at + 1 < len(parts):  # "\\\\": a backslash; the next part is literal
            out.append("\\" + parts[at + 1])
            at += 2
            continue
        if not part or part[0] not in _ESCAPES:
            raise MalformedFrame(f"undefined escape in the header {text!r} (STOMP 1.2)")
        out.append(_ESCAPES[part[0]] + part[1:])
        at += 1
    return "".join(out)


def _escape(text: str) -> str:
    """``text`` with STOMP 1.2's header escapes applied (for frames other than CONNECT)."""
    if "\\" in text:
        text = text.replace("\\", "\\\\")
    return text.replace("\r", "\\r").replace("\n", "\\n").replace(":", "\\c")


def parse_frames(buffer: bytes, messages: collections.deque[Delivery], others: list[Frame]) -> int:
    """Parse the complete frames at the start of ``buffer``: MESSAGEs go to ``messages`` (their
    headers and body), other frames to ``others``, in order. Returns how many bytes they took
    (the rest is the start of a frame not complete yet). Raises :class:`MalformedFrame` (not
    UTF-8, a header line without ``:``, a bad escape, a ``content-length`` that is not a number
    or whose body no NUL follows)."""
    end = len(buffer)
    find = buffer.find
    crlf = b"\r" in buffer  # else the fast path: every line ends in LF
    pos = 0
    for _ in range(end):  # every round takes a frame, or ends
        while pos < end and buffer[pos] in (10, 13):  # EOLs between frames (heart-beats)
            pos += 1
        if pos >= end:
            return pos
        if crlf:
            head_end, body_start = _blank_line(buffer, pos)
        else:
            head_end = find(b"\n\n", pos)
            body_start = head_end + 2
        if head_end < 0:
            return pos
        try:
            lines = buffer[pos:head_end].decode("utf-8").split("\n")
        except UnicodeDecodeError as exc:
            raise MalformedFrame(f"a frame whose headers are not UTF-8: {exc}") from None
        command = lines[0].rstrip("\r")
        headers: dict[str, str] = {}
        raw = command in ("CONNECTED", "CONNECT")  # STOMP 1.2: these escape nothing
        for entry in lines[1:]:
            line = entry[:-1] if crlf and entry.endswith("\r") else entry
            name, colon, value = line.partition(":")
            if not colon:
                raise MalformedFrame(f"a header line without ':' in a {command} frame: {line!r}")
            if "\\" in line and not raw:
                name, value = _unescape(name), _unescape(value)
            if name not in headers:
                headers[name] = value
        length = headers.get("content-length")
        if length is not None:
            if not length.isdigit():
                raise MalformedFrame(f"content-length {length!r} in a {command} frame")
            body_end = body_start + int(length)
            if body_end >= end:
                return pos
            if buffer[body_end] != 0:
                raise MalformedFrame(f"no NUL after the {length} bytes of a {command} frame")
        else:
            body_end = find(b"\x00", body_start)
            if body_end < 0:
                return pos
        if command == "MESSAGE":
            messages.append((headers, buffer[body_start:body_end]))
        else:
            others.append((command, headers, buffer[body_start:body_end]))
        pos = body_end + 1
    return pos


def _blank_line(buffer: bytes, pos: int) -> tuple[int, int]:
    """For the frame at ``pos`` (not at an EOL), lines ending in LF or CRLF: where its header
    lines end (before the last one's LF) and where its body starts (after the blank line);
    (-1, -1) while the blank line has not arrived."""
    find = buffer.find
    at = pos
    for _ in range(len(buffer)):  # every round passes one line
        eol = find(b"\n", at)
        if eol < 0:
            return -1, -1
        if at > pos and (eol == at or (eol == at + 1 and buffer[at] == 13)):
            return at - 1, eol + 1
        at = eol + 1
    return -1, -1


class StreamLink:
    """A STOMP connection to the sidecar at the ``options``' ``host:port``, read on the caller's
    thread (module docstring); it CONNECTs with their ``login``, ``passcode`` and ``vhost`` (the
    ``host`` header; ``host`` when None) and bounds every wait by their ``timeout``.

    The methods :class:`~mq_sidecar_spark._link.Link` has for a reader, with its errors:
    :meth:`start`, :meth:`connect`, :meth:`subscribe`, :meth:`take_wait`, :meth:`ack`,
    :meth:`close`. Not thread-safe: one thread uses it.
    """

    def __init__(self, options: StreamOptions) -> None:
        self.address = f"{options.host}:{options.port}"
        self.options = options
        self.timeout = options.timeout
        self._sock: socket.socket | None = None
        self._buffer = b""
        self._messages: collections.deque[Delivery] = collections.deque()
        self._receipts: set[str] = set()
        self._error: StompErrorFrame | None = None
        self._connected = False
        self._closed = False  # the peer closed the connection, or a read or write failed

    # -- reading ---------------------------------------------------------------------------

    def _fill(self, deadline: float) -> bool:
        """Read what the socket has (waiting until ``deadline`` for it) and parse it; False
        when nothing came by then. Marks the connection closed when the peer closed it or the
        read failed (then True: something happened). Raises :class:`MalformedFrame`."""
        sock = self._sock
        if sock is None or self._closed:
            return True
        sock.settimeout(max(deadline - time.monotonic(), 0.0))
        try:
            chunk = sock.recv(RECV_BYTES)
        except (TimeoutError, BlockingIOError):
            return False
        except OSError:
            chunk = b""
        if not chunk:
            self._closed = True
            return True
        buffer = self._buffer + chunk if self._buffer else chunk
        others: list[Frame] = []
        try:
            used = parse_frames(buffer, self._messages, others)
        except MalformedFrame as exc:
            self._closed = True
            raise MalformedFrame(f"the sidecar at {self.address} sent {exc}") from None
        self._buffer = buffer[used:]
        for command, headers, body in others:
            if command == "RECEIPT":
                self._receipts.add(headers.get("receipt-id", ""))
            elif command == "CONNECTED":
                self._connected = True
            elif command == "ERROR" and self._error is None:
                self._error = error_frame(self.address, headers.get("message"), body)
        if len(self._buffer) > MAX_FRAME:
            self._closed = True
            raise MalformedFrame(
                f"a frame from the sidecar at {self.address} is not complete after "
                f"{MAX_FRAME} bytes"
            )
        return True

    def _wait_for(self, receipt: str | None, what: str) -> None:
        """Read until the RECEIPT ``receipt`` (None: the CONNECTED) arrived, at most ``timeout``
        s; MESSAGEs read meanwhile stay for :meth:`take_wait`. Raises the ERROR,
        :class:`StompConnectionLost` (closed first), :class:`StompTimeout`."""
        deadline = time.monotonic() + self.timeout
        for _ in range(1_000_000):  # every round reads, or ends
            if self._connected if receipt is None else receipt in self._receipts:
                return
            if self._error is not None:
                raise self._error
            if self._closed:
                break
            if time.monotonic() >= deadline or not self._fill(deadline):
                raise StompTimeout(
                    f"no receipt from the sidecar at {self.address} within {self.timeout:g} s "
                    f"{what} (1 outstanding; option timeout)"
                )
        raise StompConnectionLost(
            f"the sidecar at {self.address} closed the connection {what} "
            "(1 receipt(s) outstanding, no ERROR)"
        )

    # -- writing ---------------------------------------------------------------------------

    def _send(self, command: str, headers: dict[str, str], what: str) -> None:
        """Write one frame (no body) within ``timeout`` s. Raises :class:`StompTimeout` (the
        sidecar stopped reading), the ERROR that came instead (waited for up to
        :data:`ERROR_GRACE` s), :class:`StompConnectionLost`."""
        sock = self._sock
        if sock is None or self._closed:
            if self._error is not None:
                raise self._error
            raise StompConnectionLost(
                f"the connection to the sidecar at {self.address} was lost before {what}"
            )
        raw = command == "CONNECT"
        lines = [command]
        lines += [f"{k}:{v}" if raw else f"{_escape(k)}:{_escape(v)}" for k, v in headers.items()]
        data = ("\n".join(lines) + "\n\n").encode("utf-8") + b"\x00"
        sock.settimeout(self.timeout)
        try:
            sock.sendall(data)
        except TimeoutError as exc:
            self._closed = True
            raise write_blocked(self.address, what, self.timeout) from exc
        except OSError as exc:
            grace = time.monotonic() + min(ERROR_GRACE, self.timeout)
            for _ in range(100):  # reads until the ERROR, the close, or the grace's end
                if self._error is not None or self._closed or not self._fill(grace):
                    break
            self._closed = True
            if self._error is not None:
                raise self._error from exc
            raise write_failed(self.address, what, exc) from exc

    # -- the owner's side ------------------------------------------------------------------

    def start(self) -> None:
        """Open the TCP connection (at most ``timeout`` s). Raises :class:`StompConnectError`
        when nothing listens at host:port (with the socket error)."""
        try:
            address = (self.options.host, self.options.port)
            sock = socket.create_connection(address, timeout=self.timeout)
        except OSError as exc:
            raise refused(self.address, exc.strerror or str(exc)) from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock = sock

    def connect(self) -> None:
        """Send CONNECT and wait for CONNECTED (at most ``timeout`` s), after :meth:`start`.
        Raises :class:`StompConnectError` (no CONNECTED in time; closed before it),
        :class:`StompErrorFrame` (the CONNECT refused)."""
        options = self.options
        headers = {
            "accept-version": "1.2",
            "host": options.vhost if options.vhost is not None else options.host,
            "heart-beat": "0,0",
        }
        if options.login is not None:
            headers["login"] = options.login
        if options.passcode is not None:
            headers["passcode"] = options.passcode
        self._send("CONNECT", headers, "CONNECT")
        try:
            self._wait_for(None, "after the CONNECT")
        except StompConnectionLost:
            raise StompConnectError(
                f"the sidecar at {self.address} closed the connection before CONNECTED"
            ) from None
        except StompTimeout:
            raise StompConnectError(
                f"no CONNECTED from {self.address} within {self.timeout:g} s (option timeout)"
            ) from None

    def subscribe(self, destination: str, ident: str, headers: dict[str, str], *, ack: str) -> None:
        """SUBSCRIBE to ``destination`` (``id`` ``ident``, ``ack`` mode, plus ``headers``) and
        wait for its RECEIPT (at most ``timeout`` s). Raises :class:`StompErrorFrame` (refused),
        :class:`StompConnectionLost`, :class:`StompTimeout`."""
        receipt = f"{ident}-sub"
        frame = {"destination": destination, "id": ident, "ack": ack, **headers}
        self._send("SUBSCRIBE", {**frame, "receipt": receipt}, "the SUBSCRIBE")
        self._wait_for(receipt, f"after the SUBSCRIBE to {destination}")

    def take_wait(self, limit: int, wait: float) -> list[Delivery]:
        """Up to ``limit`` MESSAGEs, oldest first: waits at most ``wait`` seconds for the first
        one (none came: ``[]``), then takes what else was read with it. Raises the sidecar's
        :class:`StompErrorFrame`, or :class:`StompConnectionLost` (closed, or a malformed
        frame), once the MESSAGEs before it are taken."""
        if limit < 1:
            return []
        deadline = time.monotonic() + max(wait, 0.0)
        messages = self._messages
        for _ in range(1_000_000):  # every round reads, or ends
            if messages:
                if len(messages) <= limit:
                    taken = list(messages)
                    messages.clear()
                    return taken
                return [messages.popleft() for _ in range(limit)]
            if self._error is not None:
                raise self._error
            if self._closed:
                raise StompConnectionLost(
                    f"the connection to the sidecar at {self.address} was lost"
                )
            if not self._fill(deadline):
                return []
            pending = self._error is not None or self._closed
            if not messages and not pending and time.monotonic() >= deadline:
                return []  # a frame under way, not complete by the deadline: the next take
        return []

    def ack(self, ack_id: str) -> None:
        """ACK ``ack_id`` (``ack:client``: every earlier MESSAGE of the subscription too), the
        write bounded by ``timeout``. Raises what :meth:`_send` raises."""
        self._send("ACK", {"id": ack_id}, "an ACK")

    def close(self, *, graceful: bool = True) -> None:
        """With ``graceful``, DISCONNECT and wait for its RECEIPT (at most ``timeout`` and
        :data:`DISCONNECT_WAIT` s, MESSAGEs read meanwhile dropped); then close the socket.
        Never raises (the outcome is decided before)."""
        sock = self._sock
        if sock is None:
            return
        if graceful and self._connected and not self._closed and self._error is None:
            with contextlib.suppress(Exception):
                self._send("DISCONNECT", {"receipt": _BYE}, "the DISCONNECT")
                deadline = time.monotonic() + min(self.timeout, DISCONNECT_WAIT)
                for _ in range(100_000):  # every round reads, or ends
                    self._messages.clear()
                    if _BYE in self._receipts or self._closed or time.monotonic() >= deadline:
                        break
                    if not self._fill(deadline):
                        break
        self._sock = None
        self._closed = True
        with contextlib.suppress(OSError):
            sock.close()
