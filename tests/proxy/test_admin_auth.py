"""The admin plane's bearer token (``admin_token_file``) over trio memory streams: which endpoints
need it, the 401 challenge (RFC 6750), the 503 of an unreadable token file, rotation of the file
as Kubernetes does it (a symlink swapped under the mount), and the refusal counter.

The same against a running sidecar, with real HTTP clients and Prometheus, is in
tests/integration/test_admin_auth.py.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import h11
import pytest
import trio

from proxy.admin.http import AUTHENTICATE, TokenUnavailable, read_token
from tests.proxy.test_admin_http import Client, FakeSidecar, connect, header, make_admin

TOKEN = "tok-7f3a9c"
GUARDED = ("/status", "/events")
OPEN = ("/healthz", "/readyz", "/", "/metrics")

Headers = tuple[tuple[str, str], ...]


def bearer(token: str, scheme: str = "Bearer") -> Headers:
    return (("authorization", f"{scheme} {token}"),)


def unauthorized(sidecar: FakeSidecar) -> float:
    value = sidecar.registry.get_sample_value("mq_sidecar_admin_unauthorized_total")
    assert value is not None
    return value


def guarded_admin(
    tmp_path: Path, nursery: trio.Nursery, content: str = TOKEN + "\n", **config: Any
) -> tuple[FakeSidecar, Client, Path]:
    """A sidecar whose ``admin_token_file`` holds ``content``, and a client of its admin plane."""
    token_file = tmp_path / "admin-token"
    token_file.write_text(content)
    sidecar, admin = make_admin(admin_token_file=str(token_file), **config)
    return sidecar, connect(admin, nursery), token_file


async def ask(
    client: Client, path: str, headers: Headers = (), method: str = "GET"
) -> tuple[h11.Response, bytes]:
    """One request: response and body. An accepted ``/events`` gives its head only (the stream
    stays open: the client is not used after it)."""
    response = await client.start(method, path, headers)
    if path == "/events" and response.status_code == 200:
        return response, b""
    body = await client.body()
    if client.conn.our_state is h11.DONE and client.conn.their_state is h11.DONE:
        client.conn.start_next_cycle()
    return response, body


@pytest.mark.parametrize("path", GUARDED)
async def test_guarded_endpoints_need_the_bearer_token(
    tmp_path: Path, nursery: trio.Nursery, path: str
) -> None:
    sidecar, client, _ = guarded_admin(tmp_path, nursery)
    response, body = await ask(client, path)
    assert response.status_code == 401
    assert header(response, b"www-authenticate") == AUTHENTICATE == b'Bearer realm="mq-sidecar"'
    assert b"Authorization: Bearer" in body
    assert TOKEN.encode() not in body
    assert unauthorized(sidecar) == 1
    # A wrong token (RFC 6750 §3.1: invalid_token), another scheme, a prefix of the token.
    for headers, invalid in (
        (bearer("tok-wrong"), True),
        (bearer(TOKEN[:-1]), True),
        (bearer(TOKEN + "0"), True),
        (bearer(TOKEN, scheme="Basic"), False),
        ((("authorization", "Bearer"),), False),
        (bearer(TOKEN) + bearer(TOKEN), False),  # two Authorization headers: neither counts
    ):
        response, _ = await ask(client, path, headers)
        assert response.status_code == 401, headers
        challenge = header(response, b"www-authenticate") or b""
        assert challenge.startswith(AUTHENTICATE)
        assert (b'error="invalid_token"' in challenge) is invalid, headers
    assert unauthorized(sidecar) == 7
    response, _ = await ask(client, path, bearer(TOKEN, scheme="bearer"))  # case-insensitive
    assert response.status_code == 200
    assert unauthorized(sidecar) == 7
    requests = sidecar.registry.get_sample_value(
        "mq_sidecar_admin_http_requests_total", {"endpoint": path[1:], "code": "401"}
    )
    assert requests == 7


async def test_head_is_refused_like_get(tmp_path: Path, nursery: trio.Nursery) -> None:
    _, client, _ = guarded_admin(tmp_path, nursery)
    response, body = await ask(client, "/status", method="HEAD")
    assert (response.status_code, body) == (401, b"")
    assert header(response, b"www-authenticate") == AUTHENTICATE
    response, body = await ask(client, "/status", bearer(TOKEN), method="HEAD")
    assert (response.status_code, body) == (200, b"")


async def test_health_index_and_metrics_stay_open(tmp_path: Path, nursery: trio.Nursery) -> None:
    sidecar, client, _ = guarded_admin(tmp_path, nursery)
    for path in OPEN:
        response, _ = await ask(client, path)
        assert response.status_code in (200, 503), path  # /readyz: no broker probed yet
        assert header(response, b"www-authenticate") is None
    assert unauthorized(sidecar) == 0


async def test_admin_token_metrics_guards_metrics_too(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    _, client, _ = guarded_admin(tmp_path, nursery, admin_token_metrics=True)
    response, _ = await ask(client, "/metrics")
    assert response.status_code == 401
    response, body = await ask(client, "/metrics", bearer(TOKEN))
    assert response.status_code == 200
    assert b"mq_sidecar_admin_unauthorized_total 1.0" in body
    for path in ("/healthz", "/readyz", "/"):
        response, _ = await ask(client, path)
        assert response.status_code != 401


async def test_the_token_is_the_first_line_of_the_file(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    _, client, token_file = guarded_admin(tmp_path, nursery, f"  {TOKEN}\r\nsecond-line\n")
    assert read_token(str(token_file)) == TOKEN.encode()
    assert (await ask(client, "/status", bearer(TOKEN)))[0].status_code == 200
    assert (await ask(client, "/status", bearer("second-line")))[0].status_code == 401
    token_file.write_text(TOKEN)  # no newline at all (kubectl create secret --from-literal)
    assert (await ask(client, "/status", bearer(TOKEN)))[0].status_code == 200


async def test_a_rotated_secret_applies_to_the_next_request(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """Kubernetes mounts a Secret as ``token -> ..data/token``, ``..data -> ..<timestamp>``,
    and rotates it by swapping the ``..data`` symlink (atomic rename)."""
    mount = tmp_path / "secret"
    (mount / "..v1").mkdir(parents=True)
    (mount / "..v1" / "token").write_text("old-token\n")
    (mount / "..data").symlink_to("..v1")
    (mount / "token").symlink_to("..data/token")
    _, admin = make_admin(admin_token_file=str(mount / "token"))
    client = connect(admin, nursery)
    assert (await ask(client, "/status", bearer("old-token")))[0].status_code == 200
    (mount / "..v2").mkdir()
    (mount / "..v2" / "token").write_text("new-token\n")
    (mount / "..data.tmp").symlink_to("..v2")
    os.replace(mount / "..data.tmp", mount / "..data")
    assert (await ask(client, "/status", bearer("old-token")))[0].status_code == 401
    assert (await ask(client, "/status", bearer("new-token")))[0].status_code == 200
    # Rewritten in place (a plain file or a ConfigMap edited by hand) applies as well.
    (mount / "..v2" / "token").write_text("newer-token\n")
    assert (await ask(client, "/status", bearer("new-token")))[0].status_code == 401
    assert (await ask(client, "/status", bearer("newer-token")))[0].status_code == 200


async def test_an_unreadable_token_file_closes_the_guarded_endpoints_with_503(
    tmp_path: Path, nursery: trio.Nursery, caplog: pytest.LogCaptureFixture
) -> None:
    sidecar, client, token_file = guarded_admin(tmp_path, nursery)
    token_file.unlink()
    with caplog.at_level(logging.INFO, logger="mq_sidecar.admin"):
        for headers in ((), bearer(TOKEN), (("authorization", "Bearer"),)):
            response, body = await ask(client, "/status", headers)
            assert response.status_code == 503
            assert b"admin_token_file" in body
            assert header(response, b"retry-after") == b"5"
        assert (await ask(client, "/healthz"))[0].status_code == 200
        assert (await ask(client, "/metrics"))[0].status_code == 200
        errors = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 1, caplog.text  # once, not per request
        assert f"admin_token_file {token_file}: No such file or directory" in errors[0].message
        token_file.write_text("\n\n")  # empty: closed too, with its own reason
        assert (await ask(client, "/status"))[0].status_code == 503
        assert (await ask(client, "/status", bearer("x")))[0].status_code == 503
        errors = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 2
        assert "no token on its first line" in errors[1].message
        token_file.write_text(TOKEN)
        assert (await ask(client, "/status", bearer(TOKEN)))[0].status_code == 200
        assert "readable again" in caplog.records[-1].message
    assert unauthorized(sidecar) == 0  # 503s are not refusals of a client
    assert TOKEN not in caplog.text


def test_read_token_names_the_option_and_never_blocks(tmp_path: Path) -> None:
    with pytest.raises(TokenUnavailable, match=r"^admin_token_file .*/missing: No such file"):
        read_token(str(tmp_path / "missing"))
    with pytest.raises(TokenUnavailable, match="Is a directory"):
        read_token(str(tmp_path))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # no writer: opening it must not wait for one
    with pytest.raises(TokenUnavailable, match="no token on its first line"):
        read_token(str(fifo))
