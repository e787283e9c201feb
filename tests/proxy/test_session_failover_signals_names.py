"""The pure bookkeeping behind the failover signals (proxy.tracking.links): how a leg names
temporary destinations, its bound, and which subscriptions miss messages. No session, no I/O."""

from __future__ import annotations

import pytest

from protocol import Command, Frame
from proxy.tracking import AckMode, Subscription
from proxy.tracking.links import TEMP_MAX, TempNames, misses_messages


def send(*headers: tuple[str, str]) -> Frame:
    return Frame(Command.SEND, (("destination", "/queue/q"), *headers))


def subscribe(destination: str) -> Frame:
    return Frame(Command.SUBSCRIBE, (("id", destination), ("destination", destination)))


def test_activemq_numbers_in_the_order_a_leg_first_names_them() -> None:
    """A SEND's destination counts before its reply-to, temporary queues and topics share one
    count, a name is numbered once per leg (first header entries only), and a new leg starts
    again from 1, reporting what the old one had made."""
    names = TempNames()
    names.new_link(1, style="activemq", connection_id="ID:c1")
    names.note(
        Frame(
            Command.SEND,
            (
                ("destination", "/temp-topic/t"),
                ("reply-to", "/temp-queue/a"),
                ("reply-to", "/temp-queue/ignored"),
            ),
        )
    )
    names.note(subscribe("/temp-queue/a"))
    names.note(subscribe("/temp-queue/b"))
    assert names.name_of("/temp-topic/t") == "/remote-temp-topic/ID:c1:1"
    assert names.name_of("/temp-queue/a") == "/remote-temp-queue/ID:c1:2"
    assert names.name_of("/temp-queue/b") == "/remote-temp-queue/ID:c1:3"
    assert names.name_of("/temp-queue/ignored") is None
    made = names.new_link(2, style="activemq", connection_id="ID:c2")
    assert made == (
        ("/temp-topic/t", "/remote-temp-topic/ID:c1:1"),
        ("/temp-queue/a", "/remote-temp-queue/ID:c1:2"),
        ("/temp-queue/b", "/remote-temp-queue/ID:c1:3"),
    )
    assert names.name_of("/temp-queue/a") is None  # not made on the new leg yet
    names.note(subscribe("/temp-queue/b"))
    assert names.name_of("/temp-queue/b") == "/remote-temp-queue/ID:c2:1"


def test_past_the_bound_the_names_made_later_are_unknown() -> None:
    """At most TEMP_MAX destinations are remembered; once one made on this leg is forgotten
    the numbering can no longer be followed, so later ones are reported unknown."""
    names = TempNames()
    names.new_link(1, style="activemq", connection_id="ID:c")
    for i in range(TEMP_MAX):
        names.note(send(("reply-to", f"/temp-queue/r{i}")))
    assert names.name_of(f"/temp-queue/r{TEMP_MAX - 1}") == f"/remote-temp-queue/ID:c:{TEMP_MAX}"
    names.note(send(("reply-to", "/temp-queue/one-more")))
    assert names.name_of("/temp-queue/r0") is None  # forgotten
    assert names.name_of("/temp-queue/one-more") is None
    names.new_link(2, style="activemq", connection_id="ID:d")
    names.note(send(("reply-to", "/temp-queue/fresh")))
    assert names.name_of("/temp-queue/fresh") == "/remote-temp-queue/ID:d:1"


def test_rabbitmq_names_come_from_replies_only() -> None:
    """On RabbitMQ only a reply-to makes a temporary queue, its name is random: learned from a
    reply's destination, never from a MESSAGE of another kind."""
    names = TempNames()
    names.new_link(1, style="rabbitmq", connection_id=None)
    names.note(subscribe("/temp-queue/x"))  # an ERROR on RabbitMQ: makes nothing
    names.note(send(("reply-to", "/temp-queue/r")))
    assert names.name_of("/temp-queue/r") is None
    other = Frame(Command.MESSAGE, (("subscription", "/temp-queue/r"), ("destination", "/q/x")))
    assert names.seen("/temp-queue/r", other) is False
    assert names.name_of("/temp-queue/r") is None
    reply = Frame(
        Command.MESSAGE,
        (("subscription", "/temp-queue/r"), ("destination", "/queue/amq.gen-A1")),
    )
    assert names.seen("/temp-queue/r", reply) is False  # the app's reply: not hidden
    assert names.name_of("/temp-queue/r") == "/reply-queue/amq.gen-A1"
    assert names.name_of("/temp-queue/x") is None
    assert names.probe("p", ["/temp-queue/r"]) != []
    names.probing = False
    assert names.probe("p", ["/temp-queue/r"]) == []


def sub(destination: str, *headers: tuple[str, str], local: bool = False) -> Subscription:
    frame = Frame(Command.SUBSCRIBE, (("id", "s"), ("destination", destination), *headers))
    return Subscription("s", "s", destination, AckMode.AUTO, frame, local=local)


@pytest.mark.parametrize(
    ("subscription", "misses"),
    [
        (sub("/topic/a"), True),
        (sub("/temp-topic/a"), True),
        (sub("/exchange/amq.topic/a.*"), True),
        (sub("/queue/a"), False),
        (sub("/topic/a", ("activemq.subscriptionName", "n")), False),
        (sub("/topic/a", ("durable-subscription-name", "n")), False),
        (sub("/topic/a", ("durable", "true")), False),
        (sub("/topic/a", ("persistent", "true")), False),
        (sub("/topic/a", ("durable", "false")), True),
        (sub("/topic/a", local=True), False),
    ],
)
def test_which_subscriptions_miss_messages(subscription: Subscription, misses: bool) -> None:
    assert misses_messages(subscription) is misses


def test_a_probe_is_done_once_the_queues_it_asked_for_have_names() -> None:
    """RabbitMQ: the probe asks only for temporary queues (a reply-to naming a temporary topic
    makes something else there); it is done when those have their new names."""
    names = TempNames()
    names.new_link(1, style="rabbitmq", connection_id=None)
    names.note(send(("reply-to", "/temp-queue/r")))
    names.note(send(("reply-to", "/temp-topic/t")))
    made = names.new_link(2, style="rabbitmq", connection_id=None)
    frames = names.probe("p", [name for name, _ in made])
    assert [f.get("reply-to") for f in frames] == [None, "/temp-queue/r"]
    for frame in frames:
        names.note(frame)
    assert not names.probed()
    answer = Frame(
        Command.MESSAGE,
        (
            ("subscription", "p"),
            ("reply-to", "/reply-queue/amq.gen-B2"),
            ("mq-sidecar-temp", "/temp-queue/r"),
        ),
    )
    assert names.seen("p", answer) is True  # the sidecar's own: hidden
    assert names.probed()
    assert names.name_of("/temp-queue/r") == "/reply-queue/amq.gen-B2"
