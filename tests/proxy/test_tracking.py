"""SessionState: pure bookkeeping of subscriptions, deliveries, ack ids, transactions and the
identities that recognise redeliveries and duplicates across failover (docs/behaviour.md,
"Duplicate detection")."""

from __future__ import annotations

import pytest

from protocol import Command, Frame
from proxy import tracking
from proxy.tracking import (
    ACK_MODES,
    Delivered,
    ForBroker,
    FrameRejected,
    SessionError,
    SessionState,
    Settled,
)
from proxy.tracking import deliveries as tracking_deliveries
from proxy.tracking.records import SEEN_SECONDS


def dashed(headers: dict[str, str]) -> dict[str, str]:
    """``message_id`` -> ``message-id``."""
    return {k.replace("_", "-"): v for k, v in headers.items()}


def frame(command: Command, body: bytes = b"", **headers: str) -> Frame:
    """A frame; ``message_id="x"`` becomes the header ``message-id:x``."""
    return Frame.build(command, dashed(headers), body)


def new_state(
    version: str = "1.2",
    *,
    subs: int = 10,
    transparent: bool = True,
    stable_message_ids: bool = False,
    id_cache_size: int = 20_000,
) -> SessionState:
    """A session on its first link (generation 1), as the session sets it up."""
    st = SessionState(
        "S",
        version,
        max_subscriptions=subs,
        max_unacked=100,
        transparent=transparent,
        id_cache_size=id_cache_size,
    )
    st.new_link(stable_message_ids=stable_message_ids)
    return st


def subscribe(
    st: SessionState,
    sub_id: str = "s",
    ack: str = "client-individual",
    destination: str = "/queue/a",
    **headers: str,
) -> Frame:
    return st.subscribe(
        Frame.build(
            Command.SUBSCRIBE,
            {"destination": destination, "id": sub_id, "ack": ack, **dashed(headers)},
        )
    )


def message(
    mid: str = "m1",
    *,
    ack: str | None = None,
    dup: str | None = None,
    sub: str | None = "s",
    destination: str = "/queue/a",
) -> Frame:
    """An upstream MESSAGE; ``dup`` is its mq-sidecar-id, ``ack`` the broker's ack id."""
    headers = {"destination": destination, "message-id": mid}
    if sub is not None:
        headers["subscription"] = sub
    if ack is not None:
        headers["ack"] = ack
    if dup is not None:
        headers[tracking.DUPLICATE_ID_HEADER] = dup
    return Frame.build(Command.MESSAGE, headers, b"payload")


def shown(decision: Delivered) -> Frame:
    """The MESSAGE the app gets (fails if it was hidden). For an ``auto`` subscription the
    sidecar's own ACK comes with it (``to_broker``); other modes send nothing."""
    assert decision.hidden is None
    assert decision.to_app is not None
    if decision.to_broker is not None:
        assert decision.to_broker.command is Command.ACK
    return decision.to_app


def ack_id(decision: Delivered) -> str:
    value = shown(decision).get("ack")
    assert value is not None
    return value


def settle(st: SessionState, command: Command = Command.ACK, **headers: str) -> Settled:
    return st.settle(Frame.build(command, dashed(headers)), upstream_version="1.2", now=0.0)


def to_broker(settled: Settled) -> Frame:
    assert settled.to_broker is not None
    assert not settled.local
    return settled.to_broker


# -- links, identities, internal receipts -----------------------------------------------------


def test_new_link_bumps_the_generation() -> None:
    st = SessionState("S", "1.2", max_subscriptions=1, max_unacked=1)
    assert st.generation == 0
    st.new_link(stable_message_ids=True)
    assert (st.generation, st.stable_message_ids) == (1, True)
    st.new_link(stable_message_ids=False)
    assert (st.generation, st.stable_message_ids) == (2, False)


@pytest.mark.parametrize(
    ("headers", "stable", "identity"),
    [
        ({"mq-sidecar-id": "S-7", "message-id": "ID:1"}, False, "d:S-7"),
        ({"mq-sidecar-id": "S-7", "message-id": "ID:1"}, True, "d:S-7"),
        ({"message-id": "ID:1"}, True, "m:ID:1"),
        ({"message-id": "ID:1"}, False, None),
        ({}, True, None),
        ({}, False, None),
    ],
)
def test_identity(headers: dict[str, str], stable: bool, identity: str | None) -> None:
    st = new_state(stable_message_ids=stable)
    assert st.identity(Frame.build(Command.MESSAGE, headers)) == identity


def test_internal_receipts_are_the_sidecars_own_and_taken_once() -> None:
    st = new_state()
    first, second = st.new_internal_receipt(), st.new_internal_receipt()
    assert (first, second) == ("S-i1", "S-i2")
    assert st.take_internal_receipt(second)
    assert not st.take_internal_receipt(second)
    assert st.take_internal_receipt(first)
    assert not st.take_internal_receipt("S-r1")
    assert not st.take_internal_receipt("")


# -- subscriptions ----------------------------------------------------------------------------


def test_subscribe_keeps_the_app_id_and_headers_without_receipt() -> None:
    st = new_state()
    up = st.subscribe(
        frame(
            Command.SUBSCRIBE,
            destination="/topic/t",
            id="d1",
            ack="client",
            selector="a = 1",
            activemq_subscriptionName="durable",
            receipt="r",
        )
    )
    # `client` is client-individual upstream: the sidecar sends one ACK per settled message.
    assert up == frame(
        Command.SUBSCRIBE,
        destination="/topic/t",
        id="d1",
        ack="client-individual",
        selector="a = 1",
        activemq_subscriptionName="durable",
    )
    sub = st.subscriptions["d1"]
    assert (sub.app_id, sub.upstream_id, sub.destination, sub.ack) == (
        "d1",
        "d1",
        "/topic/t",
        "client",
    )
    assert sub.frame == up
    assert list(st.iter_subscribe_frames()) == [up]
    with pytest.raises(ForBroker, match="SUBSCRIBE with id 'd1' already in use"):
        st.subscribe(frame(Command.SUBSCRIBE, destination="/q", id="d1"))


