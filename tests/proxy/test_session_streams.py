"""Session: a RabbitMQ stream subscription across a reconnect, on a scripted RabbitMQ broker and
the mock clock (docs/behaviour.md, "Streams").

The app reads a stream through the sidecar, the link is reset, the sidecar reattaches: the new
link's SUBSCRIBE names ``x-stream-offset:offset=<last shown + 1>`` whatever position the app
asked for (its own, when nothing was shown yet); what the new link sends again at or below that
is hidden and acknowledged (credit); an ACK of an old link's message is answered by the sidecar
and never reaches the new link (RabbitMQ closes the connection on an unknown delivery tag).
"""

from __future__ import annotations

import pytest
import trio

from protocol import Command, Frame
from proxy.tracking.health import SubscriptionState
from tests.proxy.scripted_broker import (
    RABBITMQ,
    BrokerLink,
    Network,
    Running,
    ScriptedBroker,
    make_config,
    start_session,
    wait_until,
)

STREAM = "/amq/queue/events"
POSITIONS = ["first", "next", "last", "offset=7", "timestamp=1700000000"]


async def subscribed(
    nursery: trio.Nursery, network: Network, position: str, ack: str = "client-individual"
) -> tuple[ScriptedBroker, Running]:
    """A session on a scripted RabbitMQ whose app has subscribed to the stream at
    ``position`` (id ``s``, prefetch 10; the SUBSCRIBE confirmed)."""
    broker = network.add("rabbit", 61001, server=RABBITMQ)
    running = await start_session(nursery, network, make_config(broker))
    app = running.app
    assert (await app.connect()).command is Command.CONNECTED
    await app.subscribe_events()
    await app.send(
        Command.SUBSCRIBE,
        {
            "destination": STREAM,
            "id": "s",
            "ack": ack,
            "prefetch-count": "10",
            "x-stream-offset": position,
            "receipt": "sub",
        },
    )
    await app.wait_receipt("sub")
    return broker, running


async def deliver(link: BrokerLink, *offsets: int) -> list[str]:
    """Deliver a MESSAGE per offset on ``link``; returns their ack tags."""
    return [
        await link.deliver(
            STREAM,
            f"m{n}".encode(),
            message_id=f"{link.broker.name}-l{link.index}-{n}",
            headers=(("x-stream-offset", str(n)),),
        )
        for n in offsets
    ]


def shown(running: Running) -> list[str | None]:
    return [f.get("x-stream-offset") for f in running.app.messages(STREAM)]


async def reattached(broker: ScriptedBroker, running: Running) -> BrokerLink:
    """Reset the link; return the new one once its restore is done (FAILOVER seen and the
    SUBSCRIBE received)."""
    await broker.link.drop("reset")
    await running.app.wait_event("FAILOVER")
    await broker.wait_for(Command.SUBSCRIBE, 1, link=2)
    return broker.links[1]


def subscribe_on(link: BrokerLink) -> Frame:
    """The SUBSCRIBE ``link`` got, without the sidecar's receipt (the first link's carries
    one, a restore's none)."""
    (frame,) = link.received(Command.SUBSCRIBE)
    return frame.without("receipt")


@pytest.mark.parametrize("position", POSITIONS)
async def test_the_new_link_resumes_after_the_last_offset_shown(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    network: Network,
    position: str,
) -> None:
    broker, running = await subscribed(nursery, network, position)
    first = subscribe_on(broker.link)
    assert first.get("x-stream-offset") == position
    await deliver(broker.link, 7, 8, 9)
    await running.app.signal.wait_until(lambda: len(shown(running)) == 3)

    link = await reattached(broker, running)
    again = subscribe_on(link)
    assert again.get("x-stream-offset") == "offset=10"
    assert again.without("x-stream-offset") == first.without("x-stream-offset")
    await deliver(link, 10, 11)
    await running.app.signal.wait_until(lambda: len(shown(running)) == 5)
    assert shown(running) == ["7", "8", "9", "10", "11"]
    assert running.app.errors() == []


