"""Session events (RECONNECTING, FAILOVER, DISCONNECT, OUTCOME; SPOOLING, SPOOL_DRAINED and the
outbox forwarder's OUTBOX_FORWARDING and OUTBOX_FORWARDED in outbox mode) and the bus that fans
them out.

The events tell an app what happened to its broker connection, like the codes JMS clients give
their ``ExceptionListener``/``FailoverEventListener`` (AMQ Broker 7.1 "Client Failover":
FAILOVER and DISCONNECT; the Qpid client failover draft: "stop the world"). They reach apps in
band (a SUBSCRIBE to the reserved destination) and operators out of band (``GET /events`` on the
admin port, Server-Sent Events): docs/behaviour.md, "Control channel".

Fan-out is bounded (docs/architecture.md, "Bounded buffers and backpressure by not reading"):
one bounded memory channel per subscriber, filled with ``send_nowait``; a subscriber too slow
to keep up is dropped (its channel closed, counted), never allowed to block the session that
publishes.

Every event the bus publishes has a number, and the bus keeps the last :data:`EVENT_HISTORY` of
them, so that an SSE reader that reconnects with ``Last-Event-ID`` gets what it missed
(:meth:`EventBus.resume`); an id is ``<epoch>-<n>``, the epoch a token of this process, so an id
of a previous process is told apart.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import secrets
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import trio

from protocol import Command, Frame
from proxy.telemetry.vocabulary import FrameOutcome, OutcomeCause
from proxy.tracking.records import DUPLICATE_ID_HEADER

__all__ = [
    "EVENT_HISTORY",
    "EventBus",
    "EventBusStatistics",
    "EventKind",
    "FrameReport",
    "Resumption",
    "SessionEvent",
    "report_of_frame",
]

#: Events the bus keeps for readers that resume (``GET /events`` with ``Last-Event-ID``): at a
#: few hundred bytes each, about half a MiB at most; a failover of 1,000 sessions publishes
#: about 3,000 events, so a reader away for longer than such a storm is told it missed some.
EVENT_HISTORY = 2048


class EventKind(enum.StrEnum):
    """What happened to a session's upstream connection."""

    #: The upstream leg was lost; the session is stopped while the sidecar reconnects.
    RECONNECTING = "RECONNECTING"
    #: The session runs again on a broker (the same one: reattach; another: failover;
    #: the first one again with ``priority_backup``: failback), restored and replayed.
    FAILOVER = "FAILOVER"
    #: Reconnecting failed for good; the app's connection is closed.
    DISCONNECT = "DISCONNECT"
    #: App frames that did not end plainly confirmed, each named with its outcome
    #: (:class:`FrameReport`; docs/behaviour.md, "Frame outcomes").
    OUTCOME = "OUTCOME"
    #: Outbox mode: the session stored an app frame in the outbox while no broker was up
    #: (its SENDs are answered from local disk and wait there); once per switch.
    SPOOLING = "SPOOLING"
    #: Outbox mode, after a SPOOLING: every frame the session stored reached a broker
    #: (confirmed and removed from the outbox); its SENDs go straight through again.
    SPOOL_DRAINED = "SPOOL_DRAINED"
    #: The outbox forwarder began forwarding the frames of a session no live session
    #: forwards (a previous process's, or an ended one's): ``session_id`` is that session's
    #: key, ``stored_frames`` its frames in the outbox, ``to_broker`` where they go.
    OUTBOX_FORWARDING = "OUTBOX_FORWARDING"
    #: The outbox forwarder has forwarded every frame of that session (``forwarded_frames``,
    #: ``forwarding_ms`` from its OUTBOX_FORWARDING); ``frames`` names those a broker refused.
    OUTBOX_FORWARDED = "OUTBOX_FORWARDED"
    #: A stream subscription resumed on a new leg past offsets the app was never shown
    #: (retention removed them from the stream): ``offsets_missed`` names them, written to
    #: the app before the MESSAGE that follows them (docs/behaviour.md, "Streams").
    STREAM_GAP = "STREAM_GAP"


@dataclass(frozen=True, slots=True)
class FrameReport:
    """One app frame that did not end plainly confirmed, as an OUTCOME event names it.

    ``receipt``: the app's receipt id (None if it asked for none); ``mq_sidecar_id``: the
    duplicate-detection id of a SEND (the app's own, else the sidecar's ``<session>-<n>``);
    ``seq``: its number in the session's stream to the broker (0: it never got one);
    ``transaction``: the transaction it belongs to, if any; ``outcome`` and ``cause`` from
    :mod:`proxy.telemetry.vocabulary`.
    """

    command: str
    receipt: str | None
    mq_sidecar_id: str | None
    seq: int
    transaction: str | None
    outcome: FrameOutcome
    cause: OutcomeCause

    @property
    def label(self) -> str:
        """The frame's shortest name: its receipt id, else its ``mq-sidecar-id``, else
        ``COMMAND #seq`` (the names in a DISCONNECT event's ``frames_lost``)."""
        return self.receipt or self.mq_sidecar_id or f"{self.command} #{self.seq}"

    def describe(self) -> str:
        """The frame as a log line or an ERROR names it: :attr:`label`, with the
        ``mq-sidecar-id`` too when it has a receipt id as well, and its outcome."""
        name = self.label
        if self.receipt is not None and self.mq_sidecar_id is not None:
            name += f" (mq-sidecar-id {self.mq_sidecar_id})"
        return f"{name}: {self.outcome}"


