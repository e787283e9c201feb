"""The admin plane's HTTP handling over trio memory streams: routes, errors, limits, SSE.

An h11 client talks to ``AdminServer.handle`` through ``trio.testing.memory_stream_pair`` (or
``lockstep_stream_pair`` where a reader must really stop reading); timeouts run on the
autojump clock, so the 10 s slowloris timeout takes no wall time. The same server on real
sockets is in test_admin_server.py and, in front of a real broker, in
tests/integration/test_admin.py.
"""

from __future__ import annotations

import json
from typing import Any

import h11
import pytest
import trio
import trio.testing
from prometheus_client.parser import text_string_to_metric_families

from config import Broker, Config, Secret
from proxy.admin.server import AdminLimits, AdminServer
from proxy.app import Sidecar
from proxy.telemetry.events import EventBus, EventKind, SessionEvent
from proxy.telemetry.statistics import SessionStatistics, SidecarStatistics
from proxy.telemetry.vocabulary import ProbeOutcome
from tests.proxy.test_admin_health import session_stats

A = Broker("127.0.0.1", 61001)
SECRETS = ("svc-login-x", "svc-pass-x", "app-login-x", "app-pass-x", "url-login-x", "url-pass-x")


class FakeSidecar(Sidecar):
    """A Sidecar that is not serving, with sessions the test sets."""

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.fake_sessions: list[SessionStatistics] = []
        self.broken = False

    def statistics(self) -> SidecarStatistics:
        if self.broken:
            raise RuntimeError("statistics bug")
        return SidecarStatistics(
            listen=("127.0.0.1", 61613),
            sessions_total=len(self.fake_sessions),
            sessions=tuple(self.fake_sessions),
        )


def make_config(**values: Any) -> Config:
    broker = Broker(
        "127.0.0.1", 61001, login="url-login-x", passcode=Secret("url-pass-x"), virtual_host="/"
    )
    return Config(
        brokers=(broker, Broker("127.0.0.1", 61002)),
        login="svc-login-x",
        passcode=Secret("svc-pass-x"),
        client_login="app-login-x",
        client_passcode=Secret("app-pass-x"),
        **values,
    )


def make_admin(limits: AdminLimits | None = None, **config: Any) -> tuple[FakeSidecar, AdminServer]:
    sidecar = FakeSidecar(make_config(**config))

    async def probe(broker: Broker) -> tuple[ProbeOutcome, str]:
        if broker.port == 61001:
            return ProbeOutcome.CONNECTED, "CONNECT answered: STOMP 1.2, test"
        return ProbeOutcome.FAILED, "connection refused"

    admin = AdminServer(sidecar, limits=limits)
    admin.prober._probe = probe
    return sidecar, admin


