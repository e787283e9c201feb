"""RabbitMQ streams in the pure bookkeeping (proxy.tracking.streams, SessionState): the offset of
the last MESSAGE delivered to the app is recorded per subscription, a restore re-subscribes right
after it, what the app was shown is hidden and acknowledged when a new leg sends it again, and
an ACK of an old leg's stream delivery is the sidecar's to answer (docs/behaviour.md, "Streams";
the broker's side measured in docs/brokers.md, "Streams")."""

from __future__ import annotations

import pytest

from config import FailoverMode
from protocol import Command, Frame
from proxy.session.outcomes import after_restore
from proxy.telemetry.vocabulary import FrameOutcome
from proxy.tracking import STREAM_CREDIT, SessionState
from proxy.tracking.replay import plan_replay
from proxy.tracking.streams import (
    StreamGap,
    gap_before,
    is_stream_subscribe,
    parse_offset,
    resume_subscribe,
)
from proxy.tracking.window import ConfirmationWindow

STREAM = "/amq/queue/events"
POSITIONS = ["first", "next", "last", "offset=7", "timestamp=1700000000"]


def new_state(*, transparent: bool = True) -> SessionState:
    st = SessionState("S", "1.2", max_subscriptions=10, max_unacked=100, transparent=transparent)
    st.new_link(stable_message_ids=False, acks_ignore_subscription=True)
    return st


def subscribe(st: SessionState, ack: str = "client-individual", **headers: str) -> Frame:
    frame = Frame.build(
        Command.SUBSCRIBE,
        {"destination": STREAM, "id": "s", "ack": ack, "prefetch-count": "10", **headers},
    )
    return st.subscribe(frame)


def stream_message(offset: str, n: int, *, gen: int = 1) -> Frame:
    """The n-th MESSAGE of a leg (generation ``gen``) at stream offset ``offset``, as RabbitMQ
    3.10 writes it (measured: docs/brokers.md, "Streams")."""
    tag = f"T_s@@session-{gen}@@{n}"
    return Frame.build(
        Command.MESSAGE,
        {
            "subscription": "s",
            "destination": "/queue/events",
            "message-id": tag,
            "redelivered": "false",
            "ack": tag,
            "x-stream-offset": offset,
        },
        f"m{offset}".encode(),
    )


def resubscribe(st: SessionState) -> Frame:
    """The SUBSCRIBE a restore sends on a new leg (the plan's only one)."""
    st.new_link(stable_message_ids=False, acks_ignore_subscription=True)
    plan = plan_replay(
        st, ConfirmationWindow(1 << 20, receipt_prefix="S-r"), replay_transactions=True
    )
    (frame,) = plan.subscribe
    return frame


# -- the pure helpers ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "stream"),
    [
        ({"x-stream-offset": "first"}, True),
        ({"x-queue-type": "stream"}, True),
        ({"x-queue-type": "quorum"}, False),
        ({}, False),
    ],
)
def test_a_subscribe_names_a_stream_by_its_headers(headers: dict[str, str], stream: bool) -> None:
    frame = Frame.build(Command.SUBSCRIBE, {"destination": STREAM, "id": "s", **headers})
    assert is_stream_subscribe(frame) is stream


@pytest.mark.parametrize(
    ("value", "offset"),
    [("0", 0), ("42", 42), ("18446744073709551615", 2**64 - 1), ("", None), ("-1", None),
     ("+1", None), ("1.5", None), ("abc", None), (" 1", None), ("\u0661", None)],
)  # fmt: skip
def test_parse_offset_takes_decimal_numbers_only(value: str, offset: int | None) -> None:
    assert parse_offset(value) == offset


