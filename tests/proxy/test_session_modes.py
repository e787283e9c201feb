"""Session: what a failover does to transactions (``transaction_failover`` replay/rollback) and
to unacknowledged messages (``failover_mode`` transparent/strict), on scripted brokers and the
mock clock."""

from __future__ import annotations

import trio

from protocol import Command, Frame
from tests.proxy.scripted_broker import (
    AppClient,
    Network,
    Running,
    ScriptedBroker,
    make_config,
    start_session,
    wait_until,
)

QUEUE = "/queue/orders"
INBOX = "/queue/in"


async def connected(
    nursery: trio.Nursery, network: Network, *brokers: ScriptedBroker, **config: object
) -> Running:
    """A running session whose app is CONNECTED and subscribed to the control channel."""
    running = await start_session(nursery, network, make_config(*brokers, **config))
    assert (await running.app.connect()).command is Command.CONNECTED
    await running.app.subscribe_events()
    return running


# -- transactions -------------------------------------------------------------------------------


async def open_dirty_transaction(app: AppClient, primary: ScriptedBroker) -> list[Frame]:
    """BEGIN tx1 and SEND t1 in it (both confirmed), then SEND t2 in it, which the primary
    holds unconfirmed; returns the three frames as the primary got them."""
    await app.send(Command.BEGIN, {"transaction": "tx1", "receipt": "b1"})
    await app.send(
        Command.SEND, {"destination": QUEUE, "transaction": "tx1", "receipt": "s1"}, b"t1"
    )
    await app.wait_receipt("s1")
    primary.receipts = "hold"
    await app.send(
        Command.SEND, {"destination": QUEUE, "transaction": "tx1", "receipt": "s2"}, b"t2"
    )
    await primary.wait_for(Command.SEND, 2)
    return [f for f in primary.link.frames if f.command in (Command.BEGIN, Command.SEND)]


