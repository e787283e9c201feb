"""``FaultProxy.slow()``, the slow-link mode added for the chaos soak: bytes still arrive intact
and in order, each chunk held at least the delay asked for; ``pass_through()`` ends it."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from tests.faultproxy import FaultProxy


@pytest.fixture
def echo_server() -> Iterator[tuple[str, int]]:
    """A loopback TCP echo server (one connection at a time, bounded lifetime)."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(10.0)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(10.0)
                try:
                    while data := conn.recv(65536):
                        conn.sendall(data)
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()
    finally:
        stop.set()
        listener.close()
        thread.join(10.0)


def roundtrip(port: int, payload: bytes) -> tuple[bytes, float]:
    """Send ``payload`` through the proxy to the echo server; (echo, seconds taken)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30.0) as sock:
        started = time.monotonic()
        sock.sendall(payload)
        got = b""
        while len(got) < len(payload):
            chunk = sock.recv(65536)
            if not chunk:
                break
            got += chunk
        return got, time.monotonic() - started


def test_slow_link_delays_but_delivers(echo_server: tuple[str, int]) -> None:
    payload = bytes(range(256)) * 64  # 16 KiB
    with FaultProxy(echo_server) as proxy:
        proxy.slow(0.3, 1_000_000)
        got, took = roundtrip(proxy.port, payload)
        assert got == payload
        assert took >= 0.6  # at least one chunk each way held 0.3 s (a lower bound only)
        proxy.pass_through()
        again, _ = roundtrip(proxy.port, payload)
        assert again == payload


def test_slow_rejects_a_bad_rate() -> None:
    with FaultProxy(("127.0.0.1", 9)) as proxy, pytest.raises(ValueError, match="rate"):
        proxy.slow(0.1, 0)
