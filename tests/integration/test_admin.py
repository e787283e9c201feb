"""The admin plane of a running sidecar in front of a real ActiveMQ, through real HTTP clients
(http.client, an h11 client for the event stream, curl), promtool and a real Prometheus.

Readiness and events follow a broker that the test stops and starts again, so those tests run
their own ActiveMQ (about a second to start) rather than the session's shared one.
"""

from __future__ import annotations

import http.client
import json
import shutil
import socket
import subprocess
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import h11
import pytest

from testbed import ActiveMQ, free_port
from tests.integration.support import (
    WAIT,
    RawClient,
    SidecarThread,
    client,
    sidecar_config,
    unique,
    wait_until,
)

Address = tuple[str, int]


# --------------------------------------------------------------------------------------
# HTTP helpers (real clients)


def http_get(
    address: Address, path: str, *, method: str = "GET", headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    """One request on a fresh connection: status, headers (lower-case names), body."""
    conn = http.client.HTTPConnection(*address, timeout=WAIT)
    try:
        conn.request(method, path, headers=headers or {})
        response = conn.getresponse()
        return (
            response.status,
            {k.lower(): v for k, v in response.getheaders()},
            response.read(),
        )
    finally:
        conn.close()


def poll_http(address: Address, path: str, status: int, timeout: float = 30.0) -> tuple[int, bytes]:
    """GET ``path`` every 100 ms until it answers ``status``; AssertionError after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: tuple[int, bytes] = (0, b"")
    while time.monotonic() < deadline:
        code, _, body = http_get(address, path)
        last = (code, body)
        if code == status:
            return last
        time.sleep(0.1)
    raise AssertionError(f"{path} did not answer {status} within {timeout} s; last: {last!r}")


class EventStream:
    """A ``GET /events`` reader: an h11 client on a plain socket (``headers``: more request
    headers, e.g. the admin token)."""

    def __init__(self, address: Address, headers: dict[str, str] | None = None) -> None:
        self.sock = socket.create_connection(address, timeout=WAIT)
        self.conn = h11.Connection(h11.CLIENT)
        request = h11.Request(
            method="GET",
            target="/events",
            headers=[("host", "t"), ("accept", "text/event-stream"), *(headers or {}).items()],
        )
        for event in (request, h11.EndOfMessage()):
            data = self.conn.send(event)
            assert data is not None
            self.sock.sendall(data)
        self.buffer = b""
        response = self._next()
        assert isinstance(response, h11.Response), response
        assert response.status_code == 200
        self.headers = {bytes(k): bytes(v) for k, v in response.headers}

    def _next(self) -> h11.Event:
        while True:
            event = self.conn.next_event()
            if event is h11.NEED_DATA:
                self.conn.receive_data(self.sock.recv(65536))
                continue
            assert isinstance(event, h11.Event)
            return event

    def next_event(self, timeout: float = WAIT) -> tuple[str, dict[str, object]]:
        """The next event (comments skipped): its kind and its JSON data."""
        deadline = time.monotonic() + timeout
        while True:
            while b"\n\n" in self.buffer:
                block, self.buffer = self.buffer.split(b"\n\n", 1)
                fields = dict(
                    line.split(": ", 1)
                    for line in block.decode().splitlines()
                    if line and not line.startswith(":") and ": " in line
                )
                if "event" in fields:
                    return fields["event"], json.loads(fields["data"])
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no event within {timeout} s")
            self.sock.settimeout(remaining)
            try:
                event = self._next()
            except TimeoutError:
                continue
            assert isinstance(event, h11.Data), event
            self.buffer += bytes(event.data)

    def close(self) -> None:
        self.sock.close()


def admin_address(sidecar: SidecarThread) -> Address:
    address = sidecar.statistics().admin_listen
    assert address is not None
    return address


@pytest.fixture(scope="module")
def amq_admin(activemq: ActiveMQ) -> Iterator[SidecarThread]:
    """A sidecar (admin plane on an ephemeral loopback port) in front of the shared ActiveMQ."""
    config = sidecar_config(activemq.stomp_url, broker_probe_interval=200)
    with SidecarThread(config) as sidecar:
        yield sidecar


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[ActiveMQ]:
    """An ActiveMQ of this test alone (the test stops and starts it)."""
    broker = ActiveMQ("own", tmp_path)
    with broker:
        yield broker


# --------------------------------------------------------------------------------------
# endpoints


def test_every_endpoint_answers_over_real_http(amq_admin: SidecarThread) -> None:
    address = admin_address(amq_admin)
    code, headers, body = http_get(address, "/healthz")
    assert (code, body) == (200, b"ok\n")
    poll_http(address, "/readyz", 200)
    code, headers, body = http_get(address, "/", method="HEAD")
    assert (code, body) == (200, b"")
    with client(amq_admin.address):
        code, headers, body = http_get(address, "/status")
        assert code == 200
        assert headers["content-type"] == "application/json"
        doc = json.loads(body)
        running = [s for s in doc["sessions"] if s["state"] == "running"]
        assert running, doc["sessions"]
        broker = amq_admin.config.brokers[0].label
        assert all(s["broker"] == broker for s in running)
        assert doc["brokers"][0]["broker"] == broker
        assert doc["brokers"][0]["state"] == "up"
        assert doc["ready"] is True
        assert doc["admin_listen"] == f"{address[0]}:{address[1]}"
        code, headers, body = http_get(address, "/metrics")
        assert headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
        assert b'mq_sidecar_sessions{state="running"} ' in body
        assert f'mq_sidecar_upstream_connected{{broker="{broker}"}} '.encode() in body
        assert f'mq_sidecar_broker_up{{broker="{broker}"}} 1.0'.encode() in body
    code, headers, body = http_get(
        address, "/metrics", headers={"Accept": "application/openmetrics-text;version=1.0.0"}
    )
    assert headers["content-type"].startswith("application/openmetrics-text; version=1.0.0")
    assert body.endswith(b"# EOF\n")


def test_curl_smoke(amq_admin: SidecarThread) -> None:
    curl = shutil.which("curl")
    if curl is None:
        pytest.fail("curl is not installed", pytrace=False)
    host, port = admin_address(amq_admin)
    for path in ("/healthz", "/readyz", "/status", "/metrics"):
        result = subprocess.run(
            [curl, "-sf", "--max-time", "10", f"http://{host}:{port}{path}"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 0, (path, result.stderr)
        assert result.stdout
    result = subprocess.run(
        [
            curl,
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "-X",
            "POST",
            f"http://{host}:{port}/metrics",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.stdout == "405"


def test_promtool_accepts_the_live_exposition(amq_admin: SidecarThread) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool (Debian package prometheus): run scripts/setup.sh", pytrace=False)
    dest = unique()
    with client(amq_admin.address) as c:
        c.conn.subscribe(destination=dest, id="1", ack="auto", headers={"receipt": "sub"})
        c.receipt("sub")
        c.conn.send(dest, "counted", headers={"receipt": "s1"})
        c.receipt("s1")
        c.expect("MESSAGE")
        _, _, body = http_get(admin_address(amq_admin), "/metrics")
    result = subprocess.run(
        [promtool, "check", "metrics"], input=body, capture_output=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout + result.stderr == b""


@contextmanager
def prometheus(tmp_path: Path, target: Address, scrape_config: str = "") -> Iterator[Address]:
    """A real Prometheus scraping ``target`` every second (``scrape_config``: more lines of
    its scrape job, indented by four spaces); yields its HTTP address."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("prometheus (Debian package): run scripts/setup.sh", pytrace=False)
    host, port = target
    prom_port = free_port()
    tmp_path.mkdir(parents=True, exist_ok=True)
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: mq-sidecar\n"
        + scrape_config
        + f"    static_configs:\n      - targets: ['{host}:{port}']\n"
    )
    log = tmp_path / "prometheus.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        yield ("127.0.0.1", prom_port)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nprometheus log:\n{log.read_text()[-2000:]}") from None
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=WAIT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def scraped_value(prom: Address, metric: str, at_least: float, timeout: float = 60) -> float:
    """The value Prometheus holds for ``metric`` once it reaches ``at_least``; AssertionError
    (with the last value) after ``timeout`` seconds."""
    query = urllib.parse.urlencode({"query": metric})
    deadline = time.monotonic() + timeout
    value = None
    while time.monotonic() < deadline:
        try:
            code, _, body = http_get(prom, f"/api/v1/query?{query}")
        except OSError:
            code, body = 0, b""
        if code == 200:
            result = json.loads(body)["data"]["result"]
            if result:
                value = float(result[0]["value"][1])
                if value >= at_least:
                    return value
        time.sleep(0.25)
    raise AssertionError(f"{metric} = {value} after {timeout} s, expected >= {at_least}")