def test_iter_subscribe_frames_in_order_without_local_subscriptions() -> None:
    st = new_state()
    a = subscribe(st, "a")
    st.subscribe(frame(Command.SUBSCRIBE, destination="/mq-sidecar/events", id="ev"), local=True)
    b = subscribe(st, "b")
    assert list(st.iter_subscribe_frames()) == [a, b]
    assert [s.app_id for s in st.local_subscriptions()] == ["ev"]


def test_stomp10_subscription_without_id_gets_a_generated_one() -> None:
    st = new_state("1.0")
    st.subscribe(frame(Command.SUBSCRIBE, destination="/queue/x", id="S-s2"))  # the app's own
    first = st.subscribe(frame(Command.SUBSCRIBE, destination="/queue/a"))
    second = st.subscribe(frame(Command.SUBSCRIBE, destination="/queue/b"))
    assert (first.get("id"), second.get("id")) == ("S-s1", "S-s3")  # S-s2 is taken
    assert st.subscriptions["S-s1"].app_id is None


def test_unsubscribe_by_id_or_by_destination_in_stomp10() -> None:
    st = new_state("1.0")
    st.subscribe(frame(Command.SUBSCRIBE, destination="/queue/a"))
    st.subscribe(frame(Command.SUBSCRIBE, destination="/queue/b", id="b"))
    # the app never named S-s1: it cannot unsubscribe by it
    assert st.unsubscribe(frame(Command.UNSUBSCRIBE, id="S-s1")) is None
    gone = st.unsubscribe(frame(Command.UNSUBSCRIBE, destination="/queue/a"))
    assert gone is not None
    assert gone.upstream_id == "S-s1"
    gone = st.unsubscribe(frame(Command.UNSUBSCRIBE, id="b"))
    assert gone is not None
    assert gone.upstream_id == "b"
    assert st.subscriptions == {}
    # no live subscription: the session passes such an UNSUBSCRIBE on (durable removal)
    assert st.unsubscribe(frame(Command.UNSUBSCRIBE, id="b")) is None
    assert st.unsubscribe(frame(Command.UNSUBSCRIBE, destination="/queue/zz")) is None


def test_unsubscribe_forgets_the_subscriptions_deliveries() -> None:
    st = new_state()
    subscribe(st, ack="client")
    key = ack_id(st.deliver(message(ack="a1", dup="X"), now=0.0))
    assert st.unacked == 1
    st.unsubscribe(frame(Command.UNSUBSCRIBE, id="s"))
    assert st.unacked == 0
    with pytest.raises(ForBroker, match=f"unknown ack id '{key}'"):
        settle(st, id=key)


def test_subscription_limit_counts_local_subscriptions_too() -> None:
    st = new_state(subs=2)
    subscribe(st, "1")
    st.subscribe(frame(Command.SUBSCRIBE, destination="/mq-sidecar/events", id="ev"), local=True)
    with pytest.raises(SessionError, match="too many subscriptions: this session already has 2"):
        subscribe(st, "2")
    st.unsubscribe(frame(Command.UNSUBSCRIBE, id="1"))
    subscribe(st, "2")


@pytest.mark.parametrize("mode", ACK_MODES)
def test_ack_modes(mode: str) -> None:
    st = new_state()
    subscribe(st, ack=mode)
    assert st.subscriptions["s"].ack == mode


@pytest.mark.parametrize("given", [None, ""])
def test_ack_mode_defaults_to_auto(given: str | None) -> None:
    st = new_state()
    headers = {"destination": "/q", "id": "s"}
    if given is not None:
        headers["ack"] = given
    st.subscribe(Frame.build(Command.SUBSCRIBE, headers))
    assert st.subscriptions["s"].ack == "auto"


def test_unknown_ack_mode_is_refused() -> None:
    with pytest.raises(ForBroker, match="ack mode 'sometimes'"):
        subscribe(new_state(), ack="sometimes")


# -- deliveries and ack ids -------------------------------------------------------------------


def test_stomp12_app_gets_sidecar_ack_ids_mapped_to_the_broker_ones() -> None:
    st = new_state()
    subscribe(st)
    first = shown(st.deliver(message("ID:1", ack="broker-ack-1"), now=0.0))
    second = shown(st.deliver(message("ID:2", ack="broker-ack-2"), now=0.0))
    assert first == frame(
        Command.MESSAGE,
        b"payload",
        destination="/queue/a",
        message_id="ID:1",
        subscription="s",
        ack="1",
    )
    assert second.get("ack") == "2"
    assert st.unacked == 2
    up = to_broker(
        st.settle(frame(Command.ACK, id="2", receipt="r9"), upstream_version="1.2", now=0.0)
    )
    assert up == frame(Command.ACK, id="broker-ack-2", receipt="r9")
    assert st.unacked == 1
    with pytest.raises(ForBroker, match="unknown ack id '2'"):
        settle(st, id="2")


@pytest.mark.parametrize(
    ("upstream_version", "expected"),
    [
        ("1.2", (("id", "broker-ack"), ("transaction", "t"))),
        ("1.1", (("message-id", "ID:1"), ("subscription", "s"), ("transaction", "t"))),
        ("1.0", (("message-id", "ID:1"), ("transaction", "t"))),
    ],
)
def test_the_upstream_ack_speaks_the_brokers_version(
    upstream_version: str, expected: tuple[tuple[str, str], ...]
) -> None:
    st = new_state()
    subscribe(st)
    st.begin_transaction(frame(Command.BEGIN, transaction="t"))
    key = ack_id(st.deliver(message("ID:1", ack="broker-ack"), now=0.0))
    settled = st.settle(
        frame(Command.ACK, id=key, transaction="t"), upstream_version=upstream_version, now=0.0
    )
    assert to_broker(settled) == Frame(Command.ACK, expected)


