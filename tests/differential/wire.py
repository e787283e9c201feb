"""Raw STOMP bytes for the differential harness, independent of the product's ``protocol``.

The client side must control the exact framing (EOL variants, content-length, repeated
headers, escaping, malformed input), and the frames it receives must be seen as they were on
the wire (repeated headers kept, values left escaped), so neither direction goes through the
sidecar's own codec: a bug there must not hide itself in the harness.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MAX_FRAME", "WireFrame", "WireParser", "encode"]

#: The largest frame the parser accepts (a scenario's largest body is 16 MiB).
MAX_FRAME = 64 << 20

Headers = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class WireFrame:
    """A frame as received: command, header lines in order (``name``, raw ``value``), body.

    A header line without a colon is kept as (line, "") with ``malformed`` set.
    """

    command: str
    headers: Headers
    body: bytes
    malformed: bool = False

    def get(self, name: str) -> str | None:
        """The first value of header ``name`` (STOMP: the first occurrence wins)."""
        for key, value in self.headers:
            if key == name:
                return value
        return None


def encode(
    command: str,
    headers: Headers | list[tuple[str, str]] = (),
    body: bytes = b"",
    *,
    eol: bytes = b"\n",
    content_length: bool = False,
) -> bytes:
    """One frame, byte for byte: ``headers`` go out as given (no escaping, repeats kept);
    ``content_length`` appends a correct ``content-length`` header; ``eol`` is ``\\n`` or
    ``\\r\\n`` for every line."""
    lines = [command.encode()]
    lines += [f"{k}:{v}".encode() for k, v in headers]
    if content_length:
        lines.append(f"content-length:{len(body)}".encode())
    return eol.join(lines) + eol + eol + body + b"\0"


class WireParser:
    """Server-to-client frames from a byte stream; heart-beats (bare EOLs) are counted."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self.heartbeats = 0
        self.broken: str | None = None

    def feed(self, data: bytes) -> None:
        self._buf += data

    def next(self) -> WireFrame | None:
        """The next complete frame, or None until more data comes (or the stream is broken:
        then ``broken`` says why and nothing more is parsed)."""
        if self.broken is not None:
            return None
        buf = self._buf
        while buf[:1] == b"\n" or buf[:2] == b"\r\n":
            self.heartbeats += 1
            del buf[: 1 if buf[:1] == b"\n" else 2]
        end = buf.find(b"\n\n")
        end_crlf = buf.find(b"\r\n\r\n")
        candidates = [(end, 2), (end_crlf, 4)]
        found = [(pos, width) for pos, width in candidates if pos >= 0]
        if not found:
            if len(buf) > MAX_FRAME:
                self.broken = "header section too large"
            return None
        pos, width = min(found)
        head = bytes(buf[:pos]).decode("utf-8", "backslashreplace")
        lines = [line.removesuffix("\r") for line in head.split("\n")]
        command, header_lines = lines[0], lines[1:]
        headers: list[tuple[str, str]] = []
        malformed = False
        for line in header_lines:
            name, colon, value = line.partition(":")
            if not colon:
                malformed = True
            headers.append((name, value))
        start = pos + width
        length: int | None = None
        for name, value in headers:
            if name == "content-length":
                length = int(value) if value.strip().isdigit() else None
                break
        if length is not None:
            if len(buf) < start + length + 1:
                return None
            if buf[start + length] != 0:
                self.broken = "content-length not followed by NUL"
                return None
            body = bytes(buf[start : start + length])
            del buf[: start + length + 1]
        else:
            nul = buf.find(b"\0", start)
            if nul < 0:
                if len(buf) > MAX_FRAME:
                    self.broken = "frame too large"
                return None
            body = bytes(buf[start:nul])
            del buf[: nul + 1]
        return WireFrame(command, tuple(headers), body, malformed)