def test_resume_subscribe_replaces_or_appends_the_offset_and_keeps_the_rest() -> None:
    frame = Frame.build(
        Command.SUBSCRIBE,
        (
            ("destination", STREAM),
            ("x-stream-offset", "first"),
            ("id", "s"),
            ("x-stream-offset", "x"),
        ),
    )
    assert resume_subscribe(frame, 9).headers == (
        ("destination", STREAM),
        ("x-stream-offset", "offset=10"),
        ("id", "s"),
    )
    bare = Frame.build(Command.SUBSCRIBE, {"destination": STREAM, "id": "s"})
    assert resume_subscribe(bare, 0).get("x-stream-offset") == "offset=1"
    assert resume_subscribe(frame, None) is frame


@pytest.mark.parametrize(
    ("resumed_at", "offset", "gap"),
    [(10, 10, None), (10, 9, None), (10, 11, (10, 10)), (10, 391, (10, 390))],
)
def test_gap_before_names_the_offsets_skipped(
    resumed_at: int, offset: int, gap: tuple[int, int] | None
) -> None:
    assert gap_before(resumed_at, offset) == gap


def test_a_gap_counts_its_offsets() -> None:
    assert StreamGap("s", STREAM, 10, 390).count == 381
    assert StreamGap(None, STREAM, 4, 4).count == 1


# -- SessionState ----------------------------------------------------------------------------


@pytest.mark.parametrize("position", POSITIONS)
def test_a_restore_resumes_after_the_last_offset_delivered(position: str) -> None:
    """Whatever position the app asked for, the new leg starts right after what it was shown;
    every other header of the app's SUBSCRIBE is sent as it was."""
    st = new_state()
    sent = subscribe(st, **{"x-stream-offset": position})
    assert sent.get("x-stream-offset") == position  # the first leg: the app's own position
    for n, offset in enumerate(["7", "8", "9"], start=1):
        assert st.deliver(stream_message(offset, n), now=0.0).to_app is not None
    assert st.subscriptions["s"].stream_offset == 9
    again = resubscribe(st)
    assert again.get("x-stream-offset") == "offset=10"
    assert again.without("x-stream-offset") == sent.without("x-stream-offset")
    assert st.subscriptions["s"].frame.get("x-stream-offset") == position  # the app's, kept


@pytest.mark.parametrize("position", POSITIONS)
def test_nothing_delivered_yet_resumes_at_the_apps_own_position(position: str) -> None:
    st = new_state()
    sent = subscribe(st, **{"x-stream-offset": position})
    assert resubscribe(st) == sent


def test_a_stream_known_only_by_its_messages_resumes_at_an_offset_appended() -> None:
    """A SUBSCRIBE to an existing stream without stream headers (RabbitMQ's default position
    is ``next``): the MESSAGEs' x-stream-offset make it a stream subscription."""
    st = new_state()
    subscribe(st)
    sub = st.subscriptions["s"]
    before = sub.stream
    st.deliver(stream_message("3", 1), now=0.0)
    assert (before, sub.stream) == (False, True)
    assert resubscribe(st).get("x-stream-offset") == "offset=4"


@pytest.mark.parametrize("transparent", [True, False])
def test_a_redelivery_at_or_below_the_last_offset_is_hidden_and_acknowledged(
    transparent: bool,
) -> None:
    """A new leg that sends again what the app was shown (a broker that starts at the chunk
    holding the offset asked for): hidden and acknowledged (credit) in both failover modes;
    the first new offset is shown."""
    st = new_state(transparent=transparent)
    subscribe(st, **{"x-stream-offset": "first"})
    for n in range(3):
        st.deliver(stream_message(str(n), n + 1), now=0.0)
    resubscribe(st)
    for n, offset in enumerate(["1", "2"], start=1):
        decision = st.deliver(stream_message(offset, n, gen=2), now=0.0)
        assert decision.to_app is None
        assert decision.hidden == "redelivery"
        assert decision.to_broker is not None
        assert decision.to_broker.headers == (("id", f"T_s@@session-2@@{n}"),)
    shown = st.deliver(stream_message("3", 3, gen=2), now=0.0).to_app
    assert shown is not None
    assert shown.get("x-stream-offset") == "3"  # the broker's header reaches the app
    assert st.subscriptions["s"].stream_offset == 3
    assert st.redeliveries_hidden == 2


