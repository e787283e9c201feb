"""The admin plane on real loopback sockets: binding, serve() wiring, concurrency, timeouts.

Real I/O, so no autojump clock; every test has a ``trio.fail_after`` guard (docs/architecture.md).
No broker is needed: the configured broker is a closed port, so readiness says "unreachable".
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from config import Broker, Config
from proxy.admin.server import AdminLimits, AdminServer
from proxy.app import ListenError, Sidecar, serve
from testbed import free_port

GUARD = 10.0


def make_config(**values: object) -> Config:
    base: dict[str, object] = {
        "listen": ("127.0.0.1", 0),
        "admin_listen": ("127.0.0.1", 0),
        "brokers": (Broker("127.0.0.1", free_port()),),
        "broker_probe_interval": 100,
        "connect_timeout": 500,
    }
    base.update(values)
    return Config(**base)  # type: ignore[arg-type]


async def http(address: tuple[str, int], request: bytes) -> bytes:
    """Send raw request bytes; everything the server answers until it closes."""
    stream = await trio.open_tcp_stream(*address)
    async with stream:
        await stream.send_all(request)
        await stream.send_eof()
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
        return data


def get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n".encode()


async def test_serve_binds_reports_its_address_and_answers() -> None:
    with trio.fail_after(GUARD):
        sidecar = Sidecar(make_config())
        admin = AdminServer(sidecar)
        async with trio.open_nursery() as nursery:
            address = await nursery.start(admin.serve)
            assert address == admin.address
            assert address[0] == "127.0.0.1"
            assert address[1] != 0
            reply = await http(address, get("/healthz"))
            assert reply.startswith(b"HTTP/1.1 200 OK\r\n")
            assert reply.endswith(b"\r\n\r\nok\n")
            await admin.prober.first_round_done.wait()
            reply = await http(address, get("/readyz"))
            assert reply.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
            assert b"unreachable" in reply
            nursery.cancel_scope.cancel()


async def test_admin_address_in_use_is_a_listen_error() -> None:
    with trio.fail_after(GUARD):
        taken = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
        port = taken.socket.getsockname()[1]
        admin = AdminServer(Sidecar(make_config(admin_listen=("127.0.0.1", port))))
        with pytest.raises(
            ListenError, match=rf"cannot listen on 127\.0\.0\.1:{port} \(admin_listen\)"
        ):
            await admin.serve()
        await taken.aclose()


async def test_slowloris_connections_do_not_block_other_requests() -> None:
    with trio.fail_after(GUARD):
        admin = AdminServer(Sidecar(make_config()), limits=AdminLimits(request_timeout=0.5))
        async with trio.open_nursery() as nursery:
            address = await nursery.start(admin.serve)
            slow = [await trio.open_tcp_stream(*address) for _ in range(5)]
            for s in slow:
                await s.send_all(b"GET /metrics HTTP/1.1\r\nHost: t\r\nX-Slow: ")
            # While they dribble, other clients are served at once.
            for _ in range(3):
                assert (await http(address, get("/healthz"))).startswith(b"HTTP/1.1 200")
            started = trio.current_time()
            for s in slow:
                data = b""
                while chunk := await s.receive_some(65536):
                    data += chunk
                assert data.startswith(b"HTTP/1.1 408 Request Timeout\r\n")
                await s.aclose()
            assert trio.current_time() - started < 3.0
            nursery.cancel_scope.cancel()


async def test_serve_starts_the_admin_plane_beside_the_stomp_listener() -> None:
    with trio.fail_after(GUARD):
        async with trio.open_nursery() as nursery:
            sidecar: Sidecar = await nursery.start(serve, make_config())
            assert sidecar.admin is not None
            assert sidecar.admin_address == sidecar.admin.address
            assert sidecar.statistics().admin_listen == sidecar.admin_address
            assert sidecar.admin_address is not None
            reply = await http(sidecar.admin_address, get("/metrics"))
            assert b'mq_sidecar_sessions{state="running"} 0.0' in reply
            sidecar.request_shutdown()
            await sidecar.stopped.wait()
        with pytest.raises(OSError, match="onnect"):  # the admin listener closed with it
            await trio.open_tcp_stream(*sidecar.admin_address)


async def test_serve_fails_cleanly_when_the_admin_address_is_taken() -> None:
    with trio.fail_after(GUARD):
        taken = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
        port = taken.socket.getsockname()[1]
        with pytest.RaisesGroup(pytest.RaisesExc(ListenError, match="admin_listen")):
            await serve(make_config(admin_listen=("127.0.0.1", port)))
        await taken.aclose()


async def test_shutdown_closes_open_admin_connections() -> None:
    with trio.fail_after(GUARD):
        async with trio.open_nursery() as nursery:
            sidecar: Sidecar = await nursery.start(serve, make_config())
            assert sidecar.admin_address is not None
            events = await trio.open_tcp_stream(*sidecar.admin_address)
            await events.send_all(b"GET /events HTTP/1.1\r\nHost: t\r\n\r\n")
            assert b"text/event-stream" in await events.receive_some(65536)
            idle = await trio.open_tcp_stream(*sidecar.admin_address)
            await idle.send_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
            assert (await idle.receive_some(65536)).startswith(b"HTTP/1.1 200 OK")
            sidecar.request_shutdown()
        for stream in (events, idle):
            while await stream.receive_some(65536):  # the server closed its end: EOF
                pass
            await stream.aclose()


async def test_readyz_in_outbox_mode_is_ready_with_no_broker(tmp_path: Path) -> None:
    """Outbox mode (docs/operations.md, "Readiness"): with the broker down, the sidecar still
    serves apps (it answers CONNECT and stores SENDs), so /readyz says ready, and why."""
    with trio.fail_after(GUARD):
        config = make_config(outbox=True, outbox_dir=str(tmp_path / "outbox"))
        async with trio.open_nursery() as nursery:
            sidecar: Sidecar = await nursery.start(serve, config)
            assert sidecar.admin is not None
            assert sidecar.admin_address is not None
            await sidecar.admin.prober.first_round_done.wait()
            reply = await http(sidecar.admin_address, get("/readyz"))
            assert reply.startswith(b"HTTP/1.1 200 OK\r\n")
            assert reply.endswith(
                b"\r\n\r\nready: no broker reachable: SENDs are stored in the outbox; outbox: "
                b"0 frame(s), 0 of %d bytes (outbox_max_bytes)\n" % config.outbox_max_bytes
            )
            nursery.cancel_scope.cancel()
