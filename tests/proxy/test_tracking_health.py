"""Every subscription's health (issue 32 part 4), the pure state model: :mod:`proxy.tracking.health`
and :class:`SessionState`'s part of it (what a lost leg, a broker's cancel or ``not_found``, a
restore, a RECEIPT and a MESSAGE do to a subscription's state)."""

from __future__ import annotations

from protocol import Command, Frame
from proxy.legs.dialect import BrokerDialect
from proxy.tracking import SessionState
from proxy.tracking.health import (
    SubscriptionHealth,
    SubscriptionKind,
    SubscriptionState,
    SubscriptionStatistics,
    kind_of,
    queue_of,
)
from tests.proxy.scripted_broker import RABBITMQ
from tests.proxy.test_session_queue_unavailable import QUEUE, cancelled, no_replica, not_found

LIVE = SubscriptionState.LIVE
RESTORING = SubscriptionState.RESTORING
CANCELLED = SubscriptionState.CANCELLED_BY_BROKER
WAITING = SubscriptionState.WAITING_FOR_QUEUE


def subscribe(state: SessionState, sub_id: str, destination: str, **headers: str) -> Frame:
    return state.subscribe(
        Frame(
            Command.SUBSCRIBE,
            (("id", sub_id), ("destination", destination), ("ack", "client"), *headers.items()),
        )
    )


def new_state() -> SessionState:
    return SessionState("3f2a1c-1", "1.2", max_subscriptions=10, max_unacked=100)


def test_a_lost_leg_makes_live_subscriptions_restoring_and_a_restore_makes_them_live() -> None:
    h = SubscriptionHealth()
    assert (h.state, h.down_for(5.0)) == (LIVE, None)
    h.lost(10.0)
    assert (h.state, h.down_for(12.5)) == (RESTORING, 2.5)
    h.lost(11.0)  # another leg lost in the same outage: still down since the first
    assert h.down_for(12.0) == 2.0
    h.restored()
    assert (h.state, h.down_for(13.0)) == (LIVE, None)


def test_a_refused_subscription_stays_down_until_the_broker_confirms_it() -> None:
    h = SubscriptionHealth()
    h.refused_by_broker(CANCELLED, 10.0)
    h.lost(10.1)  # the leg given up after the cancel: still cancelled, down since 10.0
    assert (h.state, h.down_for(11.0)) == (CANCELLED, 1.0)
    h.resubscribing("r1")
    h.restored()  # the restore sent it: not live before its RECEIPT
    assert (h.state, h.receipt, h.down_for(12.0)) == (RESTORING, "r1", 2.0)
    h.refused_by_broker(WAITING, 12.0, "not_found")  # the new leg: not_found
    assert (h.state, h.message, h.down_for(14.0)) == (WAITING, "not_found", 4.0)
    h.lost(14.5)
    h.resubscribing("r2")
    assert (h.state, h.message) == (RESTORING, "not_found")  # the broker's words kept
    h.confirmed()
    assert (h.state, h.refused, h.receipt, h.message) == (LIVE, False, None, None)
    assert h.down_for(15.0) is None


def test_a_message_confirms_a_subscription_and_dates_its_last_delivery() -> None:
    h = SubscriptionHealth()
    h.refused_by_broker(WAITING, 1.0)
    h.delivered(3.0)
    assert (h.state, h.last_delivery_at, h.down_for(4.0)) == (LIVE, 3.0, None)


def test_kinds_and_queue_names() -> None:
    assert kind_of("/queue/a", stream=False) is SubscriptionKind.QUEUE
    assert kind_of("/amq/queue/a", stream=True) is SubscriptionKind.STREAM
    for topic in ("/topic/a", "/temp-topic/a", "/exchange/amq.topic/a"):
        assert kind_of(topic, stream=False) is SubscriptionKind.TOPIC
    assert queue_of("/queue/a.b") == "a.b"
    assert queue_of("/amq/queue/s") == "s"
    assert queue_of("/topic/a") is None