def test_a_stomp10_broker_without_ack_header_is_acked_by_message_id() -> None:
    st = new_state()
    subscribe(st)
    key = ack_id(st.deliver(message("ID:1"), now=0.0))
    assert to_broker(settle(st, id=key)) == frame(Command.ACK, id="ID:1")


def test_nack_goes_upstream_as_nack() -> None:
    st = new_state()
    subscribe(st)
    key = ack_id(st.deliver(message("ID:1", ack="b1"), now=0.0))
    assert to_broker(settle(st, Command.NACK, id=key)) == frame(Command.NACK, id="b1")


def test_stomp11_app_acks_by_subscription_and_message_id() -> None:
    st = new_state("1.1")
    subscribe(st)
    out = shown(st.deliver(message("ID:1", ack="broker-ack"), now=0.0))
    assert not out.has("ack")
    assert out.get("subscription") == "s"
    with pytest.raises(ForBroker, match="message-id 'ID:1' on subscription 'other'"):
        settle(st, message_id="ID:1", subscription="other")
    up = to_broker(settle(st, message_id="ID:1", subscription="s"))
    assert up == frame(Command.ACK, id="broker-ack")


@pytest.mark.parametrize("app_id", [None, "mine"])
def test_stomp10_app_acks_by_message_id(app_id: str | None) -> None:
    st = new_state("1.0")
    headers = {"destination": "/queue/a", "ack": "client"}
    if app_id is not None:
        headers["id"] = app_id
    upstream_id = st.subscribe(Frame.build(Command.SUBSCRIBE, headers)).get("id")
    assert upstream_id is not None
    out = shown(st.deliver(message("ID:1", ack="broker-ack", sub=upstream_id), now=0.0))
    assert not out.has("ack")
    assert out.get("subscription") == app_id  # absent when the app never named it
    with pytest.raises(ForBroker, match="unknown message-id 'ID:2'"):
        settle(st, message_id="ID:2")
    st.settle(frame(Command.ACK, message_id="ID:1"), upstream_version="1.0", now=0.0)
    assert st.unacked == 0


def test_a_stomp10_broker_message_without_subscription_matches_by_destination() -> None:
    st = new_state()
    subscribe(st, "a", destination="/queue/a")
    st.subscribe(frame(Command.SUBSCRIBE, destination="/queue/b", id="b", ack="client"))
    out = shown(st.deliver(message("ID:1", sub=None, destination="/queue/b"), now=0.0))
    assert out.get("subscription") == "b"
    assert out.get("ack") == "1"


def test_messages_for_unknown_subscriptions_pass_through_unchanged() -> None:
    st = new_state()
    subscribe(st)
    reply = message("m1", ack="x", sub="/temp-queue/replies", destination="/temp-queue/replies")
    decision = st.deliver(reply, now=0.0)
    assert decision == Delivered(reply)
    assert decision.to_app is reply
    assert st.unacked == 0


def test_auto_mode_is_acknowledged_by_the_sidecar() -> None:
    """ack:auto upstream would lose the messages in flight at a failure (the broker counts
    them acknowledged when it sends them): the sidecar subscribes client-individual and ACKs
    each message itself once the app has it; the app needs no ack id."""
    st = new_state()
    up = st.subscribe(frame(Command.SUBSCRIBE, destination="/queue/a", id="s", ack="auto"))
    assert up.get("ack") == "client-individual"
    decision = st.deliver(message("m1", ack="whatever", dup="X"), now=0.0)
    out = shown(decision)
    assert not out.has("ack")
    assert decision.to_broker == frame(Command.ACK, id="whatever")
    assert st.unacked == 0


def test_client_mode_ack_is_cumulative() -> None:
    """For the app a `client` ACK is cumulative; upstream it is one ACK per message settled
    (the subscription is client-individual there), the app's own last."""
    st = new_state()
    subscribe(st, ack="client")
    keys = [ack_id(st.deliver(message(f"m{i}", ack=f"a{i}"), now=0.0)) for i in range(3)]
    settled = settle(st, id=keys[1])
    assert settled.more == (frame(Command.ACK, id="a0"),)
    assert to_broker(settled) == frame(Command.ACK, id="a1")
    assert st.unacked == 1
    with pytest.raises(ForBroker, match=f"unknown ack id '{keys[0]}'"):
        settle(st, id=keys[0])
    settled = settle(st, id=keys[2])
    assert settled.more == ()
    assert to_broker(settled) == frame(Command.ACK, id="a2")
    assert st.unacked == 0


def test_client_mode_after_a_failover_never_acks_across_the_brokers_order() -> None:
    """Found by the chaos soak on RabbitMQ: after a reattach the new link delivers a new
    message (tag 1) before the redelivery of one the app holds (tag 2), which is hidden and
    remapped. The app's cumulative ACK of the held message must not become a cumulative ACK
    of tag 2 upstream (it would cover tag 1 too, and the app's later ACK of it would be an
    "unknown delivery tag"): each settled message gets its own ACK."""
    st = new_state()
    subscribe(st, ack="client")
    held = ack_id(st.deliver(message("m-old", ack="old-1", dup="H"), now=0.0))
    st.new_link(stable_message_ids=False)
    fresh = ack_id(st.deliver(message("m-new", ack="1", dup="N"), now=1.0))
    assert st.deliver(message("m-old", ack="2", dup="H"), now=1.0).hidden == "redelivery"
    first = settle(st, id=held)
    assert (first.more, to_broker(first)) == ((), frame(Command.ACK, id="2"))
    second = settle(st, id=fresh)
    assert (second.more, to_broker(second)) == ((), frame(Command.ACK, id="1"))
    assert st.unacked == 0


