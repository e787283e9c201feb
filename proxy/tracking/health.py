"""Every subscription's health (pure): live, restoring, cancelled by the broker, waiting for its
queue (docs/behaviour.md, "Subscription health"; issue 32 part 4).

A session knows, per subscription the app made, whether a broker delivers to it now. The states
(:class:`SubscriptionState`) and what moves a subscription between them:

- **live**: its SUBSCRIBE is on the current leg and nothing says the broker dropped it.
- **restoring**: no leg has it now: the session is reconnecting, or the restore sent its
  SUBSCRIBE again and waits for the broker's RECEIPT of it (asked only for a subscription the
  broker had refused or cancelled, :attr:`SubscriptionHealth.refused`).
- **cancelled_by_broker**: the broker said it stopped delivering to it (RabbitMQ's ERROR
  ``Server cancelled subscription``: its queue's home node went down, or the queue was
  deleted); the session reconnects to make it again.
- **waiting_for_queue**: the broker answered that its queue is not there for now (RabbitMQ's
  ``not_found`` "home node ... is down or inaccessible", also a stream's after its node's
  restart; ``precondition_failed`` "does not have a replica on the local node", a stream
  whose writer moves); the session keeps it and subscribes again with back-off.

Which of the two a broker ERROR makes of the subscriptions it names is the
``RetryableError.subscriptions`` of its entry in :data:`proxy.legs.dialect.RETRYABLE_ERRORS`;
the ERROR names them by its ``subscription`` header, else by the queue its body quotes
(:func:`unavailable_queue`, matched to destinations by :func:`queue_of`). The broker's words
(the ERROR's ``message``) are kept with the state until it is confirmed
(:attr:`SubscriptionHealth.message`).

It is *down* from the moment it stops being live until the broker confirms it again: a RECEIPT
of its SUBSCRIBE, or a MESSAGE on it. A run of failed restores keeps the first moment
(:attr:`SubscriptionHealth.down_since`), so ``/readyz``'s bound (``subscription_down_timeout``)
counts from the first loss, however often the leg flaps. A subscription down only because its
leg was lost is live again as soon as a restore has sent its SUBSCRIBE: a refusal of that
SUBSCRIBE comes back as an ERROR that ends the leg, as before.

Times are the caller's clock in seconds (trio's in the daemon), passed in: nothing here reads one.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from protocol import Frame

__all__ = [
    "SubscriptionHealth",
    "SubscriptionKind",
    "SubscriptionState",
    "SubscriptionStatistics",
    "kind_of",
    "queue_of",
    "unavailable_queue",
]


class SubscriptionState(enum.StrEnum):
    """A subscription's state (``/status``'s ``state``, the label ``state`` of
    ``mq_sidecar_subscriptions``); see the module docstring."""

    LIVE = "live"
    RESTORING = "restoring"
    CANCELLED_BY_BROKER = "cancelled_by_broker"
    WAITING_FOR_QUEUE = "waiting_for_queue"


class SubscriptionKind(enum.StrEnum):
    """What a subscription reads (``/status``'s ``kind``): a ``queue`` (one consumer gets each
    message), a ``topic`` (every subscriber gets a copy: ``/topic/``, ``/temp-topic/``,
    RabbitMQ's ``/exchange/``) or a RabbitMQ ``stream`` (a log read from an offset)."""

    QUEUE = "queue"
    TOPIC = "topic"
    STREAM = "stream"


#: Destination prefixes of topics (each subscriber its own copy).
_TOPIC_PREFIXES = ("/topic/", "/temp-topic/", "/exchange/")
#: Destination prefixes that name a queue by its broker-side name (RabbitMQ, ActiveMQ).
_QUEUE_PREFIXES = ("/queue/", "/amq/queue/")


def kind_of(destination: str, *, stream: bool) -> SubscriptionKind:
    """The kind of a subscription to ``destination``; ``stream``: it is known as a RabbitMQ
    stream (:attr:`proxy.tracking.records.Subscription.stream`)."""
    if stream:
        return SubscriptionKind.STREAM
    if destination.startswith(_TOPIC_PREFIXES):
        return SubscriptionKind.TOPIC
    return SubscriptionKind.QUEUE


def queue_of(destination: str) -> str | None:
    """The broker-side queue name ``destination`` reads (``/queue/q`` and ``/amq/queue/q``:
    ``q``), None for a topic, exchange or temporary destination. RabbitMQ's ERRORs about a
    queue name it so (``durable queue 'q' in vhost '/'``)."""
    for prefix in _QUEUE_PREFIXES:
        if destination.startswith(prefix):
            return destination[len(prefix) :]
    return None


#: How RabbitMQ 3.10 names the queue in the ERRORs retried as a reconnect (measured):
#: "NOT_FOUND - home node 'N' of durable queue 'Q' in vhost '/' is down or inaccessible",
#: "PRECONDITION_FAILED - queue 'queue 'Q' in vhost '/'' does not have a replica on the local
#: node". A queue's name is 255 bytes at most.
_QUOTED_QUEUE = re.compile(rb"queue '([^']{1,255})' in vhost")


def unavailable_queue(error: Frame) -> str | None:
    """The queue a broker ERROR says is unavailable, by its name in the broker (compared with
    :func:`queue_of` of each subscription's destination), or None when its body names none
    (the cancelled subscription's ERROR names its subscription instead, header
    ``subscription``)."""
    match = _QUOTED_QUEUE.search(error.body)
    return match.group(1).decode("utf-8", "replace") if match else None


@dataclass(frozen=True, slots=True)
class SubscriptionStatistics:
    """Snapshot of one subscription for ``/status``'s ``subscriptions`` and the gauge
    ``mq_sidecar_subscriptions`` (docs/operations.md).

    Attributes:
        id: the app's subscription id (the upstream id for a STOMP 1.0 SUBSCRIBE without one).
        destination: as the app wrote it.
        kind: ``queue``, ``topic`` or ``stream`` (:class:`SubscriptionKind`).
        ack: the app's ack mode (``auto``, ``client``, ``client-individual``).
        state: :class:`SubscriptionState`'s value.
        down_for_seconds: seconds since it stopped being live, None while live.
        last_delivery_age_seconds: seconds since the broker last delivered a MESSAGE on it
            (shown to the app or hidden as a copy), None before the first.
        stream_offset: a stream's offset of the last MESSAGE delivered to the app, None for
            other kinds and before the first.
    """

    id: str
    destination: str
    kind: str
    ack: str
    state: str
    down_for_seconds: float | None
    last_delivery_age_seconds: float | None
    stream_offset: int | None


class SubscriptionHealth:
    """One subscription's state and the moments ``/status`` reports (module docstring).

    Attributes:
        state: the :class:`SubscriptionState` now.
        down_since: when it stopped being live (caller's seconds), None while confirmed live.
        refused: the broker cancelled or refused it since it was last confirmed: its next
            SUBSCRIBE asks for a RECEIPT (:attr:`receipt`), which confirms it.
        receipt: the sidecar's receipt id on that SUBSCRIBE, while it is awaited.
        message: the broker's words while :attr:`refused`: the ``message`` header of the
            ERROR that cancelled or refused it (``not_found``, ``Server cancelled
            subscription``...), None since it was last confirmed.
        last_delivery_at: when the broker last delivered a MESSAGE on it, None before the first.
    """

    __slots__ = ("down_since", "last_delivery_at", "message", "receipt", "refused", "state")

    def __init__(self) -> None:
        self.state = SubscriptionState.LIVE
        self.down_since: float | None = None
        self.refused = False
        self.receipt: str | None = None
        self.message: str | None = None
        self.last_delivery_at: float | None = None

    def lost(self, now: float) -> None:
        """Its leg was lost at ``now`` (or it was made while no leg is up): a live subscription
        is restoring; a cancelled or waiting one stays as it is."""
        if self.state is SubscriptionState.LIVE:
            self.state = SubscriptionState.RESTORING
        self.receipt = None
        if self.down_since is None:
            self.down_since = now

    def refused_by_broker(
        self, state: SubscriptionState, now: float, message: str | None = None
    ) -> None:
        """The broker cancelled it or answered that its queue is not there (``state``:
        cancelled_by_broker or waiting_for_queue), at ``now``, in an ERROR whose ``message``
        header is ``message``."""
        self.state = state
        self.refused = True
        self.receipt = None
        self.message = message
        if self.down_since is None:
            self.down_since = now

    def resubscribing(self, receipt: str) -> None:
        """A restore sends its SUBSCRIBE again, asking ``receipt`` (only when :attr:`refused`):
        restoring until the RECEIPT comes."""
        self.state = SubscriptionState.RESTORING
        self.receipt = receipt

    def restored(self) -> None:
        """A restore has sent its SUBSCRIBE on the new leg: one down only because its leg was
        lost is live again (one the broker had refused waits for its RECEIPT)."""
        if self.state is SubscriptionState.RESTORING and not self.refused:
            self.state = SubscriptionState.LIVE
            self.down_since = None

    def confirmed(self) -> None:
        """The broker confirmed it (its SUBSCRIBE's RECEIPT, a MESSAGE on it): live."""
        self.state = SubscriptionState.LIVE
        self.down_since = None
        self.refused = False
        self.receipt = None
        self.message = None

    def delivered(self, now: float) -> None:
        """The broker delivered a MESSAGE on it at ``now``: it is live."""
        self.last_delivery_at = now
        if self.state is not SubscriptionState.LIVE or self.down_since is not None:
            self.confirmed()

    def down_for(self, now: float) -> float | None:
        """Seconds it has been down at ``now``, None while live."""
        if self.state is SubscriptionState.LIVE or self.down_since is None:
            return None
        return now - self.down_since
