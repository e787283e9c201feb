"""The records of a session's bookkeeping (:mod:`proxy.tracking`): subscriptions, deliveries,
transactions, what one upstream MESSAGE or app ACK resolves to, and the errors for frames the
session cannot accept. Pure data, no I/O."""

from __future__ import annotations

import enum
import re
from collections import OrderedDict
from dataclasses import dataclass, field

from protocol import Frame
from proxy.tracking.budget import MemoryBudget
from proxy.tracking.health import SubscriptionHealth
from proxy.tracking.window import Entry, EntryContext

__all__ = [
    "ACK_MODES",
    "ARTEMIS_DUPLICATE_ID",
    "DUPLICATE_ID_HEADER",
    "PASS_THROUGH",
    "SEEDED",
    "SEEN_MAX",
    "SEEN_SECONDS",
    "SETTLED_DELIVERY_COST",
    "SIDECAR_RECEIPT",
    "STREAM_CREDIT",
    "TRANSACTION_OVERHEAD",
    "AckMode",
    "Delivered",
    "Delivery",
    "DurableRemoval",
    "ForBroker",
    "FrameRejected",
    "PassThrough",
    "SessionError",
    "Settled",
    "StoredInOutbox",
    "StreamCredit",
    "Subscription",
    "Transaction",
    "TransactionBytes",
    "ack_ident",
    "persists_seen",
]


class AckMode(enum.StrEnum):
    """A subscription's ack mode (STOMP 1.2 "SUBSCRIBE ack Header")."""

    #: The broker counts a message as acknowledged when it sends it.
    AUTO = "auto"
    #: An ACK settles the message and every earlier one of the subscription (cumulative).
    CLIENT = "client"
    #: An ACK settles one message.
    CLIENT_INDIVIDUAL = "client-individual"


#: The ack modes' header values, in the order STOMP 1.2 lists them.
ACK_MODES = tuple(m.value for m in AckMode)
#: The duplicate-detection id on every SEND through the sidecar (docs/behaviour.md, "Duplicate
#: detection").
DUPLICATE_ID_HEADER = "mq-sidecar-id"
#: The receipt ids a sidecar requests upstream (``<session>-r<n>``, session ids being
#: ``<6 hex digits>-<n>``, proxy.app): RabbitMQ copies them into the MESSAGEs it delivers.
SIDECAR_RECEIPT = re.compile(r"[0-9a-f]{6}-[0-9]+-r[0-9]+")
#: Artemis' duplicate-detection header (Artemis "Duplicate Message Detection"): SENDs to
#: Artemis carry the sidecar's id in it too.
ARTEMIS_DUPLICATE_ID = "_AMQ_DUPL_ID"
#: Identities remembered per subscription to recognise duplicates and redeliveries
#: (docs/behaviour.md, "Duplicate detection": a bounded window of ids and time): at most this
#: many...
SEEN_MAX = 20_000
#: ...and none older than this many seconds.
SEEN_SECONDS = 600.0
#: The generation of an identity seeded from the outbox's persisted ids (a previous process
#: saw it): a copy of it is a duplicate on every link, in both ``failover_mode``s.
SEEDED = -1
#: Destination prefixes whose seen identities the outbox persists (docs/behaviour.md,
#: "Duplicate detection"): queues, where a message goes to one consumer, so an id seen by any
#: subscription of the destination is seen for all. A topic gives every subscriber its own
#: copy: one id set per topic would hide from a second subscriber a message it never saw.
_PERSISTED_PREFIXES = ("/queue/", "/amq/queue/")


def persists_seen(destination: str) -> bool:
    """Whether the identities seen on ``destination`` are persisted in outbox mode: a queue
    (``/queue/...``; RabbitMQ's ``/amq/queue/...``), not a topic, exchange or temporary
    destination (see :data:`_PERSISTED_PREFIXES` for why)."""
    return destination.startswith(_PERSISTED_PREFIXES)


def ack_ident(
    version: str, message_id: str, upstream_ack: str | None, upstream_sub: str
) -> list[tuple[str, str]]:
    """The headers by which an ACK/NACK names a message in STOMP ``version``: ``id`` (the
    MESSAGE's ``ack`` header, else its ``message-id``) in 1.2, ``message-id`` +
    ``subscription`` in 1.1, ``message-id`` in 1.0 (STOMP 1.0/1.1/1.2 "ACK")."""
    if version == "1.2":
        return [("id", upstream_ack or message_id)]
    if version == "1.1":
        return [("message-id", message_id), ("subscription", upstream_sub)]
    return [("message-id", message_id)]


