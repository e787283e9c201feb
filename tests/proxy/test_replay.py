"""plan_replay: what restores a session on a new leg (docs/behaviour.md, "Restoring the
session"), planned from a SessionState and a ConfirmationWindow built by hand, the way the
session (proxy/session/) fills them."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol import Command, Frame
from proxy.tracking import DUPLICATE_ID_HEADER, PASS_THROUGH, SessionState, Transaction
from proxy.tracking.replay import ReplayPlan, plan_replay
from proxy.tracking.window import ConfirmationWindow, Entry, EntryContext


class Sim:
    """The bookkeeping of ``Session._on_app_frame`` without the I/O: each app frame is
    recorded in the SessionState and appended to the window with the same context
    (the Transaction, or ``PASS_THROUGH``), and every frame gets a receipt (each is the
    last of its burst)."""

    def __init__(self) -> None:
        self.state = SessionState("S", "1.2", max_subscriptions=100, max_unacked=100)
        self.state.new_link(stable_message_ids=False)
        self.window = ConfirmationWindow(1 << 20, receipt_prefix="S-r")
        self._dup = 0
        self._msg = 0

    def _submit(self, frame: Frame, context: EntryContext | None = None) -> Entry:
        entry = self.window.append(
            frame, app_receipt=None, want_receipt=True, now=0.0, context=context
        )
        entry.sent = True
        return entry

    # -- app frames -----------------------------------------------------------------------

    def send(self, tx: str | None = None, destination: str = "/queue/out") -> Entry | None:
        frame = Frame.build(
            Command.SEND, {"destination": destination, **({"transaction": tx} if tx else {})}, b"x"
        )
        owner = self.state.transaction_of(frame)
        if owner is not None and owner.rolled_back:
            return None  # answered locally
        self._dup += 1
        entry = self._submit(frame.with_header(DUPLICATE_ID_HEADER, f"S-{self._dup}"), owner)
        if owner is not None:
            owner.sent(entry, keep=True)
        return entry

    def subscribe(self, sub_id: str, destination: str = "/queue/in", **extra: str) -> Entry:
        frame = Frame.build(
            Command.SUBSCRIBE,
            {"destination": destination, "id": sub_id, "ack": "client-individual", **extra},
        )
        return self._submit(self.state.subscribe(frame))

    def subscribe_local(self, sub_id: str) -> None:
        frame = Frame.build(Command.SUBSCRIBE, {"destination": "/mq-sidecar/events", "id": sub_id})
        self.state.subscribe(frame, local=True)

    def unsubscribe(self, sub_id: str, **extra: str) -> Entry:
        frame = Frame.build(Command.UNSUBSCRIBE, {"id": sub_id, **extra})
        sub = self.state.unsubscribe(frame)
        if sub is None:
            return self._submit(frame, PASS_THROUGH)
        rest = frame.without("id", "destination")
        return self._submit(rest.replace(headers=(("id", sub.upstream_id), *rest.headers)))

    def deliver(self, sub_id: str) -> str:
        """A MESSAGE from the broker on ``sub_id``; returns the app's ack id."""
        self._msg += 1
        message = Frame.build(
            Command.MESSAGE,
            {
                "destination": "/queue/in",
                "message-id": f"ID:{self._msg}",
                "subscription": sub_id,
                "ack": f"broker-{self._msg}",
                DUPLICATE_ID_HEADER: f"P-{self._msg}",
            },
        )
        out = self.state.deliver(message, now=0.0).to_app
        assert out is not None
        key = out.get("ack")
        assert key is not None
        return key

    def ack(self, key: str, tx: str | None = None, command: Command = Command.ACK) -> Entry:
        frame = Frame.build(command, {"id": key, **({"transaction": tx} if tx else {})})
        owner = self.state.transaction_of(frame)
        settled = self.state.settle(frame, upstream_version="1.2", now=0.0)
        assert settled.to_broker is not None
        entry = self._submit(settled.to_broker, owner)
        if owner is not None:
            owner.sent(entry, keep=False)
        return entry

    def begin(self, tx: str) -> Entry:
        frame = Frame.build(Command.BEGIN, {"transaction": tx})
        self.state.begin_transaction(frame)
        owner = self.state.transactions[tx]
        owner.begin = self._submit(frame, owner)
        return owner.begin

    def end(self, tx: str, command: Command = Command.COMMIT) -> Entry:
        owner = self.state.close_transaction(Frame.build(command, {"transaction": tx}), now=0.0)
        assert not owner.rolled_back
        owner.end = self._submit(Frame.build(command, {"transaction": tx}), owner)
        return owner.end

    # -- the broker -----------------------------------------------------------------------

    def confirm(self, through: Entry) -> None:
        """The broker's RECEIPTs, in order, for every entry up to ``through``."""
        for entry in list(self.window):
            assert entry.receipt is not None
            assert self.window.confirm(entry.receipt) is not None
            if entry is through:
                return
        raise AssertionError(f"{through.label} is not in the window")

    def confirm_all(self) -> None:
        entries = list(self.window)
        if entries:
            self.confirm(entries[-1])

    def transaction(self, tx: str) -> Transaction:
        return self.state.transactions[tx]

    def plan(self, *, replay_transactions: bool = True) -> ReplayPlan:
        """Lose the leg, open a new one, plan the restore (as ``Session._restore``)."""
        self.window.mark_all_unsent()
        self.state.new_link(stable_message_ids=False)
        plan = plan_replay(self.state, self.window, replay_transactions=replay_transactions)
        check_partition(plan, self.window)
        return plan


