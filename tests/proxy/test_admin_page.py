"""The admin page's serving (proxy/admin/page.py) and what it reads of ``/status``: content
negotiation of ``/``, the page's headers, its files as package data, and the ``/status`` fields
the page shows (app address, outbox backlog, counters for its charts).

The page at work in a real browser is in tests/browser/test_admin_page.py.
"""

from __future__ import annotations

import fnmatch
import re
import tomllib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from protocol import Command
from proxy.admin.page import ASSETS, CONTENT_SECURITY_POLICY, wants_html
from proxy.admin.server import AdminServer
from proxy.app import Sidecar, serve
from proxy.telemetry.metrics import Metrics
from tests.proxy.test_admin_http import Client, FakeSidecar, connect, header, make_admin
from tests.proxy.test_admin_server import GUARD, http, make_config

REPO = Path(__file__).resolve().parents[2]
PAGE_DIR = REPO / "proxy" / "admin" / "page"
BROWSER_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,*/*;q=0.8"

Served = tuple[FakeSidecar, AdminServer, Client]


@pytest.fixture
async def served(nursery: trio.Nursery) -> Served:
    """An admin plane without a token file and a client on a memory stream."""
    sidecar, admin = make_admin()
    return sidecar, admin, connect(admin, nursery)


@pytest.mark.parametrize(
    ("accept", "html"),
    [
        (BROWSER_ACCEPT, True),
        ("text/html", True),
        ("TEXT/HTML; q=0.5", True),
        ("*/*", False),  # curl
        ("", False),
        ("text/plain", False),
        ("text/html;q=0", False),
        ("text/html;q=zero", False),
        ("application/json, text/html;level=1", True),
    ],
)
def test_wants_html(accept: str, html: bool) -> None:
    assert wants_html(accept) is html


async def test_a_browser_gets_the_page_with_its_headers(served: Served) -> None:
    _, _, client = served
    response, body = await client.get("/", headers=(("accept", BROWSER_ACCEPT),))
    assert response.status_code == 200
    assert header(response, b"content-type") == b"text/html; charset=utf-8"
    assert header(response, b"content-security-policy") == CONTENT_SECURITY_POLICY
    assert header(response, b"x-content-type-options") == b"nosniff"
    assert header(response, b"cache-control") == b"no-store"
    assert header(response, b"vary") == b"accept"
    assert body == (PAGE_DIR / "index.html").read_bytes()
    for path, content_type in (
        ("/page.css", b"text/css; charset=utf-8"),
        ("/page.js", b"text/javascript; charset=utf-8"),
    ):
        response, body = await client.get(path)
        assert response.status_code == 200, path
        assert header(response, b"content-type") == content_type
        assert header(response, b"content-security-policy") == CONTENT_SECURITY_POLICY
        assert header(response, b"x-content-type-options") == b"nosniff"
        assert header(response, b"cache-control") == b"no-store"
        assert body == (PAGE_DIR / ASSETS[path][0]).read_bytes()
    response, body = await client.get("/", method="HEAD", headers=(("accept", "text/html"),))
    assert (response.status_code, body) == (200, b"")
    size = len((PAGE_DIR / "index.html").read_bytes())
    assert header(response, b"content-length") == str(size).encode()


async def test_anything_but_a_browser_gets_the_text_index(served: Served) -> None:
    _, _, client = served
    for accept in ("*/*", None, "text/plain"):
        headers = (("accept", accept),) if accept else ()
        response, body = await client.get("/", headers=headers)
        assert response.status_code == 200
        assert header(response, b"content-type") == b"text/plain; charset=utf-8"
        assert body.startswith(b"mq-sidecar ")
        assert b"/status" in body
        assert b"/index.txt" in body
    response, text = await client.get("/index.txt", headers=(("accept", BROWSER_ACCEPT),))
    assert response.status_code == 200
    assert text == body


async def test_the_page_needs_no_token_and_holds_no_data(tmp_path: Path) -> None:
    """With admin_token_file the page's files are still served (they hold nothing the token
    guards), while /status is refused: the page itself asks for the token."""
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    _, admin = make_admin(admin_token_file=str(token))
    async with trio.open_nursery() as nursery:
        client = connect(admin, nursery)
        for path in ASSETS:
            response, body = await client.get(path, headers=(("accept", "text/html"),))
            assert response.status_code == 200, path
            assert b"s3cret" not in body
        response, _ = await client.get("/status")
        assert response.status_code == 401
        nursery.cancel_scope.cancel()


