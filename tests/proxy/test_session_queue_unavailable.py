"""A queue that is unavailable for a while (issue 25 parts 3 and 4), on scripted brokers and
the mock clock: RabbitMQ's ``not_found`` for a classic queue whose home node is down (then it
closes the connection) is retried as a reconnect with the window kept, not passed on as the
end of the session; legs lost before their replay was confirmed are reconnected with a growing
backoff; ``reconnect_period`` still bounds it all."""

from __future__ import annotations

import trio
import trio.testing

from protocol import Command, Frame
from proxy.legs.dialect import BrokerDialect
from proxy.tracking.health import SubscriptionState, unavailable_queue
from tests.proxy.scripted_broker import RABBITMQ, Network, ScriptedBroker, wait_until
from tests.proxy.test_session_modes import connected

QUEUE = "/queue/home-down"
HOME_DOWN = (
    b"home node 'rabbit3@localhost' of durable queue 'home-down' in vhost '/' is down or "
    b"inaccessible"
)


def not_found(receipt: str | None) -> Frame:
    headers = [("message", "not_found"), ("content-type", "text/plain")]
    if receipt is not None:
        headers.append(("receipt-id", receipt))
    return Frame(Command.ERROR, tuple(headers), HOME_DOWN)


def test_the_table_knows_rabbitmq_s_home_node_down_and_nothing_else() -> None:
    rabbit = BrokerDialect.from_server(RABBITMQ)
    assert rabbit.retryable_error(not_found("r1")) is not None
    other = Frame(Command.ERROR, (("message", "not_found"),), b"no queue 'x' in vhost '/'")
    assert rabbit.retryable_error(other) is None  # a queue that does not exist: the app's
    assert BrokerDialect.from_server("ActiveMQ/5.17.6").retryable_error(not_found("r1")) is None


async def refuse_sends_while(broker: ScriptedBroker, down: trio.Event) -> None:
    """Answer every SEND to QUEUE with not_found and close, while ``down`` is not set (its
    receipts held); then confirm what the live link holds, and everything after."""
    broker.receipts = "hold"
    seen = 0
    while not down.is_set():
        sends = [f for f in broker.frames() if f.command is Command.SEND]
        if len(sends) > seen and broker.live_links():
            seen = len(sends)
            link = broker.live_links()[-1]
            await link.send(not_found(sends[-1].get("receipt")))
            await link.drop("close")
        await trio.sleep(0.01)
    broker.receipts = "auto"
    for link in broker.live_links():
        await link.release()