def check_partition(plan: ReplayPlan, window: ConfirmationWindow) -> None:
    """Every window entry is replayed, answered or reported in doubt: exactly one of them."""
    placed = [*plan.replay, *plan.answer, *plan.in_doubt]
    assert sorted(e.seq for e in placed) == [e.seq for e in window]
    assert [e.seq for e in plan.replay] == sorted(e.seq for e in plan.replay)


def sent(plan: ReplayPlan) -> list[Frame]:
    """The frames the new leg gets, in order."""
    return [*plan.subscribe, *plan.recreate, *(e.frame for e in plan.replay)]


def commands(frames: Iterable[Frame]) -> list[str]:
    return [f"{f.command} {f.get('id') or f.get('transaction') or ''}".strip() for f in frames]


def broker_subscriptions(frames: Iterable[Frame]) -> set[str]:
    """What a broker that got ``frames`` on a fresh connection has subscribed; a SUBSCRIBE
    with an id already in use is an ERROR on a real broker."""
    live: set[str] = set()
    for frame in frames:
        sub_id = frame.get("id") or ""
        if frame.command is Command.SUBSCRIBE:
            assert sub_id not in live, f"duplicate SUBSCRIBE id {sub_id!r}"
            live.add(sub_id)
        elif frame.command is Command.UNSUBSCRIBE:
            live.discard(sub_id)
    return live


def live_ids(state: SessionState) -> set[str]:
    return {s.upstream_id for s in state.subscriptions.values() if not s.local}


# -- subscriptions ----------------------------------------------------------------------------


def test_nothing_to_restore() -> None:
    plan = Sim().plan()
    assert plan == ReplayPlan()
    assert plan.frames_sent == 0


def test_confirmed_live_subscriptions_are_sent_again_with_their_headers() -> None:
    sim = Sim()
    sim.subscribe("a", selector="x = 1")
    sim.subscribe_local("events")
    sim.subscribe("b", destination="/topic/t", **{"activemq.subscriptionName": "durable"})
    sim.confirm_all()
    plan = sim.plan()
    assert plan.subscribe == [
        Frame.build(
            Command.SUBSCRIBE,
            {
                "destination": "/queue/in",
                "id": "a",
                "ack": "client-individual",
                "selector": "x = 1",
            },
        ),
        Frame.build(
            Command.SUBSCRIBE,
            {
                "destination": "/topic/t",
                "id": "b",
                "ack": "client-individual",
                "activemq.subscriptionName": "durable",
            },
        ),
    ]
    assert (plan.recreate, plan.replay, plan.answer) == ([], [], [])
    assert plan.frames_sent == 2


