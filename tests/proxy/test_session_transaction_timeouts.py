"""Session: what the chaos soak found on a slower machine (issue 36): a transaction that loses a
frame to ``call_timeout`` is never committed, and an ACK built for a lost leg never reaches the
new one.

The chaos soak, on a machine four times slower, confirmed a COMMIT whose broker stored two of
its five SENDs. The interleaving, reproduced here on scripted brokers and the mock clock: the
first SENDs of a transaction are confirmed by the old broker; the broker is lost; the app's
next SENDs arrive while the session reconnects and are dropped by ``call_timeout`` (ERROR "never
sent and is dropped", or "may have taken effect" for one the lost broker had); the COMMIT,
handed over later, is not due yet when a broker comes back, so the restore re-ran the
transaction from what it still held (BEGIN and the confirmed SENDs) and sent the COMMIT: the
broker committed part of the transaction and the app got its RECEIPT.

The contract (docs/behaviour.md, "Transactions"): a transaction that lost a frame is rolled
back: it is not re-run on any broker, its COMMIT is answered with an ERROR naming the
transaction and why (outcome ``rolled_back``), its ABORT with a RECEIPT.
"""

from __future__ import annotations

import pytest
import trio

from protocol import Command, Frame
from proxy.session.confirmations import StaleSettlement
from tests.proxy.scripted_broker import ACTIVEMQ, RABBITMQ, Network, Running, ScriptedBroker
from tests.proxy.test_session_timeouts import connected

QUEUE = "/queue/orders"
TX = "tx1"


async def send(running: Running, n: int) -> None:
    """The app's SEND number ``n`` in the transaction, with receipt ``r<n>``."""
    await running.app.send(
        Command.SEND,
        {"destination": QUEUE, "transaction": TX, "receipt": f"r{n}"},
        f"m{n}".encode(),
    )


async def begin_and_confirm_two(running: Running, broker: ScriptedBroker) -> None:
    """BEGIN and two SENDs the broker confirms."""
    app = running.app
    await app.send(Command.BEGIN, {"transaction": TX, "receipt": "begin"})
    await send(running, 0)
    await send(running, 1)
    for receipt in ("begin", "r0", "r1"):
        await app.wait_receipt(receipt)


def committed_on(broker: ScriptedBroker) -> list[int]:
    """The numbers of the links of ``broker`` that got a COMMIT."""
    return [link.index for link in broker.links if link.received(Command.COMMIT)]


@pytest.mark.parametrize("server", [ACTIVEMQ, RABBITMQ])
@pytest.mark.parametrize("mode", ["replay", "rollback"])
async def test_a_send_dropped_while_reconnecting_rolls_its_transaction_back(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    network: Network,
    server: str,
    mode: str,
) -> None:
    """The soak's interleaving: SENDs 2 and 3 handed over while no broker answers are
    dropped at ``call_timeout``; the COMMIT handed over 0.6 s later is still in the window when
    the broker comes back. The COMMIT gets an ERROR naming the transaction rolled back, the new
    broker gets no COMMIT (nor the transaction), and nothing is committed anywhere."""
    broker = network.add("broker", 61001, server=server)
    running = await connected(
        nursery, network, broker, call_timeout=1000, transaction_failover=mode
    )
    app = running.app
    if server == RABBITMQ:
        # RabbitMQ confirms a transaction's SENDs only at COMMIT: the BEGIN is confirmed by a
        # frame of its own (the app's receipt on it); the SENDs wait.
        await app.send(Command.BEGIN, {"transaction": TX, "receipt": "begin"})
        await app.wait_receipt("begin")
        broker.receipts = "hold"
        await send(running, 0)
        await send(running, 1)
        await broker.wait_for(Command.SEND, 2)
    else:
        await begin_and_confirm_two(running, broker)
    broker.reachable = False
    await broker.link.drop("reset")
    await app.wait_event("RECONNECTING")
    broker.receipts = "auto"

    await send(running, 2)
    await send(running, 3)
    await trio.sleep(0.6)
    await app.send(Command.COMMIT, {"transaction": TX, "receipt": "commit"})
    # Dropped at call_timeout: SENDs 2 and 3, never sent; on RabbitMQ SENDs 0 and 1 too, whose
    # receipts wait for the COMMIT (sent to the lost broker: "may have taken effect").
    dropped = {"r2", "r3"} if server == ACTIVEMQ else {"r0", "r1", "r2", "r3"}
    await app.wait_error(len(dropped))
    assert {e.get("receipt-id") for e in app.errors()} == dropped
    broker.reachable = True
    await app.wait_event("FAILOVER")
    commit_error = await app.wait_error(len(dropped) + 1)
    await trio.sleep(5)

    assert commit_error.get("receipt-id") == "commit"
    message = commit_error.get("message") or ""
    assert f"transaction '{TX}' rolled back" in message
    assert "call_timeout" in message
    assert "commit" not in app.receipt_ids()
    assert committed_on(broker) == []
    new_link = broker.links[-1]
    assert new_link.received(Command.BEGIN) == []
    assert new_link.received(Command.SEND) == []
    outcome = [
        e for e in app.events("OUTCOME") if any(f["receipt"] == "commit" for f in e["frames"])
    ]
    assert outcome
    assert outcome[-1]["frames"][0]["outcome"] == "rolled_back"
    assert running.session.statistics().state == "running"

    # The session goes on: a new transaction commits on the new broker.
    await app.send(Command.BEGIN, {"transaction": "tx2", "receipt": "begin2"})
    await app.send(
        Command.SEND, {"destination": QUEUE, "transaction": "tx2", "receipt": "s2"}, b"next"
    )
    await app.send(Command.COMMIT, {"transaction": "tx2", "receipt": "commit2"})
    await app.wait_receipt("commit2")
    assert [f.body for f in new_link.received(Command.SEND)] == [b"next"]