async def test_not_found_then_close_is_a_reconnect_and_the_send_is_confirmed_later(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    broker = network.add("rabbit", 61001, server=RABBITMQ)
    running = await connected(nursery, network, broker)
    app = running.app
    back = trio.Event()
    nursery.start_soon(refuse_sends_while, broker, back)
    await app.send(Command.SEND, {"destination": QUEUE, "receipt": "r1"}, b"x")
    await wait_until(lambda: broker.connects >= 4)  # refused and reconnected, several times
    assert app.errors() == []  # the app never saw the ERROR
    assert not app.closed
    assert "r1" not in app.receipt_ids()
    back.set()  # the home node is back: the replayed SEND is confirmed
    await app.wait_receipt("r1")
    assert app.receipt_ids() == ["events-sub", "r1"]
    assert app.errors() == []
    assert {e["event"] for e in app.events()} >= {"RECONNECTING", "FAILOVER"}
    reasons = [e["reason"] for e in app.events("RECONNECTING")]
    assert all("not_found" in r and "down or inaccessible" in r for r in reasons)
    sends = [f for f in broker.frames() if f.command is Command.SEND]
    assert len({f.get("mq-sidecar-id") for f in sends}) == 1  # the same SEND, replayed


async def test_legs_lost_before_their_replay_is_confirmed_reconnect_ever_slower(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """A broker that crashes the connection at every replayed SEND (RabbitMQ's quorum queue
    electing its leader): the reconnects back off by the policy (100 ms, then 200, 400, 800,
    capped at 1 s here), not 10 a second."""
    broker = network.add("rabbit", 61001, server=RABBITMQ)
    running = await connected(nursery, network, broker)
    app = running.app
    stop = trio.Event()

    async def crash_on_send() -> None:
        seen = 0
        while not stop.is_set():
            sends = [f for f in broker.frames() if f.command is Command.SEND]
            if len(sends) > seen and broker.live_links():
                seen = len(sends)
                await broker.live_links()[-1].drop("reset")
            await trio.sleep(0.001)

    broker.receipts = "hold"
    nursery.start_soon(crash_on_send)
    start = trio.current_time()
    await app.send(Command.SEND, {"destination": QUEUE, "receipt": "r1"}, b"x")
    await wait_until(lambda: broker.connects >= 7)
    elapsed = trio.current_time() - start
    stop.set()
    await trio.sleep(0.1)
    broker.receipts = "auto"
    for link in broker.live_links():
        await link.release()
    # 5 paced reconnects after the first plain one: 0.1 + 0.2 + 0.4 + 0.8 + 1.0 s at least.
    assert elapsed >= 2.5, elapsed
    await app.wait_receipt("r1")
    assert app.errors() == []


async def test_reconnect_period_bounds_a_queue_that_stays_unavailable(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    broker = network.add("rabbit", 61001, server=RABBITMQ)
    running = await connected(nursery, network, broker, reconnect_period=5_000)
    app = running.app
    never = trio.Event()
    nursery.start_soon(refuse_sends_while, broker, never)
    await app.send(Command.SEND, {"destination": QUEUE, "receipt": "r1"}, b"x")
    await app.wait_event("DISCONNECT")
    await app.wait_closed()
    assert trio.current_time() >= 5.0
    (error,) = app.errors()
    assert "r1" in error.body.decode()
    assert "down or inaccessible" in (error.get("message") or "") + error.body.decode()
    never.set()


def no_replica(queue: str) -> Frame:
    """RabbitMQ 3.10's ERROR to a SUBSCRIBE to a stream whose writer is moving (measured; the
    body quotes the queue twice, as it does)."""
    return Frame(
        Command.ERROR,
        (("message", "precondition_failed"),),
        b"PRECONDITION_FAILED - queue 'queue '%s' in vhost '/'' does not have a replica on "
        b"the local node" % queue.encode(),
    )


def cancelled(subscription: str) -> Frame:
    """RabbitMQ's ERROR when it cancels a live subscription (rabbit_stomp_processor)."""
    return Frame(
        Command.ERROR,
        (("message", "Server cancelled subscription"), ("subscription", subscription)),
        b"The server has canceled a subscription.\nNo more messages will be delivered for "
        b'"/queue/home-down".\n',
    )


async def test_a_subscription_the_broker_cancels_is_restored(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """RabbitMQ cancels the subscription of a classic queue whose home node went down and keeps
    the connection open (rabbitmq-server#2410): the app does not get that ERROR as the end of
    its subscription; the sidecar restores it (a reconnect re-subscribes it with the headers it
    was made with) and the app receives again."""
    broker = network.add("rabbit", 61001, server=RABBITMQ)
    running = await connected(nursery, network, broker)
    app = running.app
    await app.send(
        Command.SUBSCRIBE,
        {
            "destination": QUEUE,
            "id": "s1",
            "ack": "client-individual",
            "x-queue-type": "classic",
            "receipt": "sub",
        },
    )
    await app.wait_receipt("sub")
    first = broker.link
    await first.send(cancelled("s1"))
    await broker.wait_for_links(2)
    again = await broker.wait_for(Command.SUBSCRIBE, 2)
    assert again[-1].get("id") == "s1"
    assert again[-1].get("x-queue-type") == "classic"
    assert app.errors() == []
    await broker.link.deliver(QUEUE, b"after", message_id="m-after")
    await wait_until(lambda: len(app.messages(QUEUE)) == 1)
    assert app.messages(QUEUE)[0].body == b"after"
    (event,) = app.events("RECONNECTING")
    assert "Server cancelled subscription" in event["reason"]


def test_an_outage_of_unstable_legs_counts_from_the_first() -> None:
    """``/status``'s reconnecting_for and readiness see one outage across legs that each live
    a few milliseconds (not a new one at every reattach); a leg that lives on ends it."""
    from proxy.session.leg import STABLE_LEG_SECONDS, LegState

    leg = LegState()
    leg.note_loss(10.0, lived=600.0, retryable=True, replay_unconfirmed=False)
    assert (leg.unstable, leg.unstable_since) == (1, 10.0)
    leg.note_loss(10.5, lived=0.01, retryable=False, replay_unconfirmed=True)
    leg.note_loss(11.5, lived=0.02, retryable=True, replay_unconfirmed=False)
    assert (leg.unstable, leg.unstable_since) == (3, 10.0)
    assert leg.outage_since(12.0, leg_lived=0.3) == 10.0  # the current leg is still young
    assert leg.outage_since(20.0, leg_lived=STABLE_LEG_SECONDS + 1) is None
    leg.note_loss(30.0, lived=STABLE_LEG_SECONDS + 1, retryable=True, replay_unconfirmed=False)
    assert (leg.unstable, leg.unstable_since) == (1, 30.0)  # a new episode
    leg.note_loss(40.0, lived=1.0, retryable=False, replay_unconfirmed=False)
    assert (leg.unstable, leg.unstable_since) == (0, None)


def test_a_stream_without_a_local_replica_for_now_is_retried_and_names_its_queue() -> None:
    """RabbitMQ 3.10 during a rolling restart (measured, tests/integration/
    test_streams_cluster.py): a SUBSCRIBE to a stream on a node whose replica is being
    restarted gets ``precondition_failed`` ... "does not have a replica on the local node"."""
    rabbit = BrokerDialect.from_server(RABBITMQ)
    retry = rabbit.retryable_error(no_replica("s32_c"))
    assert retry is not None
    assert retry.subscriptions is SubscriptionState.WAITING_FOR_QUEUE
    assert unavailable_queue(no_replica("s32_c")) == "s32_c"
    assert unavailable_queue(not_found(None)) == "home-down"
    other = Frame(Command.ERROR, (("message", "precondition_failed"),), b"unknown delivery tag 9")
    assert rabbit.retryable_error(other) is None  # the app's (its ACK)
    assert unavailable_queue(other) is None