class Client:
    """A minimal h11 client over a trio stream."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.conn = h11.Connection(h11.CLIENT)

    async def send(self, event: h11.Event) -> None:
        data = self.conn.send(event)
        if data:
            await self.stream.send_all(data)

    async def next_event(self) -> h11.Event:
        while True:
            event = self.conn.next_event()
            if event is h11.NEED_DATA:
                self.conn.receive_data(bytes(await self.stream.receive_some(65536)))
                continue
            assert isinstance(event, h11.Event)
            return event

    async def start(
        self,
        method: str = "GET",
        target: str = "/healthz",
        headers: tuple[tuple[str, str], ...] = (),
    ) -> h11.Response:
        await self.send(
            h11.Request(method=method, target=target, headers=[("host", "a"), *headers])
        )
        await self.send(h11.EndOfMessage())
        response = await self.next_event()
        assert isinstance(response, h11.Response), response
        return response

    async def body(self) -> bytes:
        chunks: list[bytes] = []
        while True:
            event = await self.next_event()
            if isinstance(event, h11.EndOfMessage):
                return b"".join(chunks)
            assert isinstance(event, h11.Data), event
            chunks.append(bytes(event.data))

    async def get(
        self,
        target: str = "/healthz",
        method: str = "GET",
        headers: tuple[tuple[str, str], ...] = (),
    ) -> tuple[h11.Response, bytes]:
        response = await self.start(method, target, headers)
        body = await self.body()
        if self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE:
            self.conn.start_next_cycle()
        return response, body

    async def read_until(self, marker: bytes) -> bytes:
        data = b""
        while marker not in data:
            event = await self.next_event()
            assert isinstance(event, h11.Data), event
            data += bytes(event.data)
        return data


def header(response: h11.Response, name: bytes) -> bytes | None:
    for n, v in response.headers:
        if n == name:
            return bytes(v)
    return None


async def read_all(stream: trio.abc.Stream) -> bytes:
    """Everything until EOF."""
    data = b""
    while chunk := await stream.receive_some(65536):
        data += chunk
    return data


@pytest.fixture
async def served(nursery: trio.Nursery) -> tuple[FakeSidecar, AdminServer, Client]:
    """A FakeSidecar, its AdminServer, and a client connected to it (memory streams)."""
    sidecar, admin = make_admin()
    return sidecar, admin, connect(admin, nursery)


def connect(admin: AdminServer, nursery: trio.Nursery) -> Client:
    client_stream, server_stream = trio.testing.memory_stream_pair()
    nursery.start_soon(admin.handle, server_stream)
    return Client(client_stream)


# --------------------------------------------------------------------------------------
# endpoints


async def test_healthz_and_index(served: tuple[FakeSidecar, AdminServer, Client]) -> None:
    _, _, client = served
    response, body = await client.get("/healthz")
    assert (response.status_code, body) == (200, b"ok\n")
    assert header(response, b"content-type") == b"text/plain; charset=utf-8"
    response, body = await client.get("/")  # same connection: keep-alive
    assert response.status_code == 200
    for path in (b"/metrics", b"/healthz", b"/readyz", b"/status", b"/events"):
        assert path in body


async def test_head_gives_headers_without_a_body(
    served: tuple[FakeSidecar, AdminServer, Client],
) -> None:
    _, _, client = served
    response, body = await client.get("/metrics", method="HEAD")
    assert response.status_code == 200
    assert body == b""
    assert int(header(response, b"content-length") or 0) > 1000


async def test_metrics_text_and_openmetrics(
    served: tuple[FakeSidecar, AdminServer, Client],
) -> None:
    sidecar, _, client = served
    sidecar.fake_sessions = [session_stats("s-1", "running", A.label, window_bytes=300)]
    response, body = await client.get("/metrics")
    assert header(response, b"content-type") == b"text/plain; version=0.0.4; charset=utf-8"
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }
    assert samples["mq_sidecar_sessions", (("state", "running"),)] == 1.0
    assert samples["mq_sidecar_upstream_connected", (("broker", A.label),)] == 1.0
    assert samples["mq_sidecar_window_bytes", ()] == 300.0
    response, body = await client.get(
        "/metrics", headers=(("accept", "application/openmetrics-text; version=1.0.0"),)
    )
    assert header(
        response,
        b"content-type",
    ).startswith(b"application/openmetrics-text")  # type: ignore[union-attr]
    assert body.endswith(b"# EOF\n")
    assert b"mq_sidecar_build_info{version=" in body


async def test_readyz_follows_the_prober(
    served: tuple[FakeSidecar, AdminServer, Client], nursery: trio.Nursery
) -> None:
    sidecar, admin, client = served
    response, body = await client.get("/readyz")
    assert response.status_code == 503
    assert b"not checked yet" in body
    await nursery.start(admin.prober.run)
    await admin.prober.first_round_done.wait()
    response, body = await client.get("/readyz")
    assert (response.status_code, body) == (200, b"ready: broker(s) reachable: 127.0.0.1:61001\n")
    sidecar.request_shutdown()
    response, body = await client.get("/readyz")
    assert response.status_code == 503
    assert b"shutting down" in body


async def test_status_is_json_without_credentials(
    served: tuple[FakeSidecar, AdminServer, Client], nursery: trio.Nursery
) -> None:
    sidecar, admin, client = served
    sidecar.fake_sessions = [
        session_stats("s-1", "running", A.label, window_frames=2, window_bytes=120),
        session_stats("s-2", "reconnecting", A.label, reconnecting_for=1.5),
    ]
    await nursery.start(admin.prober.run)
    await admin.prober.first_round_done.wait()
    response, body = await client.get("/status")
    assert header(response, b"content-type") == b"application/json"
    for secret in SECRETS:
        assert secret.encode() not in body
    doc = json.loads(body)
    assert doc["version"]
    assert doc["config_digest"].startswith("sha256:")
    assert doc["config"]["login"] == "***"
    assert doc["ready"] is True
    assert [(b["broker"], b["state"], b["sessions"]) for b in doc["brokers"]] == [
        ("127.0.0.1:61001", "up", 1),
        ("127.0.0.1:61002", "down", 0),
    ]
    assert doc["brokers"][1]["detail"] == "connection refused"
    assert doc["windows"] == {"frames": 2, "bytes": 120, "limit_bytes_per_session": 1048576}
    assert doc["reconnects_in_progress"] == 1
    assert [(s["session_id"], s["broker"], s["state"]) for s in doc["sessions"]] == [
        ("s-1", "127.0.0.1:61001", "running"),
        ("s-2", "127.0.0.1:61001", "reconnecting"),
    ]
    assert doc["sessions"][1]["stuck_for_seconds"] == 1.5
    assert doc["events"] == {"subscribers": 0, "published": 0, "dropped_subscribers": 0}


# --------------------------------------------------------------------------------------
# bad requests


@pytest.mark.parametrize(
    ("method", "target", "status", "allow"),
    [
        ("GET", "/nope", 404, None),
        ("GET", "/metrics/extra", 404, None),
        ("POST", "/metrics", 405, b"GET, HEAD"),
        ("DELETE", "/status", 405, b"GET, HEAD"),
        ("HEAD", "/events", 405, b"GET"),
    ],
)
async def test_unknown_paths_and_methods(
    served: tuple[FakeSidecar, AdminServer, Client],
    method: str,
    target: str,
    status: int,
    allow: bytes | None,
) -> None:
    sidecar, _, client = served
    response, _ = await client.get(target, method=method)
    assert response.status_code == status
    assert header(response, b"allow") == allow
    response, _ = await client.get("/healthz")  # the connection is still usable
    assert response.status_code == 200
    endpoint = "other" if status == 404 else target.lstrip("/")
    value = sidecar.registry.get_sample_value(
        "mq_sidecar_admin_http_requests_total", {"endpoint": endpoint, "code": str(status)}
    )
    assert value == 1.0


@pytest.mark.parametrize("complete", [True, False], ids=["whole-head", "endless-head"])
async def test_oversized_headers_get_431_and_close(nursery: trio.Nursery, complete: bool) -> None:
    _, admin = make_admin()
    client = connect(admin, nursery)
    head = b"GET /metrics HTTP/1.1\r\nHost: a\r\nX-Big: " + b"x" * 9000
    await client.stream.send_all(head + (b"\r\n\r\n" if complete else b""))
    data = await read_all(client.stream)
    assert data.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n")
    assert b"connection: close" in data


async def test_garbage_gets_400_and_close(nursery: trio.Nursery) -> None:
    _, admin = make_admin()
    client = connect(admin, nursery)
    await client.stream.send_all(b"\x16\x03\x01 not http at all\r\n\r\n")
    data = await read_all(client.stream)
    assert data.startswith(b"HTTP/1.1 400 Bad Request\r\n")


async def test_slowloris_gets_408_after_the_request_timeout(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    _, admin = make_admin()
    client = connect(admin, nursery)
    start = trio.current_time()
    await client.stream.send_all(b"GET /healthz HTTP/1.1\r\nHost: a\r\nX-Slow: ")
    await trio.sleep(3)
    await client.stream.send_all(b"still coming")
    data = await read_all(client.stream)
    assert data.startswith(b"HTTP/1.1 408 Request Timeout\r\n")
    assert 10.0 <= trio.current_time() - start < 12.0  # 10 s request_timeout + 1 s linger
    assert admin.statistics().connections == 0


async def test_idle_keep_alive_connection_is_closed_quietly(
    autojump_clock: trio.testing.MockClock, served: tuple[FakeSidecar, AdminServer, Client]
) -> None:
    _, admin, client = served
    await client.get("/healthz")
    start = trio.current_time()
    assert await read_all(client.stream) == b""  # EOF, no 408 for an idle connection
    assert 10.0 <= trio.current_time() - start < 12.0
    assert admin.statistics().connections == 0


async def test_a_request_body_is_not_read_and_the_connection_closes(
    served: tuple[FakeSidecar, AdminServer, Client],
) -> None:
    _, _, client = served
    await client.stream.send_all(
        b"GET /healthz HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello"
    )
    data = await read_all(client.stream)
    assert data.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"connection: close" in data


async def test_too_many_connections_get_503(nursery: trio.Nursery) -> None:
    _, admin = make_admin(AdminLimits(max_connections=1))
    first = connect(admin, nursery)
    response, _ = await first.get("/healthz")
    assert response.status_code == 200
    second = connect(admin, nursery)
    data = await read_all(second.stream)
    assert data.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
    assert admin.statistics().rejected_connections == 1
    response, _ = await first.get("/healthz")  # the first one is unaffected
    assert response.status_code == 200


async def test_a_handler_bug_answers_500_and_closes_only_that_connection(
    nursery: trio.Nursery, caplog: pytest.LogCaptureFixture
) -> None:
    sidecar, admin = make_admin()
    sidecar.broken = True
    client = connect(admin, nursery)
    await client.stream.send_all(b"GET /status HTTP/1.1\r\nHost: a\r\n\r\n")
    data = await read_all(client.stream)
    assert data.startswith(b"HTTP/1.1 500 Internal Server Error\r\n")
    assert b"statistics bug" not in data  # details go to the log, not to the client
    assert "admin plane: internal error" in caplog.text
    sidecar.broken = False
    response, _ = await connect(admin, nursery).get("/status")
    assert response.status_code == 200


# --------------------------------------------------------------------------------------
# Server-Sent Events


def event(kind: EventKind = EventKind.FAILOVER, session: str = "s-1") -> SessionEvent:
    return SessionEvent(
        kind, session, "broker connection lost", from_broker="a:1", to_broker="b:2", attempts=2
    )


async def test_events_stream_every_published_event(
    served: tuple[FakeSidecar, AdminServer, Client],
) -> None:
    sidecar, admin, client = served
    response = await client.start("GET", "/events")
    assert response.status_code == 200
    assert header(response, b"content-type") == b"text/event-stream; charset=utf-8"
    assert (await client.read_until(b"\n\n")).startswith(b": mq-sidecar session events\n")
    assert admin.statistics().sse_clients == 1
    sent = [event(EventKind.RECONNECTING), event(EventKind.FAILOVER, "s-2")]
    for e in sent:
        sidecar.events.publish(e)
    data = b""
    while data.count(b"\n\n") < len(sent):
        data += await client.read_until(b"\n\n")
    blocks = [b for b in data.decode().split("\n\n") if b]
    ids = [sidecar.events.event_id(n) for n in (1, 2)]
    assert blocks == [
        f"id: {i}\nevent: {e.kind}\ndata: {e.to_json()}" for i, e in zip(ids, sent, strict=True)
    ]
    assert json.loads(blocks[1].split("data: ", 1)[1])["session_id"] == "s-2"


async def test_idle_event_stream_sends_keep_alive_comments(
    autojump_clock: trio.testing.MockClock, served: tuple[FakeSidecar, AdminServer, Client]
) -> None:
    _, _, client = served
    await client.start("GET", "/events")
    await client.read_until(b"retry: 5000\n\n")
    start = trio.current_time()
    assert await client.read_until(b"\n\n") == b": keep-alive\n\n"
    assert trio.current_time() - start == pytest.approx(15.0)


async def test_a_reader_that_leaves_is_unsubscribed(
    served: tuple[FakeSidecar, AdminServer, Client],
) -> None:
    sidecar, admin, client = served
    await client.start("GET", "/events")
    await client.read_until(b"\n\n")
    assert sidecar.events.statistics().subscribers == 1
    await client.stream.aclose()
    with trio.fail_after(5):
        while admin.statistics().connections:
            await trio.testing.wait_all_tasks_blocked()
            await trio.lowlevel.checkpoint()
    assert admin.statistics().sse_clients == 0
    assert sidecar.events.statistics().subscribers == 0
    assert admin.statistics().sse_dropped == 0


async def test_a_slow_reader_is_dropped_and_counted(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    sidecar, admin = make_admin()
    sidecar.events = EventBus(subscriber_buffer=4)
    client_stream, server_stream = trio.testing.lockstep_stream_pair()
    nursery.start_soon(admin.handle, server_stream)
    client = Client(client_stream)
    await client.start("GET", "/events")
    await client.read_until(b"\n\n")
    # The reader stops reading; the session side keeps publishing and never blocks.
    for n in range(20):
        sidecar.events.publish(event(session=f"s-{n}"))
    await trio.sleep(admin.limits.send_timeout + 2)
    stats = admin.statistics()
    assert (stats.sse_clients, stats.sse_dropped, stats.connections) == (0, 1, 0)
    assert sidecar.events.statistics().dropped_subscribers == 1
    assert sidecar.registry.get_sample_value("mq_sidecar_sse_clients_dropped_total") == 1.0


async def test_too_many_event_readers_get_503(nursery: trio.Nursery) -> None:
    _, admin = make_admin(AdminLimits(max_sse_clients=1))
    first = connect(admin, nursery)
    await first.start("GET", "/events")
    await first.read_until(b"\n\n")
    response, body = await connect(admin, nursery).get("/events")
    assert response.status_code == 503
    assert body == b"too many event stream readers\n"
