"""Restoring a session on a new upstream leg: what to re-send, in which order (pure).

docs/behaviour.md, "Restoring the session": after a reconnect the new broker knows nothing of the
session (AMQ Broker 7.1 "Client Failover": "When a session is re-created on the slave, it does not
have any knowledge of messages already sent or acknowledged"), so the sidecar re-creates it:

1. every live subscription whose SUBSCRIBE the old broker had confirmed is sent again with the
   same id and headers (an unconfirmed SUBSCRIBE is replayed from the window, in order);
2. transactions: in ``replay`` mode every transaction in play is re-created (BEGIN and the SENDs
   the old broker had confirmed), and its unconfirmed frames follow from the window, so its
   COMMIT succeeds once; a COMMIT in flight at the failure is re-run as well and reported "in
   doubt" (duplicate-detection ids make a double commit harmless to consumers through a
   sidecar). In ``rollback`` mode (JMS; GigaSpaces TransactionRolledBackException) a dirty open
   transaction is rolled back, its frames dropped, and its COMMIT will answer an ERROR; a COMMIT
   in flight is answered with an ERROR "in doubt". An ABORTed transaction is never re-created,
   nor one the sidecar rolled back (an earlier failover in ``rollback`` mode, or a frame of it
   dropped at ``call_timeout``: re-running the rest would commit part of it).
3. the window's unconfirmed frames are replayed in order, except those made moot by the new
   leg: ACK/NACK of a delivery of the old leg (the redelivery is settled by identity when it
   arrives, :meth:`SessionState.deliver`), UNSUBSCRIBE of a subscription the new broker
   never had, and the SUBSCRIBE of a browser the old leg had started (never made again:
   :meth:`SessionState.new_link`).

Entries that are dropped rather than replayed still owe the app its RECEIPT (``answer``) or an
ERROR (``in_doubt``): nothing is dropped silently.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from protocol import Command, Frame
from proxy.tracking import DurableRemoval, PassThrough, SessionState, Transaction
from proxy.tracking.window import ConfirmationWindow, Entry

__all__ = ["FAILED_OVER", "ReplayPlan", "plan_replay"]

#: Why a failover rolled a transaction back (``rollback`` mode): its COMMIT's ERROR says it.
FAILED_OVER = (
    "the broker connection failed over before COMMIT (transaction_failover = rollback); its "
    "messages will be redelivered"
)


@dataclass
class ReplayPlan:
    """The frames that restore a session, in sending order: ``subscribe``, then ``recreate``,
    then the window entries in ``replay``.

    ``answer``: entries dropped because their effect already holds (the app gets its RECEIPT).
    ``in_doubt``: COMMIT entries dropped with an ERROR for the app (``rollback`` mode): written
    to a lost broker, which may have committed.
    ``refused``: COMMIT entries dropped with an ERROR "rolled back" (``rollback`` mode, or a
    transaction the sidecar had rolled back): no broker ever had them.
    """

    subscribe: list[Frame] = field(default_factory=list)
    recreate: list[Frame] = field(default_factory=list)
    replay: list[Entry] = field(default_factory=list)
    answer: list[Entry] = field(default_factory=list)
    in_doubt: list[Entry] = field(default_factory=list)
    refused: list[Entry] = field(default_factory=list)
    transactions_replayed: list[str] = field(default_factory=list)
    transactions_rolled_back: list[str] = field(default_factory=list)
    transactions_in_doubt: list[str] = field(default_factory=list)

    @property
    def frames_sent(self) -> int:
        """How many frames the plan sends."""
        return len(self.subscribe) + len(self.recreate) + len(self.replay)


def _transactions_in_play(state: SessionState, window: ConfirmationWindow) -> list[Transaction]:
    seen: dict[int, Transaction] = {}
    for tx in state.transactions.values():
        seen[id(tx)] = tx
    for entry in window:
        if isinstance(entry.context, Transaction):
            seen.setdefault(id(entry.context), entry.context)
    return list(seen.values())


def plan_replay(
    state: SessionState, window: ConfirmationWindow, *, replay_transactions: bool
) -> ReplayPlan:
    """Plan the restore of ``state`` on a new leg from what ``window`` still holds.

    Mutates: rolls transactions back in ``rollback`` mode (:meth:`SessionState.roll_back`);
    the caller removes ``answer``/``in_doubt`` entries from the window and marks the replayed
    ones sent.
    """
    plan = ReplayPlan()
    last_subscribe: dict[str | None, Entry] = {}  # per id, the SUBSCRIBE entry to replay
    for entry in window:
        if entry.frame.command is Command.SUBSCRIBE:
            last_subscribe[entry.frame.get("id")] = entry
    pending_subscribe_ids = set(last_subscribe)
    for sub in state.subscriptions.values():
        if not sub.local and sub.upstream_id not in pending_subscribe_ids:
            plan.subscribe.append(state.resubscribe(sub))
    for entry in window:
        if isinstance(entry.context, DurableRemoval):
            # Re-make the durable subscription so the replayed UNSUBSCRIBE can delete it.
            plan.subscribe.append(entry.context.subscribe)
            state.removing.add(entry.context.subscribe.get("id") or "")

    replayed: set[int] = set()
    for tx in _transactions_in_play(state, window):
        ended_by = tx.end.frame.command if tx.end is not None else None
        if ended_by is Command.ABORT or tx.rolled_back:
            # moot: it was rolled back anyway (by the app, an earlier failover, or a frame of
            # it dropped at call_timeout: no broker may be given part of it again)
            continue
        if ended_by is Command.COMMIT:
            assert tx.end is not None
            if not replay_transactions and not tx.end.sent_before:
                # Its COMMIT never reached a broker: rolled back for sure, not in doubt.
                state.roll_back(tx, FAILED_OVER)
                plan.transactions_rolled_back.append(tx.id)
                continue
            plan.transactions_in_doubt.append(tx.id)
            if not replay_transactions:
                continue
        elif not replay_transactions and tx.dirty:
            state.roll_back(tx, FAILED_OVER)
            plan.transactions_rolled_back.append(tx.id)
            continue
        replayed.add(id(tx))
        if tx.dirty or ended_by is not None:
            plan.transactions_replayed.append(tx.id)
        if tx.begin is not None and tx.begin.confirmed:
            plan.recreate.append(tx.begin.frame.without("receipt"))
            plan.recreate.extend(
                e.frame.without("receipt")
                for e in tx.entries
                if e.confirmed and e.frame.command is Command.SEND
            )

    for entry in window:
        command = entry.frame.command
        owner = entry.context if isinstance(entry.context, Transaction) else None
        if owner is not None and id(owner) not in replayed:
            if command is Command.COMMIT and owner.end is entry:
                (plan.in_doubt if entry.sent_before else plan.refused).append(entry)
            else:
                plan.answer.append(entry)
        elif _moot(entry, state, last_subscribe):
            plan.answer.append(entry)
        else:
            if command is Command.SUBSCRIBE:  # the ack mode of the new link (auto subscriptions)
                entry.frame = state.upstream_subscribe(entry.frame)
            plan.replay.append(entry)
    return plan


def _moot(entry: Entry, state: SessionState, last_subscribe: dict[str | None, Entry]) -> bool:
    """An entry whose effect the new leg already has, or can never need: an ACK/NACK of a
    delivery of the old leg, a SUBSCRIBE since cancelled or superseded by a later one with
    the same id or of a browser left dormant, an UNSUBSCRIBE of a subscription the new
    broker never had (but not one that removes a durable subscription, nor the pass-through
    kind)."""
    command = entry.frame.command
    if command in (Command.ACK, Command.NACK):
        return True
    if command is Command.SUBSCRIBE:
        sub_id = entry.frame.get("id")
        sub = state.subscriptions.get(sub_id or "")
        return sub is None or sub.dormant or last_subscribe.get(sub_id) is not entry
    return command is Command.UNSUBSCRIBE and not isinstance(
        entry.context, PassThrough | DurableRemoval
    )
