"""The control channel of one session: RECONNECTING/FAILOVER/DISCONNECT/OUTCOME events
published on the sidecar's bus (``GET /events``, the event log, other sessions) and delivered in
band to the app's subscriptions of the reserved events destination, which never go upstream.
An OUTCOME event names the app's frames that did not end plainly confirmed (:meth:`report`).

Nobody reads what is not theirs: an app gets its own session's events, and every session's
(``mq-sidecar-scope:all``) only when it authenticated with the sidecar's own ``client_login``
(:func:`scope_refused` answers the others; docs/behaviour.md, "Control channel")."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import trio

from protocol import Command, Frame
from proxy.session.core import SessionCore
from proxy.session.ending import error_frame
from proxy.session.outcomes import unsettled
from proxy.session.to_app import AppOutput
from proxy.telemetry.events import EventKind, FrameReport, SessionEvent
from proxy.telemetry.vocabulary import OutcomeCause
from proxy.tracking import StoredInOutbox

__all__ = ["SCOPE_HEADER", "ControlChannel", "scope_refused"]

#: SUBSCRIBE header with which an app asks for every session's events (``all``), not only its
#: own session's.
SCOPE_HEADER = "mq-sidecar-scope"


def scope_refused(receipt_id: str | None) -> Frame:
    """The ERROR a ``mq-sidecar-scope:all`` SUBSCRIBE gets from an app that did not present
    the sidecar's ``client_login`` (the SUBSCRIBE is not taken; the session goes on)."""
    return error_frame(
        f"{SCOPE_HEADER}:all needs the sidecar's client_login",
        receipt_id=receipt_id,
        detail=f"Every session's events ({SCOPE_HEADER}:all) are for an app that authenticated "
        "with the sidecar's own client_login/client_passcode; this session did not (or the "
        "sidecar has no client_login). Subscribe without the header to get this session's own "
        "events.",
    )


class ControlChannel:
    """Events of one session, and other sessions' events for subscriptions that asked."""

    def __init__(self, core: SessionCore, out: AppOutput) -> None:
        self.core = core
        self.out = out
        self.pumping = False  # other sessions' events are relayed (pump runs)
        self._seq = 0

    async def publish(self, event: SessionEvent) -> None:
        """Publish an event of this session: on the bus (SSE, other sessions) and, written
        before anything else happens on the session, to its own control subscriptions, so
        the app learns of a failover before it sees a message of the new leg."""
        self.core.bus.publish(event)
        await self.deliver(event)

    async def report(self, frames: Sequence[FrameReport], reason: str) -> None:
        """Tell the app what became of ``frames`` (none: nothing to tell): one OUTCOME event
        naming each by receipt id and ``mq-sidecar-id`` with its outcome, written to the app
        before anything else happens on the session and logged once by the event log; each
        counted in ``mq_sidecar_frame_outcomes_total{outcome}``."""
        if not frames:
            return
        core = self.core
        if core.tracer is not None:
            core.tracer.outcomes(frames)
        for outcome, count in Counter(f.outcome for f in frames).items():
            core.metrics.frame_outcome(outcome, count)
        broker: str | None = None
        if core.leg.upstream is not None:
            broker = core.leg.upstream.broker.label
        elif core.leg.loss is not None:
            broker = core.leg.loss.broker
        elif core.leg.broker_index is not None:
            broker = core.brokers[core.leg.broker_index].label
        await self.publish(
            SessionEvent(
                EventKind.OUTCOME, core.id, reason, from_broker=broker, frames=tuple(frames)
            )
        )

    async def name_unconfirmed(self, cause: OutcomeCause, reason: str) -> None:
        """The session ends: every frame still unconfirmed in the window is named to the app
        in one OUTCOME event with ``cause`` and ``reason``, and counted as lost; the window is
        marked named (:attr:`FlowControl.named <proxy.session.flow.FlowControl.named>`).
        Frames the outbox holds are not lost: the outbox forwards them later."""
        core = self.core
        core.flow.named = True
        lost = unsettled(
            (e for e in core.flow.window if not isinstance(e.context, StoredInOutbox)), cause
        )
        if lost:
            core.metrics.frames_lost(len(lost))
            await self.report(lost, reason)

    async def deliver(self, event: SessionEvent) -> None:
        """Write ``event`` to every control subscription of the app that wants it."""
        core = self.core
        state = core.state
        if state is None:
            return
        for sub in state.local_subscriptions():
            if event.session_id != core.id and sub.frame.get(SCOPE_HEADER) != "all":
                continue
            self._seq += 1
            message = Frame(
                Command.MESSAGE,
                (
                    ("destination", sub.destination),
                    ("message-id", f"{core.id}-e{self._seq}"),
                    ("event", str(event.kind)),
                    ("content-type", "application/json"),
                ),
                event.to_json().encode(),
            )
            await self.out.send(state.local_delivery(sub, message))

    async def pump(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Deliver other sessions' events to control subscriptions that asked for them with
        ``mq-sidecar-scope:all``; this session's own are written by :meth:`publish`. Started
        by the first such subscription (a session without one costs the bus nothing),
        subscribed to the bus before that SUBSCRIBE's receipt is answered."""
        with self.core.bus.subscribe() as events:
            task_status.started()
            async for event in events:
                if event.session_id != self.core.id:
                    await self.deliver(event)