@dataclass(frozen=True, slots=True)
class SessionEvent:
    """One event of one session; ``to_json()`` is the body apps and SSE readers get.

    Times: ``timestamp`` is Unix seconds; ``outage_ms`` is milliseconds from the loss of the
    old leg to the restored session. Broker fields are labels (``host:port``), never
    credentials. ``frames_lost`` lists the names (:attr:`FrameReport.label`: the app's
    receipt id, else a SEND's ``mq-sidecar-id``, else ``<COMMAND> #<seq>``) of frames the
    broker never confirmed and the sidecar could not replay. ``frames``: OUTCOME only, the
    frames it names (:class:`FrameReport`).
    """

    kind: EventKind
    session_id: str
    reason: str
    from_broker: str | None = None
    to_broker: str | None = None
    attempts: int = 0
    outage_ms: int | None = None
    #: Unix seconds: when the old leg was lost, and (FAILOVER) when the session was restored.
    outage_start: float | None = None
    outage_end: float | None = None
    #: FAILOVER: the temporary destinations the old leg had made, as (the app's name, the
    #: broker-side name on the old leg, on the new one); None: not known, or not made yet.
    temp_destinations: tuple[tuple[str, str | None, str | None], ...] = ()
    #: FAILOVER: browsers whose browse it cut short, as (subscription id, destination).
    browsers_interrupted: tuple[tuple[str | None, str], ...] = ()
    #: FAILOVER: non-durable topic subscriptions, which missed what was published between
    #: ``outage_start`` and ``outage_end``, as (subscription id, destination).
    topics_missed: tuple[tuple[str | None, str], ...] = ()
    #: STREAM_GAP: stream offsets the app can never see, as (subscription id, destination,
    #: first offset, last offset), and how many offsets they hold together.
    offsets_missed: tuple[tuple[str | None, str, int, int], ...] = ()
    offsets_missed_count: int = 0
    #: FAILOVER of a failback (``priority_backup``): ms the app's next frame was held.
    app_held_ms: int | None = None
    reattached: bool = False
    replayed_frames: int = 0
    transactions_replayed: tuple[str, ...] = ()
    transactions_rolled_back: tuple[str, ...] = ()
    transactions_in_doubt: tuple[str, ...] = ()
    redeliveries_hidden: int = 0
    duplicates_hidden: int = 0
    frames_lost: tuple[str, ...] = ()
    renamed_destinations: tuple[tuple[str, str], ...] = ()
    frames: tuple[FrameReport, ...] = ()
    #: SPOOLING and SPOOL_DRAINED (None in the others): the session's frames in the outbox
    #: (stored, not yet confirmed by a broker), and the whole outbox's frames, frame bytes
    #: and ``outbox_max_bytes`` (every session's, and what recovery left).
    spooled_frames: int | None = None
    outbox_frames: int | None = None
    outbox_bytes: int | None = None
    outbox_max_bytes: int | None = None
    #: SPOOL_DRAINED: the session's frames forwarded since its SPOOLING, and ms from the
    #: SPOOLING to the last of them confirmed.
    forwarded_frames: int | None = None
    spooled_ms: int | None = None
    #: OUTBOX_FORWARDING: the session's frames in the outbox (``spooled_frames`` too, its
    #: first name there, deprecated); OUTBOX_FORWARDED: ms from the OUTBOX_FORWARDING to the
    #: last of them confirmed (``spooled_ms`` too, deprecated). None in the other events.
    stored_frames: int | None = None
    forwarding_ms: int | None = None
    timestamp: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, object]:
        """A JSON-able mapping with the field names as keys (``event`` for ``kind``)."""
        out = dataclasses.asdict(self)
        out["event"] = str(out.pop("kind"))
        out["frames"] = [dataclasses.asdict(f) for f in self.frames]
        out["renamed_destinations"] = [list(p) for p in self.renamed_destinations]
        out["temp_destinations"] = [
            {"destination": d, "old": old, "new": new} for d, old, new in self.temp_destinations
        ]
        for key, subs in (
            ("browsers_interrupted", self.browsers_interrupted),
            ("topics_missed", self.topics_missed),
        ):
            out[key] = [{"subscription": s, "destination": d} for s, d in subs]
        out["offsets_missed"] = [
            {"subscription": s, "destination": d, "first": a, "last": b, "count": b - a + 1}
            for s, d, a, b in self.offsets_missed
        ]
        return out

    def to_json(self) -> str:
        """The event as one line of JSON."""
        return json.dumps(self.to_dict(), sort_keys=True, ensure_ascii=False)