def test_client_individual_mode_settles_one_delivery() -> None:
    st = new_state()
    subscribe(st)
    keys = [ack_id(st.deliver(message(f"m{i}", ack=f"a{i}"), now=0.0)) for i in range(3)]
    settle(st, id=keys[1])
    assert st.unacked == 2
    settle(st, id=keys[0])
    settle(st, id=keys[2])
    assert st.unacked == 0


def test_cumulative_ack_is_per_subscription() -> None:
    st = new_state()
    subscribe(st, "a", ack="client")
    subscribe(st, "b", ack="client")
    on_a = ack_id(st.deliver(message("m1", ack="x1", sub="a"), now=0.0))
    on_b = ack_id(st.deliver(message("m2", ack="x2", sub="b"), now=0.0))
    settle(st, id=on_b)
    assert st.unacked == 1
    settle(st, id=on_a)
    assert st.unacked == 0


# -- failover: transparent mode ---------------------------------------------------------------


@pytest.mark.parametrize("mode", ["client", "client-individual"])
def test_transparent_redelivery_of_a_held_message_is_hidden_and_remapped(mode: str) -> None:
    st = new_state()
    subscribe(st, ack=mode)
    key = ack_id(st.deliver(message("ID:old", ack="old-ack", dup="X"), now=0.0))
    st.new_link(stable_message_ids=False)
    decision = st.deliver(message("ID:new", ack="new-ack", dup="X"), now=1.0)
    assert decision == Delivered(None, hidden="redelivery")
    assert st.redeliveries_hidden == 1
    assert st.duplicates_hidden == 0
    assert st.unacked == 1
    # The app's ack id, given before the failover, now settles the new delivery.
    assert to_broker(settle(st, id=key)) == frame(Command.ACK, id="new-ack")
    assert st.unacked == 0


@pytest.mark.parametrize(
    ("upstream_version", "expected"),
    [
        ("1.1", (("message-id", "ID:new"), ("subscription", "s"))),
        ("1.0", (("message-id", "ID:new"),)),
    ],
)
def test_a_remapped_delivery_is_acked_by_its_new_message_id(
    upstream_version: str, expected: tuple[tuple[str, str], ...]
) -> None:
    st = new_state("1.1")
    subscribe(st)
    shown(st.deliver(message("ID:old", dup="X"), now=0.0))
    st.new_link(stable_message_ids=False)
    assert st.deliver(message("ID:new", dup="X"), now=1.0).hidden == "redelivery"
    # The 1.1 app still acknowledges by the message-id it was shown.
    settled = st.settle(
        frame(Command.ACK, message_id="ID:old", subscription="s"),
        upstream_version=upstream_version,
        now=2.0,
    )
    assert to_broker(settled) == Frame(Command.ACK, expected)


def test_a_stable_broker_message_id_is_an_identity_too() -> None:
    st = new_state(stable_message_ids=True)
    subscribe(st)
    key = ack_id(st.deliver(message("ID:1", ack="old-ack"), now=0.0))
    st.new_link(stable_message_ids=True)
    assert st.deliver(message("ID:1", ack="new-ack"), now=1.0).hidden == "redelivery"
    assert to_broker(settle(st, id=key)) == frame(Command.ACK, id="new-ack")


def test_without_an_identity_a_redelivery_cannot_be_recognised() -> None:
    st = new_state(stable_message_ids=False)  # RabbitMQ: message ids change on redelivery
    subscribe(st)
    first = ack_id(st.deliver(message("q1", ack="old-ack"), now=0.0))
    st.new_link(stable_message_ids=False)
    second = ack_id(st.deliver(message("q1", ack="new-ack"), now=1.0))
    assert first != second
    assert st.unacked == 2
    assert st.redeliveries_hidden == 0


@pytest.mark.parametrize("mode", ["client", "client-individual"])
@pytest.mark.parametrize(
    ("upstream_version", "expected"),
    [
        ("1.2", (("id", "new-ack"),)),
        ("1.1", (("message-id", "ID:new"), ("subscription", "s"))),
        ("1.0", (("message-id", "ID:new"),)),
    ],
)
def test_transparent_redelivery_of_an_acked_message_is_hidden_and_acked_upstream(
    mode: str, upstream_version: str, expected: tuple[tuple[str, str], ...]
) -> None:
    st = new_state()
    subscribe(st, ack=mode)
    key = ack_id(st.deliver(message("ID:old", ack="old-ack", dup="X"), now=0.0))
    settle(st, id=key)  # the ACK was sent, but the old broker may never have processed it
    st.new_link(stable_message_ids=False)
    decision = st.deliver(
        message("ID:new", ack="new-ack", dup="X"), upstream_version=upstream_version, now=1.0
    )
    assert decision == Delivered(None, to_broker=Frame(Command.ACK, expected), hidden="redelivery")
    assert st.redeliveries_hidden == 1
    assert st.unacked == 0


def test_transparent_redelivery_in_auto_mode_is_hidden_and_acked() -> None:
    st = new_state()
    subscribe(st, ack="auto")
    shown(st.deliver(message("ID:old", dup="X"), now=0.0))
    st.new_link(stable_message_ids=False)
    assert st.deliver(message("ID:new", dup="X"), now=1.0) == Delivered(
        None, to_broker=frame(Command.ACK, id="ID:new"), hidden="redelivery"
    )
    assert st.redeliveries_hidden == 1


def test_transparent_settle_of_an_older_link_sends_nothing_then_acks_the_redelivery() -> None:
    st = new_state()
    subscribe(st)
    key = ack_id(st.deliver(message("ID:old", ack="old-ack", dup="X"), now=0.0))
    st.new_link(stable_message_ids=False)
    # The app acks before the broker redelivers: the old ack id is no use on the new link.
    assert settle(st, id=key, receipt="r1") == Settled(to_broker=None)
    assert st.unacked == 0
    decision = st.deliver(message("ID:new", ack="new-ack", dup="X"), now=1.0)
    assert decision.to_app is None
    assert decision.to_broker == frame(Command.ACK, id="new-ack")
    assert decision.hidden is not None