@pytest.mark.parametrize("transparent", [True, False])
def test_an_ack_of_an_old_legs_stream_delivery_is_answered_by_the_sidecar(
    transparent: bool,
) -> None:
    """RabbitMQ closes the connection on an ACK of a delivery tag it never gave (measured:
    ``PRECONDITION_FAILED - unknown delivery tag``): the old leg's deliveries are settled with
    nothing upstream, in ``strict`` mode too (a stream never redelivers them)."""
    st = new_state(transparent=transparent)
    subscribe(st, **{"x-stream-offset": "first"})
    ack = st.deliver(stream_message("0", 1), now=0.0).to_app
    assert ack is not None
    resubscribe(st)
    settled = st.settle(
        Frame.build(Command.ACK, {"id": ack.get("ack") or "", "receipt": "r"}),
        upstream_version="1.2",
        now=0.0,
    )
    assert settled.to_broker is None
    assert not settled.local
    assert st.unacked == 0


def test_a_client_ack_covering_both_legs_acknowledges_only_the_new_legs() -> None:
    st = new_state()
    subscribe(st, ack="client", **{"x-stream-offset": "first"})
    st.deliver(stream_message("0", 1), now=0.0)
    resubscribe(st)
    last = st.deliver(stream_message("1", 1, gen=2), now=0.0).to_app
    assert last is not None
    settled = st.settle(
        Frame.build(Command.ACK, {"id": last.get("ack") or ""}), upstream_version="1.2", now=0.0
    )
    assert settled.to_broker is not None
    assert settled.to_broker.get("id") == "T_s@@session-2@@1"
    assert settled.more == ()
    assert st.unacked == 0


def test_an_offset_that_is_not_a_number_makes_it_a_queue_noted_once() -> None:
    st = new_state()
    subscribe(st, **{"x-stream-offset": "first"})
    for n in range(3):
        decision = st.deliver(stream_message("abc", n + 1), now=0.0)
        assert decision.to_app is not None
        assert decision.to_app.get("x-stream-offset") == "abc"  # passed on
    assert len(st.stream_notes) == 1
    assert "'abc' is not a number" in st.stream_notes[0]
    sub = st.subscriptions["s"]
    assert (sub.stream, sub.stream_refused) == (False, "abc")
    # A queue for good: a number later changes nothing, and a restore sends the app's header.
    st.deliver(stream_message("5", 4), now=0.0)
    assert sub.stream_offset is None
    assert resubscribe(st).get("x-stream-offset") == "first"


def test_an_auto_subscribe_naming_a_stream_stays_auto_upstream() -> None:
    """RabbitMQ refuses automatic acknowledgement on a stream (measured): the broker decides,
    so the SUBSCRIBE goes as the app wrote it and the sidecar adds no ACK of its own."""
    st = new_state()
    sent = subscribe(st, ack="auto", **{"x-stream-offset": "first"})
    assert sent.get("ack") == "auto"
    decision = st.deliver(stream_message("0", 1), now=0.0)
    assert decision.to_app is not None
    assert decision.to_broker is None
    assert resubscribe(st).get("ack") == "auto"
    # A plain auto subscription is still client-individual upstream (issue 3).
    plain = st.subscribe(Frame.build(Command.SUBSCRIBE, {"destination": "/queue/q", "id": "q"}))
    assert plain.get("ack") == "client-individual"


def test_a_queue_subscription_is_resubscribed_unchanged() -> None:
    st = new_state()
    sent = st.subscribe(
        Frame.build(
            Command.SUBSCRIBE, {"destination": "/queue/q", "id": "s", "ack": "client-individual"}
        )
    )
    assert resubscribe(st) == sent


