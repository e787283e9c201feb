"""The admin plane: HTTP/1.1 with h11 on trio, in the sidecar's own event loop (docs/operations.md).

Endpoints (all ``GET``; ``HEAD`` too, except ``/events``):

==============  ===========================================================================
``/metrics``    Prometheus text exposition of the app's registry; OpenMetrics when ``Accept``
                asks for ``application/openmetrics-text``.
``/healthz``    Liveness: 200 ``ok`` whenever the event loop answers.
``/readyz``     Readiness: 200 when a broker answered a STOMP CONNECT recently and no session
                is stuck beyond ``call_timeout`` (in outbox mode: the outbox open and not
                full, broker or not); 503 with one line per reason otherwise.
``/status``     JSON: brokers and their state, sessions (broker, window, reconnects), version,
                config digest and the redacted config. Never credentials.
``/events``     Server-Sent Events: every RECONNECTING/FAILOVER/DISCONNECT of every session, as
                ``SessionEvent.to_json()``. Slow readers are dropped and counted.
``/``           The live page for people when ``Accept`` names ``text/html`` (a browser), with
                ``/page.css`` and ``/page.js`` (:mod:`proxy.admin.page`); the text index
                otherwise.
``/index.txt``  The text index: one line per endpoint.
==============  ===========================================================================

Actions (``POST /actions/evacuate``, ``/actions/readmit``, ``/actions/drain``) are
:mod:`proxy.admin.actions`': POST only, always with the bearer token.

With ``admin_token_file``, ``/status`` and ``/events`` (and ``/metrics`` with
``admin_token_metrics``) need ``Authorization: Bearer <token>``: 401 with a
``WWW-Authenticate`` challenge otherwise, 503 while the token file cannot be read
(:class:`~proxy.admin.http.BearerToken`); ``/healthz``, ``/readyz``, ``/`` (the page and its
files, which hold no data) and ``/index.txt`` never do
(docs/operations.md, "Admin authentication").

Shape (h11's ``examples/trio-server.py``): :class:`HTTPConnection` glues one
``h11.Connection`` to one stream; :meth:`AdminServer.handle` serves requests on it until the
client leaves, a timeout fires or an error response closes it. Every task lives in the
server's nursery, which ``proxy.app.serve`` owns.

The admin plane must never disturb STOMP traffic, so everything is bounded: connections
(:attr:`AdminLimits.max_connections`), SSE readers, header bytes (431), the time to receive a
request (slowloris: 408 and close), the time to write (a stuck reader is cut off), the events
buffered per SSE reader (the :class:`~proxy.telemetry.events.EventBus` drops it). A bug while
answering one request ends that connection only (500, logged), never the sidecar.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from urllib.parse import urlsplit

import h11
import trio
from prometheus_client.exposition import choose_encoder

from config import Config
from proxy._errors import ListenError
from proxy._version import VERSION
from proxy.admin.actions import AdminActions
from proxy.admin.health import BrokerProber, evaluate_readiness
from proxy.admin.http import (
    AUTHENTICATE,
    GONE,
    BearerToken,
    HTTPConnection,
    TokenCheck,
    format_address,
    has_body,
    head_size,
    header_value,
    peer_is_loopback,
)
from proxy.admin.page import ASSETS, AdminPage
from proxy.admin.sse import EventStream
from proxy.admin.status import status_document
from proxy.telemetry.gauges import SidecarCollector
from proxy.telemetry.statistics import Readiness, SidecarView
from proxy.telemetry.vocabulary import AdminAction

__all__ = ["AdminLimits", "AdminServer", "AdminStatistics"]

log = logging.getLogger("mq_sidecar.admin")

#: accept() errors that mean "out of file descriptors/memory for now" (as trio.serve_listeners).
_ACCEPT_CAPACITY_ERRNOS = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS}


@dataclass(frozen=True, slots=True)
class AdminLimits:
    """Bounds of the admin plane. The defaults suit Prometheus and kubelet probes.

    Attributes:
        max_connections: open HTTP connections; more are answered 503 and closed.
            Prometheus keeps one, kubelet opens one per probe: 64 is plenty.
        max_sse_clients: concurrent ``GET /events`` readers; more get 503.
        max_header_bytes: request line plus headers (h11 ``max_incomplete_event_size``);
            more is answered 431. 8 KiB, as nginx's ``large_client_header_buffers``.
        request_timeout: seconds for a whole request to arrive, counted from the end of the
            previous response (h11's example: a flat 10 s). An idle keep-alive connection is
            closed silently; a partial request (slowloris) gets 408.
        send_timeout: seconds one write may take; a reader that does not read is cut off.
        sse_keepalive: seconds between ``: keep-alive`` comments on an idle event stream, so
            proxies keep it open and a vanished reader is noticed.
    """

    max_connections: int = 64
    max_sse_clients: int = 16
    max_header_bytes: int = 8192
    request_timeout: float = 10.0
    send_timeout: float = 10.0
    sse_keepalive: float = 15.0


@dataclass(frozen=True, slots=True)
class AdminStatistics:
    """Counters of the admin plane (``/status``, metrics)."""

    address: tuple[str, int] | None
    connections: int
    requests: int
    sse_clients: int
    sse_dropped: int
    rejected_connections: int


class _Route:
    """One endpoint: handler, whether HEAD is allowed, whether it needs the admin token, and
    whether it is an action (``post``: the handler checks method and token itself)."""

    __slots__ = ("guarded", "handler", "head", "post")

    def __init__(
        self,
        handler: Callable[[HTTPConnection, h11.Request], Awaitable[int]],
        *,
        head: bool,
        guarded: bool = False,
        post: bool = False,
    ) -> None:
        self.handler = handler
        self.head = head
        self.guarded = guarded
        self.post = post


class AdminServer:
    """The HTTP admin plane of one :class:`~proxy.app.Sidecar`.

    Args:
        sidecar: the daemon to report on; its ``registry``, ``events`` and ``config`` are used.
        limits: bounds (see :class:`AdminLimits`).
        prober: the broker prober; default: a :class:`~proxy.admin.health.BrokerProber` over the
            sidecar's brokers and sessions, run by :meth:`serve`.

    Registers a :class:`~proxy.telemetry.gauges.SidecarCollector` (the gauges) on the sidecar's
    registry.
    """

    def __init__(
        self,
        sidecar: SidecarView,
        *,
        limits: AdminLimits | None = None,
        prober: BrokerProber | None = None,
    ) -> None:
        self.sidecar = sidecar
        self.config: Config = sidecar.config
        self.limits = limits or AdminLimits()
        self.prober = prober or BrokerProber(
            sidecar.config,
            lambda: sidecar.statistics().sessions,
            metrics=sidecar.metrics,
            streams=sidecar.streams,
            brokers=sidecar.rotation.brokers(),
            live_leg=sidecar.live_leg_to,
        )
        self.address: tuple[str, int] | None = None
        self.connections = 0
        self.requests = 0
        self.sse = EventStream(sidecar, self.limits)
        self.rejected_connections = 0
        self._started_at: float | None = None
        token_file = sidecar.config.admin_token_file
        self.token = BearerToken(token_file) if token_file is not None else None
        self.page = AdminPage(self._index)
        self._routes: dict[str, _Route] = {
            "/metrics": _Route(
                self._metrics, head=True, guarded=sidecar.config.admin_token_metrics
            ),
            "/healthz": _Route(self._healthz, head=True),
            "/readyz": _Route(self._readyz, head=True),
            "/status": _Route(self._status, head=True, guarded=True),
            "/events": _Route(self.sse.serve, head=False, guarded=True),
            "/index.txt": _Route(self._index, head=True),
            **{path: _Route(self.page.serve, head=True) for path in ASSETS},
        }
        self.actions = AdminActions(sidecar, self.token)
        for action in AdminAction:
            route = _Route(self.actions.handler(action), head=False, post=True)
            self._routes[f"/actions/{action}"] = route
        sidecar.registry.register(SidecarCollector(sidecar, self))

    # -- public -------------------------------------------------------------------------------

    def statistics(self) -> AdminStatistics:
        """Connections and SSE readers now; requests, drops and rejections so far."""
        return AdminStatistics(
            address=self.address,
            connections=self.connections,
            requests=self.requests,
            sse_clients=self.sse.clients,
            sse_dropped=self.sse.dropped,
            rejected_connections=self.rejected_connections,
        )

    def readiness(self) -> Readiness:
        """The current verdict of ``/readyz`` (reads statistics only; never blocks)."""
        stats = self.sidecar.statistics()
        return evaluate_readiness(
            brokers=self.prober.statistics(),
            sessions=stats.sessions,
            call_timeout=self.config.durations.call_timeout,
            shutting_down=self.sidecar.shutdown_requested.is_set(),
            outbox_mode=self.config.outbox,
            outbox=stats.outbox,
            subscription_down_timeout=self.config.durations.subscription_down_timeout,
        )

    async def serve(
        self, *, task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Bind ``admin_listen``, start the prober, serve until cancelled.

        Reports the bound ``(host, port)`` through ``task_status``.

        Raises:
            ListenError: the admin address cannot be bound.
        """
        host, port = self.config.admin_listen
        try:
            listeners = await trio.open_tcp_listeners(port, host=host)
        except OSError as exc:
            where = format_address(host, port)
            raise ListenError(
                f"cannot listen on {where} (admin_listen): {exc.strerror or exc}"
            ) from exc
        sockname = listeners[0].socket.getsockname()
        self.address = (str(sockname[0]), int(sockname[1]))
        self._started_at = trio.current_time()
        log.info(
            "admin plane (metrics, health, status, events) on http://%s/",
            format_address(*self.address),
        )
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(self.prober.run)
                for listener in listeners:
                    nursery.start_soon(self._accept_loop, listener, nursery)
                task_status.started(self.address)
        finally:
            for listener in listeners:
                await trio.aclose_forcefully(listener)

    async def handle(self, stream: trio.abc.Stream) -> None:
        """Serve HTTP requests on ``stream`` until the client leaves; always closes it.

        This is the connection boundary: nothing a client sends, and no bug in a handler,
        raises out of here (only cancellation does).
        """
        if self.connections >= self.limits.max_connections:
            self.rejected_connections += 1
            self._count("rejected", 503)
            await self._reject(stream)
            return
        self.connections += 1
        http = HTTPConnection(stream, self.limits.max_header_bytes)
        try:
            await self._serve_requests(http)
        except GONE:
            pass  # the client went away mid-response
        except Exception:
            log.exception("admin plane: internal error; closing the connection")
            if http.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                with (
                    trio.move_on_after(self.limits.send_timeout),
                    contextlib.suppress(*GONE, h11.ProtocolError),
                ):
                    await http.respond(500, b"internal error; see the sidecar's log\n", close=True)
        finally:
            self.connections -= 1
            await http.close()

    # -- connections --------------------------------------------------------------------------

    async def _accept_loop(self, listener: trio.SocketListener, nursery: trio.Nursery) -> None:
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:
                if exc.errno in _ACCEPT_CAPACITY_ERRNOS:
                    log.error("admin plane: accept failed (%s); retrying in 0.1 s", exc)
                    await trio.sleep(0.1)
                    continue
                # Not worth the sidecar's life: STOMP goes on, /healthz stops answering.
                log.exception("admin plane: accept failed; no longer accepting")
                return
            nursery.start_soon(self.handle, stream)

    async def _reject(self, stream: trio.abc.Stream) -> None:
        body = b"too many admin connections\n"
        data = (
            b"HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\nretry-after: 1\r\n"
            b"content-type: text/plain; charset=utf-8\r\ncontent-length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
            + body
        )
        try:
            with trio.move_on_after(self.limits.send_timeout), contextlib.suppress(*GONE):
                await stream.send_all(data)
        finally:
            await trio.aclose_forcefully(stream)

    async def _serve_requests(self, http: HTTPConnection) -> None:
        limits = self.limits
        while True:
            http.cycle_bytes = 0
            http.head = False  # a bad request after a HEAD is answered with its body
            try:
                with trio.fail_after(limits.request_timeout):
                    event = await http.next_event()
                    if isinstance(event, h11.Request) and not has_body(event):
                        end = await http.next_event()  # bodiless: EndOfMessage at once
                        assert isinstance(end, h11.EndOfMessage)
            except trio.TooSlowError:
                if http.cycle_bytes:  # a request started but never finished: slowloris
                    log.debug(
                        "admin plane: request not received within %g s", limits.request_timeout
                    )
                    self._count("timeout", 408)
                    with trio.move_on_after(limits.send_timeout):
                        await http.respond(408, b"request timeout\n", close=True)
                return
            except h11.RemoteProtocolError as exc:
                status = exc.error_status_hint
                self._count("bad_request", status)
                if http.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                    message = f"{HTTPStatus(status).phrase}: {exc}\n".encode()
                    with trio.move_on_after(limits.send_timeout):
                        await http.respond(status, message, close=True)
                return
            if not isinstance(event, h11.Request):
                return  # ConnectionClosed (or PAUSED, which cannot happen at a cycle start)
            # Before any answer, the 431 too: a response to a HEAD has no body (h11 refuses
            # one), whatever its status.
            http.head = event.method == b"HEAD"
            if head_size(event) > limits.max_header_bytes:
                # h11 bounds only a head still incomplete; one that arrived whole is checked here.
                self._count("bad_request", 431)
                await http.respond(431, b"request header fields too large\n", close=True)
                return
            http.must_close = has_body(event)  # a body we will not read: answer, then close
            # The event stream bounds each of its writes itself; other responses get one
            # deadline for the whole answer, after which a reader that does not read is cut off.
            deadline = trio.current_time() + limits.send_timeout
            with trio.move_on_at(math.inf if self._is_events(event) else deadline):
                await self._dispatch(http, event)
            if http.conn.our_state is not h11.DONE or http.conn.their_state is not h11.DONE:
                return  # MUST_CLOSE, or an unread request body: no keep-alive
            http.conn.start_next_cycle()

    @staticmethod
    def _is_events(request: h11.Request) -> bool:
        return urlsplit(request.target.decode("latin-1")).path == "/events"

    async def _dispatch(self, http: HTTPConnection, request: h11.Request) -> None:
        self.requests += 1
        path = urlsplit(request.target.decode("latin-1")).path
        route = self._routes.get(path)
        if route is None:
            self._count("other", 404)
            await http.respond(404, f"no such endpoint: {path}\n".encode())
            return
        endpoint = "index" if path == "/" else path.lstrip("/")
        if route.post:  # an action: POST only, the token always (proxy.admin.actions)
            self._count(endpoint, await route.handler(http, request))
            return
        allowed = b"GET, HEAD" if route.head else b"GET"
        if request.method not in (b"GET", b"HEAD") or (
            request.method == b"HEAD" and not route.head
        ):
            self._count(endpoint, 405)
            method = request.method.decode("latin-1")
            await http.respond(
                405,
                f"method {method} not allowed; use {allowed.decode()}\n".encode(),
                headers=((b"allow", allowed),),
            )
            return
        if route.guarded and self.token is None and not peer_is_loopback(http.stream):
            # Safe by default (docs/operations.md, "Admin authentication"): without a token
            # file, what a token would guard is for this machine's own clients only.
            status = await self._forbid(http, endpoint)
        else:
            check = self.token.check(request) if route.guarded and self.token else TokenCheck.OK
            if check is TokenCheck.OK:
                status = await route.handler(http, request)
            else:
                status = await self._refuse(http, check, endpoint)
        self._count(endpoint, status)

    async def _forbid(self, http: HTTPConnection, endpoint: str) -> int:
        """403 for a guarded endpoint asked from a non-loopback address while no
        ``admin_token_file`` is set; counted like a 401
        (``mq_sidecar_admin_unauthorized_total``)."""
        self.sidecar.metrics.admin_unauthorized()
        log.debug("admin plane: /%s refused to a non-loopback client without a token", endpoint)
        body = (
            f"/{endpoint} is answered only to loopback clients while no admin_token_file is "
            "set; set admin_token_file to reach it from elsewhere (docs/operations.md)\n"
        ).encode()
        with trio.move_on_after(self.limits.send_timeout):
            await http.respond(403, body)
        return 403

    async def _refuse(self, http: HTTPConnection, check: TokenCheck, endpoint: str) -> int:
        """401 without the admin token (RFC 6750 §3: ``invalid_token`` for a wrong one), 503
        while the token file cannot be read (:class:`~proxy.admin.http.BearerToken` logged
        why). Bounded by ``send_timeout`` (``/events`` requests have no other deadline)."""
        if check is TokenCheck.UNAVAILABLE:
            status = 503
            body = b"the admin token cannot be read (admin_token_file); see the sidecar's log\n"
            headers = ((b"retry-after", b"5"),)
        else:
            status = 401
            self.sidecar.metrics.admin_unauthorized()
            log.debug("admin plane: /%s refused: %s admin token", endpoint, check.value)
            challenge = AUTHENTICATE
            if check is TokenCheck.INVALID:
                challenge += b', error="invalid_token"'
            body = b"this endpoint needs Authorization: Bearer <the admin token>\n"
            headers = ((b"www-authenticate", challenge),)
        with trio.move_on_after(self.limits.send_timeout):
            await http.respond(status, body, headers=headers)
        return status

    def _count(self, endpoint: str, status: int) -> None:
        self.sidecar.metrics.http_request(endpoint, status)

    # -- endpoints ----------------------------------------------------------------------------

    async def _index(self, http: HTTPConnection, request: h11.Request) -> int:
        body = (
            f"mq-sidecar {VERSION} admin plane\n"
            "/metrics  Prometheus metrics (OpenMetrics with Accept: application/openmetrics-text)\n"
            "/healthz  liveness\n/readyz   readiness (a broker reachable, no session stuck; "
            "outbox mode: the outbox open, not full)\n"
            "/status   JSON status\n/events   Server-Sent Events: RECONNECTING, FAILOVER, "
            "DISCONNECT, OUTCOME, SPOOLING, SPOOL_DRAINED, OUTBOX_FORWARDING, OUTBOX_FORWARDED\n"
            "/         the live page (in a browser; this index otherwise: /index.txt)\n"
            "POST /actions/evacuate, /actions/readmit, /actions/drain  the operator's actions "
            "(admin token)\n"
        ).encode()
        await http.respond(200, body)
        return 200

    async def _metrics(self, http: HTTPConnection, request: h11.Request) -> int:
        encoder, content_type = choose_encoder(header_value(request, b"accept"))
        body = encoder(self.sidecar.registry)
        await http.respond(200, body, content_type=content_type.encode())
        return 200

    async def _healthz(self, http: HTTPConnection, request: h11.Request) -> int:
        await http.respond(200, b"ok\n")
        return 200

    async def _readyz(self, http: HTTPConnection, request: h11.Request) -> int:
        verdict = self.readiness()
        status = 200 if verdict.ready else 503
        await http.respond(status, verdict.text().encode())
        return status

    async def _status(self, http: HTTPConnection, request: h11.Request) -> int:
        body = json.dumps(self.status(), indent=2, sort_keys=True, default=str).encode() + b"\n"
        await http.respond(200, body, content_type=b"application/json")
        return 200

    def status(self) -> dict[str, object]:
        """The ``/status`` document (JSON-able, :func:`proxy.admin.status.status_document`).
        Never contains a credential."""
        return status_document(
            self.sidecar,
            readiness=self.readiness(),
            probes=self.prober.statistics(),
            admin=dataclasses.asdict(self.statistics()),
            admin_address=self.address,
            started_at=self._started_at,
        )