def test_a_redelivery_acked_before_it_arrived_counts_as_a_redelivery() -> None:
    st = new_state()
    subscribe(st)
    key = ack_id(st.deliver(message("ID:old", ack="old-ack", dup="X"), now=0.0))
    st.new_link(stable_message_ids=False)
    settle(st, id=key)
    decision = st.deliver(message("ID:new", ack="new-ack", dup="X"), now=1.0)
    assert decision.hidden == "redelivery"
    assert (st.redeliveries_hidden, st.duplicates_hidden) == (1, 0)


def test_transparent_stale_nack_lets_the_redelivery_through() -> None:
    st = new_state()
    subscribe(st)
    key = ack_id(st.deliver(message("ID:old", ack="old-ack", dup="X"), now=0.0))
    st.new_link(stable_message_ids=False)
    assert settle(st, Command.NACK, id=key) == Settled(to_broker=None)
    again = shown(st.deliver(message("ID:new", ack="new-ack", dup="X"), now=1.0))
    assert again.get("ack") != key
    assert st.redeliveries_hidden == 0


def test_client_mode_settle_of_an_older_link_settles_the_earlier_deliveries_too() -> None:
    st = new_state()
    subscribe(st, ack="client")
    keys = [
        ack_id(st.deliver(message(f"m{i}", ack=f"a{i}", dup=f"X{i}"), now=0.0)) for i in range(3)
    ]
    st.new_link(stable_message_ids=False)
    assert settle(st, id=keys[1]) == Settled(to_broker=None)
    assert st.unacked == 1
    # m0 and m1 count as acked: their redeliveries are hidden and acked upstream
    for i in (0, 1):
        decision = st.deliver(message(f"m{i}", ack=f"b{i}", dup=f"X{i}"), now=1.0)
        assert decision.to_app is None
        assert decision.to_broker == frame(Command.ACK, id=f"b{i}")
    # m2 is still held: hidden and remapped
    assert st.deliver(message("m2", ack="b2", dup="X2"), now=1.0).hidden == "redelivery"
    assert to_broker(settle(st, id=keys[2])) == frame(Command.ACK, id="b2")


# -- duplicates and NACKs ---------------------------------------------------------------------


def test_a_duplicate_of_a_held_message_on_the_same_link_is_hidden_and_acked() -> None:
    st = new_state()
    subscribe(st)
    key = ack_id(st.deliver(message("ID:1", ack="a1", dup="X"), now=0.0))
    decision = st.deliver(message("ID:2", ack="a2", dup="X"), now=1.0)  # a producer's replay
    assert decision == Delivered(None, to_broker=frame(Command.ACK, id="a2"), hidden="duplicate")
    assert (st.duplicates_hidden, st.redeliveries_hidden) == (1, 0)
    assert to_broker(settle(st, id=key)) == frame(Command.ACK, id="a1")  # the original is intact


def test_a_duplicate_of_an_acked_message_on_the_same_link_is_hidden_and_acked() -> None:
    st = new_state()
    subscribe(st)
    settle(st, id=ack_id(st.deliver(message("ID:1", ack="a1", dup="X"), now=0.0)))
    decision = st.deliver(message("ID:2", ack="a2", dup="X"), now=1.0)
    assert decision == Delivered(None, to_broker=frame(Command.ACK, id="a2"), hidden="duplicate")
    assert st.duplicates_hidden == 1


def test_client_mode_never_acks_upstream_over_a_message_the_app_holds() -> None:
    st = new_state()
    subscribe(st, ack="client")
    settle(st, id=ack_id(st.deliver(message("ID:0", ack="a0", dup="X0"), now=0.0)))
    held = ack_id(st.deliver(message("ID:1", ack="a1", dup="X1"), now=0.0))
    decision = st.deliver(message("ID:0b", ack="a2", dup="X0"), now=0.0)  # a producer replay
    assert decision.to_app is None
    # Upstream the subscription is client-individual: this ACK settles a2 alone, not a1.
    assert decision.to_broker == frame(Command.ACK, id="a2")
    assert st.unacked == 1
    assert to_broker(settle(st, id=held)) == frame(Command.ACK, id="a1")


def test_a_duplicate_in_auto_mode_is_hidden_and_acked() -> None:
    st = new_state()
    subscribe(st, ack="auto")
    shown(st.deliver(message("ID:1", dup="X"), now=0.0))
    for mid in ("ID:2", "ID:3"):
        assert st.deliver(message(mid, dup="X"), now=0.0) == Delivered(
            None, to_broker=frame(Command.ACK, id=mid), hidden="duplicate"
        )
    assert st.duplicates_hidden == 2


def test_duplicates_are_per_subscription() -> None:
    st = new_state()
    subscribe(st, "a", destination="/topic/t")
    subscribe(st, "b", destination="/topic/t")
    shown(st.deliver(message("ID:1", dup="X", sub="a", destination="/topic/t"), now=0.0))
    shown(st.deliver(message("ID:1", dup="X", sub="b", destination="/topic/t"), now=0.0))
    assert st.duplicates_hidden == 0


@pytest.mark.parametrize("new_link", [False, True])
def test_a_nacked_message_comes_back(new_link: bool) -> None:
    st = new_state()
    subscribe(st)
    key = ack_id(st.deliver(message("ID:1", ack="a1", dup="X"), now=0.0))
    assert to_broker(settle(st, Command.NACK, id=key)) == frame(Command.NACK, id="a1")
    if new_link:
        st.new_link(stable_message_ids=False)
    again = st.deliver(message("ID:1", ack="a2", dup="X"), now=1.0)
    new_key = ack_id(again)
    assert new_key != key
    assert (st.duplicates_hidden, st.redeliveries_hidden) == (0, 0)
    assert to_broker(settle(st, id=new_key)) == frame(Command.ACK, id="a2")
    # ... and once acked, a further copy is hidden again
    assert st.deliver(message("ID:1", ack="a3", dup="X"), now=2.0).hidden == "duplicate"


