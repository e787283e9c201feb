"""Session: what a failover tells the app beyond the replay (issue 16, part 5), on scripted
brokers and the mock clock: the broker-side names of temporary destinations old → new, a browse
cut short, the non-durable topic subscriptions that missed messages and the outage window.

The scripted broker's CONNECTED ``session`` header is ``<broker>-l<link>``; on an ActiveMQ leg
the sidecar takes it as the connection id ActiveMQ names temporary destinations after
(``/remote-temp-queue/<connection id>:<n>``, docs/brokers.md, "Temporary destinations").
"""

from __future__ import annotations

import time

import trio

from protocol import Command, Frame
from tests.proxy.scripted_broker import (
    RABBITMQ,
    Network,
    Running,
    ScriptedBroker,
    make_config,
    start_session,
    wait_until,
)

QUEUE = "/queue/orders"


async def connected_app(
    nursery: trio.Nursery, network: Network, *brokers: ScriptedBroker, **connect: str
) -> Running:
    """A running session whose app is CONNECTED and subscribed to the control channel."""
    running = await start_session(nursery, network, make_config(*brokers))
    answer = await running.app.connect(**connect)
    assert answer.command is Command.CONNECTED, answer
    await running.app.subscribe_events()
    return running


async def fail_over(primary: ScriptedBroker, running: Running) -> dict[str, object]:
    """Lose the primary for good; returns the FAILOVER event of the move to the backup."""
    primary.reachable = False
    await primary.link.drop("reset")
    return await running.app.wait_event("FAILOVER")


# -- temporary destinations ---------------------------------------------------------------------


