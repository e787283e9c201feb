"""Port allocation and STOMP readiness probing over a raw socket (stdlib only, synchronous).

Readiness of a broker is "a STOMP 1.2 CONNECT is answered with CONNECTED", not "the port is
open" (docs/brokers.md): RabbitMQ opens its listeners before the STOMP plugin is usable,
and a suspended (SIGSTOP) broker still completes TCP handshakes in the kernel.
"""

from __future__ import annotations

import contextlib
import socket
import time
from dataclasses import dataclass

__all__ = ["free_port", "stomp_handshake", "wait_stomp"]

#: Pause between two CONNECT attempts, in seconds.
RETRY_INTERVAL = 0.05

#: Largest STOMP reply accepted from a broker during the probe, in bytes.
_MAX_REPLY = 65536


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that was free on ``host`` a moment ago.

    Binds port 0 (the kernel picks an ephemeral port), reads it back and closes the socket.
    Another process may take the port before the caller binds it; the window is small.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass(frozen=True)
class HandshakeResult:
    """Outcome of one STOMP CONNECT attempt that got a complete reply frame.

    ``command`` is the reply's command line (``CONNECTED`` or ``ERROR``); ``headers`` are its
    headers (first occurrence wins, values unescaped only as far as this probe needs);
    ``body`` is the frame body decoded as UTF-8 with replacement.
    """

    command: str
    headers: dict[str, str]
    body: str

    @property
    def connected(self) -> bool:
        """True when the broker answered CONNECTED."""
        return self.command == "CONNECTED"

    def describe(self) -> str:
        """One-line summary for error messages (``message`` header and body of an ERROR)."""
        if self.connected:
            return "CONNECTED"
        message = self.headers.get("message", "")
        body = " ".join(self.body.split())[:200]
        return f"{self.command} {message!r} {body!r}".strip()


def _connect_frame(vhost: str, login: str | None, passcode: str | None) -> bytes:
    # CONNECT headers are not escaped in STOMP 1.2 (spec: "CONNECT and CONNECTED frames do
    # not escape"), so values are sent as given.
    lines = ["CONNECT", "accept-version:1.2", f"host:{vhost}", "heart-beat:0,0"]
    if login is not None:
        lines.append(f"login:{login}")
    if passcode is not None:
        lines.append(f"passcode:{passcode}")
    return ("\n".join(lines) + "\n\n\x00").encode()


def _parse_frame(raw: bytes) -> HandshakeResult:
    text = raw.decode("utf-8", errors="replace")
    head, _, body = text.partition("\n\n")
    lines = [line.rstrip("\r") for line in head.split("\n")]
    headers: dict[str, str] = {}
    for line in lines[1:]:
        key, sep, value = line.partition(":")
        if sep and key not in headers:
            headers[key] = value
    return HandshakeResult(command=lines[0], headers=headers, body=body)


def stomp_handshake(
    host: str,
    port: int,
    *,
    timeout: float,
    vhost: str = "/",
    login: str | None = None,
    passcode: str | None = None,
) -> HandshakeResult:
    """Make one STOMP 1.2 CONNECT attempt and return the broker's reply frame.

    ``timeout`` (seconds) bounds the TCP connect and every read. On CONNECTED a DISCONNECT is
    sent before the socket is closed. Raises ``OSError`` (``ConnectionRefusedError``,
    ``ConnectionResetError``, ``TimeoutError``...) when there is no complete reply, and
    ``EOFError`` when the broker closes the connection before sending one.
    """
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.settimeout(timeout)
        sock.sendall(_connect_frame(vhost, login, passcode))
        buf = b""
        while True:
            # Heart-beat EOLs may precede the frame; the frame ends at the first NUL.
            stripped = buf.lstrip(b"\r\n")
            end = stripped.find(b"\x00")
            if end >= 0:
                result = _parse_frame(stripped[:end])
                break
            if len(buf) > _MAX_REPLY:
                raise EOFError(f"{host}:{port} sent {len(buf)} bytes without a frame end")
            chunk = sock.recv(4096)
            if not chunk:
                raise EOFError(f"{host}:{port} closed the connection before replying")
            buf += chunk
        if result.connected:
            with contextlib.suppress(OSError):
                sock.sendall(b"DISCONNECT\n\n\x00")
        return result


def wait_stomp(
    host: str,
    port: int,
    *,
    timeout: float,
    vhost: str = "/",
    login: str | None = None,
    passcode: str | None = None,
) -> float:
    """Wait until the STOMP server at ``host:port`` answers a 1.2 CONNECT with CONNECTED.

    Retries every ~50 ms (``RETRY_INTERVAL``) on refused, reset, EOF, timeouts and ERROR
    replies. ``vhost`` is the CONNECT ``host`` header (RabbitMQ treats it as the virtual host,
    docs/brokers.md, "Other traps"; ActiveMQ ignores it). Returns the seconds waited
    (monotonic clock).
    Raises ``TimeoutError`` naming ``host:port`` and the last failure after ``timeout`` seconds.
    """
    started = time.monotonic()
    deadline = started + timeout
    last = "no attempt made"
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(
                f"STOMP server {host}:{port} did not answer CONNECT with CONNECTED "
                f"within {timeout:.1f} s (last: {last})"
            )
        try:
            result = stomp_handshake(
                host, port, timeout=remaining, vhost=vhost, login=login, passcode=passcode
            )
        except (OSError, EOFError) as exc:
            last = f"{type(exc).__name__}: {exc}"
        else:
            if result.connected:
                return time.monotonic() - started
            last = result.describe()
        time.sleep(max(0.0, min(RETRY_INTERVAL, deadline - time.monotonic())))