@pytest.mark.parametrize("position", POSITIONS)
async def test_nothing_shown_yet_resumes_at_the_apps_own_position(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    network: Network,
    position: str,
) -> None:
    broker, running = await subscribed(nursery, network, position)
    first = subscribe_on(broker.link)
    link = await reattached(broker, running)
    assert subscribe_on(link) == first


async def test_a_redelivery_below_the_resume_offset_is_hidden_and_acknowledged(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """A new link that starts before the offset asked for (RabbitMQ reads a stream by chunks)
    shows the app nothing twice: the messages it had are hidden and acknowledged on the new
    link (credit, or the prefetch window would fill); the next one is shown."""
    broker, running = await subscribed(nursery, network, "first")
    await deliver(broker.link, 0, 1, 2)
    await running.app.signal.wait_until(lambda: len(shown(running)) == 3)
    link = await reattached(broker, running)
    assert subscribe_on(link).get("x-stream-offset") == "offset=3"

    tags = await deliver(link, 1, 2, 3)
    await running.app.signal.wait_until(lambda: len(shown(running)) == 4)
    await broker.signal.wait_until(lambda: len(link.received(Command.ACK)) == 2)
    assert shown(running) == ["0", "1", "2", "3"]
    assert [f.get("id") for f in link.received(Command.ACK)] == tags[:2]
    assert running.session.statistics().redeliveries_hidden == 2


async def test_an_ack_of_an_old_links_message_is_answered_and_not_sent(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """The app acknowledges, after the reconnect, messages the old link delivered: it gets its
    RECEIPT, and the new link gets no ACK of a tag it never gave; an ACK of a new link's
    message goes upstream as usual."""
    broker, running = await subscribed(nursery, network, "first")
    app = running.app
    await deliver(broker.link, 0, 1)
    await app.signal.wait_until(lambda: len(shown(running)) == 2)
    old = [f.get("ack") or "" for f in app.messages(STREAM)]
    link = await reattached(broker, running)

    for n, ack in enumerate(old):
        await app.send(Command.ACK, {"id": ack, "receipt": f"old{n}"})
    await app.wait_receipt("old1")
    (tag,) = await deliver(link, 2)
    await app.signal.wait_until(lambda: len(shown(running)) == 3)
    await app.send(Command.ACK, {"id": app.messages(STREAM)[2].get("ack") or "", "receipt": "new"})
    await app.wait_receipt("new")

    assert [f.get("id") for f in link.received(Command.ACK)] == [tag]
    assert app.errors() == []
    assert running.session.statistics().unacked == 0


async def test_a_non_numeric_offset_is_passed_on_and_the_subscription_is_a_queue(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    network: Network,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Bad input: a MESSAGE whose x-stream-offset is not a number reaches the app as it is,
    the subscription is resumed as a queue (the app's SUBSCRIBE unchanged), logged once, and
    the session goes on."""
    broker, running = await subscribed(nursery, network, "first")
    for n in range(3):
        await broker.link.deliver(
            STREAM, b"x", message_id=f"x{n}", headers=(("x-stream-offset", "soon"),)
        )
    await running.app.signal.wait_until(lambda: len(shown(running)) == 3)
    assert shown(running) == ["soon"] * 3
    link = await reattached(broker, running)
    assert subscribe_on(link).get("x-stream-offset") == "first"
    notes = [r for r in caplog.records if "is not a number" in r.getMessage()]
    assert len(notes) == 1
    assert running.app.errors() == []


async def test_a_gap_at_the_resume_is_named_in_an_event_before_the_message(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """The new link starts past the offset it was asked for (retention removed it): the app
    gets a STREAM_GAP event with the range and the count, then the MESSAGE."""
    broker, running = await subscribed(nursery, network, "first")
    await deliver(broker.link, 0, 1, 2)
    await running.app.signal.wait_until(lambda: len(shown(running)) == 3)
    link = await reattached(broker, running)
    assert subscribe_on(link).get("x-stream-offset") == "offset=3"
    await deliver(link, 391, 392)
    await running.app.signal.wait_until(lambda: len(shown(running)) == 5)
    event = await running.app.wait_event("STREAM_GAP")
    assert event["offsets_missed"] == [
        {"subscription": "s", "destination": STREAM, "first": 3, "last": 390, "count": 388}
    ]
    assert event["offsets_missed_count"] == 388
    kinds = [f.get("event") or f.get("x-stream-offset") for f in running.app.of(Command.MESSAGE)]
    kinds = [k for k in kinds if k is not None]
    assert kinds[kinds.index("STREAM_GAP") + 1] == "391"  # the event comes first
    assert shown(running) == ["0", "1", "2", "391", "392"]
    assert running.app.errors() == []


STREAM_DOWN = (
    b"NOT_FOUND - home node 'rabbit@localhost' of durable queue 'events' in vhost '/' is down "
    b"or inaccessible"
)


async def test_a_stream_whose_node_restarts_waits_then_resumes_at_its_offset(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """RabbitMQ 3.10 after a kill -9 and restart: every SUBSCRIBE to the stream gets
    ``not_found`` ("home node ... is down or inaccessible") and the connection closes
    (measured, docs/brokers.md, "Streams"). The sidecar keeps the subscription, shows it
    waiting for its queue (docs/behaviour.md, "Subscription health"), reconnects with
    back-off, and once the stream answers again resumes after the last offset shown, live
    again at the RECEIPT of that SUBSCRIBE; the app sees no ERROR."""
    broker, running = await subscribed(nursery, network, "first")
    await deliver(broker.link, 0, 1, 2)
    await running.app.signal.wait_until(lambda: len(shown(running)) == 3)
    state = running.session.core.state
    assert state is not None
    back = trio.Event()
    stopped = trio.Event()
    refused: set[int] = set()  # the links answered not_found

    async def refuse_subscribes() -> None:
        answered = 1  # the first link's SUBSCRIBE
        while not back.is_set():
            subscribes = [f for f in broker.frames() if f.command is Command.SUBSCRIBE]
            if len(subscribes) > answered and broker.live_links():
                answered = len(subscribes)
                link = broker.live_links()[-1]
                refused.add(link.index)
                await link.send(Frame.build(Command.ERROR, {"message": "not_found"}, STREAM_DOWN))
                await link.drop("close")
            await trio.sleep(0.01)
        stopped.set()

    nursery.start_soon(refuse_subscribes)
    await broker.link.drop("reset")
    await wait_until(lambda: broker.connects >= 5)
    health = state.subscriptions["s"].health
    # Between two legs (the back-off) it waits; a leg's SUBSCRIBE makes it restoring a moment.
    await wait_until(lambda: health.state is SubscriptionState.WAITING_FOR_QUEUE)
    assert (health.message, health.refused) == ("not_found", True)
    assert running.app.errors() == []
    back.set()
    await stopped.wait()

    def resumed() -> bool:
        live = [link for link in broker.live_links() if link.index not in refused]
        return bool(live) and bool(live[-1].received(Command.SUBSCRIBE))

    await wait_until(resumed)
    link = [link for link in broker.live_links() if link.index not in refused][-1]
    assert subscribe_on(link).get("x-stream-offset") == "offset=3"
    (again,) = link.received(Command.SUBSCRIBE)
    assert again.get("receipt") is not None  # the sidecar's: its RECEIPT confirms it
    await wait_until(lambda: health.state is SubscriptionState.LIVE)  # before any MESSAGE
    assert (health.message, health.refused, health.down_since) == (None, False, None)
    await deliver(link, 3, 4)
    await running.app.signal.wait_until(lambda: len(shown(running)) == 5)
    assert shown(running) == ["0", "1", "2", "3", "4"]
    assert running.app.errors() == []