class SessionError(Exception):
    """The app sent a frame that is valid STOMP but wrong for this session; fatal.

    The message is one line, fit for the ``message`` header of the ERROR frame the app gets
    (e.g. ``unknown ack id '17'``, ``transaction 'tx1' is not open``); the session then closes.
    """


class ForBroker(Exception):
    """A frame the session neither tracks nor judges: an id or transaction it does not know, a
    header it needs but the app left out. The frame goes to the broker as the app sent it and
    the broker's answer reaches the app unchanged (docs/behaviour.md, "Transparency first");
    the session state is left as it was. The message says why, for the log."""


class FrameRejected(SessionError):
    """One frame is refused, the session goes on (JEUS per-message exceptions; a stale ack
    id in ``strict`` mode; the COMMIT of a transaction rolled back by a failover)."""


@dataclass(eq=False)
class Subscription:
    """One live subscription of the app.

    ``frame`` is the SUBSCRIBE as sent upstream (upstream id, destination, ack mode, selector,
    durable-subscription headers...): replaying it restores the subscription. ``local`` marks
    the control-channel subscription, which never goes upstream (docs/behaviour.md, "Control
    channel").

    ``ack`` is the app's ack mode. An app's ``client`` subscription is ``client-individual``
    upstream too, and its cumulative ACK becomes one ACK per message it covers: after a
    failover the redeliveries the sidecar hides and remaps reorder the app's deliveries against
    the broker's, so a cumulative ACK upstream could cover a message the app still holds (and
    RabbitMQ closes the connection on the "unknown delivery tag" of its later ACK; found by the
    chaos soak). An app's ``auto`` subscription is made ``client-individual``
    upstream and the sidecar acknowledges each message itself once it is written to the app:
    with ``ack:auto`` a broker counts a message as acknowledged when it sends it, so the
    messages in flight when a connection breaks would be lost (issue 3, "AUTO ack's last
    message"); this way they are redelivered, and those the app already got are hidden.
    Where a ``client`` ACK covers only its own subscription (ActiveMQ, Artemis; not RabbitMQ,
    whose ``client`` ACK is an AMQP ``basic.ack multiple`` over the whole connection,
    measured), an auto subscription is ``client`` upstream instead, and one ACK of the last
    message of a burst settles the burst (:attr:`Delivered.coalesce`).
    """

    app_id: str | None
    upstream_id: str
    destination: str
    ack: AckMode
    frame: Frame
    local: bool = False
    deliveries: dict[str, Delivery] = field(default_factory=dict)  # app key -> delivery, in order
    pending_by_identity: dict[str, Delivery] = field(default_factory=dict)
    arrivals: int = 0  # upstream MESSAGEs seen on this subscription (orders cumulative acks)
    # identity -> (generation, "acked" | "nacked" | "delivered", seen at)
    seen: OrderedDict[str, tuple[int, str, float]] = field(default_factory=OrderedDict)
    sweep_at: float = float("-inf")  # when ``seen`` is next checked for expired identities
    #: A queue browser (ActiveMQ ``browser:true``): it gets what the queue held, then a
    #: ``browser:end`` MESSAGE (``browse_ended``); a new leg never makes it again
    #: (SessionState.new_link).
    browser: bool = False
    browse_ended: bool = False
    #: Outbox mode, a queue (:func:`persists_seen`): the ``mq-sidecar-id`` of each message
    #: the app settles (acknowledges, or gets on an auto subscription) is handed to the
    #: daemon to persist (:attr:`SessionState.seen_out`).
    persist_seen: bool = False
    #: Left behind by a failover (a browser): no broker has it; the app's UNSUBSCRIBE and ACKs
    #: are answered by the sidecar (``local`` is set too), a SUBSCRIBE with its id replaces it.
    dormant: bool = False
    #: A RabbitMQ stream subscription (:mod:`proxy.tracking.streams`): its SUBSCRIBE said so
    #: (``x-stream-offset``, ``x-queue-type:stream``) or its MESSAGEs carry a numeric
    #: ``x-stream-offset``. A new leg re-subscribes it after :attr:`stream_offset`, and its
    #: deliveries of an old leg are settled by the sidecar (an ACK on a stream is credit).
    stream: bool = False
    #: The offset of the last MESSAGE delivered to the app (or hidden as one the app was
    #: shown), None before the first: the new leg resumes at ``offset=<this + 1>``.
    stream_offset: int | None = None
    #: The offset the current leg was asked to resume at (``stream_offset + 1``), until its
    #: first MESSAGE past :attr:`stream_offset` came: one further on names a gap
    #: (:class:`proxy.tracking.streams.StreamGap`: retention removed what was between).
    stream_resume: int | None = None
    #: A MESSAGE carried an ``x-stream-offset`` that is not a number: the subscription is a
    #: queue for good (docs/behaviour.md, "Streams", bad input); the value, for the log.
    stream_refused: str | None = None
    #: An app ``ack:auto`` SUBSCRIBE whose headers name a stream: it stays ``auto`` upstream
    #: (RabbitMQ refuses automatic acknowledgement on a stream; the broker decides) and the
    #: sidecar sends no ACK of its own for it.
    auto_upstream: bool = False
    #: Whether a broker delivers to it now: live, restoring, cancelled by the broker, waiting
    #: for its queue, with the broker's words while it is refused (:mod:`proxy.tracking.health`;
    #: ``/status``, metrics, ``/readyz``).
    health: SubscriptionHealth = field(default_factory=SubscriptionHealth)


