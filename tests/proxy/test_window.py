"""ConfirmationWindow: sequencing, the byte bound, receipts and cumulative confirmation (pure)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol import Command, Frame
from proxy.tracking.window import (
    ConfirmationWindow,
    Entry,
    EntryContext,
    WindowStatistics,
    frame_size,
)

_EMPTY_SEND = Frame(Command.SEND, (("destination", "/q"),))
#: The smallest frame :func:`send` can build.
MIN_SIZE = frame_size(_EMPTY_SEND)


def send(size: int = MIN_SIZE, **headers: str) -> Frame:
    """A SEND to ``/q`` that counts exactly ``size`` bytes against the window."""
    frame = Frame.build(Command.SEND, {"destination": "/q", **headers})
    padding = size - frame_size(frame)
    assert padding >= 0, f"{size} is too small for {frame!r}"
    return frame.replace(body=b"x" * padding)


def window(max_bytes: int = 1000, *, receipt_fraction: float = 0.5) -> ConfirmationWindow:
    return ConfirmationWindow(max_bytes, receipt_prefix="S-r", receipt_fraction=receipt_fraction)


def add(
    w: ConfirmationWindow,
    size: int = MIN_SIZE,
    *,
    want_receipt: bool = False,
    app_receipt: str | None = None,
    now: float = 0.0,
) -> Entry:
    return w.append(send(size), app_receipt=app_receipt, want_receipt=want_receipt, now=now)


def test_frame_size_counts_command_headers_and_body() -> None:
    frame = Frame.build(Command.SEND, {"destination": "/q", "a": "bc"}, b"hello")
    # "SEND" + body + 3 (command EOL, blank line, NUL) + each "name:value\n" (+1 spare)
    assert frame_size(frame) == 4 + 5 + 3 + (11 + 2 + 2) + (1 + 2 + 2)
    assert frame_size(send(100)) == 100


def test_window_needs_a_positive_bound() -> None:
    with pytest.raises(ValueError, match="max_bytes must be > 0"):
        window(0)


# -- sequencing -------------------------------------------------------------------------------


def test_entries_are_numbered_in_order_and_numbers_are_never_reused() -> None:
    w = window()
    first = [add(w, want_receipt=True) for _ in range(3)]
    assert [e.seq for e in first] == [1, 2, 3]
    assert first[2].receipt is not None
    w.confirm(first[2].receipt)
    w.drop_all()
    assert add(w).seq == 4


def test_append_keeps_what_the_session_needs() -> None:
    w = window()
    tx = EntryContext()
    frame = send(50)
    entry = w.append(frame, app_receipt="mine", want_receipt=False, now=12.5, context=tx)
    assert (entry.seq, entry.size, entry.app_receipt, entry.enqueued_at) == (1, 50, "mine", 12.5)
    assert entry.context is tx
    assert (entry.sent, entry.answered, entry.confirmed) == (False, False, False)
    assert entry.frame == frame.with_header("receipt", "S-r1")
    assert list(w) == [entry]
    assert len(w) == 1
    assert w.unconfirmed() == [entry]
    assert w.bytes == 50


def test_unconfirmed_is_a_copy_in_order() -> None:
    w = window()
    entries = [add(w) for _ in range(3)]
    snapshot = w.unconfirmed()
    assert snapshot == entries
    snapshot.clear()
    assert len(w) == 3


# -- byte bound -------------------------------------------------------------------------------


def test_has_room_is_the_byte_bound() -> None:
    w = window(100)
    assert w.has_room(100)
    add(w, 60)
    assert w.has_room(40)
    assert not w.has_room(41)
    add(w, 40)
    assert w.bytes == 100
    assert not w.has_room(1)


def test_an_oversized_frame_is_admitted_into_an_empty_window_only() -> None:
    w = window(100)
    assert w.has_room(10_000)
    big = add(w, 500)
    assert w.bytes == 500
    assert not w.has_room(MIN_SIZE)
    assert big.receipt is not None  # it alone passes the receipt threshold
    w.confirm(big.receipt)
    assert w.has_room(10_000)


def test_confirming_makes_room() -> None:
    w = window(100)
    add(w, 30)
    receipted = add(w, 30)  # 60 bytes since the last receipt >= 50
    add(w, 30)
    assert not w.has_room(MIN_SIZE)
    assert receipted.receipt is not None
    w.confirm(receipted.receipt)
    assert w.bytes == 30
    assert w.has_room(70)
    assert not w.has_room(71)


# -- receipts requested -----------------------------------------------------------------------


def test_want_receipt_requests_the_sidecars_own_receipt() -> None:
    w = window()
    entry = add(w, want_receipt=True)
    assert entry.receipt == "S-r1"
    assert entry.frame.get_all("receipt") == ("S-r1",)


def test_an_app_receipt_requests_a_sidecar_receipt_and_is_never_leaked() -> None:
    w = window()
    add(w)
    entry = add(w, app_receipt="app-42")
    assert entry.receipt == "S-r2"
    assert entry.frame.get_all("receipt") == ("S-r2",)
    assert entry.app_receipt == "app-42"


def test_no_receipt_below_the_threshold() -> None:
    w = window()
    entry = add(w)
    assert entry.receipt is None
    assert not entry.frame.has("receipt")


@pytest.mark.parametrize(
    ("sizes", "receipted"),
    [
        # threshold = 1000 * 0.5 = 500 bytes since the last receipted entry
        ([200, 299], []),
        ([200, 299, 22], [3]),  # 521 >= 500
        ([200, 300], [2]),  # exactly 500: the frame that reaches the threshold gets it
        ([500], [1]),
        ([499, 22, 478, 22], [2, 4]),  # the count restarts after a receipted entry
        ([200, 300, 200, 300], [2, 4]),
    ],
)
def test_receipt_when_bytes_since_the_last_receipt_reach_half_the_window(
    sizes: list[int], receipted: list[int]
) -> None:
    w = window(1000)
    entries = [add(w, size) for size in sizes]
    assert [e.seq for e in entries if e.receipt is not None] == receipted


def test_a_requested_receipt_restarts_the_byte_count() -> None:
    w = window(1000)
    add(w, 400)
    assert add(w, 30, want_receipt=True).receipt is not None
    assert add(w, 400).receipt is None  # 400 since the last receipt, not 830
    assert add(w, 100).receipt is not None  # 500
    assert add(w, 450, app_receipt="a").receipt is not None
    assert add(w, 499).receipt is None


@pytest.mark.parametrize(
    ("max_bytes", "fraction", "threshold"),
    [(1000, 0.1, 100), (1000, 1.0, 1000), (1, 0.5, 1), (50, 0.01, 1)],
)
def test_receipt_fraction(max_bytes: int, fraction: float, threshold: int) -> None:
    def first_receipt(size: int) -> str | None:
        w = ConfirmationWindow(max_bytes, receipt_prefix="p", receipt_fraction=fraction)
        return w.append(send(size), app_receipt=None, want_receipt=False, now=0).receipt

    if threshold > MIN_SIZE:
        assert first_receipt(threshold - 1) is None
    assert first_receipt(max(MIN_SIZE, threshold)) == "p1"


# -- confirmation -----------------------------------------------------------------------------


def test_a_receipt_confirms_its_entry_and_every_earlier_one() -> None:
    w = window()
    e1, e2 = add(w, 30), add(w, 40)
    e3 = add(w, 50, want_receipt=True)
    e4 = add(w, 60)
    assert e3.receipt is not None
    assert w.confirm(e3.receipt) == [e1, e2, e3]
    assert all(e.confirmed for e in (e1, e2, e3))
    assert not e4.confirmed
    assert list(w) == [e4]
    assert w.bytes == 60
    assert w.confirmed_total == 3


def test_receipts_confirm_in_order_across_several_receipts() -> None:
    w = window()
    e1 = add(w)
    e2 = add(w, want_receipt=True)
    e3 = add(w)
    e4 = add(w, want_receipt=True)
    assert e2.receipt is not None
    assert e4.receipt is not None
    assert w.confirm(e2.receipt) == [e1, e2]
    assert list(w) == [e3, e4]
    assert w.confirm(e4.receipt) == [e3, e4]
    assert len(w) == 0
    assert w.bytes == 0
    assert w.confirmed_total == 4
    assert w.out_of_order == 0


@pytest.mark.parametrize("receipt", ["S-r99", "", "nonsense", "S-r1"])
def test_an_unknown_receipt_confirms_nothing(receipt: str) -> None:
    w = window()
    e1 = add(w)  # no receipt: "S-r1" is not pending
    e2 = add(w, want_receipt=True)
    assert w.confirm(receipt) is None
    assert list(w) == [e1, e2]
    assert w.confirmed_total == 0


def test_a_receipt_confirms_only_once() -> None:
    w = window()
    entry = add(w, want_receipt=True)
    assert entry.receipt is not None
    assert w.confirm(entry.receipt) == [entry]
    assert w.confirm(entry.receipt) is None


def test_an_earlier_entry_with_its_own_receipt_waits_for_it() -> None:
    """RabbitMQ may confirm a SEND out of order (publisher confirms)."""
    w = window()
    e1 = add(w, app_receipt="app-1")
    e2 = add(w)
    e3 = add(w, want_receipt=True)
    assert e1.receipt is not None
    assert e3.receipt is not None
    assert w.confirm(e3.receipt) == [e2, e3]
    assert list(w) == [e1]
    assert not e1.confirmed
    assert w.out_of_order == 1
    assert w.statistics().receipts_pending == 1
    assert w.bytes == e1.size
    assert w.confirm(e1.receipt) == [e1]
    assert w.out_of_order == 1
    assert w.confirmed_total == 3


def test_several_overtaken_entries_keep_their_order() -> None:
    w = window()
    e1 = add(w, want_receipt=True)
    e2 = add(w)
    e3 = add(w, want_receipt=True)
    e4 = add(w)
    e5 = add(w, want_receipt=True)
    assert e5.receipt is not None
    assert w.confirm(e5.receipt) == [e2, e4, e5]
    assert list(w) == [e1, e3]
    assert w.out_of_order == 2
    assert e1.receipt is not None
    assert w.confirm(e1.receipt) == [e1]
    assert list(w) == [e3]


# -- drop, mark_all_unsent, drop_all ----------------------------------------------------------


def test_drop_removes_one_entry_and_forgets_its_receipt() -> None:
    w = window()
    e1 = add(w, 30)
    e2 = add(w, 40, app_receipt="gone")
    e3 = add(w, 50, want_receipt=True)
    assert e2.receipt is not None
    assert e3.receipt is not None
    w.drop(e2)
    assert list(w) == [e1, e3]
    assert w.bytes == 80
    assert w.statistics().receipts_pending == 1
    assert w.confirm(e2.receipt) is None
    assert w.confirm(e3.receipt) == [e1, e3]
    assert not e2.confirmed
    assert w.confirmed_total == 2


def test_mark_all_unsent() -> None:
    w = window()
    entries = [add(w) for _ in range(3)]
    for entry in entries[:2]:
        entry.sent = True
    assert w.statistics().unsent == 1
    w.mark_all_unsent()
    assert not any(e.sent for e in entries)
    assert w.statistics().unsent == 3


def test_drop_all_empties_the_window_and_returns_its_entries() -> None:
    w = window()
    entries = [add(w, want_receipt=(i % 2 == 0)) for i in range(4)]
    assert w.drop_all() == entries
    assert len(w) == 0
    assert w.bytes == 0
    stats = w.statistics()
    assert (stats.frames, stats.bytes, stats.receipts_pending) == (0, 0, 0)
    receipt = entries[0].receipt
    assert receipt is not None
    assert w.confirm(receipt) is None
    assert w.drop_all() == []


# -- first_unanswered, statistics, labels -----------------------------------------------------


def test_first_unanswered_is_the_oldest_app_receipt_still_owed() -> None:
    w = window()
    assert w.first_unanswered() is None
    add(w)
    assert w.first_unanswered() is None  # no app receipt, nothing owed
    a = add(w, app_receipt="a")
    b = add(w, app_receipt="b")
    assert w.first_unanswered() is a
    a.answered = True
    assert w.first_unanswered() is b
    w.drop(b)
    assert w.first_unanswered() is None


def test_statistics_snapshot() -> None:
    w = window(1000)
    e1 = add(w, 100, app_receipt="a")
    add(w, 100)
    e3 = add(w, 100, want_receipt=True)
    add(w, 50)
    e1.sent = True
    assert e3.receipt is not None
    w.confirm(e3.receipt)  # e1 is kept: its own receipt is still pending
    stats = w.statistics()
    assert stats == WindowStatistics(
        frames=2,
        bytes=150,
        max_bytes=1000,
        unsent=1,
        receipts_pending=1,
        confirmed_total=2,
        out_of_order=1,
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.frames = 0  # type: ignore[misc]


def test_entry_label_names_the_app_receipt_else_command_and_seq() -> None:
    w = window()
    add(w)
    add(w)
    plain = add(w)
    mine = add(w, app_receipt="order-7")
    assert plain.label == "SEND #3"
    assert mine.label == "order-7"
    commit = w.append(
        Frame(Command.COMMIT, (("transaction", "t"),)), app_receipt=None, want_receipt=True, now=0
    )
    assert commit.label == "COMMIT #5"


# -- property: the byte count never drifts -----------------------------------------------------

_ops = st.lists(
    st.tuples(
        st.sampled_from(["append", "confirm", "drop", "unknown"]),
        st.integers(min_value=0, max_value=400),
        st.booleans(),
        st.booleans(),
    ),
    max_size=60,
)


@given(ops=_ops, max_bytes=st.integers(min_value=1, max_value=2000))
def test_bytes_always_equal_the_sum_of_entry_sizes(
    ops: list[tuple[str, int, bool, bool]], max_bytes: int
) -> None:
    w = ConfirmationWindow(max_bytes, receipt_prefix="S-r")
    appended = confirmed = dropped = 0
    for kind, n, want, with_app_receipt in ops:
        if kind == "append":
            app_receipt = f"app-{appended}" if with_app_receipt else None
            frame = send(max(MIN_SIZE, n))
            w.append(frame, app_receipt=app_receipt, want_receipt=want, now=0.0)
            appended += 1
        elif kind == "confirm":
            pending = [e for e in w if e.receipt is not None]
            if pending:
                target = pending[n % len(pending)]
                assert target.receipt is not None
                done = w.confirm(target.receipt)
                assert done is not None
                assert done[-1] is target
                assert [e.seq for e in done] == sorted(e.seq for e in done)
                assert all(e.confirmed for e in done)
                confirmed += len(done)
        elif kind == "drop":
            if len(w):
                w.drop(w.unconfirmed()[n % len(w)])
                dropped += 1
        else:
            assert w.confirm(f"unknown-{n}") is None
        entries = list(w)
        assert w.bytes == sum(e.size for e in entries)
        assert [e.seq for e in entries] == sorted(e.seq for e in entries)
        assert not any(e.confirmed for e in entries)
        stats = w.statistics()
        assert stats.receipts_pending == sum(1 for e in entries if e.receipt is not None)
        assert stats.confirmed_total == confirmed
        assert appended == len(entries) + confirmed + dropped


def test_an_entry_confirmed_by_a_later_receipt_gets_none_of_its_own() -> None:
    """``want_receipt=None`` (the wildcard SUBSCRIBE on ActiveMQ): no receipt on the frame,
    even with an app receipt; the next receipted entry confirms it and its app receipt."""
    w = window()
    first = w.append(send(), app_receipt="app-1", want_receipt=None, now=0.0)
    assert first.receipt is None
    assert not first.frame.has("receipt")
    second = w.append(send(), app_receipt=None, want_receipt=True, now=0.0)
    assert second.receipt is not None
    assert w.confirm(second.receipt) == [first, second]
    assert first.confirmed


def test_deferred_receipts_are_not_waited_for() -> None:
    """A transaction's SENDs on RabbitMQ: the app's receipts are requested but answered only at
    COMMIT, so they cannot make room; a full window of them reports no receipt to wait for (the
    session then lets the next frame in, bounded by max_transaction_size), and the COMMIT's
    receipt confirms them all."""
    w = window(1000)
    for i in range(5):
        w.append(send(300), app_receipt=f"a{i}", want_receipt=True, now=0.0, deferred=True)
    assert not w.has_room(300)
    assert w.receipts_pending == 0
    assert w.statistics().receipts_pending == 0
    w.append(send(300), app_receipt=None, want_receipt=None, now=0.0, deferred=True)
    commit = w.append(send(100), app_receipt="c", want_receipt=True, now=0.0)
    assert w.receipts_pending == 1
    assert commit.receipt is not None
    # RabbitMQ answers the deferred receipts at COMMIT, before the COMMIT's own.
    for i in range(5):
        first = next(e for e in w if e.app_receipt == f"a{i}")
        assert first.receipt is not None
        w.confirm(first.receipt)
    assert w.receipts_pending == 1
    confirmed = w.confirm(commit.receipt)
    assert confirmed is not None
    assert len(w) == 0
    assert w.receipts_pending == 0