def test_an_unconfirmed_subscribe_is_replayed_from_the_window_not_twice() -> None:
    sim = Sim()
    sim.subscribe("a")
    sim.confirm_all()
    pending = sim.subscribe("b")
    plan = sim.plan()
    assert [f.get("id") for f in plan.subscribe] == ["a"]
    assert plan.replay == [pending]
    assert pending.frame.get("receipt") is not None  # it keeps its receipt: it is confirmed anew
    assert broker_subscriptions(sent(plan)) == {"a", "b"}


def test_a_cancelled_subscribe_and_unsubscribe_pair_is_answered_not_replayed() -> None:
    sim = Sim()
    subscribe = sim.subscribe("a")
    unsubscribe = sim.unsubscribe("a")
    plan = sim.plan()
    assert plan.answer == [subscribe, unsubscribe]
    assert sent(plan) == []


def test_an_unsubscribe_of_a_confirmed_subscription_is_answered() -> None:
    sim = Sim()
    sim.subscribe("a")
    sim.subscribe("b")
    sim.confirm_all()
    unsubscribe = sim.unsubscribe("a")
    plan = sim.plan()
    assert [f.get("id") for f in plan.subscribe] == ["b"]  # the new broker never had "a"
    assert plan.answer == [unsubscribe]
    assert plan.replay == []


def test_a_pass_through_unsubscribe_is_replayed() -> None:
    sim = Sim()
    removal = sim.unsubscribe("durable-1", **{"activemq.subscriptionName": "durable-1"})
    assert removal.context is PASS_THROUGH
    plan = sim.plan()
    assert plan.replay == [removal]
    assert plan.answer == []


def test_resubscribing_a_confirmed_id_replays_the_new_subscribe_once() -> None:
    sim = Sim()
    sim.subscribe("a")
    sim.confirm_all()
    unsubscribe = sim.unsubscribe("a")
    again = sim.subscribe("a", destination="/queue/other")
    plan = sim.plan()
    assert plan.subscribe == []
    assert plan.answer == [unsubscribe]
    assert plan.replay == [again]
    assert broker_subscriptions(sent(plan)) == {"a"}


def test_a_subscribe_unsubscribe_subscribe_of_one_id_ends_with_one_subscription() -> None:
    sim = Sim()
    sim.subscribe("a", destination="/queue/first")
    sim.unsubscribe("a")
    sim.subscribe("a", destination="/queue/second")
    plan = sim.plan()
    frames = sent(plan)
    assert broker_subscriptions(frames) == {"a"}
    assert [f.get("destination") for f in frames if f.command is Command.SUBSCRIBE][-1] == (
        "/queue/second"
    )


# -- acknowledgements and sends ---------------------------------------------------------------


@pytest.mark.parametrize("command", [Command.ACK, Command.NACK])
def test_ack_and_nack_entries_of_the_old_leg_are_answered(command: Command) -> None:
    sim = Sim()
    sim.subscribe("a")
    sim.confirm_all()
    key = sim.deliver("a")
    entry = sim.ack(key, command=command)
    plan = sim.plan()
    assert plan.answer == [entry]
    assert plan.replay == []


def test_unconfirmed_sends_are_replayed_in_order_confirmed_ones_are_not() -> None:
    sim = Sim()
    done = sim.send()
    assert done is not None
    sim.confirm(done)
    pending = [sim.send() for _ in range(3)]
    plan = sim.plan()
    assert plan.replay == pending
    assert [e.frame.get(DUPLICATE_ID_HEADER) for e in plan.replay] == ["S-2", "S-3", "S-4"]
    assert plan.frames_sent == 3


# -- transactions: replay mode ----------------------------------------------------------------


def test_replay_recreates_an_open_transaction_and_replays_the_rest_in_order() -> None:
    sim = Sim()
    begin = sim.begin("t")
    first = sim.send("t")
    assert first is not None
    sim.confirm(first)
    second, third = sim.send("t"), sim.send("t")
    plan = sim.plan()
    assert plan.recreate == [begin.frame.without("receipt"), first.frame.without("receipt")]
    assert plan.recreate[1].get(DUPLICATE_ID_HEADER) == "S-1"
    assert plan.replay == [second, third]
    assert plan.transactions_replayed == ["t"]
    assert (plan.transactions_in_doubt, plan.transactions_rolled_back) == ([], [])
    assert not sim.transaction("t").rolled_back
    assert commands(sent(plan)) == ["BEGIN t", "SEND t", "SEND t", "SEND t"]