@dataclass(eq=False)
class Delivery:
    """A MESSAGE delivered to the app that still needs its ACK/NACK.

    ``upstream_ack`` is the broker's ``ack`` header (STOMP 1.2) on the current delivery;
    otherwise the upstream acknowledgement is built from ``message_id`` (and the subscription
    id in 1.1). ``generation`` is the link that delivered it: an ACK is only valid upstream on
    that link.
    """

    app_key: str
    subscription: Subscription
    message_id: str
    upstream_ack: str | None
    identity: str | None
    generation: int
    arrival: int = 0


@dataclass(frozen=True, slots=True)
class DurableRemoval(EntryContext):
    """Window-entry context of an UNSUBSCRIBE that also removes a durable subscription
    (RabbitMQ ``durable:true``): replaying it on a new leg needs the subscription re-made
    first, or the broker would keep the durable queue the app asked to delete."""

    subscribe: Frame


class PassThrough(EntryContext):
    """Window-entry context of an UNSUBSCRIBE that names no live subscription (ActiveMQ's
    removal of a durable subscription by name after its consumer closed): the broker decides,
    so it is replayed as it is (:data:`PASS_THROUGH`)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "PASS_THROUGH"


#: The one :class:`PassThrough` context.
PASS_THROUGH = PassThrough()


class StreamCredit(EntryContext):
    """Window-entry context of an ACK of a RabbitMQ stream's delivery outside a transaction
    (:data:`STREAM_CREDIT`): credit, not settlement (docs/brokers.md, "Streams"). One the old
    leg never confirmed is moot at a restore and reported to no one: the new leg resumes after
    its message, which never comes again (docs/behaviour.md, "Streams")."""

    __slots__ = ()


#: The one :class:`StreamCredit`.
STREAM_CREDIT = StreamCredit()


@dataclass(frozen=True, slots=True)
class StoredInOutbox(EntryContext):
    """Window-entry context of a SEND forwarded from the outbox (issue 17, docs/outbox.md):
    ``seq`` is its place in the outbox, removed from it once a RECEIPT covers the entry. The
    app had its RECEIPT when the frame was stored, so the entry carries no app receipt; it is
    replayed after a failover as any SEND outside a transaction."""

    seq: int


#: Bytes one open transaction is charged besides its frames (the object, its id, its lists):
#: so that a flood of BEGINs without COMMIT is bounded by ``max_transaction_size`` too.
TRANSACTION_OVERHEAD = 512
#: Bytes charged per delivery an ACK/NACK settled in an open transaction (the delivery is kept
#: to hold it again after an ABORT, or show it again after a rollback).
SETTLED_DELIVERY_COST = 256


@dataclass(eq=False, slots=True)
class TransactionBytes:
    """What a session's open transactions hold, in bytes (``used``), against its
    ``max_transaction_size``: the frames kept to re-run them after a failover plus the
    charges above. One per session, shared by its transactions; charged to the process's
    memory budget (``max_memory_bytes``) too when ``process`` is set."""

    used: int = 0
    process: MemoryBudget | None = None

    def add(self, nbytes: int) -> None:
        """Hold ``nbytes`` more (less, when negative)."""
        self.used += nbytes
        if self.process is not None:
            self.process.charge(nbytes)

    def leave_budget(self) -> None:
        """The session is over: give what it holds back to the process's budget."""
        if self.process is not None:
            self.process.release(self.used)
            self.process = None


