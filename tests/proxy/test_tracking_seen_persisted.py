"""SessionState in outbox mode (issue 17 part 3, docs/behaviour.md "Duplicate detection"): the
``mq-sidecar-id`` of each message the app settles on a queue subscription is handed out to
persist (``seen_out``), and a subscription seeded with persisted ids hides their copies as
duplicates, on any link and in both failover modes. Pure: no I/O, no clock."""

from __future__ import annotations

import pytest

from protocol import Command, Frame
from proxy.tracking import SessionState
from proxy.tracking.records import SEEN_MAX, persists_seen

QUEUE = "/queue/orders"


def new_state(*, persist: bool = True, transparent: bool = True) -> SessionState:
    """A session on its first link; ``persist``: outbox mode (as the handshake sets it)."""
    st = SessionState("S", "1.2", max_subscriptions=10, max_unacked=100, transparent=transparent)
    st.persist_seen_ids = persist
    st.new_link(stable_message_ids=True)
    return st


def subscribe(
    st: SessionState, ack: str = "client-individual", destination: str = QUEUE, **more: str
) -> None:
    st.subscribe(
        Frame.build(Command.SUBSCRIBE, {"destination": destination, "id": "s", "ack": ack, **more})
    )


def message(n: int, sidecar_id: str, destination: str = QUEUE) -> Frame:
    """A MESSAGE of a copy: its own broker message-id, the producer's ``mq-sidecar-id``."""
    return Frame.build(
        Command.MESSAGE,
        {
            "destination": destination,
            "message-id": f"ID:m{n}",
            "subscription": "s",
            "ack": f"a{n}",
            "mq-sidecar-id": sidecar_id,
        },
        b"x",
    )


def ack(st: SessionState, shown: Frame, command: Command = Command.ACK, **more: str) -> None:
    st.settle(
        Frame.build(command, {"id": shown.get("ack") or "", **more}),
        upstream_version="1.2",
        now=0.0,
    )


def test_an_acknowledged_message_is_handed_out_once_acked_not_when_shown() -> None:
    st = new_state()
    subscribe(st)
    shown = st.deliver(message(1, "p-1"), now=0.0).to_app
    assert shown is not None
    assert st.seen_out == []  # the app could still lose it: a restart must show it again
    ack(st, shown)
    assert st.seen_out == [(QUEUE, "p-1")]


def test_a_client_ack_hands_out_every_message_it_covers() -> None:
    st = new_state()
    subscribe(st, ack="client")
    shown = [st.deliver(message(n, f"p-{n}"), now=0.0).to_app for n in range(3)]
    assert shown[2] is not None
    ack(st, shown[2])
    assert st.seen_out == [(QUEUE, "p-0"), (QUEUE, "p-1"), (QUEUE, "p-2")]


def test_an_auto_subscription_hands_out_what_is_shown() -> None:
    st = new_state()
    subscribe(st, ack="auto")
    assert st.deliver(message(1, "p-1"), now=0.0).to_app is not None
    assert st.seen_out == [(QUEUE, "p-1")]


def test_a_nack_hands_out_nothing() -> None:
    st = new_state()
    subscribe(st)
    shown = st.deliver(message(1, "p-1"), now=0.0).to_app
    assert shown is not None
    ack(st, shown, Command.NACK)
    assert st.seen_out == []


def test_a_transaction_hands_out_its_acks_at_commit_and_none_at_abort() -> None:
    st = new_state()
    subscribe(st)
    first = st.deliver(message(1, "p-1"), now=0.0).to_app
    second = st.deliver(message(2, "p-2"), now=0.0).to_app
    assert first is not None
    assert second is not None
    st.begin_transaction(Frame.build(Command.BEGIN, {"transaction": "t1"}))
    ack(st, first, transaction="t1")
    assert st.seen_out == []
    st.close_transaction(Frame.build(Command.COMMIT, {"transaction": "t1"}), now=0.0)
    assert st.seen_out == [(QUEUE, "p-1")]
    st.seen_out.clear()
    st.begin_transaction(Frame.build(Command.BEGIN, {"transaction": "t2"}))
    ack(st, second, transaction="t2")
    st.close_transaction(Frame.build(Command.ABORT, {"transaction": "t2"}), now=0.0)
    assert st.seen_out == []  # the app holds it again


@pytest.mark.parametrize(
    ("persist", "destination", "more"),
    [
        (False, QUEUE, {}),  # not outbox mode
        (True, "/topic/prices", {}),  # every subscriber has its own copy
        (True, QUEUE, {"browser": "true"}),  # a browse consumes nothing
    ],
)
def test_nothing_is_handed_out_without_outbox_mode_for_a_topic_or_a_browser(
    persist: bool, destination: str, more: dict[str, str]
) -> None:
    st = new_state(persist=persist)
    subscribe(st, ack="auto", destination=destination, **more)
    st.deliver(message(1, "p-1", destination), now=0.0)
    assert st.seen_out == []


def test_persisted_destinations_are_queues() -> None:
    assert persists_seen("/queue/a.b")
    assert persists_seen("/amq/queue/a")
    assert not persists_seen("/topic/a")
    assert not persists_seen("/exchange/x/y")
    assert not persists_seen("/temp-queue/r")


@pytest.mark.parametrize("transparent", [True, False])
def test_a_seeded_id_hides_its_copy_as_a_duplicate_on_any_link(transparent: bool) -> None:
    st = new_state(transparent=transparent)
    subscribe(st)
    assert st.seed_seen("s", ["p-1", "p-2"], now=0.0) == 2
    hidden = st.deliver(message(7, "p-1"), now=1.0)
    assert hidden.to_app is None
    assert hidden.hidden == "duplicate"
    assert hidden.to_broker is not None  # acknowledged upstream
    assert hidden.to_broker.get("id") == "a7"
    st.new_link(stable_message_ids=True)  # a failover: still a duplicate, in strict mode too
    again = st.deliver(message(8, "p-2"), now=2.0)
    assert (again.to_app, again.hidden) == (None, "duplicate")
    shown = st.deliver(message(9, "p-3"), now=3.0).to_app  # a new message is shown
    assert shown is not None
    assert shown.get("redelivered") is None
    assert st.duplicates_hidden == 2
    assert st.seen_out == []  # a hidden copy is not handed out again


def test_seeding_keeps_the_ids_the_subscription_has_and_the_count_bound() -> None:
    st = new_state()
    subscribe(st)
    shown = st.deliver(message(1, "p-1"), now=0.0).to_app
    assert shown is not None
    # The app holds p-1: seeding it must not turn its redelivery into a hidden duplicate.
    assert st.seed_seen("s", ["p-1"], now=0.0) == 0
    assert st.seed_seen("nope", ["p-1"], now=0.0) == 0
    st.seed_seen("s", (f"q-{n}" for n in range(SEEN_MAX + 5)), now=0.0)
    assert len(st.subscriptions["s"].seen) == SEEN_MAX
    assert "d:q-0" not in st.subscriptions["s"].seen  # the oldest went