@dataclass(frozen=True, slots=True)
class Resumption:
    """What a reader that reconnects with ``Last-Event-ID`` gets (:meth:`EventBus.resume`).

    Attributes:
        missed: the events published after the one it names that the history still holds,
            oldest first, with their ids.
        gap: None when ``missed`` is everything it missed; else why it is not (the history
            no longer reaches back that far, the id is of a previous process, or no id the
            bus could read), for an explicit marker before ``missed``.
        oldest: the id of the oldest event the history holds (None: none yet).
        next_seq: the number of the first event ``events`` will give (ids of live events are
            counted from it: the channel gets every event published after it, in order).
        events: the live events, as :meth:`EventBus.subscribe` gives them.
    """

    missed: tuple[tuple[str, SessionEvent], ...]
    gap: str | None
    oldest: str | None
    next_seq: int
    events: trio.MemoryReceiveChannel[SessionEvent]


@dataclass(frozen=True, slots=True)
class EventBusStatistics:
    """Counters of an :class:`EventBus`."""

    subscribers: int
    published: int
    dropped_subscribers: int


class EventBus:
    """Publish session events to any number of bounded subscribers without ever blocking.

    Args:
        subscriber_buffer: events a subscriber may have pending before it is dropped.
    """

    def __init__(self, *, subscriber_buffer: int = 256, history: int = EVENT_HISTORY) -> None:
        self.subscriber_buffer = subscriber_buffer
        self._subscribers: set[trio.MemorySendChannel[SessionEvent]] = set()
        self.published = 0
        self.dropped_subscribers = 0
        #: This process's token in every event id.
        self.epoch = secrets.token_hex(4)
        self._history: deque[tuple[int, SessionEvent]] = deque(maxlen=history)

    def event_id(self, seq: int) -> str:
        """The id of the ``seq``-th event published (``<epoch>-<seq>``)."""
        return f"{self.epoch}-{seq}"

    def publish(self, event: SessionEvent) -> None:
        """Hand ``event`` to every subscriber; drop (and count) those whose buffer is full.
        The event is numbered and kept in the history."""
        self.published += 1
        self._history.append((self.published, event))
        for send in list(self._subscribers):
            try:
                send.send_nowait(event)
            except trio.WouldBlock:
                self._subscribers.discard(send)
                send.close()
                self.dropped_subscribers += 1
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self._subscribers.discard(send)

    @contextmanager
    def subscribe(self) -> Iterator[trio.MemoryReceiveChannel[SessionEvent]]:
        """A receive channel of every event published while the block runs.

        The channel ends (``EndOfChannel``) if the subscriber was dropped for being slow.
        """
        send, receive = trio.open_memory_channel[SessionEvent](self.subscriber_buffer)
        self._subscribers.add(send)
        try:
            with receive:
                yield receive
        finally:
            self._subscribers.discard(send)
            send.close()

    @contextmanager
    def resume(self, last_event_id: str | None) -> Iterator[Resumption]:
        """Subscribe as :meth:`subscribe` does, and take from the history what a reader whose
        last event was ``last_event_id`` missed (None: a new reader, nothing missed). The
        subscription and the history are taken in one step, so nothing falls between them."""
        missed: list[tuple[int, SessionEvent]] = []
        gap: str | None = None
        oldest = self._history[0][0] if self._history else None
        if last_event_id is not None:
            epoch, _, number = last_event_id.strip().rpartition("-")
            last = int(number) if number.isdigit() else None
            if epoch != self.epoch or last is None:
                gap = (
                    f"Last-Event-ID {last_event_id!r} is not of this sidecar process (it "
                    "restarted, or the id is not one of its): events in between are unknown"
                )
                missed = list(self._history)
            else:
                if oldest is not None and last + 1 < oldest:
                    gap = (
                        f"the event history no longer reaches back to {last_event_id}: "
                        f"{oldest - last - 1} event(s) are not shown"
                    )
                elif oldest is None and last < self.published:
                    gap = f"the event history holds none of the events after {last_event_id}"
                missed = [(seq, e) for seq, e in self._history if seq > last]
        next_seq = self.published + 1
        with self.subscribe() as events:
            yield Resumption(
                missed=tuple((self.event_id(seq), e) for seq, e in missed),
                gap=gap,
                oldest=self.event_id(oldest) if oldest is not None else None,
                next_seq=next_seq,
                events=events,
            )

    def statistics(self) -> EventBusStatistics:
        """Subscribers now, events published, subscribers dropped for being slow."""
        return EventBusStatistics(
            subscribers=len(self._subscribers),
            published=self.published,
            dropped_subscribers=self.dropped_subscribers,
        )


def report_of_frame(
    frame: Frame,
    receipt: str | None,
    outcome: FrameOutcome,
    cause: OutcomeCause,
    *,
    seq: int = 0,
) -> FrameReport:
    """The report of a frame as the app sent it (``receipt``: its receipt id) or as it went
    upstream; ``seq`` 0 when it never entered the window."""
    return FrameReport(
        command=str(frame.command),
        receipt=receipt,
        mq_sidecar_id=frame.get(DUPLICATE_ID_HEADER) if frame.command is Command.SEND else None,
        seq=seq,
        transaction=frame.get("transaction"),
        outcome=outcome,
        cause=cause,
    )