def test_replay_of_a_transaction_whose_begin_is_unconfirmed_comes_from_the_window() -> None:
    sim = Sim()
    begin = sim.begin("t")
    send = sim.send("t")
    plan = sim.plan()
    assert plan.recreate == []
    assert plan.replay == [begin, send]
    assert plan.transactions_replayed == ["t"]


def test_replay_answers_the_acks_of_a_transaction_and_replays_its_sends() -> None:
    sim = Sim()
    sim.subscribe("a")
    key = sim.deliver("a")
    sim.begin("t")
    sim.confirm_all()
    ack = sim.ack(key, "t")
    send = sim.send("t")
    commit = sim.end("t")
    plan = sim.plan()
    assert plan.answer == [ack]
    assert plan.replay == [send, commit]
    assert commands(plan.recreate) == ["BEGIN t"]


def test_replay_reruns_an_in_flight_commit_and_reports_it_in_doubt() -> None:
    sim = Sim()
    begin = sim.begin("t")
    send = sim.send("t")
    assert send is not None
    sim.confirm(send)
    commit = sim.end("t")
    assert "t" not in sim.state.transactions  # closed: only the window still knows it
    plan = sim.plan()
    assert plan.recreate == [begin.frame.without("receipt"), send.frame.without("receipt")]
    assert plan.replay == [commit]
    assert plan.transactions_in_doubt == ["t"]
    assert plan.transactions_replayed == ["t"]
    assert plan.in_doubt == []


@pytest.mark.parametrize("replay_transactions", [True, False])
def test_an_aborted_transaction_is_dropped(replay_transactions: bool) -> None:
    sim = Sim()
    begin = sim.begin("t")
    sim.confirm(begin)
    send = sim.send("t")
    abort = sim.end("t", Command.ABORT)
    plan = sim.plan(replay_transactions=replay_transactions)
    assert plan.answer == [send, abort]
    assert sent(plan) == []
    assert plan.transactions_replayed == []
    assert plan.transactions_rolled_back == []
    assert plan.transactions_in_doubt == []


def test_an_aborted_transaction_with_its_begin_unconfirmed_is_dropped_whole() -> None:
    sim = Sim()
    entries = [sim.begin("t"), sim.send("t"), sim.end("t", Command.ABORT)]
    plan = sim.plan()
    assert plan.answer == entries
    assert sent(plan) == []


def test_replay_mode_keeps_transactions_apart_from_other_frames() -> None:
    sim = Sim()
    sim.subscribe("a")
    sim.begin("t")
    outside = sim.send()
    inside = sim.send("t")
    sim.confirm_all()
    late_outside = sim.send()
    late_inside = sim.send("t")
    plan = sim.plan()
    assert outside is not None
    assert inside is not None
    assert plan.recreate == [
        Frame.build(Command.BEGIN, {"transaction": "t"}),
        inside.frame.without("receipt"),
    ]
    assert plan.replay == [late_outside, late_inside]
    assert commands(sent(plan)) == ["SUBSCRIBE a", "BEGIN t", "SEND t", "SEND", "SEND t"]


# -- transactions: rollback mode --------------------------------------------------------------


def test_rollback_rolls_back_a_dirty_open_transaction_and_answers_its_entries() -> None:
    sim = Sim()
    sim.subscribe("a")
    key = sim.deliver("a")
    begin = sim.begin("t")
    sim.confirm(begin)
    ack = sim.ack(key, "t")
    send = sim.send("t")
    identity = "d:P-1"
    assert identity in sim.state.subscriptions["a"].seen
    plan = sim.plan(replay_transactions=False)
    tx = sim.transaction("t")
    assert tx.rolled_back
    assert identity not in sim.state.subscriptions["a"].seen  # state.roll_back() ran
    assert plan.transactions_rolled_back == ["t"]
    assert plan.answer == [ack, send]
    assert (plan.recreate, plan.replay) == ([], [])
    assert plan.transactions_replayed == []
    assert [f.get("id") for f in plan.subscribe] == ["a"]
    # the app's next SEND in it is answered locally; its COMMIT will be refused by the session
    assert sim.send("t") is None