def scrape_target(prom: Address) -> dict[str, Any]:
    """Prometheus' one active target."""
    _, _, body = http_get(prom, "/api/v1/targets")
    (target,) = json.loads(body)["data"]["activeTargets"]
    assert isinstance(target, dict)
    return target


def test_a_real_prometheus_scrapes_the_sidecar(amq_admin: SidecarThread, tmp_path: Path) -> None:
    # The metric this test causes: sessions accepted (three app connections).
    for _ in range(3):
        with client(amq_admin.address):
            pass
    expected = amq_admin.statistics().sessions_total
    with prometheus(tmp_path, admin_address(amq_admin)) as prom:
        value = scraped_value(prom, "mq_sidecar_sessions_accepted_total", expected)
        assert value >= expected, (value, expected)
        target = scrape_target(prom)
        assert target["health"] == "up", target


# --------------------------------------------------------------------------------------
# bad requests never disturb STOMP traffic


def test_bad_http_requests_do_not_disturb_stomp(amq_admin: SidecarThread) -> None:
    address = admin_address(amq_admin)
    dest = unique()
    slow: list[socket.socket] = []
    try:
        with client(amq_admin.address) as c:
            c.conn.subscribe(destination=dest, id="1", ack="auto", headers={"receipt": "sub"})
            c.receipt("sub")
            # Slowloris: connections that never finish their request.
            for _ in range(20):
                s = socket.create_connection(address, timeout=WAIT)
                s.sendall(b"GET /metrics HTTP/1.1\r\nHost: t\r\nX-Slow: ")
                slow.append(s)
            # Oversized headers, garbage, wrong methods, unknown paths.
            s = socket.create_connection(address, timeout=WAIT)
            s.sendall(b"GET / HTTP/1.1\r\nHost: t\r\nX-Big: " + b"x" * 20000 + b"\r\n\r\n")
            assert s.recv(100).startswith(b"HTTP/1.1 431 ")
            s.close()
            s = socket.create_connection(address, timeout=WAIT)
            s.sendall(b"\x00\xff garbage \r\n\r\n")
            assert s.recv(100).startswith(b"HTTP/1.1 400 ")
            s.close()
            assert http_get(address, "/status", method="PUT")[0] == 405
            assert http_get(address, "/../etc/passwd")[0] == 404
            # STOMP traffic flows, and the admin plane still answers others.
            for i in range(20):
                c.conn.send(dest, f"m{i}")
            assert [m.body for m in c.messages(20)] == [f"m{i}" for i in range(20)]
            assert http_get(address, "/healthz")[0] == 200
        raw = RawClient(amq_admin.address)
        raw.connect()
        raw.close()
    finally:
        for s in slow:
            s.close()


