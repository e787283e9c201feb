"""Logs: one line per event with session id and broker, JSON with ``--log-format json``, and
credentials never in a log line, ``/status`` or ``/metrics`` (docs/operations.md, "Logs").

Every kind of credential is configured with a distinctive value (broker URL userinfo, the
sidecar's own upstream login, the apps' login, and a wrong passcode an app tries; the admin
token and a wrong one a client tries; the password of an encrypted TLS client key, used for a
second, TLS broker), the sidecar is driven through handshakes, a refused login, refused and
accepted admin requests, traffic and a broker outage at DEBUG level, and then the captured
output is searched for each value.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme
from cryptography.hazmat.primitives import serialization

from protocol import Command
from proxy.telemetry.logs import JsonFormatter
from testbed import ActiveMQ, free_port, wait_stomp
from tests.integration.support import WAIT, RawClient, SidecarThread, sidecar_config, wait_until
from tests.integration.test_admin import EventStream, admin_address, http_get

SECRETS = (
    "url-login-q7",
    "url-pass-q7",
    "svc-login-q7",
    "svc-pass-q7",
    "app-login-q7",
    "app-pass-q7",
    "wrong-pass-q7",
    "adm-token-q7",
    "wrong-token-q7",
    "key-pass-q7",
)


@pytest.fixture
def captured_logs() -> Iterator[io.StringIO]:
    """Everything the ``mq_sidecar`` loggers write at DEBUG, as JSON lines."""
    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger("mq_sidecar")
    saved = (root.level, root.propagate)
    root.setLevel(logging.DEBUG)
    root.addHandler(handler)
    try:
        yield buffer
    finally:
        root.removeHandler(handler)
        root.setLevel(saved[0])
        root.propagate = saved[1]


def assert_no_secret(text: str, where: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"{secret!r} appears in {where}"


def encrypted_client_key(tmp_path: Path, password: bytes) -> dict[str, str]:
    """The TLS options of a client certificate whose key is encrypted with ``password``."""
    leaf = trustme.CA().issue_cert("mq-sidecar-client")
    cert, key, password_file = tmp_path / "c.crt", tmp_path / "c.key", tmp_path / "key-password"
    cert.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
    plain = serialization.load_pem_private_key(leaf.private_key_pem.bytes(), None)
    key.write_bytes(
        plain.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(password),
        )
    )
    password_file.write_bytes(password + b"\n")
    return {
        "tls_cert_file": str(cert),
        "tls_key_file": str(key),
        "tls_key_password_file": str(password_file),
    }


def test_credentials_never_appear_in_logs_status_or_metrics(
    tmp_path: Path, captured_logs: io.StringIO
) -> None:
    broker = ActiveMQ("creds", tmp_path)
    token = tmp_path / "admin-token"
    token.write_text("adm-token-q7\n")
    # A TLS broker that never finishes a handshake: each attempt (probes, reconnects) reads
    # the key password and decrypts the key with it, then times out.
    tls_port = socket.create_server(("127.0.0.1", 0))
    with broker, tls_port:
        config = sidecar_config(
            f"failover:(stomp://url-login-q7:url-pass-q7@127.0.0.1:{broker.stomp_port},"
            f"stomp+ssl://127.0.0.1:{tls_port.getsockname()[1]})",
            login="svc-login-q7",
            passcode="svc-pass-q7",
            client_login="app-login-q7",
            client_passcode="app-pass-q7",
            admin_token_file=str(token),
            **encrypted_client_key(tmp_path, b"key-pass-q7"),
            broker_probe_interval=200,
            connect_timeout=1000,
            retry_interval=100,
            max_retry_interval=200,
            reconnect_period=1500,
        )
        with SidecarThread(config) as sidecar:
            address = admin_address(sidecar)
            admin = {"Authorization": "Bearer adm-token-q7"}
            assert http_get(address, "/status")[0] == 401
            wrong = {"Authorization": "Bearer wrong-token-q7"}
            assert http_get(address, "/status", headers=wrong)[0] == 401
            # an app with the right credentials, and traffic
            good = RawClient(sidecar.address)
            connected = good.connect(login="app-login-q7", passcode="app-pass-q7")
            session_id = connected.get("session")
            good.send_frame("SEND", {"destination": "/queue/creds", "receipt": "r1"}, b"x")
            assert good.frame().command is Command.RECEIPT
            # an app with a wrong passcode
            bad = RawClient(sidecar.address)
            bad.send_frame(
                "CONNECT",
                {"accept-version": "1.2", "host": "/", "login": "app-login-q7",
                 "passcode": "wrong-pass-q7"},
            )  # fmt: skip
            assert bad.frame().command is Command.ERROR
            bad.close()
            # readiness probes with the configured credentials have run
            wait_until(lambda: b"ready" in http_get(address, "/readyz")[2])
            # ...and of the TLS broker: the key was decrypted, the handshake timed out.
            tls_label = config.brokers[1].label

            def tls_probed() -> bool:
                doc = json.loads(http_get(address, "/status", headers=admin)[2])
                (tls,) = [b for b in doc["brokers"] if b["broker"] == tls_label]
                return bool(tls["checks"]) and "no CONNECTED within" in str(tls["detail"])

            wait_until(tls_probed)
            status = http_get(address, "/status", headers=admin)[2].decode()
            metrics = http_get(address, "/metrics")[2].decode()
            stream = EventStream(address, admin)
            # a broker outage: session events, failed probes, reconnect attempts, give-up
            broker.stop()
            wait_until(lambda: not sidecar.statistics().sessions, timeout=20)
            good.close()
            sse = [stream.next_event(timeout=20) for _ in range(2)]  # RECONNECTING, DISCONNECT
            stream.close()
    logs = captured_logs.getvalue()
    assert_no_secret(status, "/status")
    assert_no_secret(metrics, "/metrics")
    assert [kind for kind, _ in sse] == ["RECONNECTING", "DISCONNECT"]
    assert_no_secret(json.dumps(sse), "/events")
    assert_no_secret(logs, "the logs")
    lines = [json.loads(line) for line in logs.splitlines()]
    assert all({"ts", "level", "logger", "message"} <= set(line) for line in lines)
    events = [line for line in lines if line["logger"] == "mq_sidecar.events"]
    assert events, "no session event was logged"
    label = config.brokers[0].label
    for line in events:
        assert line["session"] == session_id
        assert line["broker"] == label
        assert line["event"] in ("RECONNECTING", "FAILOVER", "DISCONNECT")
        assert line["message"].startswith(f"session {session_id}: {line['event']}")
        assert "\n" not in line["message"]


def test_cli_json_logs_are_json_lines_without_credentials(
    activemq: ActiveMQ, tmp_path: Path
) -> None:
    port = free_port()
    log = tmp_path / "sidecar.log"
    env = {"MQ_SIDECAR_LOGIN": "svc-login-q7", "MQ_SIDECAR_PASSCODE": "svc-pass-q7"}
    with log.open("w") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "proxy",
                "run",
                "--log-format",
                "json",
                "--log-level",
                "debug",
                "--listen",
                f"127.0.0.1:{port}",
                "--admin-listen",
                "127.0.0.1:0",
                "--brokers",
                f"stomp://url-login-q7:url-pass-q7@127.0.0.1:{activemq.stomp_port}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env},
        )
    try:
        wait_stomp("127.0.0.1", port, timeout=WAIT)
        match = None
        deadline = time.monotonic() + WAIT
        while match is None and time.monotonic() < deadline:
            match = re.search(r"admin plane .* on http://127\.0\.0\.1:(\d+)/", log.read_text())
            time.sleep(0.05)
        assert match, log.read_text()
        admin = ("127.0.0.1", int(match.group(1)))
        raw = RawClient(("127.0.0.1", port))
        raw.connect()
        raw.send_frame("SEND", {"destination": "/queue/cli-json", "receipt": "r"}, b"x")
        assert raw.frame().command is Command.RECEIPT
        raw.close()
        assert http_get(admin, "/healthz")[0] == 200
        assert_no_secret(http_get(admin, "/status")[2].decode(), "/status")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=WAIT) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert_no_secret(text, "the CLI's log")
    lines = [json.loads(line) for line in text.splitlines()]  # every line is one JSON object
    assert any("admin plane" in line["message"] for line in lines)
    assert lines[-1]["message"] == "shutdown complete"
