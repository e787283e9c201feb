"""Broker reachability (a background prober) and the readiness verdict of ``GET /readyz``.

Readiness (issue 4): *at least one broker reachable* — a STOMP CONNECT answered recently —,
*no session stuck beyond its* ``call_timeout`` and *no subscription down longer than*
``subscription_down_timeout`` (issue 32: restoring, cancelled by the broker, waiting for its
queue; :mod:`proxy.tracking.health`).

In outbox mode (issue 17) the sidecar serves apps with no broker up (it answers their CONNECT
and stores their SENDs), so readiness is *the outbox open and not full* instead: no broker
reachable is no reason, and while none is, sessions reconnecting (without end, by design) or
waiting for confirmations are not stuck. A full outbox (its frames fill ``outbox_max_bytes``,
or an append waits for room) is a reason, broker or not.

Reachability is never checked inside a request: :class:`BrokerProber` runs one small task per
configured broker that, every ``broker_probe_interval``, either

* sees a live session leg to that broker (state ``running``: its heart-beats prove the broker
  answers, so no extra connection is opened), or
* opens one with :func:`proxy.legs.broker.open_upstream`, says DISCONNECT and leaves
  (:func:`probe_broker`), bounded by ``connect_timeout``.

A broker's state is the verdict of its last *finished* check (issue 36): a check ends answered
(CONNECTED, the moment it arrives: the goodbye after it is no part of the answer), failed
(refused connection, ``connect_timeout``, ERROR to the sidecar's own credentials) or timed out
(no answer within ``stale_after`` of the check's start, which the prober enforces itself). No
clock runs between checks: on a loaded machine the interval's sleep may end late, or the
broker may answer slowly but within its bounds, and neither makes a broker that answered
"down"; only a check that failed or timed out does.

Requests read the last results (:meth:`BrokerProber.statistics`) and the session statistics, and
:func:`evaluate_readiness` — a pure function, tested without I/O — turns them into a verdict.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import trio

import protocol
from config import Broker, Config
from protocol import Command, ConnectionClosed, Frame
from proxy.legs.broker import ConnectFailed, UpstreamRefused, open_upstream
from proxy.legs.connect_frame import connect_frame
from proxy.legs.opening import BrokerStreams, StreamOpener
from proxy.legs.stream import TransportLost
from proxy.legs.tls import DIAGNOSIS_SECONDS
from proxy.telemetry.metrics import Metrics
from proxy.telemetry.statistics import (
    BrokerHealth,
    OutboxStatistics,
    Readiness,
    SessionStatistics,
)
from proxy.telemetry.vocabulary import ProbeOutcome

__all__ = [
    "MAX_SUBSCRIPTION_REASONS",
    "AnswerCallback",
    "BrokerProber",
    "ProbeFunction",
    "evaluate_readiness",
    "probe_broker",
    "stuck_for",
]

#: ``/readyz`` names at most this many subscriptions that are down, then how many more.
MAX_SUBSCRIPTION_REASONS = 10

#: A probe: CONNECT to one broker; returns the outcome and a one-line detail. Never raises
#: for anything the broker or the network does.
ProbeFunction = Callable[[Broker], Awaitable[tuple[ProbeOutcome, str]]]

#: Told the detail of a probe's answer the moment it arrives (before the probe's goodbye).
AnswerCallback = Callable[[str], None]

_PROBE_RECEIPT = "mq-sidecar-probe"

log = logging.getLogger("mq_sidecar.health")


def stuck_for(session: SessionStatistics) -> float:
    """Seconds a session has been unable to make progress (0.0 when it is fine).

    Reads the optional statistics fields ``reconnecting_for`` (seconds in RECONNECTING) and
    ``oldest_unconfirmed_age`` (age of the oldest frame awaiting broker confirmation), both
    ``float | None``, and takes the larger.
    """
    ages = (
        getattr(session, "reconnecting_for", None),
        getattr(session, "oldest_unconfirmed_age", None),
    )
    return max((float(a) for a in ages if a is not None), default=0.0)


def evaluate_readiness(
    *,
    brokers: Sequence[BrokerHealth],
    sessions: Sequence[SessionStatistics],
    call_timeout: float,
    shutting_down: bool = False,
    outbox_mode: bool = False,
    outbox: OutboxStatistics | None = None,
    subscription_down_timeout: float | None = None,
) -> Readiness:
    """Ready when not shutting down, some broker is ``up`` and no session is stuck; in outbox
    mode, when not shutting down and the outbox is open and not full, with or without a
    broker (see the module docstring).

    Args:
        brokers: the prober's view (states already account for staleness).
        sessions: the live sessions' statistics.
        call_timeout: seconds (``Config.durations.call_timeout``) a session may be stuck.
        shutting_down: a graceful shutdown has begun.
        outbox_mode: the ``outbox`` option is on.
        outbox: the open outbox's statistics (None: not open, or off).
        subscription_down_timeout: seconds (``Config.durations.subscription_down_timeout``)
            a subscription may be down; None: subscriptions are no reason.
    """
    reasons: list[str] = []
    forwarding = ""  # outbox mode, SIGTERM: the outbox is forwarded before exit
    if shutting_down and outbox is not None and outbox.frames:
        left = outbox.drain_left_seconds
        until = "the drain deadline" if left is None else f"the drain deadline, {left:.1f} s"
        forwarding = (
            f"shutting down: forwarding the outbox before exit: {outbox.frames} frame(s) "
            f"left, until it is empty or {until} (drain_timeout)"
        )
    if shutting_down and (sessions or not forwarding):
        reasons.append("shutting down: draining sessions")
    if forwarding:
        reasons.append(forwarding)
    up = tuple(b.broker for b in brokers if b.state == "up")
    held: str | None = None
    if outbox_mode:
        if outbox is None:
            reasons.append("outbox not open (outbox_dir)")
        else:
            held = (
                f"outbox: {outbox.frames} frame(s), {outbox.bytes} of {outbox.max_bytes} bytes "
                "(outbox_max_bytes)"
            )
            if outbox.bytes >= outbox.max_bytes:
                reasons.append(
                    f"outbox full: {outbox.bytes} bytes held, outbox_max_bytes {outbox.max_bytes}"
                )
            elif outbox.room_waiters:
                reasons.append(
                    f"outbox full: {outbox.room_waiters} append(s) waiting for room "
                    f"({outbox.bytes} of outbox_max_bytes {outbox.max_bytes} bytes held)"
                )
        if not up:
            # The outbox serves the apps: sessions reconnect without end and their SENDs are
            # stored, so neither the brokers nor the sessions' waits are reasons.
            return Readiness(ready=not reasons, reasons=tuple(reasons), brokers_up=up, outbox=held)
    if not up:
        if not brokers:
            reasons.append("no brokers configured")
        for b in brokers:
            if b.state == "unknown":
                reasons.append(f"broker {b.broker}: not checked yet")
            else:
                reasons.append(f"broker {b.broker}: unreachable: {b.detail}")
    for s in sessions:
        age = stuck_for(s)
        if age > call_timeout:
            reasons.append(
                f"session {s.session_id} ({s.state}, broker {s.broker or '-'}) stuck for "
                f"{age:.1f} s, longer than call_timeout {call_timeout:g} s"
            )
    if subscription_down_timeout is not None:
        reasons += _subscriptions_down(sessions, subscription_down_timeout)
    return Readiness(ready=not reasons, reasons=tuple(reasons), brokers_up=up, outbox=held)


def _subscriptions_down(sessions: Sequence[SessionStatistics], bound: float) -> list[str]:
    """One line per subscription down longer than ``bound`` seconds (the first
    :data:`MAX_SUBSCRIPTION_REASONS`, then how many more)."""
    down = [
        (s.session_id, sub)
        for s in sessions
        for sub in s.per_subscription
        if sub.down_for_seconds is not None and sub.down_for_seconds > bound
    ]
    lines = [
        f"subscription {sub.id!r} of session {session} to {sub.destination}: {sub.state} for "
        f"{sub.down_for_seconds:.1f} s, longer than subscription_down_timeout {bound:g} s"
        for session, sub in down[:MAX_SUBSCRIPTION_REASONS]
    ]
    if len(down) > MAX_SUBSCRIPTION_REASONS:
        lines.append(f"... and {len(down) - MAX_SUBSCRIPTION_REASONS} more subscription(s) down")
    return lines


def _connect_frame(broker: Broker, config: Config) -> tuple[Frame, bool]:
    """The probe's CONNECT (the sessions' one, without heart-beats), and whether it carries
    configured credentials."""
    own_credentials = broker.login is not None or config.login is not None
    return connect_frame(broker, config, heart_beat="0,0"), own_credentials


async def probe_broker(
    broker: Broker,
    config: Config,
    open_stream: StreamOpener,
    *,
    answered: AnswerCallback | None = None,
) -> tuple[ProbeOutcome, str]:
    """CONNECT to ``broker`` as the sessions would (same credentials, same TLS through the
    sidecar's ``open_stream``), then DISCONNECT.

    Bounded by ``connect_timeout`` (seconds) for the CONNECT and again for the goodbye. The
    detail never contains a credential (only the broker's label and its own words).
    ``answered`` is called with the detail as soon as CONNECTED arrives, before the goodbye.
    """
    connect, own_credentials = _connect_frame(broker, config)
    timeout = config.durations.connect_timeout
    try:
        async with open_upstream(
            broker,
            connect,
            limits=protocol.Limits(),
            grace=config.heartbeat_grace,
            connect_timeout=timeout,
            open_stream=open_stream,
        ) as upstream:
            server = upstream.connected.get("server") or "unknown server"
            detail = f"CONNECT answered: STOMP {upstream.version}, {server}"
            if answered is not None:
                answered(detail)
            with trio.move_on_after(timeout):
                try:
                    await upstream.send(Frame(Command.DISCONNECT, (("receipt", _PROBE_RECEIPT),)))
                    while True:
                        event = await upstream.receive_event()
                        if isinstance(event, ConnectionClosed) or (
                            isinstance(event, Frame) and event.command is Command.RECEIPT
                        ):
                            break
                except (TransportLost, protocol.ProtocolError):
                    pass  # the CONNECT was answered; a rude goodbye does not change that
    except UpstreamRefused as exc:
        what = (
            "the sidecar's credentials were refused" if own_credentials else "answered with ERROR"
        )
        return ProbeOutcome.REFUSED, f"{what}: {exc.reason}"
    except ConnectFailed as exc:
        return ProbeOutcome.FAILED, exc.reason
    return ProbeOutcome.CONNECTED, detail


@dataclass(slots=True)
class _Record:
    broker: Broker
    own_credentials: bool
    last_check: float | None = None
    last_answer: float | None = None
    last_outcome: ProbeOutcome | None = None
    detail: str = "not checked yet"
    checks: int = 0
    failures: int = 0
    answered: bool | None = None  # the last check's verdict (None: not checked yet)
    timed_out: bool = False  # the last check got no answer within stale_after


class BrokerProber:
    """Checks every broker in the list in the background; see the module docstring.

    Args:
        config: brokers, credentials, ``connect_timeout``, ``broker_probe_interval``.
        sessions: returns the live sessions' statistics (``Sidecar.statistics().sessions``).
        metrics: where to count checks (``mq_sidecar_broker_probes_total``), optional.
        probe: the CONNECT probe; default :func:`probe_broker` through ``streams`` (tests
            pass their own).
        streams: the sidecar's :class:`~proxy.legs.broker.BrokerStreams` (TLS as the sessions
            have it, and one tracker of the brokers' certificates); a private one when None;
            tests pass a :data:`~proxy.legs.opening.StreamOpener` of their own.
        brokers: the brokers to check (the list in force); default ``config.brokers``.
            :meth:`follow` changes them while it runs.
        live_leg: whether a running session has a live leg to the broker of this label (the
            check then needs no connection of its own); default: read from ``sessions()``.
            The sidecar passes :meth:`proxy.app.Sidecar.live_leg_to`, which builds no session
            statistics (with 5,000 sessions, building them took a sixth of the process's CPU,
            measured with py-spy in bench/admission.py).

    A broker is ``up`` while its last finished check was answered, ``down`` once a check
    fails or times out. Each check is bounded by the prober: a probe not answered within
    ``stale_after`` seconds of its start (two intervals, ``connect_timeout`` and twice
    ``DIAGNOSIS_SECONDS``: the probe's own bounds, the CONNECT's and the diagnosis of a TLS
    handshake that went silent after it, and room for a loop that runs late) is cancelled and
    counts as failed
    ("no answer for N s"). Nothing else ages a verdict: neither a check in progress nor the
    wait between checks, however late a busy event loop wakes the prober (issue 36: a broker
    that had just answered was called down on a loaded machine because its answer was older
    than ``stale_after`` by the time the next check ended). The default probe's answer counts
    when CONNECTED arrives: its goodbye (bounded by ``connect_timeout`` of its own) is no part
    of the check's bound. A refusal (ERROR to CONNECT) counts as an answer, unless the probe
    presented the sidecar's own configured credentials: then the sessions would be refused
    too.
    """

    def __init__(
        self,
        config: Config,
        sessions: Callable[[], Sequence[SessionStatistics]],
        *,
        metrics: Metrics | None = None,
        probe: ProbeFunction | None = None,
        streams: StreamOpener | None = None,
        brokers: Sequence[Broker] | None = None,
        live_leg: Callable[[str], bool] | None = None,
    ) -> None:
        self.config = config
        self._live_leg = live_leg
        seconds = config.durations
        self.interval = seconds.broker_probe_interval
        self.stale_after = 2 * self.interval + seconds.connect_timeout + 2 * DIAGNOSIS_SECONDS
        self._sessions = sessions
        self._metrics = metrics
        opener = streams if streams is not None else BrokerStreams(config)
        self._probe: ProbeFunction = probe or (
            lambda b: probe_broker(b, config, opener, answered=self._answer_callback(b.label))
        )
        #: The check in progress per broker label: told the answer as soon as it arrives.
        self._answers: dict[str, AnswerCallback] = {}
        self._records = [
            self._new_record(b) for b in (config.brokers if brokers is None else brokers)
        ]
        self._scopes: dict[str, trio.CancelScope] = {}
        self._nursery: trio.Nursery | None = None
        self._checked = 0
        #: Set once every broker has been checked at least once.
        self.first_round_done = trio.Event()
        if not self._records:
            self.first_round_done.set()

    def _new_record(self, broker: Broker) -> _Record:
        return _Record(broker, broker.login is not None or self.config.login is not None)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Check every broker every ``interval`` until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for record in self._records:
                nursery.start_soon(self._watch, record)
            task_status.started()

    def follow(self, brokers: Sequence[Broker]) -> None:
        """Make ``brokers`` (the list in force, in its order) the brokers checked: a broker
        that joined is checked from now on (its first check at once), one that left is no
        longer checked nor reported. Call it from trio, while :meth:`run` runs or before."""
        old = {r.broker.label: r for r in self._records}
        records = []
        for broker in brokers:
            record = old.pop(broker.label, None)
            if record is None:
                record = self._new_record(broker)
                if self._nursery is not None:
                    self._nursery.start_soon(self._watch, record)
            records.append(record)
        for label, record in old.items():
            scope = self._scopes.pop(label, None)
            if scope is not None:
                scope.cancel()
            if record.last_check is not None:
                self._checked -= 1
        self._records = records
        if self._checked >= len(self._records):
            self.first_round_done.set()

    async def _watch(self, record: _Record) -> None:
        label = record.broker.label
        with trio.CancelScope() as scope:
            self._scopes[label] = scope
            await self._check_forever(record)

    async def _check_forever(self, record: _Record) -> None:
        while True:
            await self._check(record)
            await trio.sleep(self.interval)

    async def _check(self, record: _Record) -> None:
        """One check of ``record``'s broker, recorded once: at its answer, at its failure, or
        ``stale_after`` seconds after its start without an answer (then cancelled)."""
        label = record.broker.label
        if self._live_leg is not None:
            live = self._live_leg(label)
        else:
            live = any(s.broker == label and s.state == "running" for s in self._sessions())
        if live:
            self._record(record, ProbeOutcome.LIVE_SESSION, "a session leg to it is live")
            return
        recorded = False

        def answered(detail: str) -> None:
            nonlocal recorded
            if not recorded:
                recorded = True
                scope.deadline = math.inf  # answered: the goodbye has its own bound
                self._record(record, ProbeOutcome.CONNECTED, detail)

        self._answers[label] = answered
        try:
            with trio.move_on_after(self.stale_after) as scope:
                try:
                    outcome, detail = await self._probe(record.broker)
                except Exception as exc:
                    # A bug in a probe must not end the sidecar (the admin plane never disturbs
                    # STOMP traffic): the broker counts as unreachable and the bug is logged.
                    log.exception("broker %s: readiness probe failed", label)
                    outcome, detail = ProbeOutcome.FAILED, f"probe error: {type(exc).__name__}"
                if not recorded:
                    self._record(record, outcome, detail)
                return
        finally:
            if self._answers.get(label) is answered:
                del self._answers[label]
        self._record(record, ProbeOutcome.FAILED, record.detail, timed_out=True)

    def _answer_callback(self, label: str) -> AnswerCallback:
        """What the default probe of broker ``label`` calls with its answer's detail: the
        check in progress records it (nothing when none is, e.g. a probe run by hand)."""

        def answered(detail: str) -> None:
            callback = self._answers.get(label)
            if callback is not None:
                callback(detail)

        return answered

    def _record(
        self, record: _Record, outcome: ProbeOutcome, detail: str, *, timed_out: bool = False
    ) -> None:
        now = trio.current_time()
        if record.last_check is None:
            self._checked += 1
            if self._checked >= len(self._records):
                self.first_round_done.set()
        record.last_check = now
        record.last_outcome = outcome
        record.detail = detail  # a timed-out check keeps the last detail: "no answer for"
        record.timed_out = timed_out
        record.checks += 1
        answered = outcome is not ProbeOutcome.FAILED and not (
            outcome is ProbeOutcome.REFUSED and record.own_credentials
        )
        if answered:
            record.last_answer = now
        else:
            record.failures += 1
        if answered is not record.answered:  # one log line per change, not per check
            label = record.broker.label
            extra = {"broker": label}
            if answered:
                log.info("broker %s reachable: %s", label, detail, extra=extra)
            else:
                why = self._silence(record, now) if timed_out else detail
                log.warning("broker %s unreachable: %s", label, why, extra=extra)
            record.answered = answered
        if self._metrics is not None:
            self._metrics.probe(record.broker.label, outcome)

    def _silence(self, r: _Record, now: float) -> str:
        """The detail of a timed-out check: how long the broker has not answered."""
        if r.last_answer is None:
            return f"no answer within {self.stale_after:g} s"
        return f"no answer for {now - r.last_answer:.1f} s (last: {r.detail})"

    def _health(self, r: _Record, now: float) -> BrokerHealth:
        state, detail = "down", r.detail
        if r.last_check is None:
            state = "unknown"
        elif r.answered:
            state = "up"
        elif r.timed_out:
            detail = self._silence(r, now)
        return BrokerHealth(
            broker=r.broker.label,
            state=state,
            last_check=r.last_check,
            last_answer=r.last_answer,
            last_outcome=r.last_outcome,
            detail=detail,
            checks=r.checks,
            failures=r.failures,
        )

    def statistics(self) -> tuple[BrokerHealth, ...]:
        """The latest check of every broker, in configuration order."""
        now = trio.current_time()
        return tuple(self._health(r, now) for r in self._records)
