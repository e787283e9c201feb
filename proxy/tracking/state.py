"""The state of one app session that outlives any single upstream connection
(:class:`SessionState`); see :mod:`proxy.tracking` for the rules it keeps."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

from protocol import Command, Frame
from proxy.tracking.records import (
    ACK_MODES,
    ARTEMIS_DUPLICATE_ID,
    DUPLICATE_ID_HEADER,
    SEEN_MAX,
    SEEN_SECONDS,
    AckMode,
    Delivered,
    Delivery,
    FrameRejected,
    SessionError,
    Settled,
    Subscription,
    Transaction,
    ack_ident,
)

__all__ = ["SessionState"]

#: The headers by which an ACK/NACK names its message, in one STOMP version or another.
_ACK_IDENTIFIERS = frozenset({"id", "message-id", "subscription"})


class SessionState:
    """The state of one app session that outlives any single upstream connection.

    Args:
        session_id: the sidecar's id for this session (prefix of generated ids).
        app_version: the STOMP version negotiated with the app ("1.0", "1.1", "1.2").
        max_subscriptions: live subscriptions allowed per session (docs/behaviour.md, "Limits
            and bad input").
        max_unacked: delivered-but-unacknowledged messages allowed (same page).
        transparent: ``failover_mode`` is "transparent" (else "strict", JMS semantics).

    Methods raise :class:`SessionError` (fatal) or :class:`FrameRejected` (that frame only).
    """

    def __init__(
        self,
        session_id: str,
        app_version: str,
        *,
        max_subscriptions: int,
        max_unacked: int,
        transparent: bool = True,
    ) -> None:
        self.session_id = session_id
        self.app_version = app_version
        self.max_subscriptions = max_subscriptions
        self.max_unacked = max_unacked
        self.transparent = transparent
        self.generation = 0
        self.stable_message_ids = False
        #: The upstream ack mode of the app's auto subscriptions on the current link.
        self.auto_ack_mode = AckMode.CLIENT_INDIVIDUAL
        self.subscriptions: dict[str, Subscription] = {}  # by upstream id
        self.transactions: dict[str, Transaction] = {}
        self._internal: set[str] = set()
        self._deliveries: dict[str, Delivery] = {}  # app key -> delivery (all subscriptions)
        self._stale: OrderedDict[str, None] = OrderedDict()  # strict mode: superseded ack keys
        self.removing: set[str] = set()  # upstream ids of durable subscriptions being removed
        self._next_internal = 0
        self._next_ack = 0
        self._next_sub = 0
        self.duplicates_hidden = 0
        self.redeliveries_hidden = 0

    # -- links ------------------------------------------------------------------------------

    def new_link(
        self, *, stable_message_ids: bool, client_ack_per_subscription: bool = False
    ) -> None:
        """A new upstream connection: deliveries of older links are stale from now on.

        ``client_ack_per_subscription``: a ``client`` ACK on this link settles only its own
        subscription's messages, so app auto subscriptions are ``client`` upstream (see
        :class:`Subscription`); SUBSCRIBEs replayed on it say so (:meth:`upstream_subscribe`).
        """
        self.generation += 1
        self.stable_message_ids = stable_message_ids
        self.auto_ack_mode = (
            AckMode.CLIENT if client_ack_per_subscription else AckMode.CLIENT_INDIVIDUAL
        )

    def identity(self, message: Frame) -> str | None:
        """The identity of a message (module docstring), or None when it has none."""
        return self._identity_of(message.get(DUPLICATE_ID_HEADER), message.get("message-id"))

    def _identity_of(self, dup_id: str | None, message_id: str | None) -> str | None:
        """:meth:`identity` from the message's first ``mq-sidecar-id`` and ``message-id``."""
        if dup_id is not None:
            return f"d:{dup_id}"
        if self.stable_message_ids and message_id is not None:
            return f"m:{message_id}"
        return None

    # -- internal receipts ------------------------------------------------------------------

    def new_internal_receipt(self) -> str:
        """A receipt id for a frame of the sidecar's own (restore, goodbye)."""
        self._next_internal += 1
        own = f"{self.session_id}-i{self._next_internal}"
        self._internal.add(own)
        return own

    def take_internal_receipt(self, receipt: str) -> bool:
        """Whether ``receipt`` was one of ours (and forget it)."""
        if receipt in self._internal:
            self._internal.discard(receipt)
            return True
        return False

    # -- subscriptions ----------------------------------------------------------------------

    def subscribe(self, frame: Frame, *, local: bool = False) -> Frame:
        """Record an app SUBSCRIBE; return the SUBSCRIBE to send upstream (no receipt).

        Raises:
            SessionError: duplicate id, unknown ack mode, or too many subscriptions.
        """
        destination = frame.get("destination")
        assert destination is not None  # protocol.Connection checks required headers
        app_id = frame.get("id")
        ack_header = frame.get("ack", "auto") or "auto"
        if ack_header not in ACK_MODES:
            raise SessionError(
                f"unknown ack mode '{ack_header}' (expected one of {', '.join(ACK_MODES)})"
            )
        ack = AckMode(ack_header)
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
        if ack is AckMode.CLIENT and not local:
            upstream = upstream.with_header("ack", AckMode.CLIENT_INDIVIDUAL.value)
        elif ack is AckMode.AUTO and not local:
            upstream = upstream.with_header("ack", self.auto_ack_mode.value)
        self.removing.discard(upstream_id)
        self.subscriptions[upstream_id] = Subscription(
            app_id=app_id,
            upstream_id=upstream_id,
            destination=destination,
            ack=ack,
            frame=upstream,
            local=local,
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
        sub.pending_by_identity.clear()
        return sub

    def upstream_subscribe(self, frame: Frame) -> Frame:
        """A SUBSCRIBE about to go upstream again (a restore), with the ack mode of the
        current link for an app auto subscription (:meth:`new_link`)."""
        sub = self.subscriptions.get(frame.get("id") or "")
        if sub is None or sub.ack is not AckMode.AUTO or sub.local:
            return frame
        mode = self.auto_ack_mode.value
        if frame.get("ack") == mode:
            return frame
        sub.frame = sub.frame.with_header("ack", mode)
        return frame.with_header("ack", mode)

    def local_subscriptions(self) -> list[Subscription]:
        """The control-channel subscriptions (never sent upstream)."""
        return [s for s in self.subscriptions.values() if s.local]

    def iter_subscribe_frames(self) -> Iterator[Frame]:
        """The SUBSCRIBE frames that recreate every live broker subscription, in order."""
        for sub in self.subscriptions.values():
            if not sub.local:
                yield sub.frame

    # -- deliveries -------------------------------------------------------------------------

    @property
    def unacked(self) -> int:
        """Messages delivered to the app that still need an ACK/NACK."""
        return len(self._deliveries)

    def _remember(
        self,
        sub: Subscription,
        identity: str,
        status: str,
        now: float,
        generation: int | None = None,
    ) -> None:
        seen = sub.seen
        if identity in seen:
            seen.move_to_end(identity)
        seen[identity] = (self.generation if generation is None else generation, status, now)
        if len(seen) > SEEN_MAX:
            seen.popitem(last=False)
        if now >= sub.sweep_at:  # the age bound, checked at most once a second (hot path)
            sub.sweep_at = now + 1.0
            cutoff = now - SEEN_SECONDS
            while seen and next(iter(seen.values()))[2] < cutoff:
                seen.popitem(last=False)

    def deliver(self, message: Frame, *, upstream_version: str = "1.2", now: float) -> Delivered:
        """Decide what an upstream MESSAGE becomes for the app.

        ``to_broker``, when set, is sent after ``to_app`` was written (for an ``auto``
        subscription: the sidecar's own ACK, see :class:`Subscription`). Normal case: the
        upstream ``ack`` header is replaced by the sidecar's ack id (STOMP 1.2 apps) or
        removed (1.0/1.1 apps acknowledge by ``message-id``) and ``subscription`` is the
        app's id. A MESSAGE for a subscription the app never made (RabbitMQ delivers
        temp-queue replies with ``subscription:/temp-queue/...``) passes through unchanged.

        Recognised by identity (docs/behaviour.md, "Duplicate detection"):

        - a redelivery (after a failover) of a message the app holds unacknowledged: in
          ``transparent`` mode hidden, and its ack id now maps to this delivery; in ``strict``
          mode shown as a new delivery with ``redelivered:true`` (the old ack id is stale);
        - a redelivery of a message the app already acknowledged: acknowledged upstream and
          hidden in ``transparent`` mode, shown again in ``strict``; a message the app NACKed
          is always shown again (it asked for a redelivery);
        - a duplicate (same identity on the same link, e.g. a producer's replayed SEND):
          acknowledged upstream and hidden in both modes.
        """
        # One pass over the headers (the hot path): the ids this needs, first entries only
        # (STOMP 1.2 "Repeated Header Entries"), and the app's headers without ``ack``.
        upstream_sub: str | None = None
        message_id: str | None = None
        upstream_ack: str | None = None
        dup_id: str | None = None
        rest: list[tuple[str, str]] = []
        artemis_at: list[int] = []  # where _AMQ_DUPL_ID entries are in ``rest``
        sub_at = -1
        for item in message.headers:
            name = item[0]
            if name == "ack":
                if upstream_ack is None:
                    upstream_ack = item[1]
                continue
            if name == "subscription":
                if sub_at >= 0:
                    continue  # repeats go: the app gets exactly one (its own id) or none
                sub_at = len(rest)
                upstream_sub = item[1]
            elif name == "message-id":
                if message_id is None:
                    message_id = item[1]
            elif name == DUPLICATE_ID_HEADER:
                # The sidecars' own id: used here, never shown to the app (so an app that
                # re-publishes a MESSAGE with its headers copied sends a new message).
                if dup_id is None:
                    dup_id = item[1]
                continue
            elif name == ARTEMIS_DUPLICATE_ID:
                artemis_at.append(len(rest))
            rest.append(item)
        if artemis_at and dup_id is not None:
            # Artemis' copy of the sidecar's id goes too; one the app set itself stays.
            for at in reversed(artemis_at):
                if rest[at][1] == dup_id:
                    del rest[at]
                    if at < sub_at:
                        sub_at -= 1
        if upstream_sub is not None:
            sub = self.subscriptions.get(upstream_sub)
        else:  # a STOMP 1.0 broker: match by destination
            destination = message.get("destination")
            sub = next(
                (s for s in self.subscriptions.values() if s.destination == destination), None
            )
        if sub is None:
            if upstream_sub in self.removing:
                return Delivered(None, hidden="unsubscribed")
            if dup_id is None:
                return Delivered(message)
            # Not the app's subscription (a temp-queue reply): unchanged but for the ids.
            kept = [h for h in message.headers if h[0] != DUPLICATE_ID_HEADER]
            kept = [h for h in kept if not (h[0] == ARTEMIS_DUPLICATE_ID and h[1] == dup_id)]
            return Delivered(Frame.unchecked(Command.MESSAGE, tuple(kept), message.body))
        sub.arrivals += 1
        identity = self._identity_of(dup_id, message_id)
        message_id = message_id or ""
        redelivered = False
        if identity is not None:
            held = sub.pending_by_identity.get(identity)
            if held is not None:
                if held.generation == self.generation:
                    return self._hide(sub, message_id, upstream_ack, "duplicate", upstream_version)
                if self.transparent:
                    held.upstream_ack = upstream_ack
                    held.message_id = message_id
                    held.generation = self.generation
                    held.arrival = sub.arrivals
                    self.redeliveries_hidden += 1
                    return Delivered(None, hidden="redelivery")
                redelivered = True  # strict: the held ack id is stale from now on
                self._forget(held)
                self._stale[held.app_key] = None
                while len(self._stale) > 2 * self.max_unacked:
                    self._stale.popitem(last=False)
            else:
                seen = sub.seen.get(identity)
                if seen is not None and seen[1] == "nacked":
                    # The app asked for it to come back (RabbitMQ requeues a NACKed message
                    # at once): deliver it again, never hide it.
                    del sub.seen[identity]
                elif seen is not None:
                    if seen[0] == self.generation:
                        return self._hide(
                            sub, message_id, upstream_ack, "duplicate", upstream_version
                        )
                    if self.transparent:
                        return self._hide(
                            sub, message_id, upstream_ack, "redelivery", upstream_version
                        )
                    redelivered = True
        # The app's headers: its own subscription id in place of the first entry (or none).
        if sub.app_id is not None:
            if sub_at >= 0:
                rest[sub_at] = ("subscription", sub.app_id)
            else:
                rest.append(("subscription", sub.app_id))
        elif sub_at >= 0:
            del rest[sub_at]
        out = Frame.unchecked(Command.MESSAGE, tuple(rest), message.body)
        if redelivered:
            out = out.with_header("redelivered", "true")
        if sub.ack is AckMode.AUTO:
            if identity is not None:
                self._remember(sub, identity, "acked", now)
            ack = self._own_ack(sub, message_id, upstream_ack, upstream_version)
            return Delivered(out, to_broker=ack, coalesce=self._coalesce(sub))
        out, key = self._app_ack_key(sub, out, message_id)
        delivery = Delivery(
            app_key=key,
            subscription=sub,
            message_id=message_id,
            upstream_ack=upstream_ack,
            identity=identity,
            generation=self.generation,
            arrival=sub.arrivals,
        )
        self._stale.pop(key, None)
        self._deliveries[key] = delivery
        sub.deliveries[key] = delivery
        if identity is not None:
            sub.pending_by_identity[identity] = delivery
            self._remember(sub, identity, "delivered", now)
        return Delivered(out)

    def _app_ack_key(self, sub: Subscription, out: Frame, message_id: str) -> tuple[Frame, str]:
        """The key the app will acknowledge ``out`` by: a new sidecar ack id (STOMP 1.2, added
        as the ``ack`` header, appended: ``out`` has none), ``subscription`` + ``message-id``
        (1.1) or ``message-id`` (1.0)."""
        if self.app_version == "1.2":
            self._next_ack += 1
            key = str(self._next_ack)
            return Frame.unchecked(out.command, (*out.headers, ("ack", key)), out.body), key
        if self.app_version == "1.1":
            return out, f"{sub.app_id}\x00{message_id}"
        return out, message_id

    def _hide(
        self,
        sub: Subscription,
        message_id: str,
        upstream_ack: str | None,
        why: str,
        upstream_version: str,
    ) -> Delivered:
        """Hide a duplicate or redelivery and acknowledge it upstream at once (every
        subscription that acknowledges is ``client-individual`` upstream, see Subscription)."""
        if why == "duplicate":
            self.duplicates_hidden += 1
        else:
            self.redeliveries_hidden += 1
        ack = self._own_ack(sub, message_id, upstream_ack, upstream_version)
        return Delivered(None, to_broker=ack, hidden=why, coalesce=self._coalesce(sub))

    def _coalesce(self, sub: Subscription) -> str | None:
        """The key under which the sidecar's ACKs of ``sub`` replace each other: only an app
        auto subscription that is ``client`` upstream (cumulative, per subscription)."""
        if sub.ack is AckMode.AUTO and self.auto_ack_mode is AckMode.CLIENT:
            return sub.upstream_id
        return None

    @staticmethod
    def _own_ack(
        sub: Subscription, message_id: str, upstream_ack: str | None, upstream_version: str
    ) -> Frame:
        """The sidecar's own ACK of a message the app will never acknowledge itself (an auto
        subscription's, a hidden one): :meth:`upstream_ack` of a bare ACK, built directly."""
        ident = ack_ident(upstream_version, message_id, upstream_ack, sub.upstream_id)
        return Frame.unchecked(Command.ACK, tuple(ident), b"")

    def _forget(self, delivery: Delivery) -> None:
        sub = delivery.subscription
        sub.deliveries.pop(delivery.app_key, None)
        self._deliveries.pop(delivery.app_key, None)
        if (
            delivery.identity is not None
            and sub.pending_by_identity.get(delivery.identity) is delivery
        ):
            del sub.pending_by_identity[delivery.identity]

    def local_delivery(self, sub: Subscription, message: Frame) -> Frame:
        """Address a sidecar-made MESSAGE (an event) to a local subscription; an ack id is
        added when the subscription asks for acks, and settling it sends nothing upstream."""
        out = message
        if sub.app_id is not None:
            out = out.with_header("subscription", sub.app_id)
        if sub.ack is AckMode.AUTO:
            return out
        message_id = out.get("message-id", "") or ""
        out, key = self._app_ack_key(sub, out, message_id)
        delivery = Delivery(key, sub, message_id, None, None, self.generation)
        self._deliveries[key] = delivery
        sub.deliveries[key] = delivery
        return out

    def settle(self, frame: Frame, *, upstream_version: str, now: float) -> Settled:
        """Resolve an app ACK/NACK to the frame for the broker, and forget what it settles.

        In ``client`` ack mode an ACK/NACK is cumulative (STOMP 1.2 "SUBSCRIBE ack Header"):
        every earlier delivery on that subscription is settled too. A delivery from an older
        link has no valid upstream ack id: in ``transparent`` mode its identity is remembered
        and the redelivery is settled when it arrives (``to_broker`` None); in ``strict`` mode
        the ACK is rejected as stale (JMS: acknowledgements of messages received before a
        failover fail).

        Raises:
            SessionError: the ack id (or message-id) matches no outstanding delivery.
            FrameRejected: a stale ack id in ``strict`` mode.
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
            if key in self._stale:
                raise FrameRejected(
                    f"{what} is stale: the message was delivered before a failover and has been "
                    "redelivered with a new ack id"
                )
            raise SessionError(f"unknown {what}: no unacknowledged message has it")
        sub = delivery.subscription
        stale = delivery.generation != self.generation and not sub.local
        if stale and not self.transparent:
            self._forget(delivery)
            raise FrameRejected(
                f"{what} is stale: the message was delivered before a failover and will be "
                "redelivered"
            )
        status = "nacked" if frame.command == "NACK" else "acked"
        settled = [delivery]
        if sub.ack is AckMode.CLIENT:
            settled = []
            for candidate in list(sub.deliveries.values()):
                settled.append(candidate)
                if candidate is delivery:
                    break
        tx = frame.get("transaction")
        for d in settled:
            self._forget(d)
            if d.identity is not None:
                self._remember(sub, d.identity, status, now, generation=d.generation)
            if tx is not None and tx in self.transactions:
                self.transactions[tx].acked.append(d)
        if sub.local:
            return Settled(None, local=True)
        if sub.ack is AckMode.CLIENT:
            # client-individual upstream (Subscription): one ACK/NACK per message settled,
            # except those of older links (their redeliveries are settled on arrival).
            frames = [
                self.upstream_ack(frame, d, upstream_version)
                for d in settled
                if d.generation == self.generation
            ]
            if not frames:
                return Settled(None)
            return Settled(frames[-1], more=tuple(frames[:-1]))
        if stale:
            return Settled(None)
        return Settled(self.upstream_ack(frame, delivery, upstream_version))

    def upstream_ack(self, frame: Frame, delivery: Delivery, upstream_version: str) -> Frame:
        """Build the ACK/NACK for the broker, in the upstream leg's STOMP version.

        The app's other headers (``transaction``, ``receipt``) are kept; the identifying
        headers are rewritten: ``id`` in 1.2, ``message-id`` + ``subscription`` in 1.1,
        ``message-id`` in 1.0 (STOMP 1.0/1.1/1.2 "ACK").
        """
        rest = [h for h in frame.headers if h[0] not in _ACK_IDENTIFIERS]
        ident = ack_ident(
            upstream_version,
            delivery.message_id,
            delivery.upstream_ack,
            delivery.subscription.upstream_id,
        )
        return Frame.unchecked(frame.command, tuple(ident + rest), frame.body)

    # -- transactions -----------------------------------------------------------------------

    def begin(self, frame: Frame) -> None:
        """Open the transaction a BEGIN names. Raises SessionError if it is already open."""
        tx = frame.get("transaction", "") or ""
        if tx in self.transactions:
            raise SessionError(f"transaction '{tx}' is already open")
        self.transactions[tx] = Transaction(tx)

    def end(self, frame: Frame, *, now: float) -> Transaction:
        """Close the transaction a COMMIT/ABORT names (``now``: the caller's clock, seconds,
        as for :meth:`deliver`). Raises SessionError if it is not open."""
        tx = frame.get("transaction", "") or ""
        if tx not in self.transactions:
            raise SessionError(f"transaction '{tx}' is not open")
        ended = self.transactions.pop(tx)
        if frame.command == "ABORT":
            # The broker keeps what the transaction acknowledged unacknowledged (ActiveMQ
            # StompSubscription.onStompAbort); so does the sidecar: the app holds them again.
            for d in ended.acked:
                self._restore_delivery(d, now)
            ended.acked.clear()
        return ended

    def _restore_delivery(self, d: Delivery, now: float) -> None:
        sub = d.subscription
        if sub.upstream_id not in self.subscriptions:
            return
        self._deliveries[d.app_key] = d
        sub.deliveries[d.app_key] = d
        if d.identity is not None:
            sub.pending_by_identity[d.identity] = d
            self._remember(sub, d.identity, "delivered", now, generation=d.generation)

    def transaction_of(self, frame: Frame) -> Transaction | None:
        """The open transaction a SEND/ACK/NACK names, if any.

        Raises SessionError if it names a transaction that is not open.
        """
        tx = frame.get("transaction")
        if tx is None:
            return None
        if tx not in self.transactions:
            raise SessionError(f"transaction '{tx}' is not open")
        return self.transactions[tx]

    def roll_back(self, tx: Transaction) -> None:
        """A failover rolled ``tx`` back (``rollback`` mode): the messages its ACKs settled
        will come back and must be shown again (GigaSpaces/JMS: redelivered after rollback)."""
        tx.rolled_back = True
        for d in tx.acked:
            if d.identity is not None:
                d.subscription.seen.pop(d.identity, None)
        tx.acked.clear()
