"""The admin plane's actions (``POST /actions/evacuate``, ``/actions/readmit``, ``/actions/drain``)
over trio memory streams: POST only (405 with ``Allow: POST`` for GET and HEAD), the token always
(403 without a token file, loopback or not; 401 without the token, and nothing done), the body's
fields (400), what cannot be done (409 with the reason), what is done (200), and the log line
and the counter of each.

The sessions' move off an evacuated broker is in test_evacuation.py; the whole of it through a
running sidecar and real brokers in tests/integration/test_evacuation.py.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import h11
import pytest
import trio

from proxy.admin.actions import MAX_BODY_BYTES
from proxy.admin.http import AUTHENTICATE
from proxy.admin.server import AdminServer
from tests.proxy.test_admin_http import Client, FakeSidecar, connect, header, make_admin

TOKEN = "act-5d2e81"
UP = "127.0.0.1:61001"  # make_admin's probe: this one answers
DOWN = "127.0.0.1:61002"  # and this one does not
ACTIONS = ("/actions/evacuate", "/actions/readmit", "/actions/restore", "/actions/drain")


class Asker:
    """A client of the admin plane that opens a new connection when the last answer closed
    its connection (a body left unread: 401, 403, a body too large)."""

    def __init__(self, admin: AdminServer, nursery: trio.Nursery) -> None:
        self.admin = admin
        self.nursery = nursery
        self.client = connect(admin, nursery)
        self.connections = 1

    def fresh(self, *, new: bool = False) -> Client:
        """This connection, or a new one when it is closed (or ``new``: after an idle time
        longer than the server keeps a connection)."""
        if new or self.client.conn.our_state is not h11.IDLE:
            self.client = connect(self.admin, self.nursery)
            self.connections += 1
        return self.client

    async def get(
        self, target: str, method: str = "GET", headers: tuple[tuple[str, str], ...] = ()
    ) -> tuple[h11.Response, bytes]:
        return await self.fresh().get(target, method=method, headers=headers)


async def post(
    asker: Asker,
    target: str,
    body: object = None,
    *,
    token: str | None = TOKEN,
    raw: bytes | None = None,
) -> tuple[h11.Response, dict[str, Any]]:
    """One POST with ``body`` as JSON (or ``raw`` bytes; neither: no body); the response and
    its JSON."""
    client = asker.fresh()
    data = raw if raw is not None else b"" if body is None else json.dumps(body).encode()
    headers = [("host", "a"), ("content-type", "application/json")]
    if token is not None:
        headers.append(("authorization", f"Bearer {token}"))
    if data:
        headers.append(("content-length", str(len(data))))
    await client.send(h11.Request(method="POST", target=target, headers=headers))
    if data:
        await client.send(h11.Data(data=data))
    await client.send(h11.EndOfMessage())
    response = await client.next_event()
    assert isinstance(response, h11.Response), response
    answer = await client.body()
    if client.conn.our_state is h11.DONE and client.conn.their_state is h11.DONE:
        client.conn.start_next_cycle()
    assert header(response, b"content-type") == b"application/json"
    parsed = json.loads(answer)
    assert isinstance(parsed, dict)
    assert isinstance(parsed["message"], str)
    assert parsed["ok"] is (response.status_code == 200)
    return response, parsed


async def acting_admin(
    tmp_path: Path, nursery: trio.Nursery, *, token_file: bool = True
) -> tuple[FakeSidecar, AdminServer, Asker]:
    """A sidecar with an ``admin_token_file`` (or none), its prober's first round done (the
    first broker up, the second down), and a client of its admin plane."""
    config: dict[str, Any] = {}
    if token_file:
        path = tmp_path / "admin-token"
        path.write_text(TOKEN + "\n")
        config["admin_token_file"] = str(path)
    sidecar, admin = make_admin(**config)
    sidecar.admin = admin  # as serve() does: evacuations read its prober
    await nursery.start(admin.prober.run)
    await admin.prober.first_round_done.wait()
    return sidecar, admin, Asker(admin, nursery)


def actions(sidecar: FakeSidecar, action: str, result: str) -> float:
    value = sidecar.registry.get_sample_value(
        "mq_sidecar_admin_actions_total", {"action": action, "result": result}
    )
    assert value is not None
    return value


def evacuated(sidecar: FakeSidecar) -> list[str]:
    return [e.broker for e in sidecar.rotation.evacuations()]


@pytest.mark.parametrize("target", ACTIONS)
@pytest.mark.parametrize("method", ["GET", "HEAD"])
async def test_get_and_head_on_an_action_are_405(
    tmp_path: Path, nursery: trio.Nursery, target: str, method: str
) -> None:
    sidecar, _, client = await acting_admin(tmp_path, nursery)
    response, body = await client.get(target, method=method)
    assert response.status_code == 405
    assert header(response, b"allow") == b"POST"
    if method == "GET":
        assert json.loads(body) == {"ok": False, "message": "method GET not allowed; use POST"}
    assert evacuated(sidecar) == []
    assert not sidecar.shutdown_requested.is_set()
    code = sidecar.registry.get_sample_value(
        "mq_sidecar_admin_http_requests_total", {"endpoint": target[1:], "code": "405"}
    )
    assert code == 1


@pytest.mark.parametrize("target", ACTIONS)
async def test_without_a_token_file_every_action_is_403_even_on_loopback(
    tmp_path: Path, nursery: trio.Nursery, target: str
) -> None:
    """A memory stream counts as loopback (tests/proxy/test_admin_loopback.py): /status
    answers it, the actions do not."""
    sidecar, _, client = await acting_admin(tmp_path, nursery, token_file=False)
    assert (await client.get("/status"))[0].status_code == 200
    body = {"broker": DOWN} if target != "/actions/drain" else {}
    response, answer = await post(client, target, body, token=None)
    assert response.status_code == 403
    assert "admin_token_file" in answer["message"]
    response, _ = await post(client, target, body, token="anything")
    assert response.status_code == 403
    assert evacuated(sidecar) == []
    assert not sidecar.shutdown_requested.is_set()
    assert actions(sidecar, target.rpartition("/")[2], "forbidden") == 2


async def test_a_missing_or_wrong_token_is_401_and_nothing_else(
    tmp_path: Path, nursery: trio.Nursery, caplog: pytest.LogCaptureFixture
) -> None:
    """401 with the challenge, the body not read, nothing done; the attempt is logged with
    who asked and counted, the token never."""
    sidecar, _, client = await acting_admin(tmp_path, nursery)
    caplog.set_level(logging.INFO, "mq_sidecar.admin")
    for token in (None, "wrong", TOKEN + "x"):
        for target, body in (
            ("/actions/evacuate", {"broker": DOWN}),
            ("/actions/drain", {}),
            ("/actions/restore", {"broker": DOWN}),
        ):
            response, answer = await post(client, target, body, token=token)
            assert response.status_code == 401
            challenge = header(response, b"www-authenticate") or b""
            assert challenge.startswith(AUTHENTICATE)
            assert set(answer) == {"ok", "message"}
    assert evacuated(sidecar) == []
    assert not sidecar.shutdown_requested.is_set()
    assert actions(sidecar, "evacuate", "unauthorized") == 3
    assert actions(sidecar, "drain", "unauthorized") == 3
    unauthorized = sidecar.registry.get_sample_value("mq_sidecar_admin_unauthorized_total")
    assert unauthorized == 9
    lines = [r.getMessage() for r in caplog.records if "admin action" in r.getMessage()]
    assert len(lines) == 9
    assert lines[0] == (
        "admin action evacuate asked by local: unauthorized: this action needs "
        "Authorization: Bearer"
    )
    assert not any("wrong" in line or TOKEN in line for line in caplog.messages)
    assert client.connections >= 9  # each answered, then closed: the body was never read


@pytest.mark.parametrize(
    ("target", "raw", "words"),
    [
        ("/actions/evacuate", b"not json", "the body is not JSON"),
        ("/actions/evacuate", b"[1]", "the body must be a JSON object"),
        ("/actions/evacuate", b"{}", 'missing broker: evacuate takes "broker", "for_seconds"'),
        ("/actions/evacuate", b'{"broker": 5}', '"broker" must be a broker label'),
        ("/actions/evacuate", b'{"broker": "%s", "for_second": 5}' % DOWN.encode(), "unknown"),
        ("/actions/evacuate", b'{"broker": "x:1"}', "x:1 is not in the broker list"),
        ("/actions/evacuate", b'{"broker": "%s", "for_seconds": 0}' % DOWN.encode(), "above 0"),
        ("/actions/evacuate", b'{"broker": "%s", "for_seconds": -3}' % DOWN.encode(), "above 0"),
        ("/actions/evacuate", b'{"broker": "%s", "for_seconds": true}' % DOWN.encode(), "above"),
        ("/actions/evacuate", b'{"broker": "%s", "for_seconds": "9"}' % DOWN.encode(), "above"),
        ("/actions/evacuate", b'{"broker": "%s", "for_seconds": 1e400}' % DOWN.encode(), "above"),
        ("/actions/restore", b'{"broker": "%s", "for_seconds": 5}' % DOWN.encode(), "unknown"),
        ("/actions/restore", b'{"broker": "nowhere:61613"}', "not in the broker list"),
        ("/actions/drain", b'{"now": true}', "unknown now: drain takes no field"),
        ("/actions/drain", b"\xff\xfe", "the body is not JSON"),
    ],
)
async def test_a_body_the_action_does_not_take_is_400(
    tmp_path: Path, nursery: trio.Nursery, target: str, raw: bytes, words: str
) -> None:
    sidecar, _, client = await acting_admin(tmp_path, nursery)
    response, answer = await post(client, target, raw=raw)
    assert response.status_code == 400
    assert words in answer["message"]
    assert evacuated(sidecar) == []
    assert not sidecar.shutdown_requested.is_set()
    assert actions(sidecar, target.rpartition("/")[2], "bad_request") == 1
    # The body was read whole: the connection goes on.
    assert header(response, b"connection") is None
    assert (await client.get("/healthz"))[0].status_code == 200
    assert client.connections == 1


async def test_a_body_over_the_bound_is_400_unread(tmp_path: Path, nursery: trio.Nursery) -> None:
    sidecar, _, client = await acting_admin(tmp_path, nursery)
    raw = b'{"broker": "' + b"x" * MAX_BODY_BYTES + b'"}'
    response, answer = await post(client, "/actions/evacuate", raw=raw)
    assert response.status_code == 400
    assert f"at most {MAX_BODY_BYTES}" in answer["message"]
    assert header(response, b"connection") == b"close"
    assert evacuated(sidecar) == []


async def test_an_evacuation_that_would_strand_the_sessions_is_409(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """The only broker that answers cannot be evacuated: the other one is down (the
    prober's words are in the reason). The one that is down can."""
    sidecar, _, client = await acting_admin(tmp_path, nursery)
    response, answer = await post(client, "/actions/evacuate", {"broker": UP})
    assert response.status_code == 409
    assert answer["message"] == (
        f"{UP} not evacuated: no other broker can take the sessions: {DOWN}: down "
        "(connection refused)"
    )
    assert evacuated(sidecar) == []
    response, answer = await post(client, "/actions/evacuate", {"broker": DOWN})
    assert response.status_code == 200
    assert evacuated(sidecar) == [DOWN]
    assert actions(sidecar, "evacuate", "refused") == 1
    assert actions(sidecar, "evacuate", "done") == 1


async def test_evacuate_shows_in_status_and_metrics_then_restore(
    tmp_path: Path,
    nursery: trio.Nursery,
    autojump_clock: trio.testing.MockClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """200 with the evacuation; ``/status``'s broker entry and ``mq_sidecar_broker_evacuated``
    show it until its ``for_seconds`` pass or it is restored; a restore of a broker not
    evacuated is 409."""
    sidecar, _, client = await acting_admin(tmp_path, nursery)
    caplog.set_level(logging.INFO, "mq_sidecar")
    response, answer = await post(client, "/actions/evacuate", {"broker": DOWN, "for_seconds": 60})
    assert response.status_code == 200
    assert answer["message"] == (
        f"{DOWN} evacuated for 60 s: 0 session(s) on it move to another broker at their next "
        "quiet point"
    )
    assert answer["evacuation"]["reason"] == "requested on the admin plane by local"
    assert answer["evacuation"]["seconds_left"] == 60.0
    assert "admin action evacuate asked by local: done" in caplog.text
    assert f"broker {DOWN} evacuated (requested on the admin plane by local) for 60 s" in (
        caplog.text
    )

    async def status_of(label: str) -> dict[str, Any]:
        client.fresh(new=True)  # the clock jumped past the server's idle timeout
        response, body = await client.get(
            "/status", headers=(("authorization", f"Bearer {TOKEN}"),)
        )
        assert response.status_code == 200
        (entry,) = [b for b in json.loads(body)["brokers"] if b["broker"] == label]
        assert isinstance(entry, dict)
        return entry

    def gauge(label: str) -> float | None:
        return sidecar.registry.get_sample_value("mq_sidecar_broker_evacuated", {"broker": label})

    await trio.sleep(20)
    entry = await status_of(DOWN)
    assert entry["evacuated"]["seconds_left"] == pytest.approx(40.0, abs=0.01)
    assert entry["evacuated"]["since_seconds"] == pytest.approx(20.0, abs=0.01)
    assert (await status_of(UP))["evacuated"] is None
    assert (gauge(DOWN), gauge(UP)) == (1, 0)
    await trio.sleep(41)  # its time is up: back in the rotation by itself
    assert (await status_of(DOWN))["evacuated"] is None
    assert gauge(DOWN) == 0
    client.fresh(new=True)
    response, answer = await post(client, "/actions/restore", {"broker": DOWN})
    assert response.status_code == 409
    assert answer["message"] == f"{DOWN} is not evacuated"

    response, _ = await post(client, "/actions/evacuate", {"broker": DOWN})  # until readmitted
    assert response.status_code == 200
    await trio.sleep(3600)
    assert (await status_of(DOWN))["evacuated"]["seconds_left"] is None
    client.fresh(new=True)
    response, answer = await post(client, "/actions/readmit", {"broker": DOWN})
    assert response.status_code == 200
    assert answer["message"] == f"{DOWN} is back in the rotation"
    assert (await status_of(DOWN))["evacuated"] is None
    assert actions(sidecar, "readmit", "done") == 1
    assert actions(sidecar, "restore", "refused") == 1  # the deprecated name still answers


async def test_drain_starts_the_sigterm_drain_once(tmp_path: Path, nursery: trio.Nursery) -> None:
    """With no body or ``{}``: the shutdown SIGTERM starts (``/readyz`` says so); a second
    drain is 409."""
    sidecar, _, client = await acting_admin(tmp_path, nursery)
    response, answer = await post(client, "/actions/drain")
    assert response.status_code == 200
    assert answer["message"].startswith("draining 0 session(s) within drain_timeout (10 s)")
    assert sidecar.shutdown_requested.is_set()
    response, body = await client.get("/readyz")
    assert response.status_code == 503
    assert b"shutting down: draining sessions" in body
    response, answer = await post(client, "/actions/drain", {})
    assert response.status_code == 409
    assert answer["message"] == "a drain is already under way"
    assert actions(sidecar, "drain", "done") == 1
    assert actions(sidecar, "drain", "refused") == 1


async def test_an_unreadable_token_file_is_503(tmp_path: Path, nursery: trio.Nursery) -> None:
    sidecar, _, client = await acting_admin(tmp_path, nursery)
    (tmp_path / "admin-token").unlink()
    response, _ = await post(client, "/actions/drain")
    assert response.status_code == 503
    assert header(response, b"retry-after") == b"5"
    assert not sidecar.shutdown_requested.is_set()
    assert actions(sidecar, "drain", "unavailable") == 1
