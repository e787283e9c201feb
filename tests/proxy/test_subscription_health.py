"""Every subscription's health (issue 32 part 4) in a session on a scripted RabbitMQ and the
mock clock (the pure model: tests/proxy/test_tracking_health.py): a subscription the broker
cancels is ``cancelled_by_broker``, then ``restoring`` until the broker confirms its new SUBSCRIBE,
``waiting_for_queue`` while the broker answers that its queue is not there, and live again;
``/status``, the gauge ``mq_sidecar_subscriptions`` and ``/readyz`` (after
``subscription_down_timeout``) show it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio
import trio.testing
from prometheus_client import CollectorRegistry

from config import Config
from protocol import Command
from proxy.admin.health import MAX_SUBSCRIPTION_REASONS, evaluate_readiness
from proxy.admin.server import AdminServer
from proxy.tracking.health import SubscriptionState, SubscriptionStatistics
from tests.proxy.scripted_broker import RABBITMQ, Network, wait_until
from tests.proxy.test_admin_health import A, health, session_stats
from tests.proxy.test_admin_page import app_of_an_outbox_sidecar
from tests.proxy.test_admin_server import GUARD
from tests.proxy.test_metrics import FakeSidecar
from tests.proxy.test_session_modes import connected
from tests.proxy.test_session_queue_unavailable import QUEUE, cancelled, not_found

# -- a session on a scripted RabbitMQ ------------------------------------------------------------


async def test_a_cancelled_subscription_is_shown_down_until_the_broker_confirms_it_again(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    broker = network.add("rabbit", 61001, server=RABBITMQ)
    running = await connected(nursery, network, broker, subscription_down_timeout=10_000)
    app, session = running.app, running.session
    for sub_id, destination in (("s1", QUEUE), ("t1", "/topic/x")):
        await app.send(
            Command.SUBSCRIBE,
            {"destination": destination, "id": sub_id, "ack": "auto", "receipt": sub_id},
        )
        await app.wait_receipt(sub_id)
    await broker.link.deliver("/topic/x", b"t", message_id="m1")
    await wait_until(lambda: len(app.messages("/topic/x")) == 1)

    def states() -> dict[str, tuple[str, float | None]]:
        return {s.id: (s.state, s.down_for_seconds) for s in session.statistics().per_subscription}

    assert states() == {"s1": ("live", None), "t1": ("live", None)}
    (t1,) = [s for s in session.statistics().per_subscription if s.id == "t1"]
    assert (t1.kind, t1.ack) == ("topic", "auto")
    assert t1.last_delivery_age_seconds is not None
    assert 0.0 <= t1.last_delivery_age_seconds < 1.0  # the mock clock: wait_until's steps

    broker.receipts = "hold"  # the broker will not confirm s1's new SUBSCRIBE for a while
    cancelled_at = trio.current_time()
    await broker.link.send(cancelled("s1"))
    again = await broker.wait_for(Command.SUBSCRIBE, 4)  # both made again on the new leg
    receipt = next(f.get("receipt") for f in again[2:] if f.get("id") == "s1")
    assert receipt is not None  # the sidecar's own: its RECEIPT confirms s1
    assert next(f.get("receipt") for f in again[2:] if f.get("id") == "t1") is None
    await wait_until(lambda: states()["t1"] == ("live", None))
    assert states()["s1"][0] == "restoring"

    # The new leg's broker says the queue is not there: waiting for it, still down since the
    # cancel; the sidecar reconnects with back-off and subscribes again.
    await broker.live_links()[-1].send(not_found(None))
    await wait_until(lambda: states()["s1"][0] == "waiting_for_queue")
    await broker.wait_for_links(3)
    await wait_until(lambda: states()["s1"][0] == "restoring")

    def readiness() -> tuple[bool, tuple[str, ...]]:
        verdict = evaluate_readiness(
            brokers=[health(A, "up")],
            sessions=[session.statistics()],
            call_timeout=3600.0,
            subscription_down_timeout=10.0,
        )
        return verdict.ready, verdict.reasons

    assert readiness() == (True, ())
    await trio.sleep(max(0.0, cancelled_at + 10.5 - trio.current_time()))
    ready, reasons = readiness()
    assert not ready
    assert len(reasons) == 1
    assert reasons[0].startswith(f"subscription 's1' of session {session.core.id} to {QUEUE}: ")
    assert "longer than subscription_down_timeout 10 s" in reasons[0]
    down = states()["s1"][1]
    assert down is not None
    assert down >= 10.5

    broker.receipts = "auto"
    await broker.live_links()[-1].release()  # the broker confirms the SUBSCRIBE: live
    await wait_until(lambda: states()["s1"] == ("live", None))
    assert readiness() == (True, ())
    assert app.errors() == []


async def test_a_subscription_made_while_reconnecting_is_restoring_until_a_restore_sends_it(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    broker = network.add("rabbit", 61001, server=RABBITMQ)
    running = await connected(nursery, network, broker)
    app, session = running.app, running.session
    broker.reachable = False
    await broker.link.drop("close")
    await app.wait_event("RECONNECTING")
    await app.send(Command.SUBSCRIBE, {"destination": QUEUE, "id": "s1", "receipt": "s1"})
    await wait_until(lambda: len(session.statistics().per_subscription) == 1)
    (sub,) = session.statistics().per_subscription
    assert sub.state == "restoring"
    broker.reachable = True
    await app.wait_receipt("s1")
    (sub,) = session.statistics().per_subscription
    assert (sub.state, sub.down_for_seconds) == ("live", None)


# -- the gauge and /readyz -----------------------------------------------------------------------


def stats_with(*states: str, down_for: float | None = 20.0) -> list[SubscriptionStatistics]:
    return [
        SubscriptionStatistics(
            f"s{i}",
            f"/queue/q{i}",
            "queue",
            "auto",
            st,
            None if st == "live" else down_for,
            None,
            None,
        )
        for i, st in enumerate(states)
    ]


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


async def test_the_gauge_counts_subscriptions_by_state_and_readyz_names_those_down_too_long() -> (
    None
):
    sidecar = FakeSidecar(Config(brokers=(A,), subscription_down_timeout=15_000))
    admin = AdminServer(sidecar)
    r = sidecar.registry
    for st in SubscriptionState:
        assert value(r, "mq_sidecar_subscriptions", state=st.value) == 0
    sidecar.fake_sessions = [
        session_stats("a", per_subscription=tuple(stats_with("live", "live", "restoring"))),
        session_stats(
            "b",
            per_subscription=tuple(stats_with("cancelled_by_broker", "waiting_for_queue")),
        ),
    ]
    assert value(r, "mq_sidecar_subscriptions", state="live") == 2
    assert value(r, "mq_sidecar_subscriptions", state="restoring") == 1
    assert value(r, "mq_sidecar_subscriptions", state="cancelled_by_broker") == 1
    assert value(r, "mq_sidecar_subscriptions", state="waiting_for_queue") == 1
    reasons = [x for x in admin.readiness().reasons if x.startswith("subscription")]
    assert reasons == [
        "subscription 's2' of session a to /queue/q2: restoring for 20.0 s, longer than "
        "subscription_down_timeout 15 s",
        "subscription 's0' of session b to /queue/q0: cancelled_by_broker for 20.0 s, longer "
        "than subscription_down_timeout 15 s",
        "subscription 's1' of session b to /queue/q1: waiting_for_queue for 20.0 s, longer "
        "than subscription_down_timeout 15 s",
    ]


def test_readyz_bounds_its_subscription_lines_and_a_zero_bound_turns_them_off() -> None:
    many = session_stats("a", per_subscription=tuple(stats_with(*["restoring"] * 25)))
    verdict = evaluate_readiness(
        brokers=[health(A, "up")], sessions=[many], call_timeout=30.0, subscription_down_timeout=5.0
    )
    assert len(verdict.reasons) == MAX_SUBSCRIPTION_REASONS + 1
    assert verdict.reasons[-1] == "... and 15 more subscription(s) down"
    short = session_stats("a", per_subscription=tuple(stats_with("restoring", down_for=4.0)))
    assert evaluate_readiness(
        brokers=[health(A, "up")],
        sessions=[short],
        call_timeout=30.0,
        subscription_down_timeout=5.0,
    ).ready
    assert Config(subscription_down_timeout=0).durations.subscription_down_timeout is None
    off = evaluate_readiness(brokers=[health(A, "up")], sessions=[many], call_timeout=30.0)
    assert off.ready


async def test_status_lists_every_subscription_in_a_part_of_its_own(tmp_path: Path) -> None:
    """A real app in outbox mode with no broker: its SUBSCRIBE is in no broker's hands, so it
    is restoring; ``/status`` lists it under ``subscriptions`` (not in the session's entry),
    and readiness in outbox mode without a broker does not count it."""
    with trio.fail_after(GUARD):
        async with app_of_an_outbox_sidecar(tmp_path, subscription_down_timeout=1) as (
            sidecar,
            app,
        ):
            assert sidecar.admin is not None
            await app.send_all(b"SUBSCRIBE\ndestination:/queue/a\nid:c\nack:client\n\n\0")
            status: dict[str, Any] = {"subscriptions": []}

            def down_for() -> float:
                subs = status["subscriptions"]
                return float(subs[0]["down_for_seconds"]) if subs else 0.0

            while down_for() <= 0.002:  # past subscription_down_timeout (1 ms); bounded by GUARD
                await trio.sleep(0.01)
                status = sidecar.admin.status()
            (session,) = status["sessions"]
            assert "per_subscription" not in session
            assert session["subscriptions"] == 1
            (sub,) = status["subscriptions"]
            assert sub["session_id"] == session["session_id"]
            assert {
                k: v for k, v in sub.items() if k not in ("session_id", "down_for_seconds")
            } == {
                "id": "c",
                "destination": "/queue/a",
                "kind": "queue",
                "ack": "client",
                "state": "restoring",
                "last_delivery_age_seconds": None,
                "stream_offset": None,
            }
            assert status["subscriptions_truncated"] is False
            assert sidecar.admin.readiness().ready  # outbox mode, no broker: no reason
