"""The soak's invariant checker (:meth:`tests.chaos.soak.Ledger.check`) on made-up records:
each broken invariant is reported, and a clean history reports nothing."""

from __future__ import annotations

from tests.chaos.soak import Ledger, Sent, Tx


def sent(ledger: Ledger, mid: str, outcome: str, *, tx: str | None = None) -> Sent:
    record = Sent(mid, "activemq", "amq.P", "/queue/q", tx, 1.0, 1, outcome=outcome)
    ledger.sent[mid] = record
    return record


def kinds(ledger: Ledger) -> list[str]:
    return sorted(v.kind for v in ledger.check())


def test_a_clean_history_has_no_violation() -> None:
    ledger = Ledger()
    sent(ledger, "m1", "confirmed")
    sent(ledger, "m2", "error_maybe")  # may or may not arrive: both fine
    sent(ledger, "m3", "unanswered_at_close")
    ledger.reported_labels.add("m3")  # listed in a DISCONNECT event
    ledger.receive("c", "m1", 1)
    tx = Tx("t1", "activemq", "amq.T", 0.0, ["t1.0", "t1.1"], "COMMIT", "committed")
    ledger.txs["t1"] = tx
    for mid in tx.ids:
        sent(ledger, mid, "confirmed", tx="t1")
        ledger.receive("c", mid, 1)
    assert kinds(ledger) == []


def test_each_broken_invariant_is_reported() -> None:
    ledger = Ledger()
    sent(ledger, "lost", "confirmed")
    sent(ledger, "twice", "confirmed")
    ledger.receive("c", "twice", 1)
    ledger.receive("c", "twice", 1)
    sent(ledger, "dropped", "error_dropped")
    ledger.receive("c", "dropped", 1)
    sent(ledger, "silent", "unanswered_at_close")  # not received, not reported
    sent(ledger, "hung", "unanswered")
    ledger.receive("c", "ghost", 1)
    committed = Tx("t1", "activemq", "amq.T", 0.0, ["t1.0", "t1.1"], "COMMIT", "committed")
    aborted = Tx("t2", "activemq", "amq.T", 0.0, ["t2.0"], "ABORT", "aborted")
    doubt = Tx("t3", "activemq", "amq.T", 0.0, ["t3.0", "t3.1"], "COMMIT", "in_doubt")
    for tx in (committed, aborted, doubt):
        ledger.txs[tx.id] = tx
        for mid in tx.ids:
            sent(ledger, mid, "confirmed", tx=tx.id)
    ledger.receive("c", "t1.0", 1)  # t1.1 missing from a committed transaction
    ledger.receive("c", "t2.0", 1)  # an aborted transaction's message delivered
    ledger.receive("c", "t3.0", 1)  # half of an in-doubt transaction
    assert kinds(ledger) == [
        "dropped_but_delivered",
        "duplicated",
        "lost",
        "lost_in_commit",
        "partial_transaction",
        "phantom",
        "unanswered",
        "uncommitted_delivered",
        "unreported_loss",
    ]


def test_a_redelivery_to_a_new_consumer_session_is_told_apart() -> None:
    ledger = Ledger()
    sent(ledger, "m1", "confirmed")
    ledger.receive("c", "m1", 1)
    ledger.receive("c", "m1", 2)  # the consumer's session was lost and made again
    assert kinds(ledger) == ["duplicated_after_session_loss"]