def test_the_broker_s_error_names_a_subscription_by_id_or_by_its_queue() -> None:
    state = new_state()
    subscribe(state, "s1", QUEUE)
    subscribe(state, "s2", "/amq/queue/home-down")
    subscribe(state, "t1", "/topic/x")
    subscribe(state, "st", "/amq/queue/s32_c", **{"x-stream-offset": "first"})
    (sub,) = state.subscriptions_refused(cancelled("s1"), CANCELLED, 5.0)
    assert sub.upstream_id == "s1"
    assert state.subscriptions["s1"].health.state is CANCELLED
    assert state.subscriptions["s1"].health.message == "Server cancelled subscription"
    assert state.subscriptions["s2"].health.state is LIVE
    named = state.subscriptions_refused(not_found(None), WAITING, 6.0)
    assert [s.upstream_id for s in named] == ["s1", "s2"]  # both read the queue 'home-down'
    assert state.subscriptions["s2"].health.message == "not_found"
    (stream,) = state.subscriptions_refused(
        no_replica("s32_c"), WAITING, 6.5
    )  # a stream's writer moves
    assert (stream.upstream_id, stream.health.state) == ("st", WAITING)
    assert state.subscriptions["t1"].health.state is LIVE
    other = Frame(Command.ERROR, (("message", "not_found"),), b"no exchange 'x' in vhost '/'")
    assert state.subscriptions_refused(other, WAITING, 7.0) == []
    assert state.subscription_waiting("nope", 7.0) is None
    assert state.subscription_waiting("t1", 7.0) is state.subscriptions["t1"]
    assert state.subscriptions["t1"].health.state is WAITING


def test_a_restore_asks_a_receipt_only_for_refused_subscriptions_and_forgets_unanswered_ones() -> (
    None
):
    state = new_state()
    subscribe(state, "s1", QUEUE)
    subscribe(state, "t1", "/topic/x")
    state.subscriptions_refused(cancelled("s1"), CANCELLED, 1.0)
    for attempt in range(50):  # a run of legs lost before the broker answered
        state.subscriptions_lost(2.0 + attempt)
        s1 = state.resubscribe(state.subscriptions["s1"])
        t1 = state.resubscribe(state.subscriptions["t1"])
        assert t1.get("receipt") is None
        receipt = s1.get("receipt")
        assert receipt is not None
        state.subscriptions_restored()
        assert state.subscriptions["t1"].health.state is LIVE
        assert state.subscriptions["s1"].health.state is RESTORING
    assert len(state._internal) == 1  # only the last one's receipt is still awaited
    assert receipt is not None
    assert state.subscribe_confirmed(receipt)
    assert state.take_internal_receipt(receipt)
    assert not state.subscribe_confirmed("other")
    assert state.subscriptions["s1"].health.state is LIVE


def test_statistics_per_subscription() -> None:
    state = new_state()
    subscribe(state, "s1", QUEUE)
    subscribe(state, "st", "/amq/queue/log", **{"x-stream-offset": "first", "prefetch-count": "9"})
    state.subscribe(
        Frame(Command.SUBSCRIBE, (("id", "ev"), ("destination", "/mq-sidecar/events"))),
        local=True,
    )
    state.subscriptions["st"].stream_offset = 41
    state.subscriptions["st"].health.delivered(2.0)
    state.subscriptions_refused(cancelled("s1"), CANCELLED, 3.0)
    assert state.subscription_statistics(4.5) == (
        SubscriptionStatistics(
            "s1", QUEUE, "queue", "client", "cancelled_by_broker", 1.5, None, None
        ),
        SubscriptionStatistics("st", "/amq/queue/log", "stream", "client", "live", None, 2.5, 41),
    )


def test_the_retried_errors_say_what_they_make_of_the_subscriptions_they_name() -> None:
    rabbit = BrokerDialect.from_server(RABBITMQ)
    cancel = rabbit.retryable_error(cancelled("s1"))
    home_down = rabbit.retryable_error(not_found(None))
    assert cancel is not None
    assert home_down is not None
    assert cancel.subscriptions is CANCELLED
    assert home_down.subscriptions is WAITING
