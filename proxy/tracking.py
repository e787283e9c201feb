"""Session bookkeeping, pure: subscriptions, deliveries and ack ids, transactions, receipts.

No I/O and no trio here (like ``protocol/``): the session feeds frames in and gets frames out,
and the tests drive it directly. Everything a later reconnect needs to restore a session lives
in :class:`SessionState` (DESIGN §3.5): every live subscription with the headers it was made
with, every open transaction with its frames, every message delivered to the app and not yet
acknowledged, and the map from the sidecar's receipt ids to the app's.

Identifiers the app sees are the sidecar's own (DESIGN §3.3, §3.5):

- **ack ids** (STOMP 1.2 ``ack`` header of MESSAGE) are numbers the sidecar allocates per
  session and maps to the upstream delivery, so a later upstream change can keep them valid.
  STOMP 1.0/1.1 apps acknowledge by ``message-id`` (+ ``subscription`` in 1.1); those keys are
  mapped the same way.
- **receipt ids** sent upstream are ``<session id>-r<n>``; the app's receipt id never reaches a
  broker, so one session's ids can never collide with another's on a shared broker.
- **subscription ids** upstream are the app's own (RabbitMQ names durable subscription queues
  after them, so they must survive a reconnect unchanged); a STOMP 1.0 SUBSCRIBE without an id
  gets ``<session id>-s<n>``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from protocol import Frame

__all__ = [
    "ACK_MODES",
    "Delivery",
    "SessionError",
    "SessionState",
    "Subscription",
    "Transaction",
]

#: STOMP 1.2 "SUBSCRIBE ack Header".
ACK_MODES = ("auto", "client", "client-individual")


class SessionError(Exception):
    """The app sent a frame that is valid STOMP but wrong for this session's state.

    The message is one line, fit for the ``message`` header of the ERROR frame the app gets
    (e.g. ``unknown ack id '17'``, ``transaction 'tx1' is not open``).
    """


@dataclass(eq=False)
class Subscription:
    """One live subscription of the app.

    ``frame`` is the SUBSCRIBE as sent upstream (upstream id, destination, ack mode, selector,
    durable-subscription headers...): replaying it restores the subscription.
    """

    app_id: str | None
    upstream_id: str
    destination: str
    ack: str
    frame: Frame
    deliveries: dict[str, Delivery] = field(default_factory=dict)  # app key -> delivery, in order


@dataclass(eq=False)
class Delivery:
    """A MESSAGE delivered to the app that still needs its ACK/NACK.

    ``upstream_ack`` is the broker's ``ack`` header (STOMP 1.2) when it sent one; otherwise the
    upstream acknowledgement is built from ``message_id`` (and the subscription id in 1.1).
    """

    app_key: str
    subscription: Subscription
    message_id: str
    upstream_ack: str | None


@dataclass(eq=False)
class Transaction:
    """An open transaction (BEGIN seen, no COMMIT/ABORT yet) and the frames sent in it."""

    id: str
    frames: list[Frame] = field(default_factory=list)


class SessionState:
    """The state of one app session that outlives any single upstream connection.

    Args:
        session_id: the sidecar's id for this session (prefix of generated ids).
        app_version: the STOMP version negotiated with the app ("1.0", "1.1", "1.2").
        max_subscriptions: live subscriptions allowed per session (DESIGN §3.8).
        max_unacked: delivered-but-unacknowledged messages allowed (DESIGN §3.8).

    Methods raise :class:`SessionError` for frames that do not fit the session's state.
    """

    def __init__(
        self,
        session_id: str,
        app_version: str,
        *,
        max_subscriptions: int,
        max_unacked: int,
    ) -> None:
        self.session_id = session_id
        self.app_version = app_version
        self.max_subscriptions = max_subscriptions
        self.max_unacked = max_unacked
        self.subscriptions: dict[str, Subscription] = {}  # by upstream id
        self.transactions: dict[str, Transaction] = {}
        self._receipts: dict[str, str | None] = {}  # own receipt id -> app's (None: ours)
        self._deliveries: dict[str, Delivery] = {}  # app key -> delivery (all subscriptions)
        self._next_receipt = 0
        self._next_ack = 0
        self._next_sub = 0

    # -- receipts -----------------------------------------------------------------------------

    def new_receipt(self, app_receipt: str | None) -> str:
        """Allocate a receipt id for an upstream frame; remember the app's id it answers."""
        self._next_receipt += 1
        own = f"{self.session_id}-r{self._next_receipt}"
        self._receipts[own] = app_receipt
        return own

    def map_receipt(self, frame: Frame) -> Frame:
        """Return ``frame`` with the app's ``receipt`` header replaced by a sidecar receipt id."""
        app_receipt = frame.get("receipt")
        if app_receipt is None:
            return frame
        return frame.with_header("receipt", self.new_receipt(app_receipt))

    def take_receipt(self, own: str) -> tuple[bool, str | None]:
        """Resolve an upstream ``receipt-id``: ``(known, app receipt id or None if ours)``."""
        if own not in self._receipts:
            return False, None
        return True, self._receipts.pop(own)

    @property
    def pending_receipts(self) -> int:
        """Receipts requested upstream and not yet answered."""
        return len(self._receipts)

    # -- subscriptions ------------------------------------------------------------------------

    def subscribe(self, frame: Frame) -> Frame:
        """Record an app SUBSCRIBE; return the SUBSCRIBE to send upstream (receipt not mapped).

        Raises:
            SessionError: duplicate id, unknown ack mode, or too many subscriptions.
        """
        destination = frame.get("destination")
        assert destination is not None  # protocol.Connection checks required headers
        app_id = frame.get("id")
        ack = frame.get("ack", "auto") or "auto"
        if ack not in ACK_MODES:
            raise SessionError(f"unknown ack mode '{ack}' (expected one of {', '.join(ACK_MODES)})")
        if len(self.subscriptions) >= self.max_subscriptions:
            raise SessionError(
                f"too many subscriptions: this session already has {self.max_subscriptions}"
            )
        if app_id is not None:
            if app_id in self.subscriptions:
                raise SessionError(f"subscription id '{app_id}' is already in use")
            upstream_id = app_id
            upstream = frame
        else:  # STOMP 1.0 allows a SUBSCRIBE without id
            while True:
                self._next_sub += 1
                upstream_id = f"{self.session_id}-s{self._next_sub}"
                if upstream_id not in self.subscriptions:
                    break
            upstream = frame.with_header("id", upstream_id)
        upstream = upstream.without("receipt")
        self.subscriptions[upstream_id] = Subscription(
            app_id=app_id, upstream_id=upstream_id, destination=destination, ack=ack, frame=upstream
        )
        return upstream

    def unsubscribe(self, frame: Frame) -> Subscription | None:
        """Forget the subscription an app UNSUBSCRIBE names (by id, or destination in 1.0).

        Its unacknowledged deliveries are forgotten too: the broker redelivers them elsewhere.
        Returns None when no live subscription matches: such an UNSUBSCRIBE still means
        something to a broker (ActiveMQ removes a durable subscription by name after its
        consumer closed), so the session passes it on and the broker answers.
        """
        app_id = frame.get("id")
        sub: Subscription | None = None
        if app_id is not None:
            sub = self.subscriptions.get(app_id)
            if sub is not None and sub.app_id is None:
                sub = None
        else:
            destination = frame.get("destination")
            sub = next(
                (s for s in self.subscriptions.values() if s.destination == destination), None
            )
        if sub is None:
            return None
        del self.subscriptions[sub.upstream_id]
        for key in sub.deliveries:
            self._deliveries.pop(key, None)
        sub.deliveries.clear()
        return sub

    # -- deliveries ---------------------------------------------------------------------------

    @property
    def unacked(self) -> int:
        """Messages delivered to the app that still need an ACK/NACK."""
        return len(self._deliveries)

    def deliver(self, message: Frame) -> Frame:
        """Turn an upstream MESSAGE into the MESSAGE the app gets, recording what needs an ack.

        The upstream ``ack`` header is replaced by the sidecar's ack id (STOMP 1.2 apps) or
        removed (1.0/1.1 apps acknowledge by ``message-id``); ``subscription`` is the app's id.
        A MESSAGE for a subscription the app never made (RabbitMQ delivers temp-queue replies
        with ``subscription:/temp-queue/...``) passes through unchanged and needs no ack.
        """
        upstream_sub = message.get("subscription")
        sub = self.subscriptions.get(upstream_sub) if upstream_sub is not None else None
        if sub is None and upstream_sub is None:  # a STOMP 1.0 broker: match by destination
            destination = message.get("destination")
            sub = next(
                (s for s in self.subscriptions.values() if s.destination == destination), None
            )
        if sub is None:
            return message
        upstream_ack = message.get("ack")
        out = message.without("ack")
        if sub.app_id is not None:
            out = out.with_header("subscription", sub.app_id)
        elif out.has("subscription"):
            out = out.without("subscription")
        if sub.ack == "auto":
            return out
        message_id = message.get("message-id", "") or ""
        if self.app_version == "1.2":
            self._next_ack += 1
            key = str(self._next_ack)
            out = out.with_header("ack", key)
        elif self.app_version == "1.1":
            key = f"{sub.app_id}\x00{message_id}"
        else:
            key = message_id
        delivery = Delivery(
            app_key=key, subscription=sub, message_id=message_id, upstream_ack=upstream_ack
        )
        self._deliveries[key] = delivery
        sub.deliveries[key] = delivery
        return out

    def settle(self, frame: Frame) -> Delivery:
        """Resolve an app ACK/NACK to its delivery and forget what it settles.

        In ``client`` ack mode an ACK/NACK is cumulative (STOMP 1.2 "SUBSCRIBE ack Header"):
        every earlier delivery on that subscription is settled too.

        Raises:
            SessionError: the ack id (or message-id) matches no outstanding delivery.
        """
        if self.app_version == "1.2":
            key = frame.get("id", "") or ""
            what = f"ack id '{key}'"
        elif self.app_version == "1.1":
            key = f"{frame.get('subscription')}\x00{frame.get('message-id')}"
            what = (
                f"message-id '{frame.get('message-id')}' "
                f"on subscription '{frame.get('subscription')}'"
            )
        else:
            key = frame.get("message-id", "") or ""
            what = f"message-id '{key}'"
        delivery = self._deliveries.get(key)
        if delivery is None:
            raise SessionError(f"unknown {what}: no unacknowledged message has it")
        sub = delivery.subscription
        if sub.ack == "client":
            while sub.deliveries:
                first_key = next(iter(sub.deliveries))
                sub.deliveries.pop(first_key)
                self._deliveries.pop(first_key, None)
                if first_key == key:
                    break
        else:
            sub.deliveries.pop(key, None)
            del self._deliveries[key]
        return delivery

    def upstream_ack(self, frame: Frame, delivery: Delivery, upstream_version: str) -> Frame:
        """Build the ACK/NACK for the broker, in the upstream leg's STOMP version.

        The app's other headers (``transaction``, ``receipt`` already mapped) are kept; the
        identifying headers are rewritten: ``id`` in 1.2, ``message-id`` + ``subscription`` in
        1.1, ``message-id`` in 1.0 (STOMP 1.0/1.1/1.2 "ACK").
        """
        rest = frame.without("id", "message-id", "subscription")
        if upstream_version == "1.2":
            ident: tuple[tuple[str, str], ...] = (
                ("id", delivery.upstream_ack or delivery.message_id),
            )
        elif upstream_version == "1.1":
            ident = (
                ("message-id", delivery.message_id),
                ("subscription", delivery.subscription.upstream_id),
            )
        else:
            ident = (("message-id", delivery.message_id),)
        return rest.replace(headers=ident + rest.headers)

    # -- transactions -------------------------------------------------------------------------

    def begin(self, frame: Frame) -> None:
        """Open the transaction a BEGIN names. Raises SessionError if it is already open."""
        tx = frame.get("transaction", "") or ""
        if tx in self.transactions:
            raise SessionError(f"transaction '{tx}' is already open")
        self.transactions[tx] = Transaction(tx)

    def end(self, frame: Frame) -> Transaction:
        """Close the transaction a COMMIT/ABORT names. Raises SessionError if it is not open."""
        tx = frame.get("transaction", "") or ""
        if tx not in self.transactions:
            raise SessionError(f"transaction '{tx}' is not open")
        return self.transactions.pop(tx)

    def record_in_transaction(self, frame: Frame) -> None:
        """Remember a SEND/ACK/NACK sent in a transaction (replayed or rolled back on failover).

        Raises SessionError if the frame names a transaction that is not open.
        """
        tx = frame.get("transaction")
        if tx is None:
            return
        if tx not in self.transactions:
            raise SessionError(f"transaction '{tx}' is not open")
        self.transactions[tx].frames.append(frame)

    def iter_subscribe_frames(self) -> Iterator[Frame]:
        """The SUBSCRIBE frames that recreate every live subscription, in creation order."""
        for sub in self.subscriptions.values():
            yield sub.frame
