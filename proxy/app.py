"""The daemon: the STOMP listener, one :class:`Session` per app connection, the admin plane,
graceful shutdown.

``serve`` is the root of the task tree (docs/architecture.md: "Every task has an owner",
"Readiness is reported, never waited for", "Shutdown is a phase with a deadline"): it binds the
listener, starts the admin plane (``proxy.admin``: metrics, health, status, events) and the
event log in the same nursery, reports the :class:`Sidecar` through ``task_status`` once both
listeners are bound (tests and readiness wait on that, never on a sleep), accepts connections
into a sessions nursery it owns, and on shutdown stops accepting and asks every session to
drain (:meth:`proxy.session.Session.request_drain`: no new frames from its app, the receipts of
what is in flight handed over until ``drain_timeout``, what is still unconfirmed then named to
the app, DISCONNECT upstream, ERROR to the app); a backstop cancels whatever still runs a few
seconds after that deadline. The admin plane answers during the drain (``/readyz`` says
"shutting down").

The :class:`Sidecar` owns what sessions report into: the Prometheus ``registry`` (never the
global one), the :class:`~proxy.telemetry.metrics.Metrics` recorded on it, and the
:class:`~proxy.telemetry.events.EventBus` of session events. What changes the brokers the
sessions use (the live broker list, the admin plane's evacuations and readmissions) is its
:class:`~proxy.rotation.BrokerRotation`.

At most ``max_sessions`` sessions are open at once (those still reading their CONNECT count). A
connection beyond that gets no :class:`Session`: its CONNECT (a small frame, read within
``handshake_timeout``) is answered with an ERROR naming the option and the connection closes;
it is counted (``mq_sidecar_sessions_refused_total``) and logged at most once a minute.

One memory budget bounds what all sessions hold together (``max_memory_bytes``; the
accounting is :mod:`proxy.tracking.budget`'s, the waiting :mod:`proxy.legs.memory`'s): while
it is over, apps are not read and a new connection is refused the same way, its ERROR naming
that option.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import resource
import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio
from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector

import protocol
from config import Config
from proxy._errors import FileLimitTooLow, ListenError, OutboxUnusable, TracingUnavailable
from proxy.admin.server import AdminLimits, AdminServer
from proxy.legs.memory import MemoryBudgetGate, refusal
from proxy.legs.opening import BrokerStreams
from proxy.legs.stream import RECEIVE_SIZE, FrameStream, TransportLost
from proxy.outbox.forwarder import OutboxForwarder
from proxy.outbox.service import OutboxService, forward_before_exit, open_outbox
from proxy.reconnect.board import ReconnectBoard
from proxy.reconnect.discovery import NoBrokers
from proxy.reconnect.resolve import Resolve
from proxy.reload import reload_on_signal
from proxy.rotation import BrokerRotation
from proxy.session import Session
from proxy.session.ending import error_frame
from proxy.shutdown import drain_sessions, log_drain, shutdown_on_signals
from proxy.telemetry.events import EventBus
from proxy.telemetry.logs import log_session_event
from proxy.telemetry.metrics import Metrics
from proxy.telemetry.statistics import SidecarStatistics
from proxy.tracking.budget import FRAME_COST, MemoryBudget

if TYPE_CHECKING:  # imported at run time only when tracing is on (start_tracing)
    from proxy.telemetry.tracing import Tracing

__all__ = [
    "FILES_BESIDE_SESSIONS",
    "FileLimitTooLow",
    "ListenError",
    "NoBrokers",
    "OutboxUnusable",
    "Sidecar",
    "SidecarStatistics",
    "TracingUnavailable",
    "fit_file_limit",
    "serve",
    "start_tracing",
]

log = logging.getLogger("mq_sidecar.app")

#: accept() errors that mean "out of file descriptors/memory for now": retry, don't die
#: (the same set as trio.serve_listeners).
_ACCEPT_CAPACITY_ERRNOS = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS}
_ACCEPT_RETRY_SECONDS = 0.1
#: Connections refused for ``max_sessions`` that may wait for their CONNECT at once; more are
#: closed without an answer (each holds a socket until its CONNECT or ``handshake_timeout``).
_MAX_REFUSING = 64
#: What a refused connection may send before its answer: a CONNECT takes a few hundred bytes.
_REFUSAL_LIMITS = protocol.Limits(
    max_frame_bytes=65536, max_headers=100, max_header_line_bytes=16384
)
#: Seconds the refusal's ERROR may take to write.
_REFUSAL_SEND_SECONDS = 2.0
#: Seconds between log lines about refused connections (a flood is one line a minute).
_REFUSAL_LOG_INTERVAL = 60.0


class _Refusals:
    """Connections refused for ``max_sessions``: those waiting for their CONNECT now, and the
    log lines about them (the first, then at most one per :data:`_REFUSAL_LOG_INTERVAL`, each
    saying how many went unlogged since the one before)."""

    def __init__(self) -> None:
        self.waiting = 0
        self._logged_at: float | None = None
        self._unlogged = 0

    def log(self, why: str) -> None:
        now = trio.current_time()
        if self._logged_at is not None and now - self._logged_at < _REFUSAL_LOG_INTERVAL:
            self._unlogged += 1
            return
        more = f"; {self._unlogged} more refused since the last such line" if self._unlogged else ""
        log.warning("refused an app connection: %s%s", why, more)
        self._logged_at = now
        self._unlogged = 0


class Sidecar:
    """The running daemon's state: configuration, live sessions, shutdown trigger.

    Args:
        config: validated configuration.
        resolve: the DNS lookup of the broker list's names (tests); default: dnspython's.

    Attributes:
        registry: this sidecar's Prometheus registry (``/metrics``), with the process,
            platform and GC collectors of prometheus-client.
        metrics: the counters and histograms the session code records into.
        events: the bus of RECONNECTING/FAILOVER/DISCONNECT events (in-band control channel,
            ``GET /events``, the event log).
        admin: the admin plane once :func:`serve` has started it.
        reconnects: the board the sessions report their reconnects to, where a new
            session's first connection waits for their outcome (docs/behaviour.md, "Broker
            list and reconnect policy").
        streams: opens every broker connection (sessions and readiness probes), with TLS
            built from the configuration at each connect; its ``tracker`` holds what each
            TLS broker's certificate said (``/status``, the expiry gauge).
        outbox: the outbox (``outbox`` on; :mod:`proxy.outbox.service`), open while :meth:`serve`
            runs; None otherwise.
        forwarder: the outbox forwarder (:mod:`proxy.outbox.forwarder`), with the outbox.
        tracing: the sessions' tracing (``tracing = true``, :func:`start_tracing`), or None.
        rotation: the brokers in rotation (:mod:`proxy.rotation`): the live broker list (DNS
            names, the brokers file, what a SIGHUP changes), evacuations and readmissions; the
            list in force is ``reconnects.brokers``.
    """

    def __init__(
        self, config: Config, *, tracing: Tracing | None = None, resolve: Resolve | None = None
    ) -> None:
        self.config = config
        self.tracing = tracing
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        static = [b for b in config.brokers if not b.dns]  # DNS names: resolved at start
        self.metrics = Metrics(self.registry, brokers=[b.label for b in static])
        self.events = EventBus()
        self.reconnects = ReconnectBoard(static, max_connecting=config.max_connecting)
        self.rotation = BrokerRotation(
            config,
            self.reconnects,
            self.metrics,
            brokers_of_sessions=lambda: (s.statistics().broker for s in self.sessions),
            prober=lambda: self.admin.prober if self.admin is not None else None,
            resolve=resolve,
        )
        self.streams = BrokerStreams(config)
        self.admin: AdminServer | None = None
        self.outbox: OutboxService | None = None
        self.forwarder: OutboxForwarder | None = None
        self.sessions: set[Session] = set()
        #: The process's memory budget (``max_memory_bytes``) and the app reads waiting for it.
        self.memory = MemoryBudgetGate(
            MemoryBudget(
                config.max_memory_bytes,
                reserve=FRAME_COST * config.max_frame_bytes + RECEIVE_SIZE,
                broker_read=FRAME_COST * RECEIVE_SIZE,
            )
        )
        self.listen_address: tuple[str, int] | None = None
        self.admin_address: tuple[str, int] | None = None
        self.shutdown_requested = trio.Event()
        self.stopped = trio.Event()
        self._prefix = secrets.token_hex(3)
        self._counter = itertools.count(1)
        self.sessions_total = 0
        self._refusals = _Refusals()
        #: When the drain's wait for receipts ends (trio seconds), once shutdown began.
        self._drain_deadline: float | None = None

    def request_shutdown(self) -> None:
        """Begin a graceful shutdown (what SIGTERM/SIGINT do)."""
        self.shutdown_requested.set()

    @property
    def draining(self) -> bool:
        """Whether the sessions were asked to drain (the listener is closed)."""
        return self._drain_deadline is not None

    def live_leg_to(self, broker: str) -> bool:
        """Whether a running session has a live leg to the broker labelled ``broker`` (what
        :meth:`statistics` would show, without building every session's statistics)."""
        return any(s.live_broker() == broker for s in self.sessions)

    def statistics(self) -> SidecarStatistics:
        """Listener address and per-session statistics."""
        return SidecarStatistics(
            listen=self.listen_address,
            sessions_total=self.sessions_total,
            sessions=tuple(s.statistics() for s in self.sessions),
            admin_listen=self.admin_address,
            outbox=self.outbox.statistics() if self.outbox is not None else None,
            memory=self.memory.budget.statistics(),
        )

    async def serve(
        self, *, task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Run until :meth:`request_shutdown`, then drain within ``drain_timeout``.

        With ``outbox`` on, the outbox is opened first (:func:`proxy.outbox.service.open_outbox`)
        and stays open until every session has ended. Reports the bound ``(host, port)`` through
        ``task_status``.

        Raises:
            ListenError: the listen address cannot be bound (in use, permission).
            OutboxUnusable: ``outbox_dir`` is locked by another sidecar or unusable.
        """
        await self.rotation.start()
        if not self.config.outbox:
            await self._serve(task_status)
            self._stopped()
            return
        async with open_outbox(self.config, self.metrics) as outbox, trio.open_nursery() as nursery:
            self.outbox = outbox
            # Frames no live session forwards: a previous process's, an ended session's.
            self.forwarder = OutboxForwarder(
                self.config,
                outbox,
                self.streams,
                self.metrics,
                self._prefix,
                reconnects=self.reconnects,
                events=self.events,
            )
            await nursery.start(self.forwarder.run)
            try:
                await self._serve(task_status)
                assert self._drain_deadline is not None
                await forward_before_exit(outbox, self._drain_deadline)
            finally:
                nursery.cancel_scope.cancel()
                self.outbox = None
        self._stopped()

    def _stopped(self) -> None:
        log.info("shutdown complete")
        self.stopped.set()

    async def _serve(self, task_status: trio.TaskStatus[tuple[str, int]]) -> None:
        host, port = self.config.listen
        try:
            listeners = await trio.open_tcp_listeners(port, host=host)
        except OSError as exc:
            raise ListenError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
        sockname = listeners[0].socket.getsockname()
        self.listen_address = (str(sockname[0]), int(sockname[1]))
        log.info("listening for STOMP on %s:%d", *self.listen_address)
        async with trio.open_nursery() as sessions_nursery:
            try:
                async with trio.open_nursery() as accept_nursery:
                    for listener in listeners:
                        accept_nursery.start_soon(self._accept_loop, listener, sessions_nursery)
                    task_status.started(self.listen_address)
                    await self.shutdown_requested.wait()
                    accept_nursery.cancel_scope.cancel()
            finally:
                # Also when cancelled (e.g. the admin plane failed to bind): never leak a socket.
                for listener in listeners:
                    await trio.aclose_forcefully(listener)
            draining = list(self.sessions)
            self._drain_deadline = drain_sessions(
                draining, self.config.durations.drain_timeout, sessions_nursery.cancel_scope
            )
        log_drain(draining)

    async def _accept_loop(
        self, listener: trio.SocketListener, sessions_nursery: trio.Nursery
    ) -> None:
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:
                if exc.errno in _ACCEPT_CAPACITY_ERRNOS:
                    log.error("accept failed (%s); retrying in %g s", exc, _ACCEPT_RETRY_SECONDS)
                    await trio.sleep(_ACCEPT_RETRY_SECONDS)
                    continue
                raise
            sessions_nursery.start_soon(self._run_session, stream)

    async def _run_session(self, stream: trio.abc.Stream) -> None:
        limit = self.config.max_sessions
        if len(self.sessions) >= limit:
            await self._refuse(
                stream,
                f"max_sessions ({limit}) reached",
                "too many sessions",
                f"mq-sidecar serves at most {limit} app sessions at once (max_sessions); this "
                "connection is closed. Connect again once a session has ended.",
            )
            return
        budget = self.memory.budget
        if budget.over:
            budget.refused_total += 1
            await self._refuse(stream, *refusal(budget, self.config.max_frame_bytes))
            return
        # <6 hex digits>-<n>: the shape proxy.tracking.SIDECAR_RECEIPT recognises.
        session_id = f"{self._prefix}-{next(self._counter)}"
        session = Session(
            self.config,
            stream,
            session_id,
            bus=self.events,
            metrics=self.metrics,
            reconnects=self.reconnects,
            open_stream=self.streams,
            outbox=self.outbox,
            tracing=self.tracing,
            memory=self.memory,
        )
        self.sessions.add(session)
        self.sessions_total += 1
        if self._drain_deadline is not None:  # accepted just before the listener closed
            session.request_drain(self._drain_deadline)
        try:
            await session.run()
        finally:
            self.sessions.discard(session)

    async def _refuse(self, stream: trio.abc.Stream, why: str, what: str, detail: str) -> None:
        """Answer a connection over ``max_sessions`` or ``max_memory_bytes`` without a Session:
        read its first frame (its CONNECT: at most :data:`_REFUSAL_LIMITS`, within
        ``handshake_timeout``), answer an ERROR (message ``<what>: <why>``, ``why`` naming the
        option; ``detail`` its body), close. Past :data:`_MAX_REFUSING` at once: close at
        once."""
        refusals = self._refusals
        self.metrics.session_refused()
        refusals.log(why)
        if refusals.waiting >= _MAX_REFUSING:
            await trio.aclose_forcefully(stream)
            return
        refusals.waiting += 1
        conn = protocol.Connection(protocol.Role.SERVER, _REFUSAL_LIMITS, judge_frames=False)
        app = FrameStream(stream, conn, grace=self.config.heartbeat_grace)
        try:
            with trio.move_on_after(self.config.durations.handshake_timeout):
                try:
                    while isinstance(event := await app.receive_event(), protocol.HeartBeat):
                        pass
                    if isinstance(event, protocol.ConnectionClosed):
                        return
                except protocol.RemoteProtocolError:
                    pass  # more than a CONNECT, or not STOMP: the refusal says why all the same
                except TransportLost:
                    return
            refusal = error_frame(f"{what}: {why}", detail=detail)
            with (
                trio.move_on_after(_REFUSAL_SEND_SECONDS),
                contextlib.suppress(TransportLost, protocol.LocalProtocolError),
            ):
                await app.send(refusal)
        finally:
            refusals.waiting -= 1
            await trio.aclose_forcefully(stream)


async def _log_events(events: EventBus) -> None:
    """One log line per session event (with session id and broker), for as long as it runs."""
    while True:
        with events.subscribe() as channel:
            async for event in channel:
                log_session_event(event)
        # Dropped for being slow (a burst larger than the bus buffer): say so, subscribe again.
        log.warning("event log fell behind; some session events were not logged")


def start_tracing(config: Config) -> Tracing | None:
    """The sidecar's tracing when ``tracing = true`` (:meth:`Tracing.from_environment
    <proxy.telemetry.tracing.Tracing.from_environment>`: OpenTelemetry's ``OTEL_*``
    variables); None when off, and then OpenTelemetry is never imported.

    Raises:
        TracingUnavailable: tracing is on and the ``otel`` extra is not installed, or the
            exporter asked for cannot be made.
    """
    if not config.tracing:
        return None
    try:
        from proxy.telemetry.tracing import Tracing  # noqa: PLC0415 (only when tracing is on)
    except ImportError as exc:
        raise TracingUnavailable(
            f"tracing = true, but OpenTelemetry is not installed ({exc}): install mq-sidecar[otel]"
        ) from None
    return Tracing.from_environment()


#: Open files the daemon needs beside its sessions' sockets: listeners, admin connections and
#: SSE readers (bounded by AdminLimits), broker probes, DNS, logs, the outbox's database.
FILES_BESIDE_SESSIONS = 256


def fit_file_limit(max_sessions: int) -> int:
    """Raise this process's soft open-file limit (``RLIMIT_NOFILE``) to what ``max_sessions``
    needs: two sockets per session (the app's, the broker's) and
    :data:`FILES_BESIDE_SESSIONS`, up to the hard limit; a soft limit already as high is
    left alone. Returns the soft limit in force.

    Raises:
        FileLimitTooLow: the hard limit is lower than what is needed (both numbers and the
            option named).
    """
    needed = 2 * max_sessions + FILES_BESIDE_SESSIONS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return soft
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise FileLimitTooLow(
            f"max_sessions ({max_sessions}) needs {needed} open files (two sockets per session "
            f"and {FILES_BESIDE_SESSIONS} for the rest), the open-file limit allows {hard} "
            "(RLIMIT_NOFILE, hard): lower max_sessions or raise the limit (ulimit -n, the "
            "container's nofile)"
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    log.info(
        "open-file limit raised from %d to %d for max_sessions (%d)", soft, needed, max_sessions
    )
    return needed


async def serve(
    config: Config,
    *,
    handle_signals: bool = False,
    admin_limits: AdminLimits | None = None,
    tracing: Tracing | None = None,
    reload_config: Callable[[], Config] | None = None,
    task_status: trio.TaskStatus[Sidecar] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run a sidecar for ``config`` until shutdown; report the :class:`Sidecar` when bound.

    Args:
        config: validated configuration.
        handle_signals: turn SIGTERM/SIGINT into a graceful shutdown and SIGHUP into a
            reload (:mod:`proxy.reload`; main thread only).
        admin_limits: bounds of the admin plane (default :class:`~proxy.admin.server.AdminLimits`).
        tracing: the sessions' tracing, owned by the caller (a test's in-memory exporter);
            None: :func:`start_tracing` makes it from ``config`` and the environment, and it
            is shut down (what it queued exported) when the sidecar stops.
        reload_config: loads the configuration again for a SIGHUP (the CLI's file, environment
            and flags); None: the configuration in force (the brokers file and DNS names are
            read again all the same).

    Raises:
        ListenError: the STOMP or the admin address cannot be bound (raised as the only
            member of an ExceptionGroup, as everything leaving a nursery is).
        OutboxUnusable: ``outbox_dir`` cannot be used (the same way).
        TracingUnavailable: ``tracing = true`` cannot start (:func:`start_tracing`).
        FileLimitTooLow: the open-file limit cannot hold ``max_sessions``
            (:func:`fit_file_limit`).
    """
    fit_file_limit(config.max_sessions)
    owned = start_tracing(config) if tracing is None else None
    sidecar = Sidecar(config, tracing=tracing if tracing is not None else owned)
    async with trio.open_nursery(strict_exception_groups=True) as nursery:
        if handle_signals:
            nursery.start_soon(shutdown_on_signals, sidecar.request_shutdown)
            load = reload_config if reload_config is not None else lambda: sidecar.config
            nursery.start_soon(reload_on_signal, sidecar, load)
        nursery.start_soon(_log_events, sidecar.events)
        await nursery.start(sidecar.serve)
        nursery.start_soon(sidecar.rotation.discovery.run)
        sidecar.admin = AdminServer(sidecar, limits=admin_limits)
        sidecar.admin_address = await nursery.start(sidecar.admin.serve)
        task_status.started(sidecar)
        await sidecar.stopped.wait()
        nursery.cancel_scope.cancel()  # the admin plane, the event log, the signal task
    if owned is not None:
        # What the sessions' spans queued is exported (within the exporter's timeout; after
        # a crash, the SDK's exit hook does it).
        await trio.to_thread.run_sync(owned.shutdown)
