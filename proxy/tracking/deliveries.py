"""Deliveries and acknowledgements of one session (a part of :class:`SessionState`): what an
upstream MESSAGE becomes for the app, and what an app ACK/NACK becomes for the broker. See
:mod:`proxy.tracking` for the identities and ids this keeps."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from protocol import Command, Frame
from proxy.tracking.links import TempNames
from proxy.tracking.records import (
    ARTEMIS_DUPLICATE_ID,
    DUPLICATE_ID_HEADER,
    SEEDED,
    SEEN_SECONDS,
    SIDECAR_RECEIPT,
    AckMode,
    Delivered,
    Delivery,
    ForBroker,
    FrameRejected,
    Settled,
    Subscription,
    Transaction,
    ack_ident,
)
from proxy.tracking.streams import STREAM_OFFSET, StreamGap, gap_before, parse_offset

__all__ = ["Deliveries"]

#: The headers by which an ACK/NACK names its message, in one STOMP version or another.
_ACK_IDENTIFIERS = frozenset({"id", "message-id", "subscription"})


class Deliveries:
    """The delivery half of :class:`proxy.tracking.SessionState` (its base class): the state
    below is set up by ``SessionState.__init__``."""

    app_version: str
    max_unacked: int
    id_cache_size: int
    transparent: bool
    generation: int
    stable_message_ids: bool
    acks_ignore_subscription: bool
    auto_ack_mode: AckMode
    subscriptions: dict[str, Subscription]
    transactions: dict[str, Transaction]
    removing: set[str]
    duplicates_hidden: int
    redeliveries_hidden: int
    _deliveries: dict[str, Delivery]
    _stale: OrderedDict[str, None]
    _next_ack: int
    temps: TempNames
    seen_out: list[tuple[str, str]]
    stream_notes: list[str]
    stream_gaps: list[StreamGap]
    stream_offsets_missed: int

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
        if len(seen) > self.id_cache_size:
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

        On a stream subscription (``x-stream-offset`` on the MESSAGE, a number), the offset is
        recorded (:attr:`Subscription.stream_offset`) and a MESSAGE at or below the last one
        delivered to the app is hidden and acknowledged (credit) in both modes: the app was
        shown it (docs/behaviour.md, "Streams"). The first MESSAGE past it on a resumed leg
        that comes after the offset the leg was asked to start at names the offsets between
        as a gap (retention removed them): appended to :attr:`stream_gaps`, counted in
        :attr:`stream_offsets_missed`, and the MESSAGE is shown. A value that is not a number
        turns the subscription into a queue for good, noted once in :attr:`stream_notes`.
        """
        # One pass over the headers (the hot path): the ids this needs, first entries only
        # (STOMP 1.2 "Repeated Header Entries"), and the app's headers without ``ack``.
        upstream_sub: str | None = None
        message_id: str | None = None
        upstream_ack: str | None = None
        dup_id: str | None = None
        stream_value: str | None = None
        rest: list[tuple[str, str]] = []
        artemis_at: list[int] = []  # where _AMQ_DUPL_ID entries are in ``rest``
        sub_at = -1
        for item in message.headers:
            name = item[0]
            # The first ``ack`` and ``subscription`` are the broker's (STOMP 1.2 "Repeated
            # Header Entries": the first one counts): the sidecar replaces them. A repeat is
            # the app's own data (a re-published MESSAGE's copied headers; RabbitMQ keeps
            # every repeat) and reaches the app as it would directly.
            if name == "ack":
                if upstream_ack is None:
                    upstream_ack = item[1]
                    continue
            elif name == "subscription":
                if sub_at < 0:
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
            elif name == STREAM_OFFSET:
                if stream_value is None:
                    stream_value = item[1]
            elif name == "receipt" and SIDECAR_RECEIPT.fullmatch(item[1]):
                # RabbitMQ copies a SEND's headers into the MESSAGE, the receipt request of
                # the producer's sidecar too: that one is the sidecars' own, not shown.
                continue
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
            if upstream_sub is not None and self.temps.seen(upstream_sub, message):
                return Delivered(None)  # the sidecar's own probe (proxy.tracking.links)
            if dup_id is None and not message.has("receipt"):
                return Delivered(message)
            # Not the app's subscription (a temp-queue reply): unchanged but for the ids.
            kept = [
                h
                for h in message.headers
                if h[0] != DUPLICATE_ID_HEADER
                and not (h[0] == "receipt" and SIDECAR_RECEIPT.fullmatch(h[1]))
            ]
            kept = [h for h in kept if not (h[0] == ARTEMIS_DUPLICATE_ID and h[1] == dup_id)]
            return Delivered(Frame.unchecked(Command.MESSAGE, tuple(kept), message.body))
        sub.arrivals += 1
        sub.health.delivered(now)  # the broker delivers to it: live (proxy.tracking.health)
        identity = self._identity_of(dup_id, message_id)
        message_id = message_id or ""
        if stream_value is not None and sub.stream_refused is None and not sub.local:
            offset = parse_offset(stream_value)
            if offset is None:
                sub.stream = False
                sub.stream_refused = stream_value
                self.stream_notes.append(
                    f"subscription {sub.upstream_id!r} to {sub.destination}: x-stream-offset "
                    f"{stream_value[:40]!r} is not a number; treated as a queue"
                )
            else:
                sub.stream = True
                last = sub.stream_offset
                if last is not None and offset <= last:
                    # Shown already (a new leg read the stream again from before it).
                    return self._hide(sub, message_id, upstream_ack, "redelivery", upstream_version)
                sub.stream_offset = offset
                if sub.stream_resume is not None:
                    skipped = gap_before(sub.stream_resume, offset)
                    sub.stream_resume = None
                    if skipped is not None:
                        first, last = skipped
                        gap = StreamGap(sub.app_id, sub.destination, first, last)
                        self.stream_gaps.append(gap)
                        self.stream_offsets_missed += gap.count
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
                    if seen[0] == self.generation or seen[0] == SEEDED:
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
        if upstream_ack is None and message.get("browser") == "end":
            # ActiveMQ's end-of-browse marker (a ``browser:true`` subscription) carries no
            # ``ack`` and needs none: the app gets none either, and nothing is tracked or
            # acknowledged (found by the differential harness).
            sub.browse_ended = True
            return Delivered(out)
        if sub.ack is AckMode.AUTO:
            if identity is not None:
                self._remember(sub, identity, "acked", now)
                if sub.persist_seen and dup_id is not None:
                    self.seen_out.append((sub.destination, dup_id))
            if sub.auto_upstream:
                return Delivered(out)  # auto upstream too: the broker wants no ACK
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
        as the ``ack`` header: appended, or before the first ``ack`` the frame still has, a
        repeat the app put there, since the first entry counts), ``subscription`` +
        ``message-id`` (1.1) or ``message-id`` (1.0)."""
        if self.app_version == "1.2":
            self._next_ack += 1
            key = str(self._next_ack)
            headers = out.headers
            mine = (("ack", key),)
            for at, (name, _) in enumerate(headers):
                if name == "ack":
                    headers = headers[:at] + mine + headers[at:]
                    break
            else:
                headers += mine
            return Frame.unchecked(out.command, headers, out.body), key
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
        if sub.auto_upstream:
            return Delivered(None, hidden=why)
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
            ForBroker: the ack id (or message-id) matches no outstanding delivery: the broker
                judges the frame as the app sent it (its own ERROR reaches the app).
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
        if delivery is None and self.app_version == "1.1" and self.acks_ignore_subscription:
            delivery = self._by_message_id(frame.get("message-id"))
        if delivery is None:
            if key in self._stale:
                raise FrameRejected(
                    f"{what} is stale: the message was delivered before a failover and has been "
                    "redelivered with a new ack id"
                )
            raise ForBroker(f"{frame.command} of unknown {what}")
        sub = delivery.subscription
        stale = delivery.generation != self.generation and not sub.local
        if stale and not self.transparent and not sub.stream:
            # (A stream's old deliveries never come again: the new leg resumes after them,
            # and an ACK there is credit, which the sidecar answers; docs/behaviour.md,
            # "Streams".)
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
        open_tx = self.transactions.get(tx) if tx is not None else None
        for d in settled:
            self._forget(d)
            if d.identity is not None:
                self._remember(sub, d.identity, status, now, generation=d.generation)
                if status == "acked" and open_tx is None:
                    self.persist(d)  # a transaction's ACKs at its COMMIT (SessionState.end)
            if open_tx is not None:
                open_tx.settled(d)
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
            return Settled(frames[-1], more=tuple(frames[:-1]), credit=sub.stream)
        if stale:
            return Settled(None)
        return Settled(self.upstream_ack(frame, delivery, upstream_version), credit=sub.stream)

    def persist(self, delivery: Delivery) -> None:
        """Hand the ``mq-sidecar-id`` of a message the app acknowledged to the daemon, to
        persist (:attr:`seen_out`), when its subscription persists seen ids (outbox mode, a
        queue: :attr:`Subscription.persist_seen`)."""
        identity = delivery.identity
        sub = delivery.subscription
        if sub.persist_seen and identity is not None and identity.startswith("d:"):
            self.seen_out.append((sub.destination, identity[2:]))

    def seed_seen(self, upstream_id: str, sidecar_ids: Iterable[str], now: float) -> int:
        """Seed the seen identities of subscription ``upstream_id`` with ``sidecar_ids`` (the
        ``mq-sidecar-id`` s the outbox persisted for its destination, oldest first, before a
        restart: :meth:`GroupCommitter.seen_ids <proxy.outbox.GroupCommitter.seen_ids>`), so a
        copy of one of them is hidden and acknowledged upstream as a duplicate, on any link and
        in both ``failover_mode`` s. ``now``: the caller's clock (seconds, as for
        :meth:`deliver`); a seeded id is kept for up to ``SEEN_SECONDS`` from then, within
        ``id_cache_size``. An identity the subscription already has is left as it is. Returns the
        number seeded; 0 for an unknown subscription."""
        sub = self.subscriptions.get(upstream_id)
        if sub is None:
            return 0
        seen = sub.seen
        count = 0
        for sidecar_id in sidecar_ids:
            identity = f"d:{sidecar_id}"
            if identity not in seen:
                seen[identity] = (SEEDED, "acked", now)
                count += 1
        while len(seen) > self.id_cache_size:
            seen.popitem(last=False)
        return count

    def _by_message_id(self, message_id: str | None) -> Delivery | None:
        """The one outstanding delivery with ``message_id`` (a STOMP 1.1 ACK whose
        ``subscription`` names another, which RabbitMQ ignores; measured), else None."""
        found = [d for d in self._deliveries.values() if d.message_id == message_id]
        return found[0] if len(found) == 1 else None

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

    def _identity_of(self, dup_id: str | None, message_id: str | None) -> str | None:
        """:meth:`identity` from the message's first ``mq-sidecar-id`` and ``message-id``."""
        if dup_id is not None:
            return f"d:{dup_id}"
        if self.stable_message_ids and message_id is not None:
            return f"m:{message_id}"
        return None

    def _restore_delivery(self, d: Delivery, now: float) -> None:
        sub = d.subscription
        if sub.upstream_id not in self.subscriptions:
            return
        self._deliveries[d.app_key] = d
        sub.deliveries[d.app_key] = d
        if d.identity is not None:
            sub.pending_by_identity[d.identity] = d
            self._remember(sub, d.identity, "delivered", now, generation=d.generation)