def test_a_resumed_leg_that_starts_further_on_names_the_gap_once() -> None:
    """Retention removed the offset the new leg was asked to start at: RabbitMQ starts at the
    first offset it still has (measured, docs/brokers.md, "Streams"). The first MESSAGE names
    the offsets between as a gap and is shown; later ones, and later jumps on the same leg
    (RabbitMQ's entries that are not messages), name none."""
    st = new_state()
    subscribe(st, **{"x-stream-offset": "first"})
    for n in range(3):
        st.deliver(stream_message(str(n), n + 1), now=0.0)
    assert st.stream_gaps == []
    assert resubscribe(st).get("x-stream-offset") == "offset=3"
    shown = st.deliver(stream_message("391", 1, gen=2), now=0.0).to_app
    assert shown is not None
    assert shown.get("x-stream-offset") == "391"
    assert st.stream_gaps == [StreamGap("s", STREAM, 3, 390)]
    assert st.stream_offsets_missed == 388
    st.stream_gaps.clear()
    st.deliver(stream_message("393", 2, gen=2), now=0.0)
    assert st.stream_gaps == []
    assert st.subscriptions["s"].stream_offset == 393


def test_a_resumed_leg_that_starts_where_asked_names_no_gap() -> None:
    """A redelivery first (hidden), then the offset asked for: no gap; nor on a first leg
    whose broker starts further on than the app's own position (the broker's answer, as
    directly)."""
    st = new_state()
    subscribe(st, **{"x-stream-offset": "offset=5"})
    st.deliver(stream_message("200", 1), now=0.0)  # retention: 5 is gone; the app's position
    assert st.stream_gaps == []
    resubscribe(st)
    assert st.deliver(stream_message("200", 1, gen=2), now=0.0).to_app is None
    assert st.deliver(stream_message("201", 2, gen=2), now=0.0).to_app is not None
    assert (st.stream_gaps, st.stream_offsets_missed) == ([], 0)


@pytest.mark.parametrize("mode", [FailoverMode.TRANSPARENT, FailoverMode.STRICT])
def test_a_stream_ack_in_flight_at_a_failover_is_credit_reported_to_no_one(
    mode: FailoverMode,
) -> None:
    """An ACK of a stream delivery is credit (Settled.credit); one the old leg never
    confirmed is moot at the restore and named in no OUTCOME, in both failover modes (its
    message never comes again); a queue's is (``replayed`` / ``lost``)."""
    reports = []
    for headers in ({"x-stream-offset": "first"}, {}):
        st = new_state(transparent=mode is FailoverMode.TRANSPARENT)
        subscribe(st, **headers)
        message = stream_message("0", 1) if headers else queue_message(1)
        shown = st.deliver(message, now=0.0).to_app
        assert shown is not None
        settled = st.settle(
            Frame.build(Command.ACK, {"id": shown.get("ack") or ""}),
            upstream_version="1.2",
            now=0.0,
        )
        assert settled.to_broker is not None
        assert settled.credit is bool(headers)
        window = ConfirmationWindow(1 << 20, receipt_prefix="S-r")
        window.append(
            settled.to_broker,
            app_receipt=None,
            want_receipt=False,
            now=0.0,
            context=STREAM_CREDIT if settled.credit else None,
        )
        window.mark_all_unsent()
        st.new_link(stable_message_ids=False, acks_ignore_subscription=True)
        plan = plan_replay(st, window, replay_transactions=True)
        reports.append([r.outcome for r in after_restore(plan, mode)])
    lost_or_replayed = FrameOutcome.LOST if mode is FailoverMode.STRICT else FrameOutcome.REPLAYED
    assert reports == [[], [lost_or_replayed]]


def queue_message(n: int) -> Frame:
    """The n-th MESSAGE of a queue subscription ``s`` (no ``x-stream-offset``)."""
    return stream_message("0", n).without("x-stream-offset")