async def test_replay_mode_reruns_an_open_transaction_on_the_new_broker(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """``transaction_failover = "replay"``: a failover in the middle of tx1 re-runs it on the
    backup (BEGIN and the confirmed SEND re-created, the unconfirmed SEND replayed, in order,
    same ``mq-sidecar-id``s), and the app's COMMIT afterwards succeeds there, once."""
    primary = network.add("primary", 61001)
    backup = network.add("backup", 61002)
    running = await connected(nursery, network, primary, backup, transaction_failover="replay")
    app = running.app
    begin, t1, t2 = await open_dirty_transaction(app, primary)

    primary.reachable = False
    await primary.link.drop("close")
    failover = await app.wait_event("FAILOVER")
    assert failover["transactions_replayed"] == ["tx1"]
    assert failover["transactions_rolled_back"] == []
    await app.wait_receipt("s2")
    await app.send(Command.COMMIT, {"transaction": "tx1", "receipt": "c1"})
    await app.wait_receipt("c1")
    await trio.sleep(5)

    frames = backup.link.frames
    assert [f.command for f in frames] == [
        Command.CONNECT,
        Command.BEGIN,
        Command.SEND,
        Command.SEND,
        Command.COMMIT,
    ]
    assert all(f.get("transaction") == "tx1" for f in frames[1:])
    assert frames[1] == begin.without("receipt")
    assert frames[2] == t1.without("receipt")  # re-created: its effect was confirmed
    assert frames[3] == t2  # replayed from the window, receipt and all
    assert [f.body for f in frames[2:4]] == [b"t1", b"t2"]
    assert Command.COMMIT not in primary.links[0].commands()
    assert app.receipt_ids() == ["events-sub", "b1", "s1", "s2", "c1"]
    assert app.errors() == []
    assert running.session.statistics().transactions == 0


async def test_rollback_mode_rolls_an_open_transaction_back_and_its_commit_fails(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """``transaction_failover = "rollback"`` (JMS): a failover in the middle of tx1 rolls it
    back: nothing of it goes to the backup, later frames of it are not sent either, and the
    app's COMMIT gets an ERROR "rolled back" (the session goes on; a new transaction works)."""
    primary = network.add("primary", 61001)
    backup = network.add("backup", 61002)
    running = await connected(nursery, network, primary, backup, transaction_failover="rollback")
    app = running.app
    await open_dirty_transaction(app, primary)

    primary.reachable = False
    await primary.link.drop("close")
    failover = await app.wait_event("FAILOVER")
    assert failover["transactions_rolled_back"] == ["tx1"]
    assert failover["transactions_replayed"] == []
    await app.send(
        Command.SEND, {"destination": QUEUE, "transaction": "tx1", "receipt": "s3"}, b"t3"
    )
    await app.send(Command.COMMIT, {"transaction": "tx1", "receipt": "c1"})
    error = await app.wait_error()
    assert error.get("receipt-id") == "c1"
    message = error.get("message") or ""
    assert message.startswith("transaction 'tx1' rolled back")
    assert backup.link.commands() == [Command.CONNECT]
    assert "c1" not in app.receipt_ids()

    await app.send(Command.BEGIN, {"transaction": "tx2"})
    await app.send(Command.SEND, {"destination": QUEUE, "transaction": "tx2"}, b"u1")
    await app.send(Command.COMMIT, {"transaction": "tx2", "receipt": "c2"})
    await app.wait_receipt("c2")
    assert backup.link.commands() == [
        Command.CONNECT,
        Command.BEGIN,
        Command.SEND,
        Command.COMMIT,
    ]
    assert [f.get("transaction") for f in backup.link.frames[1:]] == ["tx2"] * 3
    assert len(app.errors()) == 1
    assert running.session.statistics().state == "running"


# -- acknowledgements ---------------------------------------------------------------------------


async def deliver_then_cut(app: AppClient, broker: ScriptedBroker) -> tuple[str, str]:
    """SUBSCRIBE (client-individual), one MESSAGE delivered and not acked, the link reset
    (the broker stays up: reattach), the MESSAGE redelivered on the new link. Returns the
    app's ack id of the first delivery and the broker's ack id of the redelivery."""
    await app.send(
        Command.SUBSCRIBE,
        {"destination": INBOX, "id": "sub1", "ack": "client-individual", "receipt": "sub"},
    )
    await app.wait_receipt("sub")
    await broker.link.deliver(INBOX, b"hello", message_id="ID:m1")
    await app.signal.wait_until(lambda: len(app.messages(INBOX)) == 1)
    first = app.messages(INBOX)[0]
    assert first.get("subscription") == "sub1"
    assert first.get("message-id") == "ID:m1"
    app_ack = first.get("ack")
    assert app_ack is not None

    await broker.link.drop("reset")
    (resubscribe,) = await broker.wait_for(Command.SUBSCRIBE, link=2)
    assert resubscribe.get("id") == "sub1"
    assert resubscribe.get("ack") == "client-individual"
    redelivery_ack = await broker.links[1].deliver(
        INBOX, b"hello", message_id="ID:m1", headers=[("redelivered", "true")]
    )
    return app_ack, redelivery_ack


async def test_transparent_mode_hides_the_redelivery_and_maps_the_ack_to_it(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """``failover_mode = "transparent"``: the redelivery after the cut is hidden from the app,
    and the app's ACK of the first delivery's ack id goes to the new link as the ACK of the
    redelivery; nothing is acked on the old link."""
    broker = network.add("broker", 61001)
    running = await connected(nursery, network, broker, failover_mode="transparent")
    app, session = running.app, running.session
    app_ack, redelivery_ack = await deliver_then_cut(app, broker)

    await wait_until(lambda: session.statistics().redeliveries_hidden == 1)
    await trio.sleep(5)
    assert len(app.messages(INBOX)) == 1
    assert session.statistics().unacked == 1
    await app.send(Command.ACK, {"id": app_ack, "receipt": "a1"})
    await app.wait_receipt("a1")

    (ack,) = broker.links[1].received(Command.ACK)
    assert ack.get("id") == redelivery_ack
    assert broker.links[0].received(Command.ACK) == []
    assert app.errors() == []
    stats = session.statistics()
    assert stats.unacked == 0
    assert stats.redeliveries_hidden == 1


async def test_transparent_mode_settles_a_redelivery_the_app_acked_before_it_came(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """``transparent``: the app ACKs the first delivery after the cut but before the broker
    redelivers it: the app gets its RECEIPT at once, and when the redelivery comes the
    sidecar hides it and acknowledges it on the new link itself."""
    broker = network.add("broker", 61001)
    running = await connected(nursery, network, broker, failover_mode="transparent")
    app, session = running.app, running.session
    await app.send(
        Command.SUBSCRIBE,
        {"destination": INBOX, "id": "sub1", "ack": "client-individual", "receipt": "sub"},
    )
    await app.wait_receipt("sub")
    await broker.link.deliver(INBOX, b"hello", message_id="ID:m1")
    await app.signal.wait_until(lambda: len(app.messages(INBOX)) == 1)
    app_ack = app.messages(INBOX)[0].get("ack") or ""
    await broker.link.drop("reset")
    await broker.wait_for(Command.SUBSCRIBE, link=2)

    await app.send(Command.ACK, {"id": app_ack, "receipt": "a1"})
    await app.wait_receipt("a1")
    assert broker.links[1].received(Command.ACK) == []
    redelivery_ack = await broker.links[1].deliver(INBOX, b"hello", message_id="ID:m1")
    (ack,) = await broker.wait_for(Command.ACK, link=2)
    assert ack.get("id") == redelivery_ack
    await trio.sleep(5)
    assert len(app.messages(INBOX)) == 1
    assert app.errors() == []
    assert session.statistics().unacked == 0


async def test_strict_mode_shows_the_redelivery_and_fails_the_stale_ack(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """``failover_mode = "strict"`` (JMS): the redelivery reaches the app as a new delivery
    (``redelivered:true``, a new ack id); an ACK of the first delivery's ack id is refused with
    an ERROR naming it stale (nothing goes upstream, the session goes on); the ACK of the new
    ack id reaches the new link as the ACK of the redelivery."""
    broker = network.add("broker", 61001)
    running = await connected(nursery, network, broker, failover_mode="strict")
    app, session = running.app, running.session
    app_ack, redelivery_ack = await deliver_then_cut(app, broker)

    await app.signal.wait_until(lambda: len(app.messages(INBOX)) == 2)
    second = app.messages(INBOX)[1]
    assert second.get("redelivered") == "true"
    assert second.get("message-id") == "ID:m1"
    new_ack = second.get("ack")
    assert new_ack is not None
    assert new_ack != app_ack
    assert session.statistics().redeliveries_hidden == 0

    await app.send(Command.ACK, {"id": app_ack, "receipt": "a1"})
    error = await app.wait_error()
    assert error.get("receipt-id") == "a1"
    assert f"ack id '{app_ack}' is stale" in (error.get("message") or "")
    assert broker.links[1].received(Command.ACK) == []

    await app.send(Command.ACK, {"id": new_ack, "receipt": "a2"})
    await app.wait_receipt("a2")
    (ack,) = broker.links[1].received(Command.ACK)
    assert ack.get("id") == redelivery_ack
    assert broker.links[0].received(Command.ACK) == []
    assert "a1" not in app.receipt_ids()
    stats = session.statistics()
    assert stats.unacked == 0
    assert stats.state == "running"


async def test_acks_that_all_arrive_during_the_flush_at_max_unacked_do_not_stall_the_relay(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """At ``max_unacked`` the relay flushes the app and waits for its ACKs before it reads the
    broker again. When every ACK arrives while that flush is still writing, the relay must
    read on: it once made its wake-up event after the flush and waited for an ACK that never
    came (the app held nothing more to acknowledge), so the session stalled for good."""
    broker = network.add("broker", 61001)
    running = await connected(nursery, network, broker, max_unacked=2)
    app, session = running.app, running.session
    await app.send(
        Command.SUBSCRIBE,
        {"destination": INBOX, "id": "sub1", "ack": "client-individual", "receipt": "sub"},
    )
    await app.wait_receipt("sub")
    out = session.out
    flush = out.flush
    acked_during_flush = 0

    async def flush_while_the_app_acks() -> None:
        # The interleaving under test, made certain: the app gets what is queued and
        # acknowledges all of it before the flush returns.
        nonlocal acked_during_flush
        await flush()
        stats = session.statistics()
        if stats.unacked >= 2:
            await app.signal.wait_until(lambda: len(app.messages(INBOX)) >= stats.unacked)
            for message in app.messages(INBOX)[acked_during_flush:]:
                await app.send(Command.ACK, {"id": message.get("ack") or ""})
                acked_during_flush += 1
            await wait_until(lambda: session.statistics().unacked == 0)

    out.flush = flush_while_the_app_acks  # type: ignore[method-assign]
    for i in range(3):
        await broker.link.deliver(INBOX, b"m%d" % i, message_id=f"ID:m{i}")
    await app.signal.wait_until(lambda: len(app.messages(INBOX)) == 3)
    assert acked_during_flush == 2
    assert app.errors() == []