def test_the_page_loads_nothing_from_elsewhere_and_has_no_inline_code() -> None:
    """The CSP allows only this origin's files; the page is written so it needs nothing else:
    no inline script, style or event handler, no absolute URL, no cookie, no query string."""
    html = (PAGE_DIR / "index.html").read_text()
    script = (PAGE_DIR / "page.js").read_text()
    css = (PAGE_DIR / "page.css").read_text()
    assert re.findall(r"<script\b[^>]*>.*?</script>", html, flags=re.S) == [
        '<script src="page.js" defer></script>'
    ]
    assert "<style" not in html
    assert re.search(r"\sstyle=", html) is None
    assert re.search(r"\son[a-z]+=", html) is None
    for text in (html, css):
        assert re.search(r"(src|href)=\"(https?:)?//", text) is None
        assert "url(" not in css
        assert "@import" not in css
    # The only absolute URL in the script is the SVG namespace (a name, never fetched).
    assert set(re.findall(r"https?://[^\s\"']+", script)) == {"http://www.w3.org/2000/svg"}
    assert "document.cookie" not in script
    assert "localStorage" not in script
    assert "innerHTML" not in script
    assert "eval(" not in script
    assert re.search(r"fetch\([^)]*\?", script) is None  # no query string in any request
    assert '"Authorization"' in script or "headers.Authorization" in script


def test_every_file_of_the_page_is_package_data() -> None:
    """An installed wheel holds the page: pyproject's package data covers each file."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["proxy"]
    files = sorted(p.relative_to(REPO / "proxy").as_posix() for p in PAGE_DIR.iterdir())
    assert files == ["admin/page/index.html", "admin/page/page.css", "admin/page/page.js"]
    for name in files:
        assert any(fnmatch.fnmatch(name, pattern) for pattern in patterns), name


# --------------------------------------------------------------------------------------
# what the page reads of /status


def test_metrics_totals_count_sends_messages_and_replays() -> None:
    metrics = Metrics()
    assert metrics.totals() == {"sends": 0, "messages": 0, "replayed_frames": 0}
    metrics.frame_to_broker(Command.SEND, 10)
    metrics.frame_to_broker(Command.SEND, 10)
    metrics.frame_to_broker(Command.ACK, 0)
    metrics.frame_to_app(Command.MESSAGE, 5)
    metrics.frame_to_app(Command.RECEIPT, 0)
    metrics.frames_replayed(3)
    assert metrics.totals() == {"sends": 2, "messages": 1, "replayed_frames": 3}


@asynccontextmanager
async def app_of_an_outbox_sidecar(
    tmp_path: Path, **options: object
) -> AsyncIterator[tuple[Sidecar, trio.SocketStream]]:
    """A real sidecar in outbox mode with no broker (``options`` on top) and an app that sent
    it CONNECT over TCP; both stopped on leaving."""
    config = make_config(outbox=True, outbox_dir=str(tmp_path / "outbox"), **options)
    async with trio.open_nursery() as nursery:
        sidecar: Sidecar = await nursery.start(serve, config)
        assert sidecar.admin is not None
        assert sidecar.listen_address is not None
        app = await trio.open_tcp_stream(*sidecar.listen_address)
        await app.send_all(b"CONNECT\naccept-version:1.2\nhost:/\n\n\0")
        yield sidecar, app
        await app.aclose()
        nursery.cancel_scope.cancel()


async def test_status_names_the_app_address_and_the_outbox_backlog(tmp_path: Path) -> None:
    """A real app connection in outbox mode with no broker: its SEND is stored, not
    confirmed by a broker, so it is the session's outbox backlog; its address is the one
    the app connected from; the totals are there for the page's charts."""
    with trio.fail_after(GUARD):
        async with app_of_an_outbox_sidecar(tmp_path) as (sidecar, app):
            assert sidecar.admin is not None
            await app.send_all(b"SEND\ndestination:/queue/a\nreceipt:r1\n\nhello\0")
            data = b""
            while b"receipt-id:r1" not in data:
                data += await app.receive_some(65536)
            assert data.startswith(b"CONNECTED\n")
            host, port = app.socket.getsockname()[:2]
            status: dict[str, Any] = sidecar.admin.status()
            (session,) = status["sessions"]
            assert session["app_address"] == f"{host}:{port}"
            assert session["outbox_backlog"] == 1
            assert status["totals"] == {"sends": 0, "messages": 0, "replayed_frames": 0}


async def test_status_of_a_session_without_the_outbox_has_no_backlog() -> None:
    with trio.fail_after(GUARD):
        async with trio.open_nursery() as nursery:
            sidecar: Sidecar = await nursery.start(serve, make_config())
            assert sidecar.admin is not None
            assert sidecar.listen_address is not None
            app = await trio.open_tcp_stream(*sidecar.listen_address)
            await app.send_all(b"CONNECT\naccept-version:1.2\nhost:/\n\n\0")
            while not sidecar.statistics().sessions:  # accepted in the sidecar's own task
                await trio.testing.wait_all_tasks_blocked()
            status: dict[str, Any] = sidecar.admin.status()
            (session,) = status["sessions"]
            assert session["outbox_backlog"] is None
            assert session["app_address"] == f"127.0.0.1:{app.socket.getsockname()[1]}"
            await app.aclose()
            assert sidecar.admin_address is not None
            reply = await http(sidecar.admin_address, b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            assert b"/index.txt" in reply
            nursery.cancel_scope.cancel()