# -- failover: strict mode --------------------------------------------------------------------


def test_strict_redelivery_is_shown_with_redelivered_and_a_new_ack_id() -> None:
    st = new_state(transparent=False)
    subscribe(st)
    old_key = ack_id(st.deliver(message("ID:old", ack="old-ack", dup="X"), now=0.0))
    st.new_link(stable_message_ids=False)
    again = shown(st.deliver(message("ID:new", ack="new-ack", dup="X"), now=1.0))
    assert again.get("redelivered") == "true"
    new_key = again.get("ack")
    assert new_key is not None
    assert new_key != old_key
    assert st.redeliveries_hidden == 0
    assert st.unacked == 1
    assert to_broker(settle(st, id=new_key)) == frame(Command.ACK, id="new-ack")


def test_strict_stale_ack_before_the_redelivery_is_rejected() -> None:
    st = new_state(transparent=False)
    subscribe(st)
    old_key = ack_id(st.deliver(message("ID:old", ack="old-ack", dup="X"), now=0.0))
    st.new_link(stable_message_ids=False)
    with pytest.raises(FrameRejected, match=f"ack id '{old_key}' is stale"):
        settle(st, id=old_key)
    assert st.unacked == 0
    again = shown(st.deliver(message("ID:new", ack="new-ack", dup="X"), now=1.0))
    assert again.get("redelivered") == "true"


def test_strict_stale_ack_after_the_redelivery_is_rejected_not_fatal() -> None:
    st = new_state(transparent=False)
    subscribe(st)
    old_key = ack_id(st.deliver(message("ID:old", ack="old-ack", dup="X"), now=0.0))
    st.new_link(stable_message_ids=False)
    shown(st.deliver(message("ID:new", ack="new-ack", dup="X"), now=1.0))
    with pytest.raises(FrameRejected):
        settle(st, id=old_key)


def test_strict_redelivery_of_an_acked_message_is_shown_again() -> None:
    st = new_state(transparent=False)
    subscribe(st)
    settle(st, id=ack_id(st.deliver(message("ID:old", ack="old-ack", dup="X"), now=0.0)))
    st.new_link(stable_message_ids=False)
    again = shown(st.deliver(message("ID:new", ack="new-ack", dup="X"), now=1.0))
    assert again.get("redelivered") == "true"


def test_strict_duplicate_on_the_same_link_is_still_hidden() -> None:
    st = new_state(transparent=False)
    subscribe(st)
    shown(st.deliver(message("ID:1", ack="a1", dup="X"), now=0.0))
    assert st.deliver(message("ID:2", ack="a2", dup="X"), now=0.0).hidden == "duplicate"
    assert st.duplicates_hidden == 1


# -- the seen-identity window is bounded ------------------------------------------------------


def test_seen_identities_are_bounded_in_number() -> None:
    """``id_cache_size`` ids per subscription, the newest."""
    st = new_state(id_cache_size=2)
    subscribe(st, ack="auto")
    for dup in ("A", "B", "C"):
        shown(st.deliver(message(f"ID:{dup}", dup=dup), now=0.0))
    assert list(st.subscriptions["s"].seen) == ["d:B", "d:C"]
    st.new_link(stable_message_ids=False)
    shown(st.deliver(message("ID:A2", dup="A"), now=1.0))  # forgotten: shown again
    assert st.deliver(message("ID:C2", dup="C"), now=1.0).hidden == "redelivery"


def test_seen_identities_are_bounded_in_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracking_deliveries, "SEEN_SECONDS", 10.0)
    st = new_state()
    subscribe(st, ack="auto")
    shown(st.deliver(message("ID:A", dup="A"), now=0.0))
    shown(st.deliver(message("ID:B", dup="B"), now=5.0))
    assert list(st.subscriptions["s"].seen) == ["d:A", "d:B"]  # nothing is older than 10 s yet
    shown(st.deliver(message("ID:C", dup="C"), now=10.5))  # A is 10.5 s old: forgotten
    assert list(st.subscriptions["s"].seen) == ["d:B", "d:C"]
    st.new_link(stable_message_ids=False)
    shown(st.deliver(message("ID:A2", dup="A"), now=11.0))
    assert st.deliver(message("ID:B2", dup="B"), now=11.0).hidden == "redelivery"


def test_a_new_status_refreshes_a_seen_identity() -> None:
    st = new_state(id_cache_size=2)
    subscribe(st)
    key = ack_id(st.deliver(message("ID:A", ack="a", dup="A"), now=0.0))
    shown(st.deliver(message("ID:B", ack="b", dup="B"), now=0.0))
    assert list(st.subscriptions["s"].seen) == ["d:A", "d:B"]
    settle(st, id=key)  # A is acked: now the most recent
    assert list(st.subscriptions["s"].seen) == ["d:B", "d:A"]
    shown(st.deliver(message("ID:C", ack="c", dup="C"), now=0.0))
    assert list(st.subscriptions["s"].seen) == ["d:A", "d:C"]


# -- transactions -----------------------------------------------------------------------------


def test_transactions_open_and_close() -> None:
    st = new_state()
    st.begin_transaction(frame(Command.BEGIN, transaction="t"))
    with pytest.raises(ForBroker, match="BEGIN of transaction 't'"):
        st.begin_transaction(frame(Command.BEGIN, transaction="t"))
    tx = st.transactions["t"]
    assert (tx.id, tx.begin, tx.entries, tx.end, tx.rolled_back) == ("t", None, [], None, None)
    assert not tx.dirty
    assert st.transaction_of(frame(Command.SEND, destination="/q")) is None
    assert st.transaction_of(frame(Command.SEND, destination="/q", transaction="t")) is tx
    with pytest.raises(ForBroker, match="in transaction 'other', not open"):
        st.transaction_of(frame(Command.ACK, id="1", transaction="other"))
    assert st.close_transaction(frame(Command.COMMIT, transaction="t"), now=0.0) is tx
    assert st.transactions == {}
    with pytest.raises(ForBroker, match="of transaction 't', not open"):
        st.close_transaction(frame(Command.ABORT, transaction="t"), now=0.0)