async def test_activemq_temp_destinations_are_reported_old_to_new(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """ActiveMQ numbers a connection's temporary destinations in the order it first names them
    (a SEND's destination, then its reply-to; a SUBSCRIBE's destination). Before the failover
    ``/temp-queue/a`` (a request's reply-to) is the leg's first, ``/temp-queue/b`` (subscribed)
    its second; the new leg re-subscribes ``b`` first, so it is ``:1`` there, and ``a``, named
    by no frame of the restore, is not made again yet (``new`` null). The event lists both with
    their names, and the one renamed pair; names made during the outage are not listed."""
    primary = network.add("primary", 61001)
    backup = network.add("backup", 61002)
    running = await connected_app(nursery, network, primary, backup)
    app = running.app
    await app.send(Command.SEND, {"destination": QUEUE, "reply-to": "/temp-queue/a"}, b"q")
    await app.send(Command.SUBSCRIBE, {"destination": "/temp-queue/b", "id": "b", "receipt": "sb"})
    await app.wait_receipt("sb")
    failover = await fail_over(primary, running)

    assert failover["temp_destinations"] == [
        {"destination": "/temp-queue/a", "old": "/remote-temp-queue/primary-l1:1", "new": None},
        {
            "destination": "/temp-queue/b",
            "old": "/remote-temp-queue/primary-l1:2",
            "new": "/remote-temp-queue/backup-l1:1",
        },
    ]
    assert failover["renamed_destinations"] == [
        ["/remote-temp-queue/primary-l1:2", "/remote-temp-queue/backup-l1:1"]
    ]
    resubscribed = await backup.wait_for(Command.SUBSCRIBE)
    assert [f.get("destination") for f in resubscribed] == ["/temp-queue/b"]

    # The app names `a` again: the backup's second; a second failover reports it so.
    await app.send(
        Command.SEND, {"destination": QUEUE, "reply-to": "/temp-queue/a", "receipt": "q2"}, b"q"
    )
    await app.wait_receipt("q2")
    primary.reachable = True
    backup.reachable = False
    await backup.link.drop("close")
    second = await app.wait_event("FAILOVER", 2)
    assert second["temp_destinations"] == [
        {
            "destination": "/temp-queue/b",
            "old": "/remote-temp-queue/backup-l1:1",
            "new": "/remote-temp-queue/primary-l2:1",
        },
        {"destination": "/temp-queue/a", "old": "/remote-temp-queue/backup-l1:2", "new": None},
    ]


async def test_activemq_names_are_unknown_when_the_app_set_a_client_id(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """With a ``client-id`` on the app's CONNECT ActiveMQ's ``session`` header is that id, not
    the connection's: the temporary destination is still listed, its names unknown (null),
    and nothing is claimed renamed."""
    primary = network.add("primary", 61001)
    backup = network.add("backup", 61002)
    running = await connected_app(nursery, network, primary, backup, **{"client-id": "me"})
    app = running.app
    await app.send(Command.SUBSCRIBE, {"destination": "/temp-queue/r", "id": "r", "receipt": "sr"})
    await app.wait_receipt("sr")
    failover = await fail_over(primary, running)
    assert failover["temp_destinations"] == [
        {"destination": "/temp-queue/r", "old": None, "new": None}
    ]
    assert failover["renamed_destinations"] == []


def reply(subscription: str, destination: str, body: bytes, **headers: str) -> Frame:
    """A MESSAGE as RabbitMQ delivers a reply to a temporary queue (measured)."""
    return Frame(
        Command.MESSAGE,
        (
            ("subscription", subscription),
            ("destination", destination),
            ("message-id", f"T_{subscription}@@session-x@@1"),
            ("redelivered", "false"),
            *headers.items(),
        ),
        body,
    )


async def answer_probe(broker: ScriptedBroker, new_queue: str, link: int = 1) -> Frame:
    """Play RabbitMQ's part in the sidecar's probe on the broker's ``link``-th link: the probe
    SEND comes back on the probe subscription with its reply-to rewritten. Returns the probe
    SUBSCRIBE."""
    (subscribe,) = await broker.wait_for(Command.SUBSCRIBE, link=link)
    (send,) = await broker.wait_for(Command.SEND, link=link)
    assert send.get("destination") == subscribe.get("destination")
    await broker.link.send(
        Frame(
            Command.MESSAGE,
            (
                ("subscription", subscribe.get("id") or ""),
                ("destination", subscribe.get("destination") or ""),
                ("message-id", "T_probe@@session-y@@1"),
                ("reply-to", f"/reply-queue/{new_queue}"),
                ("mq-sidecar-temp", send.get("mq-sidecar-temp") or ""),
            ),
        )
    )
    return subscribe


async def requester_on_rabbitmq(
    nursery: trio.Nursery, network: Network
) -> tuple[ScriptedBroker, ScriptedBroker, Running]:
    """Two RabbitMQ brokers, an app on the first that sent a request with
    ``reply-to:/temp-queue/r`` (confirmed)."""
    primary = network.add("primary", 61001, server=RABBITMQ)
    backup = network.add("backup", 61002, server=RABBITMQ)
    running = await connected_app(nursery, network, primary, backup)
    await running.app.send(
        Command.SEND, {"destination": QUEUE, "reply-to": "/temp-queue/r", "receipt": "q1"}, b"q"
    )
    await running.app.wait_receipt("q1")
    return primary, backup, running


async def test_rabbitmq_temp_queue_names_from_a_reply_and_from_the_probe(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """RabbitMQ's names are random: the old one is learned from a reply (``destination:
    /queue/amq.gen-...`` on ``subscription:/temp-queue/r``), the new one from the sidecar's
    probe after the reconnect: a private ``/exchange/amq.direct`` subscription and a SEND to it
    whose ``reply-to`` names the temporary queue, made again by it (RabbitMQ rewrites the
    header to the new name). The app sees the reply as the broker sent it, never the probe;
    the probe subscription is cancelled; the app's next request goes after it."""
    primary, backup, running = await requester_on_rabbitmq(nursery, network)
    app = running.app
    await primary.link.send(reply("/temp-queue/r", "/queue/amq.gen-OLD", b"pong"))
    await app.signal.wait_until(lambda: bool(app.messages("/queue/amq.gen-OLD")))
    (got,) = app.messages("/queue/amq.gen-OLD")
    assert (got.get("subscription"), got.body) == ("/temp-queue/r", b"pong")

    primary.reachable = False
    await primary.link.drop("reset")
    probe = await answer_probe(backup, "amq.gen-NEW")
    failover = await app.wait_event("FAILOVER")
    assert failover["temp_destinations"] == [
        {
            "destination": "/temp-queue/r",
            "old": "/reply-queue/amq.gen-OLD",
            "new": "/reply-queue/amq.gen-NEW",
        }
    ]
    assert failover["renamed_destinations"] == [
        ["/reply-queue/amq.gen-OLD", "/reply-queue/amq.gen-NEW"]
    ]
    assert probe.get("destination") == f"/exchange/amq.direct/{probe.get('id')}"
    await app.send(
        Command.SEND, {"destination": QUEUE, "reply-to": "/temp-queue/r", "receipt": "q2"}, b"q"
    )
    await app.wait_receipt("q2")
    assert backup.link.commands()[:5] == [
        Command.CONNECT,
        Command.SUBSCRIBE,
        Command.SEND,
        Command.UNSUBSCRIBE,
        Command.SEND,
    ]
    assert backup.link.received(Command.UNSUBSCRIBE)[0].get("id") == probe.get("id")
    subscriptions = [f.get("subscription") for f in app.of(Command.MESSAGE)]
    assert set(subscriptions) == {"events", "/temp-queue/r"}  # never the probe's
    assert subscriptions.count("/temp-queue/r") == 1
    assert app.errors() == []


async def test_rabbitmq_probe_refused_leaves_names_unknown_and_is_not_repeated(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """A broker that refuses the probe (an ERROR, e.g. no permission on ``amq.direct``, and
    RabbitMQ closes the connection): the ERROR is the sidecar's, not the app's; the new name is
    reported unknown; the session reconnects and does not probe again."""
    primary, backup, running = await requester_on_rabbitmq(nursery, network)
    app = running.app
    primary.reachable = False
    await primary.link.drop("reset")
    await backup.wait_for(Command.SEND)
    await backup.link.send(Frame(Command.ERROR, (("message", "access_refused"),)))
    await backup.link.drop("close")
    failover = await app.wait_event("FAILOVER")
    assert failover["temp_destinations"] == [
        {"destination": "/temp-queue/r", "old": None, "new": None}
    ]
    await app.wait_event("FAILOVER", 2)  # on a second link to the backup
    assert running.session.core.state is not None
    assert running.session.core.state.temps.probing is False
    await app.send(
        Command.SEND, {"destination": QUEUE, "reply-to": "/temp-queue/r", "receipt": "q2"}, b"q"
    )
    await app.wait_receipt("q2")
    assert backup.links[1].commands() == [Command.CONNECT, Command.SEND]  # no probe
    assert app.errors() == []


# -- browsers -----------------------------------------------------------------------------------


async def browse(
    broker: ScriptedBroker, running: Running, messages: int, *, end: bool
) -> list[Frame]:
    """SUBSCRIBE ``browser:true`` (id ``b``) and deliver ``messages`` messages of QUEUE on
    it, then ActiveMQ's ``browser:end`` marker if ``end``; returns what the app got on it."""
    app = running.app
    await app.send(
        Command.SUBSCRIBE,
        {"destination": QUEUE, "id": "b", "browser": "true", "receipt": "sb"},
    )
    await app.wait_receipt("sb")
    for i in range(messages):
        await broker.link.deliver(QUEUE, f"m{i}".encode(), message_id=f"ID:m{i}")
    if end:
        await broker.link.send(
            Frame(
                Command.MESSAGE,
                (
                    ("browser", "end"),
                    ("destination", QUEUE),
                    ("message-id", "0"),
                    ("subscription", "b"),
                ),
            )
        )
    want = messages + int(end)
    await app.signal.wait_until(lambda: len(app.messages(QUEUE)) == want)
    return app.messages(QUEUE)


async def test_an_interrupted_browse_gets_an_error_and_is_not_started_again(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """A browse cut by the failover before ``browser:end`` (Qpid draft: a browser's
    enumeration fails): the FAILOVER event names it, then the app gets an ERROR on that
    subscription (header ``subscription:b``; the session stays open), and the new leg gets
    no SUBSCRIBE for it, which would start the browse again from the head of the queue. The
    app's UNSUBSCRIBE is answered by the sidecar; its SUBSCRIBE with the same id browses anew
    on the backup."""
    primary = network.add("primary", 61001)
    backup = network.add("backup", 61002)
    running = await connected_app(nursery, network, primary, backup)
    app = running.app
    await browse(primary, running, 2, end=False)
    failover = await fail_over(primary, running)
    assert failover["browsers_interrupted"] == [{"subscription": "b", "destination": QUEUE}]
    error = await app.wait_error()
    assert error.get("subscription") == "b"
    assert "browse interrupted by a failover" in (error.get("message") or "")
    assert app.index(lambda f: f.get("event") == "FAILOVER") < app.index(
        lambda f: f.command is Command.ERROR
    )
    await app.send(Command.UNSUBSCRIBE, {"id": "b", "receipt": "ub"})
    await app.wait_receipt("ub")
    await app.send(
        Command.SUBSCRIBE,
        {"destination": QUEUE, "id": "b", "browser": "true", "receipt": "sb2"},
    )
    await app.wait_receipt("sb2")
    assert backup.link.commands() == [Command.CONNECT, Command.SUBSCRIBE]
    assert backup.link.subscriptions["b"].get("browser") == "true"
    assert running.session.statistics().state == "running"


async def test_a_finished_browse_is_neither_started_again_nor_reported(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """A browse that had its ``browser:end`` is over: the failover does not start it again
    and reports nothing about it; a SUBSCRIBE with its id (without UNSUBSCRIBE) replaces it."""
    primary = network.add("primary", 61001)
    backup = network.add("backup", 61002)
    running = await connected_app(nursery, network, primary, backup)
    app = running.app
    await browse(primary, running, 1, end=True)
    failover = await fail_over(primary, running)
    assert failover["browsers_interrupted"] == []
    await trio.sleep(1)
    assert app.errors() == []
    assert backup.link.commands() == [Command.CONNECT]
    await app.send(
        Command.SUBSCRIBE,
        {"destination": QUEUE, "id": "b", "browser": "true", "receipt": "sb2"},
    )
    await app.wait_receipt("sb2")
    assert backup.link.commands() == [Command.CONNECT, Command.SUBSCRIBE]


async def test_a_browse_that_delivered_nothing_is_started_again(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """A browser that had delivered nothing when the leg was lost is made again on the new
    one: the app sees one whole browse, and nothing is reported."""
    primary = network.add("primary", 61001)
    backup = network.add("backup", 61002)
    running = await connected_app(nursery, network, primary, backup)
    await browse(primary, running, 0, end=False)
    failover = await fail_over(primary, running)
    assert failover["browsers_interrupted"] == []
    (again,) = await backup.wait_for(Command.SUBSCRIBE)
    assert (again.get("id"), again.get("browser")) == ("b", "true")


async def test_browsers_on_rabbitmq_are_ordinary_subscriptions(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """RabbitMQ ignores ``browser:true`` (a plain consumer): its subscription is made again
    like any other, nothing is reported."""
    primary = network.add("primary", 61001, server=RABBITMQ)
    backup = network.add("backup", 61002, server=RABBITMQ)
    running = await connected_app(nursery, network, primary, backup)
    await browse(primary, running, 1, end=False)
    failover = await fail_over(primary, running)
    assert failover["browsers_interrupted"] == []
    (again,) = await backup.wait_for(Command.SUBSCRIBE)
    assert again.get("id") == "b"


# -- topics and the outage window ---------------------------------------------------------------


async def test_failover_lists_the_topic_subscriptions_that_missed_messages(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """Non-durable topic subscriptions miss what is published while no broker has them: the
    FAILOVER event lists them (not a queue's, not a durable one's: ActiveMQ's
    ``activemq.subscriptionName``, RabbitMQ's ``durable:true``) with the outage window as Unix
    times, ``outage_end - outage_start`` being the outage; RECONNECTING gives its start."""
    primary = network.add("primary", 61001)
    backup = network.add("backup", 61002)
    running = await connected_app(nursery, network, primary, backup)
    app = running.app
    subscriptions = [
        {"destination": "/topic/prices", "id": "prices"},
        {"destination": "/topic/audit", "id": "audit", "activemq.subscriptionName": "audit"},
        {"destination": "/topic/rmq", "id": "rmq", "durable": "true", "auto-delete": "false"},
        {"destination": "/exchange/amq.topic/news.*", "id": "news"},
        {"destination": QUEUE, "id": "orders"},
    ]
    for headers in subscriptions:
        await app.send(Command.SUBSCRIBE, {**headers, "receipt": headers["id"]})
    await app.wait_receipt("orders")
    primary.reachable = False
    before = time.time()
    await primary.link.drop("reset")
    reconnecting = await app.wait_event("RECONNECTING")
    failover = await app.wait_event("FAILOVER")
    after = time.time()

    assert failover["topics_missed"] == [
        {"subscription": "prices", "destination": "/topic/prices"},
        {"subscription": "news", "destination": "/exchange/amq.topic/news.*"},
    ]
    start, end = failover["outage_start"], failover["outage_end"]
    assert isinstance(start, float)
    assert isinstance(end, float)
    assert before - 1 <= start <= end <= after + 1
    assert abs((end - start) * 1000 - failover["outage_ms"]) <= 1
    assert isinstance(reconnecting["outage_start"], float)
    assert abs(reconnecting["outage_start"] - start) < 1
    assert reconnecting["topics_missed"] == []


async def test_a_failover_without_any_of_it_reports_empty_lists(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """The fields are always there, empty when nothing applies (an app can read them
    unconditionally); ``app_held_ms`` is set only by a failback."""
    primary = network.add("primary", 61001)
    backup = network.add("backup", 61002)
    running = await connected_app(nursery, network, primary, backup)
    failover = await fail_over(primary, running)
    for key in ("temp_destinations", "renamed_destinations", "browsers_interrupted"):
        assert failover[key] == []
    assert failover["topics_missed"] == []
    assert failover["app_held_ms"] is None
    await wait_until(lambda: running.session.statistics().broker == backup.label)