async def test_the_commit_of_a_transaction_that_lost_a_send_after_the_drop_gets_an_error(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """The app goes on after the ERROR of its dropped SEND (it pipelines): its later SEND in
    the transaction is answered (the COMMIT will fail), its COMMIT gets an ERROR naming the
    transaction; the new broker never hears of the transaction. ABORT of such a transaction
    gets a RECEIPT, as after a failover's rollback."""
    broker = network.add("broker", 61001)
    running = await connected(nursery, network, broker, call_timeout=1000)
    app = running.app
    await begin_and_confirm_two(running, broker)
    broker.reachable = False
    await broker.link.drop("reset")
    await app.wait_event("RECONNECTING")
    await send(running, 2)
    error = await app.wait_error()
    assert error.get("receipt-id") == "r2"
    broker.reachable = True
    await app.wait_event("FAILOVER")

    await send(running, 3)
    await app.send(Command.COMMIT, {"transaction": TX, "receipt": "commit"})
    commit_error = await app.wait_error(2)
    assert commit_error.get("receipt-id") == "commit"
    assert f"transaction '{TX}' rolled back" in (commit_error.get("message") or "")
    assert "r3" in app.receipt_ids()
    await trio.sleep(5)
    assert committed_on(broker) == []
    assert broker.links[-1].received(Command.SEND) == []

    # A second transaction with the same fate is ABORTed by the app: a RECEIPT.
    await app.send(Command.BEGIN, {"transaction": "tx3", "receipt": "b3"})
    await app.wait_receipt("b3")
    broker.reachable = False
    await broker.link.drop("reset")
    await app.wait_event("RECONNECTING", 2)
    await app.send(
        Command.SEND, {"destination": QUEUE, "transaction": "tx3", "receipt": "s3"}, b"x"
    )
    await app.wait_error(3)
    broker.reachable = True
    await app.wait_event("FAILOVER", 2)
    await app.send(Command.ABORT, {"transaction": "tx3", "receipt": "a3"})
    await app.wait_receipt("a3")
    assert len(app.errors()) == 3


async def test_a_send_the_lost_broker_had_dropped_at_call_timeout_rolls_back_too(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """A SEND written to the broker that is then lost, unconfirmed, and dropped at
    ``call_timeout`` ("may have taken effect"): the lost broker rolled its open transaction
    back, so the COMMIT after it must not commit the rest elsewhere."""
    broker = network.add("broker", 61001)
    running = await connected(nursery, network, broker, call_timeout=1000)
    app = running.app
    await begin_and_confirm_two(running, broker)
    broker.receipts = "hold"
    await send(running, 2)
    await broker.wait_for(Command.SEND, 3)
    broker.reachable = False
    await broker.link.drop("close")
    await app.wait_event("RECONNECTING")
    await trio.sleep(0.5)
    await app.send(Command.COMMIT, {"transaction": TX, "receipt": "commit"})
    error = await app.wait_error()
    assert error.get("receipt-id") == "r2"
    assert b"may have taken effect" in error.body
    broker.receipts = "auto"
    broker.reachable = True
    await app.wait_event("FAILOVER")
    commit_error = await app.wait_error(2)
    assert commit_error.get("receipt-id") == "commit"
    assert f"transaction '{TX}' rolled back" in (commit_error.get("message") or "")
    await trio.sleep(5)
    assert committed_on(broker) == []
    assert broker.links[-1].received(Command.SEND) == []


async def test_an_ack_built_for_a_lost_leg_never_reaches_the_new_one(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """The chaos soak under CPU pressure (RabbitMQ, a ``client`` subscription): the app's
    cumulative ACK becomes one ACK per message upstream; a restore took the send lock between
    two of them, and the rest, with the old leg's delivery tags, went to the new leg, which
    RabbitMQ closed (PRECONDITION_FAILED "unknown delivery tag"). An ACK built for a link that
    is gone by the time it enters the window is not sent (StaleSettlement); one built for the
    current link is."""
    broker = network.add("broker", 61001, server=RABBITMQ)
    running = await connected(nursery, network, broker)
    app = running.app
    await app.send(
        Command.SUBSCRIBE, {"destination": QUEUE, "id": "s", "ack": "client", "receipt": "sub"}
    )
    await app.wait_receipt("sub")
    old_ack = await broker.link.deliver(QUEUE, b"m", message_id="m-1")
    state = running.session.core.state
    assert state is not None
    old = state.generation
    await broker.link.drop("reset")
    await app.wait_event("FAILOVER")
    await broker.wait_for(Command.SUBSCRIBE, link=2)
    assert state.generation == old + 1

    confirmations = running.session.confirmations
    stale = Frame(Command.ACK, (("id", old_ack),))
    with pytest.raises(StaleSettlement):
        await confirmations.submit(stale, app_receipt=None, idle=True, generation=old)
    new_ack = await broker.links[-1].deliver(QUEUE, b"n", message_id="m-2")
    fresh = Frame(Command.ACK, (("id", new_ack),))
    await confirmations.submit(fresh, app_receipt=None, idle=True, generation=state.generation)
    await confirmations.flush_upstream()  # as the app relay does at the end of a burst
    await broker.wait_for(Command.ACK, link=len(broker.links))
    await trio.sleep(1)
    assert [f.get("id") for f in broker.links[-1].received(Command.ACK)] == [new_ack]


@pytest.mark.parametrize("reached", [False, True])
async def test_rollback_mode_names_a_commit_no_broker_had_rolled_back_not_in_doubt(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network, reached: bool
) -> None:
    """``transaction_failover = rollback``: a COMMIT handed over while the session reconnects
    never reached a broker, so its ERROR says the transaction was rolled back (outcome
    ``rolled_back``); one written to the broker that was then lost unconfirmed may have
    committed there: "in doubt" (outcome ``unknown``)."""
    broker = network.add("broker", 61001)
    running = await connected(nursery, network, broker, transaction_failover="rollback")
    app = running.app
    await begin_and_confirm_two(running, broker)
    if reached:
        broker.receipts = "hold"
        await app.send(Command.COMMIT, {"transaction": TX, "receipt": "commit"})
        await broker.wait_for(Command.COMMIT)
    broker.reachable = False
    await broker.link.drop("reset")
    await app.wait_event("RECONNECTING")
    if not reached:
        await app.send(Command.COMMIT, {"transaction": TX, "receipt": "commit"})
    broker.receipts = "auto"
    broker.reachable = True
    failover = await app.wait_event("FAILOVER")
    error = await app.wait_error()
    assert error.get("receipt-id") == "commit"
    message = error.get("message") or ""
    if reached:
        assert message.startswith("transaction outcome in doubt"), message
        assert error.get("mq-sidecar-outcome") == "unknown"
        assert failover["transactions_in_doubt"] == [TX]
    else:
        assert message.startswith(f"transaction '{TX}' rolled back"), message
        assert error.get("mq-sidecar-outcome") == "rolled_back"
        assert failover["transactions_rolled_back"] == [TX]
    await trio.sleep(2)
    assert broker.links[-1].received(Command.COMMIT) == []