def test_rollback_of_a_dirty_transaction_that_was_wholly_confirmed() -> None:
    sim = Sim()
    sim.begin("t")
    sim.send("t")
    sim.confirm_all()
    plan = sim.plan(replay_transactions=False)
    assert plan.transactions_rolled_back == ["t"]
    assert sim.transaction("t").rolled_back
    assert sent(plan) == []
    assert plan.answer == []


@pytest.mark.parametrize("begin_confirmed", [True, False])
def test_rollback_keeps_a_clean_open_transaction(begin_confirmed: bool) -> None:
    sim = Sim()
    begin = sim.begin("t")
    if begin_confirmed:
        sim.confirm(begin)
    plan = sim.plan(replay_transactions=False)
    assert not sim.transaction("t").rolled_back
    assert plan.transactions_rolled_back == []
    assert plan.transactions_replayed == []  # nothing done in it: nothing to report
    if begin_confirmed:
        assert (plan.recreate, plan.replay) == ([begin.frame.without("receipt")], [])
    else:
        assert (plan.recreate, plan.replay) == ([], [begin])


def test_rollback_reports_an_in_flight_commit_in_doubt() -> None:
    sim = Sim()
    begin = sim.begin("t")
    sim.confirm(begin)
    send = sim.send("t")
    commit = sim.end("t")
    plan = sim.plan(replay_transactions=False)
    assert plan.in_doubt == [commit]
    assert plan.answer == [send]
    assert plan.transactions_in_doubt == ["t"]
    assert plan.transactions_rolled_back == []
    assert sent(plan) == []


def test_rollback_mode_still_replays_frames_outside_transactions() -> None:
    sim = Sim()
    sim.begin("t")
    inside = sim.send("t")
    outside = sim.send()
    plan = sim.plan(replay_transactions=False)
    assert plan.answer[-1] is inside
    assert plan.replay == [outside]


# -- a whole session --------------------------------------------------------------------------


def test_a_mixed_session_is_restored_in_order() -> None:
    sim = Sim()
    sim.subscribe("a")
    sim.subscribe_local("events")
    key = sim.deliver("a")
    sim.begin("t1")
    sim.send("t1")
    sim.confirm_all()
    sub_b = sim.subscribe("b")
    ack = sim.ack(key)
    plain = sim.send()
    t1_send = sim.send("t1")
    t1_commit = sim.end("t1")
    t2 = [sim.begin("t2"), sim.send("t2"), sim.end("t2", Command.ABORT)]
    removal = sim.unsubscribe("old-durable")
    plan = sim.plan()
    assert commands(sent(plan)) == [
        "SUBSCRIBE a",
        "BEGIN t1",
        "SEND t1",
        "SUBSCRIBE b",
        "SEND",
        "SEND t1",
        "COMMIT t1",
        "UNSUBSCRIBE old-durable",
    ]
    assert plan.replay == [sub_b, plain, t1_send, t1_commit, removal]
    assert plan.answer == [ack, *t2]
    assert plan.transactions_in_doubt == ["t1"]
    assert plan.transactions_replayed == ["t1"]
    assert plan.frames_sent == 8
    assert broker_subscriptions(sent(plan)) == live_ids(sim.state)


# -- property: subscriptions on the new leg are the live ones ----------------------------------


@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["subscribe", "unsubscribe", "confirm"]), st.integers(0, 4)),
        max_size=30,
    )
)
def test_the_new_leg_ends_with_exactly_the_live_subscriptions(ops: list[tuple[str, int]]) -> None:
    """Ids are never reused here (see the xfail test above for reuse)."""
    sim = Sim()
    made = 0
    for op, n in ops:
        if op == "subscribe":
            made += 1
            sim.subscribe(f"s{made}")
        elif op == "unsubscribe":
            live = sorted(live_ids(sim.state))
            if live:
                sim.unsubscribe(live[n % len(live)])
        else:
            entries = list(sim.window)
            if entries:
                sim.confirm(entries[n % len(entries)])
    plan = sim.plan()
    assert broker_subscriptions(sent(plan)) == live_ids(sim.state)
