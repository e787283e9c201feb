"""The state of one app session that outlives any single upstream connection
(:class:`SessionState`); see :mod:`proxy.tracking` for the rules it keeps."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

from protocol import Command, Frame
from proxy.tracking.deliveries import Deliveries
from proxy.tracking.health import (
    SubscriptionState,
    SubscriptionStatistics,
    kind_of,
    queue_of,
    unavailable_queue,
)
from proxy.tracking.links import LinkEnd, TempNames, misses_messages
from proxy.tracking.records import (
    ACK_MODES,
    DUPLICATE_ID_HEADER,
    SEEN_MAX,
    AckMode,
    Delivery,
    ForBroker,
    SessionError,
    Subscription,
    Transaction,
    TransactionBytes,
    persists_seen,
)
from proxy.tracking.streams import StreamGap, is_stream_subscribe, resume_subscribe

__all__ = ["SessionState"]


class SessionState(Deliveries):
    """The state of one app session that outlives any single upstream connection.

    Args:
        session_id: the sidecar's id for this session (prefix of generated ids).
        app_version: the STOMP version negotiated with the app ("1.0", "1.1", "1.2").
        max_subscriptions: live subscriptions allowed per session (docs/behaviour.md, "Limits
            and bad input").
        max_unacked: delivered-but-unacknowledged messages allowed (same page).
        id_cache_size: duplicate-detection ids each subscription remembers (``id_cache_size``,
            docs/behaviour.md, "Duplicate detection"; default :data:`SEEN_MAX`).
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
        id_cache_size: int = SEEN_MAX,
    ) -> None:
        self.session_id = session_id
        self.app_version = app_version
        self.max_subscriptions = max_subscriptions
        self.max_unacked = max_unacked
        self.id_cache_size = id_cache_size
        self.transparent = transparent
        self.generation = 0
        self.stable_message_ids = False
        self.acks_ignore_subscription = False
        #: The upstream ack mode of the app's auto subscriptions on the current link.
        self.auto_ack_mode = AckMode.CLIENT_INDIVIDUAL
        self.subscriptions: dict[str, Subscription] = {}  # by upstream id
        self.transactions: dict[str, Transaction] = {}
        #: What the open transactions hold, bytes (against ``max_transaction_size``).
        self.transaction_bytes = TransactionBytes()
        self._internal: set[str] = set()
        self._deliveries: dict[str, Delivery] = {}  # app key -> delivery (all subscriptions)
        self._stale: OrderedDict[str, None] = OrderedDict()  # strict mode: superseded ack keys
        self.removing: set[str] = set()  # upstream ids of durable subscriptions being removed
        self._next_internal = 0
        self._next_ack = 0
        self._next_sub = 0
        self.duplicates_hidden = 0
        self.redeliveries_hidden = 0
        #: Temporary destinations and their broker-side names (proxy.tracking.links).
        self.temps = TempNames()
        #: The current link's broker browses (ActiveMQ Classic ``browser:true``).
        self.browsers = False
        #: Outbox mode: queue subscriptions persist the ids of what the app settles
        #: (:attr:`Subscription.persist_seen`); set by the daemon before any SUBSCRIBE.
        self.persist_seen_ids = False
        #: ``(destination, mq-sidecar-id)`` pairs to persist, in the order settled: appended
        #: by :meth:`deliver`, :meth:`settle` and :meth:`end` (COMMIT); the daemon takes and
        #: clears them after each such call, so they hold at most what one call settles.
        self.seen_out: list[tuple[str, str]] = []
        #: One line per stream subscription found to be a queue after all (a MESSAGE's
        #: ``x-stream-offset`` not a number), for the daemon to log once and clear.
        self.stream_notes: list[str] = []
        #: Offsets of stream subscriptions that a resumed leg skipped (retention removed them;
        #: :class:`proxy.tracking.streams.StreamGap`), for the daemon to report and clear:
        #: at most one per :meth:`deliver` call.
        self.stream_gaps: list[StreamGap] = []
        #: Offsets named in :attr:`stream_gaps` since the session began (their ``count``).
        self.stream_offsets_missed = 0

    # -- links ------------------------------------------------------------------------------

    def new_link(
        self,
        *,
        stable_message_ids: bool,
        client_ack_per_subscription: bool = False,
        acks_ignore_subscription: bool = False,
        keeps_finished_browsers: bool = False,
        temp_names: str = "",
        connection_id: str | None = None,
    ) -> LinkEnd:
        """A new upstream connection: deliveries of older links are stale from now on.

        ``client_ack_per_subscription``: a ``client`` ACK on this link settles only its own
        subscription's messages, so app auto subscriptions are ``client`` upstream (see
        :class:`Subscription`); SUBSCRIBEs replayed on it say so (:meth:`upstream_subscribe`).
        ``acks_ignore_subscription``: the broker settles a STOMP 1.1 ACK by its ``message-id``
        whatever its ``subscription`` says (RabbitMQ), so the session does too.
        ``keeps_finished_browsers``: the broker keeps a finished browser until UNSUBSCRIBE
        (ActiveMQ Classic), so one that delivered stays dormant rather than browse again.
        ``temp_names``, ``connection_id``: how the broker names temporary destinations and
        ActiveMQ's id of the connection (None: not known), for their names
        (:class:`proxy.tracking.links.TempNames`). All of these are the new leg's
        :class:`proxy.legs.dialect.BrokerDialect`'s.

        Returns what the end of the old link did (:class:`~proxy.tracking.links.LinkEnd`):
        its browsers that had delivered something are never made again (a new SUBSCRIBE would
        restart the browse from the queue's head, silently showing the app its messages
        again): they stay *dormant* (ActiveMQ keeps a finished browser until UNSUBSCRIBE), and
        those whose ``browser:end`` had not come are reported interrupted (Qpid client
        failover draft, "Queue Browsers": an exception to the app). A browser that delivered
        nothing yet is made again: the app sees one whole browse.
        """
        interrupted: list[Subscription] = []
        if self.browsers:
            for sub in self.subscriptions.values():
                if sub.browser and not sub.local and (sub.browse_ended or sub.arrivals):
                    sub.local = sub.dormant = True
                    if not sub.browse_ended:
                        interrupted.append(sub)
        self.browsers = keeps_finished_browsers
        self.generation += 1
        self.acks_ignore_subscription = acks_ignore_subscription
        self.stable_message_ids = stable_message_ids
        self.auto_ack_mode = (
            AckMode.CLIENT if client_ack_per_subscription else AckMode.CLIENT_INDIVIDUAL
        )
        temps = self.temps.new_link(self.generation, style=temp_names, connection_id=connection_id)
        return LinkEnd(tuple(interrupted), temps)

    def identity(self, message: Frame) -> str | None:
        """The identity of a message (module docstring), or None when it has none."""
        return self._identity_of(message.get(DUPLICATE_ID_HEADER), message.get("message-id"))

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
            SessionError: too many subscriptions (``max_subscriptions``, the sidecar's limit).
            ForBroker: no destination, an unknown ack mode, an id already in use, or no id
                from a STOMP 1.1/1.2 app: the broker judges (ActiveMQ accepts a second
                SUBSCRIBE with an id in use, RabbitMQ refuses it; measured).
        """
        destination = frame.get("destination")
        if destination is None:
            raise ForBroker("SUBSCRIBE without destination")
        app_id = frame.get("id")
        ack_header = frame.get("ack", "auto") or "auto"
        if ack_header not in ACK_MODES:
            raise ForBroker(f"SUBSCRIBE with ack mode {ack_header!r}")
        ack = AckMode(ack_header)
        left = self.subscriptions.get(app_id or "")
        if left is not None and left.dormant:  # a browser a failover left: replaced
            self.unsubscribe(Frame(Command.UNSUBSCRIBE, (("id", left.upstream_id),)))
        if len(self.subscriptions) >= self.max_subscriptions:
            raise SessionError(
                f"too many subscriptions: this session already has {self.max_subscriptions} "
                "(max_subscriptions)"
            )
        if app_id is not None:
            if app_id in self.subscriptions:
                raise ForBroker(f"SUBSCRIBE with id {app_id!r} already in use")
            upstream_id = app_id
            upstream = frame
        elif self.app_version != "1.0":
            raise ForBroker("SUBSCRIBE without id")
        else:  # STOMP 1.0 allows a SUBSCRIBE without id
            while True:
                self._next_sub += 1
                upstream_id = f"{self.session_id}-s{self._next_sub}"
                if upstream_id not in self.subscriptions:
                    break
            upstream = frame.with_header("id", upstream_id)
        upstream = upstream.without("receipt")
        stream = not local and is_stream_subscribe(frame)
        # An auto SUBSCRIBE that names a stream stays auto: RabbitMQ refuses it (measured:
        # "automatic acknowledgement not supported by stream queues"), as it would directly.
        auto_upstream = stream and ack is AckMode.AUTO
        if ack is AckMode.CLIENT and not local:
            upstream = upstream.with_header("ack", AckMode.CLIENT_INDIVIDUAL.value)
        elif ack is AckMode.AUTO and not local and not auto_upstream:
            upstream = upstream.with_header("ack", self.auto_ack_mode.value)
        self.removing.discard(upstream_id)
        self.subscriptions[upstream_id] = Subscription(
            app_id=app_id,
            upstream_id=upstream_id,
            destination=destination,
            ack=ack,
            frame=upstream,
            local=local,
            browser=frame.get("browser") == "true",
            persist_seen=(
                self.persist_seen_ids
                and not local
                and frame.get("browser") != "true"
                and persists_seen(destination)
            ),
            stream=stream,
            auto_upstream=auto_upstream,
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
        current link for an app auto subscription (:meth:`new_link`), and, for a stream
        subscription, the position right after the last MESSAGE the app was delivered
        (:func:`proxy.tracking.streams.resume_subscribe`; docs/behaviour.md, "Streams")."""
        sub = self.subscriptions.get(frame.get("id") or "")
        if sub is None or sub.local:
            return frame
        if sub.stream:
            frame = resume_subscribe(frame, sub.stream_offset)
            if sub.stream_offset is not None:
                sub.stream_resume = sub.stream_offset + 1
        if sub.ack is not AckMode.AUTO or sub.auto_upstream:
            return frame
        mode = self.auto_ack_mode.value
        if frame.get("ack") == mode:
            return frame
        sub.frame = sub.frame.with_header("ack", mode)
        return frame.with_header("ack", mode)

    def local_subscriptions(self) -> list[Subscription]:
        """The control-channel subscriptions (never sent upstream)."""
        return [s for s in self.subscriptions.values() if s.local and not s.dormant]

    def missing_messages(self) -> list[Subscription]:
        """The live non-durable topic subscriptions: those that miss what is published while
        no broker has them (:func:`proxy.tracking.links.misses_messages`)."""
        return [s for s in self.subscriptions.values() if misses_messages(s)]

    # -- subscription health (proxy.tracking.health) ---------------------------------------

    def broker_subscriptions(self) -> list[Subscription]:
        """The subscriptions a broker has or should have (not the control channel's, not a
        dormant browser), in the order the app made them."""
        return [s for s in self.subscriptions.values() if not s.local]

    def subscriptions_lost(self, now: float) -> None:
        """No leg has the subscriptions from ``now`` (the leg was lost): the live ones are
        restoring; cancelled or waiting ones stay so (:meth:`SubscriptionHealth.lost
        <proxy.tracking.health.SubscriptionHealth.lost>`)."""
        for sub in self.broker_subscriptions():
            self._forget_confirmation(sub)
            sub.health.lost(now)

    def subscriptions_refused(
        self, error: Frame, state: SubscriptionState, now: float
    ) -> list[Subscription]:
        """The broker's ``error`` says it cancelled a subscription or that a queue is not
        there for now: the subscriptions it names are in ``state`` (cancelled_by_broker or
        waiting_for_queue) from ``now``. It names them by its ``subscription`` header (the
        upstream id: RabbitMQ's cancel), else by the queue its body quotes
        (:func:`~proxy.tracking.health.unavailable_queue`: RabbitMQ's ``not_found`` and a
        stream's ``precondition_failed``, every subscription to ``/queue/<q>`` or
        ``/amq/queue/<q>``). The ERROR's ``message`` is kept with the state
        (:attr:`SubscriptionHealth.message <proxy.tracking.health.SubscriptionHealth.message>`)
        until the broker confirms the subscription again. Returns them (none when it names none
        the session has)."""
        named = self.subscriptions.get(error.get("subscription") or "")
        if named is not None and not named.local:
            found = [named]
        else:
            queue = unavailable_queue(error)
            found = [
                s
                for s in self.broker_subscriptions()
                if queue is not None and queue_of(s.destination) == queue
            ]
        for sub in found:
            self._refused(sub, state, now, error.get("message"))
        return found

    def subscription_waiting(
        self, upstream_id: str, now: float, message: str | None = None
    ) -> Subscription | None:
        """The subscription ``upstream_id`` waits for its queue from ``now`` (the broker
        answered its SUBSCRIBE ``not_found``, in words ``message``; a stream whose node
        restarted): its next SUBSCRIBE asks for a RECEIPT, which makes it live again. None when
        the session has no such broker subscription."""
        sub = self.subscriptions.get(upstream_id)
        if sub is None or sub.local:
            return None
        self._refused(sub, SubscriptionState.WAITING_FOR_QUEUE, now, message)
        return sub

    def _refused(
        self, sub: Subscription, state: SubscriptionState, now: float, message: str | None
    ) -> None:
        """The broker cancelled or refused ``sub`` (:meth:`subscriptions_refused`)."""
        self._forget_confirmation(sub)
        sub.health.refused_by_broker(state, now, message)

    def _forget_confirmation(self, sub: Subscription) -> None:
        """The RECEIPT ``sub``'s last SUBSCRIBE asked for will not come (its leg is gone, or
        the broker refused it): its id is no longer one of ours (bounds :meth:`resubscribe`'s
        ids over a run of failed restores)."""
        if sub.health.receipt is not None:
            self._internal.discard(sub.health.receipt)

    def resubscribe(self, sub: Subscription) -> Frame:
        """The SUBSCRIBE that makes ``sub`` again on a new leg (:meth:`upstream_subscribe`);
        for one the broker had cancelled or refused, with a receipt of the sidecar's own
        (:meth:`new_internal_receipt`) whose RECEIPT confirms it live
        (:meth:`subscribe_confirmed`)."""
        frame = self.upstream_subscribe(sub.frame)
        if not sub.health.refused:
            return frame
        receipt = self.new_internal_receipt()
        sub.health.resubscribing(receipt)
        return frame.with_header("receipt", receipt)

    def subscriptions_restored(self) -> None:
        """A restore has sent every SUBSCRIBE on the new leg: those down only because their
        leg was lost are live again; those the broker had refused wait for their RECEIPT."""
        for sub in self.broker_subscriptions():
            sub.health.restored()

    def subscribe_confirmed(self, receipt: str) -> bool:
        """The broker's RECEIPT ``receipt`` of a restore's SUBSCRIBE (:meth:`resubscribe`):
        that subscription is live. Whether it was one."""
        for sub in self.broker_subscriptions():
            if sub.health.receipt == receipt:
                sub.health.confirmed()
                return True
        return False

    def subscription_statistics(self, now: float) -> tuple[SubscriptionStatistics, ...]:
        """Every broker subscription's state at ``now`` (``/status``'s ``subscriptions``)."""
        out = []
        for sub in self.broker_subscriptions():
            health = sub.health
            down = health.down_for(now)
            last = health.last_delivery_at
            out.append(
                SubscriptionStatistics(
                    id=sub.app_id if sub.app_id is not None else sub.upstream_id,
                    destination=sub.destination,
                    kind=kind_of(sub.destination, stream=sub.stream).value,
                    ack=sub.ack.value,
                    state=health.state.value,
                    down_for_seconds=None if down is None else round(down, 3),
                    last_delivery_age_seconds=None if last is None else round(now - last, 3),
                    stream_offset=sub.stream_offset if sub.stream else None,
                )
            )
        return tuple(out)

    def iter_subscribe_frames(self) -> Iterator[Frame]:
        """The SUBSCRIBE frames that recreate every live broker subscription, in order."""
        for sub in self.subscriptions.values():
            if not sub.local:
                yield sub.frame

    # -- transactions -----------------------------------------------------------------------

    def begin_transaction(self, frame: Frame) -> Transaction:
        """Open the transaction a BEGIN names and return it.

        Raises ForBroker when the BEGIN names none or one already open (the broker judges)."""
        tx = frame.get("transaction")
        if tx is None or tx in self.transactions:
            raise ForBroker(f"BEGIN of transaction {tx!r}")
        opened = self.transactions[tx] = Transaction(tx, self.transaction_bytes)
        return opened

    def close_transaction(self, frame: Frame, *, now: float) -> Transaction:
        """Close the transaction a COMMIT/ABORT names (``now``: the caller's clock, seconds,
        as for :meth:`deliver`). Raises ForBroker if it names none that is open."""
        tx = frame.get("transaction")
        if tx is None or tx not in self.transactions:
            raise ForBroker(f"{frame.command} of transaction {tx!r}, not open")
        ended = self.transactions.pop(tx)
        acked = ended.forget_settled()
        if frame.command == "COMMIT":
            for d in acked:
                seen = d.subscription.seen.get(d.identity) if d.identity is not None else None
                if seen is not None and seen[1] == "acked":
                    self.persist(d)
        if frame.command == "ABORT":
            # The broker keeps what the transaction acknowledged unacknowledged (ActiveMQ
            # StompSubscription.onStompAbort); so does the sidecar: the app holds them again.
            for d in acked:
                self._restore_delivery(d, now)
            ended.finished()  # an aborted transaction is never re-run
        ended.release()
        return ended

    def transaction_of(self, frame: Frame) -> Transaction | None:
        """The open transaction a SEND/ACK/NACK names, if any.

        Raises ForBroker if it names a transaction that is not open (the broker judges).
        """
        tx = frame.get("transaction")
        if tx is None:
            return None
        if tx not in self.transactions:
            raise ForBroker(f"{frame.command} in transaction {tx!r}, not open")
        return self.transactions[tx]

    def roll_back(self, tx: Transaction, reason: str) -> None:
        """``tx`` is rolled back by the sidecar, for ``reason`` (what its COMMIT's ERROR says
        after "rolled back: "): a failover in ``rollback`` mode, or a frame of it dropped at
        ``call_timeout`` (the broker can never be given the whole transaction). The messages
        its ACKs settled will come back and must be shown again (GigaSpaces/JMS: redelivered
        after rollback)."""
        tx.rolled_back = reason
        for d in tx.forget_settled():
            if d.identity is not None:
                d.subscription.seen.pop(d.identity, None)