@dataclass(eq=False)
class Transaction(EntryContext):
    """A transaction and what the session keeps of it: the BEGIN, the SEND entries it must be
    able to re-run on a new broker (``replay`` mode only: ``rollback`` mode never re-runs
    them), the COMMIT/ABORT that ends it (each knows whether the broker confirmed it).

    ``acked`` are the deliveries its ACKs settled: held again after an ABORT, shown again
    after a failover rolls the transaction back.
    ``rolled_back``: why it was rolled back by the sidecar (a failover in ``rollback`` mode, a
    frame of it dropped at ``call_timeout``), or None; its COMMIT answers an ERROR saying so,
    and no broker is given it again (:func:`proxy.tracking.replay.plan_replay`).
    ``frames``: SEND/ACK/NACK frames sent in it. ``charged_bytes``: what it is charged in
    ``budget`` (:data:`TRANSACTION_OVERHEAD`, the kept SENDs' sizes,
    :data:`SETTLED_DELIVERY_COST` per settled delivery), returned by :meth:`release`.
    """

    id: str
    budget: TransactionBytes = field(default_factory=TransactionBytes)
    begin: Entry | None = None
    entries: list[Entry] = field(default_factory=list)
    end: Entry | None = None
    acked: list[Delivery] = field(default_factory=list)
    rolled_back: str | None = None
    frames: int = 0
    charged_bytes: int = 0

    def __post_init__(self) -> None:
        self._charge(TRANSACTION_OVERHEAD)

    @property
    def dirty(self) -> bool:
        """Work was done in it (Qpid draft: a "dirty" session cannot fail over silently)."""
        return self.frames > 0

    def sent(self, entry: Entry, *, keep: bool, charge: bool | None = None) -> None:
        """A SEND/ACK/NACK of this transaction went into the window; ``keep`` it (a SEND in
        ``replay`` mode) to re-run it on a new broker. Its size is charged when kept, or with
        ``charge`` (the window holds it until COMMIT: RabbitMQ answers its receipt only then);
        ``charge`` defaults to ``keep``."""
        self.frames += 1
        if keep:
            self.entries.append(entry)
        if keep if charge is None else charge:
            self._charge(entry.size)

    def settled(self, delivery: Delivery) -> None:
        """An ACK/NACK in this transaction settled ``delivery``."""
        self.acked.append(delivery)
        self._charge(SETTLED_DELIVERY_COST)

    def forget_settled(self) -> list[Delivery]:
        """Return and clear :attr:`acked`, uncharging it."""
        acked, self.acked = self.acked, []
        self._charge(-SETTLED_DELIVERY_COST * len(acked))
        return acked

    def release(self) -> None:
        """It ended (COMMIT/ABORT): give back everything it was charged."""
        self._charge(-self.charged_bytes)

    def finished(self) -> None:
        """Nothing of it will be re-run (an ABORT, or a COMMIT the broker confirmed): drop the
        kept SENDs now. Each entry refers back to the transaction (its ``context``), so
        without this the frames would wait for the cyclic garbage collector: a steady
        transactional producer measured up to 120 MiB of dead frames between collections."""
        self.entries = []

    def _charge(self, nbytes: int) -> None:
        self.charged_bytes += nbytes
        self.budget.add(nbytes)


@dataclass(frozen=True, slots=True)
class Delivered:
    """What to do with one upstream MESSAGE.

    ``to_app``: the MESSAGE for the app (None: hidden). ``to_broker``: an ACK/NACK to send for
    a hidden message. ``hidden``: why it was hidden ("duplicate", "redelivery") or None.
    ``coalesce``: set (the upstream subscription id) when ``to_broker`` is a cumulative
    ``client`` ACK of an auto subscription: a later one of the same subscription replaces it.
    """

    to_app: Frame | None
    to_broker: Frame | None = None
    hidden: str | None = None
    coalesce: str | None = None


@dataclass(frozen=True, slots=True)
class Settled:
    """What an app ACK/NACK resolved to.

    ``to_broker``: the ACK/NACK to send upstream, or None when the delivery belongs to an older
    link and the redelivery will be settled on arrival (``transparent`` mode); ``local``: the
    delivery was the sidecar's own (control channel), nothing goes upstream. ``more``: in
    ``client`` mode, the ACKs/NACKs of the other messages a cumulative ACK settles, to send
    before ``to_broker`` (which carries the app's receipt).
    """

    to_broker: Frame | None
    local: bool = False
    more: tuple[Frame, ...] = ()
    #: The delivery was a stream subscription's: the ACK is credit (:class:`StreamCredit`).
    credit: bool = False
