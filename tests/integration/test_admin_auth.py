"""Who may read what, through a running sidecar in front of a real ActiveMQ (issue 15, "Nobody
reads what is not theirs"): the admin token over real HTTP clients (http.client, curl, a real
Prometheus with ``credentials_file``) and the CLI's startup check; the control channel's
``mq-sidecar-scope:all`` rule with stomp.py; ``max_sessions`` with stomp.py and raw clients.

The rules themselves, on memory streams and the mock clock, are in tests/proxy/test_admin_auth.py,
tests/proxy/test_session_control.py and tests/proxy/test_max_sessions.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import stomp

from protocol import Command
from testbed import ActiveMQ
from tests.integration.support import (
    WAIT,
    Client,
    RawClient,
    SidecarThread,
    sidecar_config,
    wait_until,
)
from tests.integration.test_admin import (
    EventStream,
    admin_address,
    http_get,
    poll_http,
    prometheus,
    scrape_target,
    scraped_value,
)
from tests.integration.test_failover import EVENTS, next_event

TOKEN = "adm-4e1b77c2"
CHALLENGE = 'Bearer realm="mq-sidecar"'


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    """The token as Kubernetes mounts a Secret: ``token -> ..data/token``, ``..data ->
    ..v1``; :func:`rotate` swaps ``..data`` as the kubelet does."""
    mount = tmp_path / "admin"
    (mount / "..v1").mkdir(parents=True)
    (mount / "..v1" / "token").write_text(TOKEN + "\n")
    (mount / "..data").symlink_to("..v1")
    (mount / "token").symlink_to("..data/token")
    return mount / "token"


def rotate(token_file: Path, version: str, token: str) -> None:
    mount = token_file.parent
    (mount / version).mkdir()
    (mount / version / "token").write_text(token + "\n")
    (mount / "..data.tmp").symlink_to(version)
    os.replace(mount / "..data.tmp", mount / "..data")


@pytest.fixture
def guarded(activemq: ActiveMQ, token_file: Path) -> Iterator[SidecarThread]:
    config = sidecar_config(
        activemq.stomp_url, broker_probe_interval=200, admin_token_file=str(token_file)
    )
    with SidecarThread(config) as sidecar:
        yield sidecar


# --------------------------------------------------------------------------------------
# the admin token


def test_status_and_events_need_the_token_health_and_metrics_do_not(
    guarded: SidecarThread,
) -> None:
    address = admin_address(guarded)
    for path in ("/status", "/events"):
        code, headers, body = http_get(address, path)
        assert (code, headers["www-authenticate"]) == (401, CHALLENGE), path
        code, headers, _ = http_get(address, path, headers=bearer("not-it"))
        assert code == 401
        assert headers["www-authenticate"] == CHALLENGE + ', error="invalid_token"'
    code, _, body = http_get(address, "/status", method="HEAD")
    assert (code, body) == (401, b"")
    code, headers, body = http_get(address, "/status", headers=bearer(TOKEN))
    assert code == 200
    assert headers["content-type"] == "application/json"
    assert TOKEN.encode() not in body
    events = EventStream(address, bearer(TOKEN))  # asserts 200
    events.close()
    assert http_get(address, "/healthz")[0] == 200
    poll_http(address, "/readyz", 200)
    assert http_get(address, "/")[0] == 200
    code, _, metrics = http_get(address, "/metrics")
    assert code == 200
    assert b"mq_sidecar_admin_unauthorized_total 5.0" in metrics
    assert b'mq_sidecar_admin_http_requests_total{code="401",endpoint="status"} 3.0' in metrics


def test_curl_with_the_token(guarded: SidecarThread) -> None:
    curl = shutil.which("curl")
    if curl is None:
        pytest.fail("curl is not installed", pytrace=False)
    host, port = admin_address(guarded)
    url = f"http://{host}:{port}/status"
    without = subprocess.run(
        [curl, "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "10", url],
        capture_output=True,
        text=True,
        check=False,
    )
    assert without.stdout == "401"
    with_token = subprocess.run(
        [curl, "-sf", "--max-time", "10", "-H", f"Authorization: Bearer {TOKEN}", url],
        capture_output=True,
        text=True,
        check=False,
    )
    assert with_token.returncode == 0, with_token.stderr
    assert '"sessions_open"' in with_token.stdout


def test_a_rotated_token_applies_without_a_restart(
    guarded: SidecarThread, token_file: Path
) -> None:
    address = admin_address(guarded)
    assert http_get(address, "/status", headers=bearer(TOKEN))[0] == 200
    rotate(token_file, "..v2", "adm-rotated-91")
    assert http_get(address, "/status", headers=bearer(TOKEN))[0] == 401
    assert http_get(address, "/status", headers=bearer("adm-rotated-91"))[0] == 200
    # The Secret gone (or not yet mounted): closed with 503, never open; health stays up.
    os.unlink(token_file.parent / "..data")
    code, headers, body = http_get(address, "/status", headers=bearer("adm-rotated-91"))
    assert (code, headers["retry-after"]) == (503, "5")
    assert b"admin_token_file" in body
    assert http_get(address, "/healthz")[0] == 200
    (token_file.parent / "..data").symlink_to("..v2")
    assert http_get(address, "/status", headers=bearer("adm-rotated-91"))[0] == 200


def test_prometheus_scrapes_guarded_metrics_with_a_credentials_file(
    activemq: ActiveMQ, token_file: Path, tmp_path: Path
) -> None:
    config = sidecar_config(
        activemq.stomp_url, admin_token_file=str(token_file), admin_token_metrics=True
    )
    with SidecarThread(config) as sidecar:
        address = admin_address(sidecar)
        assert http_get(address, "/metrics")[0] == 401
        assert http_get(address, "/metrics", headers=bearer(TOKEN))[0] == 200
        # Prometheus reads the same file (a Secret mounted into its pod).
        scrape = f"    authorization:\n      type: Bearer\n      credentials_file: {token_file}\n"
        with prometheus(tmp_path, address, scrape) as prom:
            scraped_value(prom, "mq_sidecar_build_info", 1)
            assert scrape_target(prom)["health"] == "up"
        # Without the token its scrape fails: 401, the target is down.
        with prometheus(tmp_path / "without", address) as prom:
            assert scraped_value(prom, "up", 0) == 0  # the first scrape has run: it failed
            target = scrape_target(prom)
            assert target["health"] == "down", target
            assert "401" in target["lastError"], target


def test_run_exits_1_when_the_token_file_cannot_be_read(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-token"
    result = subprocess.run(
        [sys.executable, "-m", "proxy", "run", "--brokers", "stomp://127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "MQ_SIDECAR_ADMIN_TOKEN_FILE": str(missing)},
    )
    assert result.returncode == 1, result
    assert result.stderr == (f"mq-sidecar: admin_token_file {missing}: No such file or directory\n")


# --------------------------------------------------------------------------------------
# the control channel: every session's events only with the sidecar's client_login


def test_scope_all_without_client_login_is_refused_and_the_session_goes_on(
    activemq: ActiveMQ,
) -> None:
    with SidecarThread(sidecar_config(activemq.stomp_url)) as sidecar:
        c = Client(sidecar.address)
        c.connect()
        c.conn.subscribe(
            destination=EVENTS,
            id="all",
            ack="auto",
            headers={"receipt": "all", "mq-sidecar-scope": "all"},
        )
        error = c.expect("ERROR")
        assert error.headers["message"] == "mq-sidecar-scope:all needs the sidecar's client_login"
        assert error.headers["receipt-id"] == "all"
        c.conn.subscribe(destination=EVENTS, id="own", ack="auto", headers={"receipt": "own"})
        c.receipt("own")
        assert c.conn.is_connected()
        c.close()


def test_scope_all_with_the_sidecars_client_login_sees_other_sessions(tmp_path: Path) -> None:
    broker = ActiveMQ("scope", tmp_path)
    with broker:
        config = sidecar_config(
            broker.stomp_url,
            client_login="ops",
            client_passcode="ops-pw-31",
            retry_interval=100,
            max_retry_interval=200,
            reconnect_period=3000,
        )
        with SidecarThread(config) as sidecar:
            monitor = Client(sidecar.address)
            monitor.connect("ops", "ops-pw-31")
            monitor.conn.subscribe(
                destination=EVENTS,
                id="all",
                ack="auto",
                headers={"receipt": "all", "mq-sidecar-scope": "all"},
            )
            monitor.receipt("all")
            app = RawClient(sidecar.address)
            session_id = app.connect(login="ops", passcode="ops-pw-31").get("session")
            broker.stop()
            event = next_event(monitor, "RECONNECTING", timeout=20, session_id=session_id)
            assert event["from_broker"] == config.brokers[0].label
            monitor.close()
            app.close()


# --------------------------------------------------------------------------------------
# max_sessions


def test_max_sessions_refuses_the_next_connection_naming_the_option(
    activemq: ActiveMQ,
) -> None:
    with SidecarThread(sidecar_config(activemq.stomp_url, max_sessions=2)) as sidecar:
        first, second = Client(sidecar.address), Client(sidecar.address)
        first.connect()
        second.connect()
        # stomp.py: connect() fails, and its listener got the ERROR.
        third = Client(sidecar.address)
        with pytest.raises(stomp.exception.ConnectFailedException):
            third.connect()
        error = third.expect("ERROR")
        assert error.headers["message"] == "too many sessions: max_sessions (2) reached"
        third.expect("DISCONNECTED")
        # A raw client: the ERROR in answer to its CONNECT, then the close.
        raw = RawClient(sidecar.address)
        raw.send_frame("CONNECT", {"accept-version": "1.2", "host": "/"})
        answer = raw.frame()
        assert answer.command is Command.ERROR
        assert answer.get("message") == "too many sessions: max_sessions (2) reached"
        assert raw.closed()
        raw.close()
        _, _, metrics = http_get(admin_address(sidecar), "/metrics")
        assert b"mq_sidecar_sessions_refused_total 2.0" in metrics
        assert len(sidecar.statistics().sessions) == 2
        # One leaves: the next one is let in.
        first.close()
        wait_until(lambda: len(sidecar.statistics().sessions) == 1, timeout=WAIT)
        fourth = Client(sidecar.address)
        fourth.connect()
        assert len(sidecar.statistics().sessions) == 2
        fourth.close()
        second.close()