def test_acks_in_a_transaction_record_the_deliveries_they_settle() -> None:
    st = new_state()
    subscribe(st, ack="client")
    st.begin_transaction(frame(Command.BEGIN, transaction="t"))
    shown(st.deliver(message("ID:1", ack="a1", dup="X"), now=0.0))
    shown(st.deliver(message("ID:2", ack="a2"), now=0.0))  # no identity
    key = ack_id(st.deliver(message("ID:3", ack="a3", dup="Z"), now=0.0))
    settle(st, id=key, transaction="t")
    acked = st.transactions["t"].acked
    assert [d.message_id for d in acked] == ["ID:1", "ID:2", "ID:3"]  # cumulative: all three
    assert [d.identity for d in acked] == ["d:X", None, "d:Z"]


@pytest.mark.parametrize("roll_back", [False, True])
def test_roll_back_forgets_what_the_transactions_acks_settled(roll_back: bool) -> None:
    st = new_state()
    subscribe(st)
    st.begin_transaction(frame(Command.BEGIN, transaction="t"))
    key = ack_id(st.deliver(message("ID:1", ack="a1", dup="X"), now=0.0))
    up = to_broker(settle(st, id=key, transaction="t"))
    assert up == frame(Command.ACK, id="a1", transaction="t")
    st.new_link(stable_message_ids=False)
    tx = st.transactions["t"]
    if roll_back:
        st.roll_back(tx, "a failover")
        assert tx.rolled_back
        assert tx.acked == []
        # the transaction's ACK never happened: the message is shown again
        again = st.deliver(message("ID:1b", ack="b1", dup="X"), now=1.0)
        assert to_broker(settle(st, id=ack_id(again))) == frame(Command.ACK, id="b1")
    else:
        assert st.deliver(message("ID:1b", ack="b1", dup="X"), now=1.0).hidden == "redelivery"


def test_an_aborted_ack_does_not_make_the_sidecar_ack_the_redelivery() -> None:
    st = new_state()
    subscribe(st)
    st.begin_transaction(frame(Command.BEGIN, transaction="t"))
    key = ack_id(st.deliver(message("ID:1", ack="a1", dup="X"), now=0.0))
    settle(st, id=key, transaction="t")
    st.close_transaction(frame(Command.ABORT, transaction="t"), now=0.0)
    st.new_link(stable_message_ids=False)
    decision = st.deliver(message("ID:1", ack="b1", dup="X"), now=1.0)
    assert decision.to_broker is None  # nobody acked it: the sidecar must not either
    if decision.to_app is None:  # the app holds it again: its ack id settles the redelivery
        assert to_broker(settle(st, id=key)) == frame(Command.ACK, id="b1")


