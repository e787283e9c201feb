"""Session in outbox mode on scripted brokers (docs/outbox.md): the app's SENDs are answered
once stored, forwarded from the outbox, replayed from the window after a failover and removed
once confirmed; a CONNECT with no broker up is answered by the sidecar, and its first leg is
restored onto. A real outbox in a temporary directory (its writes run in a worker thread), so
these run on the real clock: every wait is bounded (scripted_broker.WAIT)."""

from __future__ import annotations

from pathlib import Path

import trio

from protocol import Command
from proxy.spool import OutboxService, open_outbox
from tests.proxy.scripted_broker import (
    Network,
    make_config,
    start_session,
    wait_until,
)

QUEUE = "/queue/orders"


def _frames(outbox: OutboxService) -> int:
    return outbox.committer.statistics().frames


async def test_forwarded_frames_are_replayed_after_a_failover_and_removed_once_confirmed(
    nursery: trio.Nursery, network: Network, tmp_path: Path
) -> None:
    primary = network.add("primary", 61001)
    backup = network.add("backup", 61002)
    primary.receipts = "hold"
    config = make_config(primary, backup, outbox=True, outbox_dir=str(tmp_path))
    async with open_outbox(config) as outbox:
        running = await start_session(nursery, network, config, outbox=outbox)
        app = running.app
        connected = await app.connect()
        assert connected.get("server") == primary.server  # the broker's CONNECTED
        for n in range(3):
            await app.send(Command.SEND, {"destination": QUEUE, "receipt": f"r{n}"}, b"m%d" % n)
        await app.wait_receipt("r2")  # stored: answered though the broker holds its receipts
        sent = await primary.wait_for(Command.SEND, 3)
        assert [f.get("receipt") for f in sent][-1] is not None  # the sidecar's own
        assert all(f.get("receipt") not in ("r0", "r1", "r2") for f in sent)
        assert _frames(outbox) == 3  # not confirmed: still stored

        primary.reachable = False
        await primary.link.drop("reset")
        replayed = await backup.wait_for(Command.SEND, 3)
        assert [f.body for f in replayed] == [b"m0", b"m1", b"m2"]
        assert [f.get("mq-sidecar-id") for f in replayed] == [f.get("mq-sidecar-id") for f in sent]
        spool = running.session.spool
        assert spool is not None
        # Removed from the store, then counted: wait for the count, set last.
        await wait_until(lambda: spool.forwarded == 3)
        assert _frames(outbox) == 0
        assert app.receipt_ids() == ["r0", "r1", "r2"]  # once each, never again
        assert app.errors() == []


async def test_connect_with_no_broker_up_then_the_first_leg_is_restored_onto(
    nursery: trio.Nursery, network: Network, tmp_path: Path
) -> None:
    broker = network.add("only", 61001)
    broker.reachable = False
    config = make_config(broker, outbox=True, outbox_dir=str(tmp_path))
    async with open_outbox(config) as outbox:
        running = await start_session(nursery, network, config, outbox=outbox)
        app = running.app
        connected = await app.connect()
        assert connected.command is Command.CONNECTED
        assert (connected.get("server") or "").startswith("mq-sidecar/")
        assert running.session.statistics().state == "reconnecting"
        await app.send(Command.SUBSCRIBE, {"destination": "/queue/in", "id": "1", "receipt": "s"})
        await app.send(Command.SEND, {"destination": QUEUE, "receipt": "r"}, b"held")
        await app.wait_receipt("r")  # stored, with no broker
        assert _frames(outbox) == 1

        broker.reachable = True
        forwarded = await broker.wait_for(Command.SEND, 1)
        assert forwarded[0].body == b"held"
        assert [f.get("destination") for f in broker.link.received(Command.SUBSCRIBE)] == [
            "/queue/in"
        ]
        await app.wait_receipt("s")  # the broker's, for the restored subscription
        spool = running.session.spool
        assert spool is not None
        await wait_until(lambda: spool.forwarded == 1)
        assert _frames(outbox) == 0
        assert running.session.statistics().state == "running"
        assert app.receipt_ids().count("r") == 1


async def test_a_transaction_of_stored_sends_is_stored_at_commit_and_forwarded_plain(
    nursery: trio.Nursery, network: Network, tmp_path: Path
) -> None:
    broker = network.add("only", 61001)
    broker.reachable = False
    config = make_config(broker, outbox=True, outbox_dir=str(tmp_path))
    async with open_outbox(config) as outbox:
        running = await start_session(nursery, network, config, outbox=outbox)
        app = running.app
        assert (await app.connect()).command is Command.CONNECTED  # the sidecar's own
        await app.send(Command.BEGIN, {"transaction": "t1", "receipt": "b"})
        for n in range(2):
            headers = {"destination": QUEUE, "transaction": "t1", "receipt": f"s{n}"}
            await app.send(Command.SEND, headers, b"t%d" % n)
        await app.wait_receipt("s1")
        assert _frames(outbox) == 0  # held until COMMIT
        await app.send(Command.BEGIN, {"transaction": "t2"})
        await app.send(Command.SEND, {"destination": QUEUE, "transaction": "t2"}, b"gone")
        await app.send(Command.ABORT, {"transaction": "t2", "receipt": "a"})
        await app.send(Command.COMMIT, {"transaction": "t1", "receipt": "c"})
        await app.wait_receipt("c")  # durable: both SENDs in one append
        assert _frames(outbox) == 2
        assert app.receipt_ids() == ["b", "s0", "s1", "a", "c"]

        broker.reachable = True
        forwarded = await broker.wait_for(Command.SEND, 2)
        assert [f.body for f in forwarded] == [b"t0", b"t1"]
        assert [f.get("transaction") for f in forwarded] == [None, None]
        assert all(f.get("mq-sidecar-id") for f in forwarded)
        spool = running.session.spool
        assert spool is not None
        await wait_until(lambda: spool.forwarded == 2)
        commands = broker.link.commands()
        assert Command.BEGIN not in commands
        assert Command.COMMIT not in commands
        assert Command.ABORT not in commands


async def test_a_transaction_with_another_frame_goes_to_the_broker(
    nursery: trio.Nursery, network: Network, tmp_path: Path
) -> None:
    broker = network.add("only", 61001)
    config = make_config(
        broker, outbox=True, outbox_dir=str(tmp_path), outbox_destinations=(QUEUE,)
    )
    async with open_outbox(config) as outbox:
        running = await start_session(nursery, network, config, outbox=outbox)
        app = running.app
        assert (await app.connect()).command is Command.CONNECTED
        await app.send(Command.BEGIN, {"transaction": "t", "receipt": "b"})
        stored = {"destination": QUEUE, "transaction": "t", "receipt": "s0"}
        await app.send(Command.SEND, stored, b"stored-kind")
        other = {"destination": "/queue/other", "transaction": "t", "receipt": "s1"}
        await app.send(Command.SEND, other, b"other-kind")
        await app.send(Command.COMMIT, {"transaction": "t", "receipt": "c"})
        await app.wait_receipt("c")  # the broker's, for its COMMIT
        commands = [f.command for f in broker.link.frames if f.command is not Command.CONNECT]
        assert commands == [Command.BEGIN, Command.SEND, Command.SEND, Command.COMMIT]
        sends = broker.link.received(Command.SEND)
        assert [f.body for f in sends] == [b"stored-kind", b"other-kind"]
        assert [f.get("transaction") for f in sends] == ["t", "t"]
        assert _frames(outbox) == 0
        assert app.receipt_ids().count("s0") == 1  # answered when held, not again
