"""Session: ``max_transaction_size`` bounds what open transactions hold (issue 16, "every buffer
bounded"): the SENDs kept to re-run a transaction after a failover (``replay`` mode), the
deliveries its ACKs settled, the transactions themselves. Past it the app's frame gets an
ERROR naming the option, the transaction is aborted upstream, and the session goes on.
Scripted broker, mock clock."""

from __future__ import annotations

import trio

from protocol import Command
from proxy.tracking import TRANSACTION_OVERHEAD
from tests.proxy.scripted_broker import (
    Network,
    Running,
    ScriptedBroker,
    make_config,
    start_session,
)

QUEUE = "/queue/orders"
INBOX = "/queue/in"
KIB = b"x" * 1024


async def running_app(
    nursery: trio.Nursery, network: Network, **config: object
) -> tuple[Running, ScriptedBroker]:
    primary = network.add("primary", 61001)
    running = await start_session(nursery, network, make_config(primary, **config))
    assert (await running.app.connect()).command is Command.CONNECTED
    return running, primary


def held(running: Running) -> int:
    state = running.session.core.state
    assert state is not None
    return state.transaction_bytes.used


async def test_replay_mode_aborts_a_transaction_that_outgrows_the_limit(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    running, primary = await running_app(
        nursery, network, transaction_failover="replay", max_transaction_size=8 * 1024
    )
    app = running.app
    await app.send(Command.BEGIN, {"transaction": "tx1", "receipt": "b1"})
    for i in range(10):
        headers = {"destination": QUEUE, "transaction": "tx1", "receipt": f"s{i}"}
        await app.send(Command.SEND, headers, KIB)
    error = await app.wait_error()
    message = error.get("message") or ""
    assert "max_transaction_size (8192 bytes" in message
    assert message.startswith("transaction 'tx1' aborted")
    refused = error.get("receipt-id")
    assert refused is not None
    sent_in_tx = int(refused.removeprefix("s"))
    assert 5 <= sent_in_tx < 8  # ~1.1 KiB each, 512 bytes for the transaction itself
    await primary.wait_for(Command.ABORT)
    aborts = primary.link.received(Command.ABORT)
    assert [f.get("transaction") for f in aborts] == ["tx1"]
    sends = primary.link.received(Command.SEND)
    assert len(sends) == sent_in_tx, "the refused SEND never went upstream"
    assert held(running) == 0, "the aborted transaction gave everything back"

    # The session goes on: a new transaction within the limit commits.
    await app.send(Command.BEGIN, {"transaction": "tx2"})
    await app.send(Command.SEND, {"destination": QUEUE, "transaction": "tx2"}, KIB)
    await app.send(Command.COMMIT, {"transaction": "tx2", "receipt": "c2"})
    await app.wait_receipt("c2")
    # The SENDs the app still sent in tx1 are refused by the sidecar (the broker no longer
    # knows tx1), each naming why; its ABORT is answered.
    later = app.errors()[1:]
    assert [e.get("receipt-id") for e in later] == [f"s{i}" for i in range(sent_in_tx + 1, 10)]
    assert all("SEND in transaction 'tx1': transaction 'tx1' aborted" in (e.get("message") or "")
               for e in later)  # fmt: skip
    await app.send(Command.ABORT, {"transaction": "tx1", "receipt": "a1"})
    await app.wait_receipt("a1")
    assert len(primary.link.received(Command.ABORT)) == 1
    assert running.session.statistics().state == "running"
    assert held(running) == 0


async def test_rollback_mode_holds_no_frames_so_a_long_transaction_is_not_bounded(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """``rollback`` mode never re-runs a transaction: its SENDs are not kept, so 100 KiB
    pass a limit of 8 KiB and the session holds only the transaction itself."""
    running, _ = await running_app(
        nursery, network, transaction_failover="rollback", max_transaction_size=8 * 1024
    )
    app = running.app
    await app.send(Command.BEGIN, {"transaction": "tx1"})
    for _ in range(100):
        await app.send(Command.SEND, {"destination": QUEUE, "transaction": "tx1"}, KIB)
    await app.send(Command.SEND, {"destination": QUEUE, "transaction": "tx1", "receipt": "s"})
    await app.wait_receipt("s")
    assert held(running) == TRANSACTION_OVERHEAD
    await app.send(Command.COMMIT, {"transaction": "tx1", "receipt": "c1"})
    await app.wait_receipt("c1")
    assert app.errors() == []
    assert held(running) == 0


async def test_acks_in_a_transaction_are_bounded_and_an_abort_gives_the_messages_back(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """Each delivery an ACK settles in a transaction is kept (to hold it again after ABORT):
    past the limit the transaction is aborted, and the app holds those messages again, so
    ACKs outside a transaction settle them."""
    limit = TRANSACTION_OVERHEAD + 3 * 256
    running, primary = await running_app(nursery, network, max_transaction_size=limit)
    app = running.app
    await app.send(
        Command.SUBSCRIBE,
        {"destination": INBOX, "id": "s1", "ack": "client-individual", "receipt": "sub"},
    )
    await app.wait_receipt("sub")
    for i in range(5):
        await primary.link.deliver(INBOX, b"m", message_id=f"m{i}")
    await app.signal.wait_until(lambda: len(app.messages(INBOX)) == 5)
    acks = [m.get("ack") or "" for m in app.messages(INBOX)]
    await app.send(Command.BEGIN, {"transaction": "tx1"})
    for i, ack in enumerate(acks):
        await app.send(Command.ACK, {"id": ack, "transaction": "tx1", "receipt": f"a{i}"})
    error = await app.wait_error()
    assert error.get("receipt-id") == "a3"
    assert "max_transaction_size" in (error.get("message") or "")
    await primary.wait_for(Command.ABORT)
    assert held(running) == 0
    # The aborted ACKs did not count: the app acks all five again, outside a transaction.
    for i, ack in enumerate(acks):
        await app.send(Command.ACK, {"id": ack, "receipt": f"r{i}"})
    await app.wait_receipt("r4")
    outside = [f for f in primary.link.received(Command.ACK) if f.get("transaction") is None]
    assert len(outside) == 5
    assert [e.get("receipt-id") for e in app.errors()] == ["a3", "a4"]  # a4: in aborted tx1


async def test_a_flood_of_begins_is_bounded_too(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    running, primary = await running_app(
        nursery, network, max_transaction_size=4 * TRANSACTION_OVERHEAD
    )
    app = running.app
    for i in range(5):
        await app.send(Command.BEGIN, {"transaction": f"t{i}", "receipt": f"b{i}"})
    error = await app.wait_error()
    assert error.get("receipt-id") == "b4"
    message = error.get("message") or ""
    assert message.startswith("BEGIN of transaction 't4' refused")
    assert "max_transaction_size is 2048" in message
    await app.wait_receipt("b3")
    begins = [f.get("transaction") for f in primary.link.received(Command.BEGIN)]
    assert begins == ["t0", "t1", "t2", "t3"]
    await app.send(Command.ABORT, {"transaction": "t0", "receipt": "x0"})
    await app.wait_receipt("x0")
    await app.send(Command.BEGIN, {"transaction": "t5", "receipt": "b5"})
    await app.wait_receipt("b5")
    assert len(app.errors()) == 1