# --------------------------------------------------------------------------------------
# readiness and events follow a real broker


def test_readiness_flips_when_the_only_broker_stops_and_returns(own_broker: ActiveMQ) -> None:
    config = sidecar_config(own_broker.stomp_url, broker_probe_interval=200, connect_timeout=1000)
    label = config.brokers[0].label
    with SidecarThread(config) as sidecar:
        address = admin_address(sidecar)
        _, body = poll_http(address, "/readyz", 200)
        assert body == f"ready: broker(s) reachable: {label}\n".encode()
        own_broker.stop()
        _, body = poll_http(address, "/readyz", 503)
        assert body.startswith(f"not ready:\n- broker {label}: unreachable: ".encode()), body
        _, _, metrics = http_get(address, "/metrics")
        assert b"mq_sidecar_ready 0.0" in metrics
        assert f'mq_sidecar_broker_up{{broker="{label}"}} 0.0'.encode() in metrics
        own_broker.start()
        own_broker.wait_ready()
        poll_http(address, "/readyz", 200)
        doc = json.loads(http_get(address, "/status")[2])
        assert doc["brokers"][0]["state"] == "up"
        assert doc["brokers"][0]["failures"] >= 1


def test_event_stream_reports_a_stopped_broker(own_broker: ActiveMQ) -> None:
    config = sidecar_config(
        own_broker.stomp_url,
        broker_probe_interval=200,
        connect_timeout=1000,
        retry_interval=100,
        max_retry_interval=200,
        reconnect_period=3000,
    )
    label = config.brokers[0].label
    with SidecarThread(config) as sidecar:
        events = EventStream(admin_address(sidecar))
        try:
            assert events.headers[b"content-type"] == b"text/event-stream; charset=utf-8"
            raw = RawClient(sidecar.address)
            connected = raw.connect()
            session_id = connected.get("session")
            assert session_id
            own_broker.stop()
            kind, data = events.next_event(timeout=20)
            assert kind in ("RECONNECTING", "DISCONNECT"), (kind, data)
            assert data["event"] == kind
            assert data["session_id"] == session_id
            assert data["from_broker"] == label
            if kind == "RECONNECTING":
                # the broker stays down: reconnect_period (3 s) gives up with DISCONNECT
                kind, data = events.next_event(timeout=20)
                assert (kind, data["session_id"]) == ("DISCONNECT", session_id)
        finally:
            events.close()
        wait_until(lambda: not sidecar.statistics().sessions)