def test_an_aborted_ack_is_stamped_with_the_callers_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every identity is stamped with the clock the session passes in (trio's), never a clock
    of tracking's own. Regression: the ABORT path stamped ``time.monotonic()`` into records
    otherwise stamped with ``trio.current_time()``; two clocks that cannot be compared, so the
    age bound (SEEN_SECONDS) judged that identity by the wrong clock and it, and every identity
    remembered after it, outlived the bound. ``time.monotonic`` is made huge here so that a
    stamp from it can never pass for an old one."""
    import time

    monkeypatch.setattr(time, "monotonic", lambda: 1e9)
    st = new_state()
    subscribe(st)
    st.begin_transaction(frame(Command.BEGIN, transaction="t"))
    key = ack_id(st.deliver(message("ID:1", ack="a1", dup="X"), now=0.0))
    settle(st, id=key, transaction="t")
    st.close_transaction(frame(Command.ABORT, transaction="t"), now=1.0)  # the app holds X again
    sub = st.subscriptions["s"]
    assert sub.seen["d:X"][2] == 1.0
    # Past the age bound by the caller's clock, the next delivery's sweep forgets X.
    st.deliver(message("ID:2", ack="a2", dup="Y"), now=SEEN_SECONDS + 5.0)
    assert "d:X" not in sub.seen
    assert "d:Y" in sub.seen


# -- the control channel ----------------------------------------------------------------------


def _event(n: int) -> Frame:
    return frame(Command.MESSAGE, b"{}", destination="/mq-sidecar/events", message_id=f"S-e{n}")


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
def test_local_deliveries_settle_locally(version: str) -> None:
    st = new_state(version)
    st.subscribe(
        frame(
            Command.SUBSCRIBE, destination="/mq-sidecar/events", id="ev", ack="client-individual"
        ),
        local=True,
    )
    (sub,) = st.local_subscriptions()
    out = st.local_delivery(sub, _event(1))
    assert out.get("subscription") == "ev"
    assert st.unacked == 1
    st.new_link(stable_message_ids=False)  # never stale: nothing went upstream
    if version == "1.2":
        assert out.get("ack") == "1"
        headers = {"id": "1"}
    elif version == "1.1":
        assert not out.has("ack")
        headers = {"subscription": "ev", "message-id": "S-e1"}
    else:
        headers = {"message-id": "S-e1"}
    settled = st.settle(Frame.build(Command.ACK, headers), upstream_version="1.2", now=0.0)
    assert settled == Settled(to_broker=None, local=True)
    assert st.unacked == 0


def test_local_delivery_in_auto_mode_needs_no_ack() -> None:
    st = new_state()
    st.subscribe(frame(Command.SUBSCRIBE, destination="/mq-sidecar/events", id="ev"), local=True)
    (sub,) = st.local_subscriptions()
    out = st.local_delivery(sub, _event(1))
    assert out == _event(1).with_header("subscription", "ev")
    assert st.unacked == 0


def test_local_and_broker_ack_ids_share_one_sequence() -> None:
    st = new_state()
    subscribe(st)
    st.subscribe(
        frame(Command.SUBSCRIBE, destination="/mq-sidecar/events", id="ev", ack="client"),
        local=True,
    )
    (sub,) = st.local_subscriptions()
    assert ack_id(st.deliver(message("ID:1", ack="a1"), now=0.0)) == "1"
    assert st.local_delivery(sub, _event(1)).get("ack") == "2"
    assert ack_id(st.deliver(message("ID:2", ack="a2"), now=0.0)) == "3"
    assert settle(st, id="2") == Settled(to_broker=None, local=True)
    assert to_broker(settle(st, id="3")) == frame(Command.ACK, id="a2")


# -- auto subscriptions: cumulative client ACKs where they stay in the subscription ----------


def test_auto_subscription_is_client_upstream_where_client_acks_are_per_subscription() -> None:
    st = new_state()
    st.new_link(stable_message_ids=True, client_ack_per_subscription=True)
    assert subscribe(st, "a", ack="auto").get("ack") == "client"
    assert subscribe(st, "c", ack="client").get("ack") == "client-individual"
    assert subscribe(st, "i", ack="client-individual").get("ack") == "client-individual"


def test_auto_subscription_acks_coalesce_per_subscription_shown_or_hidden() -> None:
    st = new_state()
    st.new_link(stable_message_ids=True, client_ack_per_subscription=True)
    subscribe(st, "a", ack="auto")
    subscribe(st, "i", ack="client-individual")
    first = st.deliver(message("m1", ack="k1", sub="a"), now=0.0)
    assert first.coalesce == "a"
    assert first.to_broker == Frame.build(Command.ACK, {"id": "k1"})
    again = st.deliver(message("m1", ack="k2", sub="a"), now=0.0)  # the same link: a duplicate
    assert again.hidden == "duplicate"
    assert again.coalesce == "a"  # replaces the first ACK: k2 settles both
    assert st.deliver(message("m3", ack="k3", sub="i"), now=0.0).coalesce is None


def test_auto_subscription_acks_stay_individual_where_client_acks_span_the_connection() -> None:
    """RabbitMQ: a client ACK is channel-wide, it would settle other subscriptions' messages."""
    st = new_state()
    assert subscribe(st, "a", ack="auto").get("ack") == "client-individual"
    assert st.deliver(message("m1", ack="k1", sub="a"), now=0.0).coalesce is None


def test_a_restore_subscribes_auto_subscriptions_in_the_new_links_mode() -> None:
    st = new_state()
    st.new_link(stable_message_ids=True, client_ack_per_subscription=True)
    up = subscribe(st, "a", ack="auto", selector="x = 1")
    st.new_link(stable_message_ids=False, client_ack_per_subscription=False)
    again = st.upstream_subscribe(up)
    assert again == up.with_header("ack", "client-individual")
    assert list(st.iter_subscribe_frames()) == [again]
    plain = subscribe(st, "i", ack="client-individual", destination="/queue/b")
    assert st.upstream_subscribe(plain) is plain


# -- transparency: what the session does not judge, and the ids it keeps to itself -----------


@pytest.mark.parametrize(
    ("version", "headers", "why"),
    [
        ("1.2", {"id": "s"}, "without destination"),
        ("1.2", {"destination": "/q"}, "without id"),
        ("1.1", {"destination": "/q"}, "without id"),
    ],
)
def test_a_subscribe_the_session_cannot_track_goes_to_the_broker(
    version: str, headers: dict[str, str], why: str
) -> None:
    """The broker judges a SUBSCRIBE without destination, or without id from a 1.1/1.2 app
    (its own ERROR reaches the app); the session state is unchanged."""
    st = new_state(version)
    with pytest.raises(ForBroker, match=why):
        st.subscribe(Frame.build(Command.SUBSCRIBE, headers))
    assert st.subscriptions == {}


def test_a_stomp11_ack_naming_another_subscription_settles_where_the_broker_does() -> None:
    """RabbitMQ settles a 1.1 ACK by ``message-id`` whatever its ``subscription`` says
    (measured): on such a leg the session finds the delivery the same way."""
    st = new_state("1.1")
    st.new_link(stable_message_ids=False, acks_ignore_subscription=True)
    subscribe(st)
    shown(st.deliver(message("ID:1", ack="a1"), now=0.0))
    settled = settle(st, message_id="ID:1", subscription="other")
    assert to_broker(settled) == frame(Command.ACK, id="a1")
    assert st.unacked == 0


def test_the_sidecars_duplicate_detection_id_is_not_shown_to_the_app() -> None:
    """``mq-sidecar-id`` (and an ``_AMQ_DUPL_ID`` equal to it) is used, then removed; an
    ``_AMQ_DUPL_ID`` the app set to another value stays, in its place."""
    st = new_state()
    subscribe(st)
    upstream = Frame.build(
        Command.MESSAGE,
        {
            "_AMQ_DUPL_ID": "X",
            "destination": "/queue/a",
            "message-id": "m1",
            "subscription": "s",
            "ack": "a1",
            "mq-sidecar-id": "X",
        },
    )
    out = shown(st.deliver(upstream, now=0.0))
    assert [k for k, _ in out.headers] == ["destination", "message-id", "subscription", "ack"]
    assert st.deliver(upstream.with_header("ack", "a2"), now=0.0).hidden == "duplicate"
    own = Frame.build(
        Command.MESSAGE,
        {"destination": "/queue/a", "message-id": "m2", "subscription": "s", "_AMQ_DUPL_ID": "app"},
    )
    kept = shown(st.deliver(own.with_header("mq-sidecar-id", "Y"), now=0.0))
    assert kept.get("_AMQ_DUPL_ID") == "app"
