"""Safe by default (docs/operations.md, "Admin authentication"): without ``admin_token_file``,
``/status`` and ``/events`` answer only loopback clients (403 to others, naming the option);
``/metrics``, ``/healthz`` and ``/readyz`` stay open to Prometheus and the kubelet."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from proxy.admin.http import address_is_loopback, peer_is_loopback
from tests.proxy.test_admin_http import Client, make_admin


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.3.2.1", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("fe80::1%eth0", False),
        ("10.1.2.3", False),
        ("192.0.2.7", False),
        ("::ffff:192.0.2.7", False),
        ("localhost", False),  # getpeername gives addresses, never names
        ("", False),
    ],
)
def test_loopback_addresses(host: str, loopback: bool) -> None:
    assert address_is_loopback(host) is loopback


class _Peer:
    """The socket of a stream as ``peer_is_loopback`` reads it: only ``getpeername``."""

    def __init__(self, host: str) -> None:
        self.host = host

    def getpeername(self) -> tuple[str, int]:
        if not self.host:
            raise OSError("reset")
        return (self.host, 40000)


class _FromPeer(trio.abc.Stream):
    """A memory stream that says it comes from ``host`` (no traffic leaves the process)."""

    def __init__(self, inner: trio.abc.Stream, host: str) -> None:
        self.inner = inner
        self.socket = _Peer(host)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.inner.aclose()


def test_a_peer_that_cannot_be_read_is_not_loopback() -> None:
    a, _ = trio.testing.memory_stream_pair()
    assert peer_is_loopback(a)  # in-process: no socket
    assert not peer_is_loopback(_FromPeer(a, ""))
    assert peer_is_loopback(_FromPeer(a, "127.0.0.1"))


async def _get(host: str, path: str, nursery: trio.Nursery, **config: Any) -> tuple[int, bytes]:
    _, admin = make_admin(**config)
    client_stream, server_stream = trio.testing.memory_stream_pair()
    nursery.start_soon(admin.handle, _FromPeer(server_stream, host))
    client = Client(client_stream)
    if path == "/events":  # a stream: the head is the answer
        response = await client.start("GET", path)
        return response.status_code, b"" if response.status_code == 200 else await client.body()
    response, body = await client.get(path)
    return response.status_code, body


@pytest.mark.parametrize("path", ["/status", "/events"])
async def test_without_a_token_a_remote_client_is_refused_naming_the_option(
    path: str, nursery: trio.Nursery
) -> None:
    status, body = await _get("10.1.2.3", path, nursery)
    assert status == 403
    assert b"admin_token_file" in body


async def test_without_a_token_a_loopback_client_gets_status(nursery: trio.Nursery) -> None:
    status, body = await _get("127.0.0.1", "/status", nursery)
    assert status == 200
    assert b'"sessions_open"' in body


@pytest.mark.parametrize("path", ["/metrics", "/healthz", "/readyz"])
async def test_probes_and_metrics_stay_open_to_remote_clients(
    path: str, nursery: trio.Nursery
) -> None:
    status, _ = await _get("10.1.2.3", path, nursery)
    assert status in (200, 503)  # /readyz: not ready in a sidecar that serves nothing
