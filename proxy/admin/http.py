"""HTTP/1.1 server connections with h11 on trio (h11's ``examples/trio-server.py``), for the
admin plane (:mod:`proxy.admin.server`): one :class:`HTTPConnection` per accepted stream, the
helpers that read a request's head, and the bearer token check (:class:`BearerToken`). Nothing
here knows the admin plane's endpoints.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import hmac
import ipaddress
import logging
import os
from http import HTTPStatus

import h11
import trio

from proxy._version import VERSION

__all__ = [
    "AUTHENTICATE",
    "GONE",
    "RECEIVE_SIZE",
    "SERVER_HEADER",
    "TEXT_PLAIN",
    "BearerToken",
    "HTTPConnection",
    "TokenCheck",
    "TokenUnavailable",
    "address_is_loopback",
    "bearer_credentials",
    "format_address",
    "has_body",
    "head_size",
    "header_value",
    "peer_address",
    "peer_is_loopback",
    "read_token",
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
#: The ``WWW-Authenticate`` challenge of a 401 (RFC 6750 §3).
AUTHENTICATE = b'Bearer realm="mq-sidecar"'
#: Bytes of the token file read at most (a token is one line; a request head is 8 KiB).
_TOKEN_FILE_BYTES = 16384

log = logging.getLogger("mq_sidecar.admin")


def peer_is_loopback(stream: trio.abc.Stream) -> bool:
    """Whether the client at the other end of ``stream`` connected from a loopback address
    (``127.0.0.0/8``, ``::1``, or IPv4-mapped ``::ffff:127.x``). A stream with no socket (a
    memory stream inside the process, as in tests) counts as local; one whose peer cannot be
    read (already reset) does not."""
    sock = getattr(stream, "socket", None)
    if sock is None:
        return True
    try:
        host = str(sock.getpeername()[0])
    except OSError:
        return False
    return address_is_loopback(host)


def peer_address(stream: trio.abc.Stream) -> str:
    """``host:port`` of the client at the other end of ``stream`` (IPv6 in brackets), for the
    log lines that say who asked; ``local`` for a stream with no socket (a memory stream inside
    the process), ``unknown`` when the peer cannot be read (already reset)."""
    sock = getattr(stream, "socket", None)
    if sock is None:
        return "local"
    try:
        peer = sock.getpeername()
    except OSError:
        return "unknown"
    return format_address(str(peer[0]), int(peer[1]))


def address_is_loopback(host: str) -> bool:
    """Whether ``host`` (an IP address as ``getpeername`` gives it, maybe with an IPv6 scope)
    is a loopback address; a name or anything unparseable is not."""
    try:
        address = ipaddress.ip_address(host.partition("%")[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


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


class TokenUnavailable(Exception):
    """The token file cannot be read or holds no token; the message is one line naming the
    option and the file (never anything of its content)."""


class TokenCheck(enum.Enum):
    """What :meth:`BearerToken.check` found."""

    OK = "ok"
    MISSING = "missing"  # no ``Authorization: Bearer`` credentials
    INVALID = "invalid"  # credentials, not the token
    UNAVAILABLE = "unavailable"  # the token file cannot be read: nobody gets in


def read_token(path: str) -> bytes:
    """The bearer token in the file ``path``: its first line, surrounding whitespace removed
    (as Prometheus reads a ``credentials_file``).

    Opened without blocking (a FIFO without a writer reads as empty), at most 16 KiB read.

    Raises:
        TokenUnavailable: the file cannot be read, or its first line is empty.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            data = os.read(fd, _TOKEN_FILE_BYTES)
        finally:
            os.close(fd)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise TokenUnavailable(f"admin_token_file {path}: {reason}") from None
    token = data.split(b"\n", 1)[0].strip()
    if not token:
        raise TokenUnavailable(f"admin_token_file {path}: no token on its first line")
    return token


class BearerToken:
    """Checks a request's ``Authorization: Bearer <token>`` (RFC 6750 §2.1) against the token
    in ``path``, re-read at every check: a rotated Kubernetes Secret (a symlink swapped under
    the mount) applies to the next request, without a restart.

    A token file that cannot be read is logged once per reason (and once when it can be read
    again); while it cannot, every check says :attr:`TokenCheck.UNAVAILABLE`: closed, never
    open.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._problem: str | None = None

    def check(self, request: h11.Request) -> TokenCheck:
        """Whether ``request`` carries the token (compared in constant time)."""
        try:
            token = read_token(self.path)
        except TokenUnavailable as exc:
            if str(exc) != self._problem:
                self._problem = str(exc)
                log.error(
                    "admin plane: %s; the endpoints that need the admin token answer 503", exc
                )
            return TokenCheck.UNAVAILABLE
        if self._problem is not None:
            self._problem = None
            log.info("admin plane: admin_token_file %s is readable again", self.path)
        presented = bearer_credentials(request)
        if presented is None:
            return TokenCheck.MISSING
        # Digests of both: equal lengths, so the comparison tells nothing of the token's length.
        same = hmac.compare_digest(
            hashlib.sha256(presented).digest(), hashlib.sha256(token).digest()
        )
        return TokenCheck.OK if same else TokenCheck.INVALID


def bearer_credentials(request: h11.Request) -> bytes | None:
    """The token of the request's one ``Authorization: Bearer <token>`` header (the scheme
    is case-insensitive, RFC 7235 §2.1), or None."""
    values = [v for n, v in request.headers if n == b"authorization"]
    if len(values) != 1:
        return None
    scheme, _, credentials = bytes(values[0]).partition(b" ")
    if scheme.lower() != b"bearer":
        return None
    return credentials.strip() or None


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
