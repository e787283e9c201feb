"""HTTP/1.1 server connections with h11 on trio (h11's ``examples/trio-server.py``), for the
admin plane (:mod:`proxy.admin`): one :class:`HTTPConnection` per accepted stream, and the
helpers that read a request's head. Nothing here knows the admin plane's endpoints.
"""

from __future__ import annotations

import contextlib
from http import HTTPStatus

import h11
import trio

from proxy._version import VERSION

__all__ = [
    "GONE",
    "RECEIVE_SIZE",
    "SERVER_HEADER",
    "TEXT_PLAIN",
    "HTTPConnection",
    "format_address",
    "has_body",
    "head_size",
    "header_value",
]

#: What a stream raises when the peer is gone (or we closed it).
GONE = (trio.BrokenResourceError, trio.ClosedResourceError)
#: Bytes asked of the kernel per read.
RECEIVE_SIZE = 16384
#: Seconds to wait for the peer to close after our last response (so it reads that response
#: before a close with unread data turns into a TCP RST).
_LINGER_SECONDS = 1.0
#: Bytes read and thrown away while lingering.
_LINGER_BYTES = 65536
#: The ``Server`` header of every response.
SERVER_HEADER = f"mq-sidecar/{VERSION}".encode()
#: The content type of plain-text responses.
TEXT_PLAIN = b"text/plain; charset=utf-8"


class HTTPConnection:
    """An ``h11.Connection`` bound to a trio stream (h11's ``TrioHTTPWrapper``)."""

    def __init__(self, stream: trio.abc.Stream, max_header_bytes: int) -> None:
        self.stream = stream
        self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=max_header_bytes)
        #: Bytes received since the current request/response cycle began.
        self.cycle_bytes = 0
        #: Close after the current response (the request had a body we do not read).
        self.must_close = False
        #: The current request is a HEAD: responses carry headers only.
        self.head = False

    async def send(self, event: h11.Event) -> None:
        """Serialize and write ``event``; a failed write leaves h11 in ERROR (send_failed)."""
        data = self.conn.send(event)
        if not data:
            return
        try:
            await self.stream.send_all(data)
        except BaseException:
            self.conn.send_failed()
            raise

    async def next_event(self) -> h11.Event | type[h11.PAUSED]:
        """The next h11 event; a reset reads as EOF (``ConnectionClosed``)."""
        while True:
            event = self.conn.next_event()
            if event is h11.NEED_DATA:
                try:
                    data = await self.stream.receive_some(RECEIVE_SIZE)
                except GONE:
                    data = b""
                self.cycle_bytes += len(data)
                self.conn.receive_data(bytes(data))
                continue
            if isinstance(event, h11.Event) or event is h11.PAUSED:
                return event

    async def respond(
        self,
        status: int,
        body: bytes,
        *,
        content_type: bytes = TEXT_PLAIN,
        headers: tuple[tuple[bytes, bytes], ...] = (),
        close: bool = False,
    ) -> None:
        """A complete response with ``Content-Length`` (no body written for a HEAD request)."""
        all_headers = [
            (b"server", SERVER_HEADER),
            (b"content-type", content_type),
            (b"content-length", str(len(body)).encode()),
            (b"cache-control", b"no-store"),
            *headers,
        ]
        if close or self.must_close:
            all_headers.append((b"connection", b"close"))
        reason = HTTPStatus(status).phrase.encode()
        await self.send(h11.Response(status_code=status, headers=all_headers, reason=reason))
        if body and not self.head:
            await self.send(h11.Data(data=body))
        await self.send(h11.EndOfMessage())

    async def close(self) -> None:
        """Half-close, give the peer a moment to read and close, then close for good."""
        stream = self.stream
        try:
            with trio.move_on_after(_LINGER_SECONDS), contextlib.suppress(*GONE):
                if isinstance(stream, trio.abc.HalfCloseableStream):
                    await stream.send_eof()
                drained = 0
                while drained < _LINGER_BYTES:
                    data = await stream.receive_some(RECEIVE_SIZE)
                    if not data:
                        break
                    drained += len(data)
        finally:  # also when cancelled (the sidecar is stopping): never leak the socket
            await trio.aclose_forcefully(stream)


def format_address(host: str, port: int) -> str:
    """``host:port``, IPv6 literals in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def has_body(request: h11.Request) -> bool:
    """Whether the request announces a body (``Transfer-Encoding``, or a non-zero length)."""
    for name, value in request.headers:
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip() != b"0"):
            return True
    return False


def head_size(request: h11.Request) -> int:
    """Bytes of the request line and headers as received (give or take whitespace)."""
    size = len(request.method) + len(request.target) + 12
    return size + sum(len(name) + len(value) + 4 for name, value in request.headers)


def header_value(request: h11.Request, name: bytes) -> str:
    """The values of header ``name`` joined with ``, `` (empty if absent)."""
    return b", ".join(v for n, v in request.headers if n == name).decode("latin-1")
