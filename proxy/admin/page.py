"""``GET /``: the live admin page for people (docs/operations.md, "The admin page"), and the
plain-text index for everyone else.

The page is three files of this package (``proxy/admin/page/``: ``index.html``, ``page.css``,
``page.js``), read once when the admin plane starts and served as they are: no build step, no
external asset, no inline script or style, so a strict Content-Security-Policy holds
(:data:`PAGE_HEADERS`). Its script reads ``/status`` once a second and ``/events`` with
``fetch()`` (never ``EventSource``, which cannot send ``Authorization``); with
``admin_token_file`` set it asks for the token and sends it as ``Authorization: Bearer``, never
in a cookie or a query string. It shows nothing the endpoints it reads would not show.

``/`` is negotiated: a client whose ``Accept`` names ``text/html`` (a browser) gets the page;
any other (curl's ``*/*``, a script, a probe) the text index, which ``/index.txt`` always
answers.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from importlib.resources import files

import h11

from proxy.admin.http import HTTPConnection, header_value

__all__ = ["ASSETS", "CONTENT_SECURITY_POLICY", "PAGE_HEADERS", "AdminPage", "wants_html"]

#: Nothing but this origin's own script, style and fetches; no frames, forms, plugins or base
#: (CSP Level 3). ``img-src data:`` is for the page's empty ``data:`` favicon, which spares the
#: browser a ``/favicon.ico`` request (a 404).
CONTENT_SECURITY_POLICY = (
    b"default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    b"img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
#: Headers of the page and its assets (``Cache-Control: no-store`` comes with every response
#: of the admin plane): a version upgrade is seen at the next load, never a stale script.
PAGE_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-security-policy", CONTENT_SECURITY_POLICY),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
)
#: Path -> (file in ``proxy/admin/page/``, content type). ``/`` is negotiated (:func:`wants_html`).
ASSETS: dict[str, tuple[str, bytes]] = {
    "/": ("index.html", b"text/html; charset=utf-8"),
    "/page.css": ("page.css", b"text/css; charset=utf-8"),
    "/page.js": ("page.js", b"text/javascript; charset=utf-8"),
}

Handler = Callable[[HTTPConnection, h11.Request], Awaitable[int]]


def wants_html(accept: str) -> bool:
    """Whether an ``Accept`` header value names ``text/html`` with a non-zero ``q`` (RFC 9110
    §12.5.1). ``*/*`` alone does not: curl and scripts keep getting the text index."""
    for media_range in accept.split(","):
        kind, *params = (part.strip() for part in media_range.split(";"))
        if kind.lower() != "text/html":
            continue
        q = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        if q > 0:
            return True
    return False


class AdminPage:
    """The page's files, read from the package once, and their handlers.

    Args:
        text_index: the handler of the plain-text index (``/index.txt``), which ``/`` answers
            to a client that does not ask for HTML.

    Raises:
        OSError: a file of the page is missing from the installed package (a broken install:
            the sidecar does not start half-built).
    """

    def __init__(self, text_index: Handler) -> None:
        self.text_index = text_index
        folder = files("proxy.admin").joinpath("page")
        self.bodies = {
            path: folder.joinpath(name).read_bytes() for path, (name, _) in ASSETS.items()
        }

    async def serve(self, http: HTTPConnection, request: h11.Request) -> int:
        """Answer ``GET``/``HEAD`` of ``/``, ``/page.css`` or ``/page.js``; returns 200."""
        path = request.target.decode("latin-1").partition("?")[0]
        if path == "/" and not wants_html(header_value(request, b"accept")):
            return await self.text_index(http, request)
        _, content_type = ASSETS[path]
        headers = (*PAGE_HEADERS, (b"vary", b"accept")) if path == "/" else PAGE_HEADERS
        await http.respond(200, self.bodies[path], content_type=content_type, headers=headers)
        return 200
