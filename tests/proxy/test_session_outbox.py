"""Session in outbox mode on scripted brokers (docs/outbox.md): the app's SENDs are answered
once stored, forwarded from the outbox, replayed from the window after a failover and removed
once confirmed; a CONNECT with no broker up is answered by the sidecar, and its first leg is
restored onto; the SPOOLING and SPOOL_DRAINED events, once per switch. A real outbox in a
temporary directory (its writes run in a worker thread), so these run on the real clock: every
wait is bounded (scripted_broker.WAIT)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from protocol import Command
from proxy.outbox.service import OutboxService, open_outbox
from proxy.telemetry.events import EventKind, SessionEvent
from proxy.telemetry.logs import log_session_event
from tests.proxy.scripted_broker import (
    Network,
    Running,
    ScriptedBroker,
    make_config,
    start_session,
    wait_until,
)

QUEUE = "/queue/orders"


def _frames(outbox: OutboxService) -> int:
    return outbox.committer.statistics().frames


@contextlib.asynccontextmanager
async def _no_broker_up(
    nursery: trio.Nursery, network: Network, tmp_path: Path
) -> AsyncIterator[tuple[ScriptedBroker, OutboxService, Running]]:
    """A session in outbox mode (its outbox in ``tmp_path``) whose only broker does not
    answer until the test sets ``broker.reachable``; the app has not connected yet."""
    broker = network.add("only", 61001)
    broker.reachable = False
    config = make_config(broker, outbox=True, outbox_dir=str(tmp_path))
    async with open_outbox(config) as outbox:
        yield broker, outbox, await start_session(nursery, network, config, outbox=outbox)


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
        session_outbox = running.session.outbox
        assert session_outbox is not None
        # Removed from the store, then counted: wait for the count, set last.
        await wait_until(lambda: session_outbox.forwarded == 3)
        assert _frames(outbox) == 0
        assert app.receipt_ids() == ["r0", "r1", "r2"]  # once each, never again
        assert app.errors() == []


async def test_connect_with_no_broker_up_then_the_first_leg_is_restored_onto(
    nursery: trio.Nursery, network: Network, tmp_path: Path
) -> None:
    async with _no_broker_up(nursery, network, tmp_path) as (broker, outbox, running):
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
        session_outbox = running.session.outbox
        assert session_outbox is not None
        await wait_until(lambda: session_outbox.forwarded == 1)
        assert _frames(outbox) == 0
        assert running.session.statistics().state == "running"
        assert app.receipt_ids().count("r") == 1


async def test_a_transaction_of_stored_sends_is_stored_at_commit_and_forwarded_plain(
    nursery: trio.Nursery, network: Network, tmp_path: Path
) -> None:
    async with _no_broker_up(nursery, network, tmp_path) as (broker, outbox, running):
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
        session_outbox = running.session.outbox
        assert session_outbox is not None
        await wait_until(lambda: session_outbox.forwarded == 2)
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


# -- the control channel: SPOOLING and SPOOL_DRAINED (docs/behaviour.md, "Control channel") ---

EVENTS_SUB = {"destination": "/mq-sidecar/events", "id": "events", "ack": "auto"}


async def test_spooling_with_no_broker_at_connect_then_spool_drained_once_forwarded(
    nursery: trio.Nursery, network: Network, tmp_path: Path
) -> None:
    async with _no_broker_up(nursery, network, tmp_path) as (broker, outbox, running):
        app = running.app
        assert (await app.connect()).command is Command.CONNECTED  # the sidecar's own
        await app.send(Command.SUBSCRIBE, {**EVENTS_SUB, "receipt": "e"})
        await app.wait_receipt("e")
        for n in range(3):  # three bursts, one switch: one event
            await app.send(Command.SEND, {"destination": QUEUE, "receipt": f"r{n}"}, b"m%d" % n)
            await app.wait_receipt(f"r{n}")
        (spooling,) = app.events("SPOOLING")
        assert spooling["spooled_frames"] == 1  # when the first was stored
        assert spooling["outbox_frames"] == 1
        assert spooling["outbox_bytes"] > 0
        assert spooling["outbox_max_bytes"] == running.session.core.config.outbox_max_bytes
        assert spooling["reason"] == "no broker answered at CONNECT"
        assert spooling["from_broker"] is None
        assert spooling["forwarded_frames"] is None
        # Before the RECEIPT of the frame that switched the session.
        assert app.index(lambda f: f.get("event") == "SPOOLING") < app.index(
            lambda f: f.get("receipt-id") == "r0"
        )
        assert app.events("SPOOL_DRAINED") == []

        broker.reachable = True
        drained = await app.wait_event("SPOOL_DRAINED")
        assert drained["forwarded_frames"] == 3
        assert drained["spooled_frames"] == 0
        assert drained["outbox_frames"] == 0
        assert drained["to_broker"] == broker.label
        assert drained["spooled_ms"] >= 0
        kinds = [e["event"] for e in app.events()]
        assert kinds == ["SPOOLING", "FAILOVER", "SPOOL_DRAINED"]
        assert _frames(outbox) == 0

        # With a broker up, stored frames go straight through: no event.
        await app.send(Command.SEND, {"destination": QUEUE, "receipt": "r9"}, b"m9")
        await app.wait_receipt("r9")
        session_outbox = running.session.outbox
        assert session_outbox is not None
        await wait_until(lambda: session_outbox.forwarded == 4)
        assert [e["event"] for e in app.events()] == kinds


async def test_spooling_after_a_broker_loss_and_back_once_per_switch(
    nursery: trio.Nursery, network: Network, tmp_path: Path
) -> None:
    broker = network.add("only", 61001)
    config = make_config(broker, outbox=True, outbox_dir=str(tmp_path))
    async with open_outbox(config) as outbox:
        running = await start_session(nursery, network, config, outbox=outbox)
        app = running.app
        assert (await app.connect()).get("server") == broker.server
        await app.send(Command.SUBSCRIBE, {**EVENTS_SUB, "receipt": "e"})
        await app.wait_receipt("e")
        await app.send(Command.SEND, {"destination": QUEUE, "receipt": "up"}, b"up")
        await app.wait_receipt("up")
        session_outbox = running.session.outbox
        assert session_outbox is not None
        await wait_until(lambda: session_outbox.forwarded == 1)
        assert app.events() == []  # a broker up: no switch

        for round_ in range(2):  # two outages: two switches each way
            broker.reachable = False
            await broker.link.drop("reset")
            await app.wait_event("RECONNECTING", round_ + 1)
            for n in range(2):
                receipt = f"d{round_}-{n}"
                await app.send(Command.SEND, {"destination": QUEUE, "receipt": receipt}, b"d")
                await app.wait_receipt(receipt)
            spooling = await app.wait_event("SPOOLING", round_ + 1)
            assert spooling["from_broker"] == broker.label
            assert spooling["spooled_frames"] == 1
            broker.reachable = True
            drained = await app.wait_event("SPOOL_DRAINED", round_ + 1)
            assert drained["forwarded_frames"] == 2
            assert drained["to_broker"] == broker.label
        assert [e["event"] for e in app.events()] == [
            "RECONNECTING",
            "SPOOLING",
            "FAILOVER",
            "SPOOL_DRAINED",
        ] * 2
        assert _frames(outbox) == 0


def test_spooling_events_are_logged_once_each(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="mq_sidecar.events"):
        log_session_event(
            SessionEvent(
                EventKind.SPOOLING,
                "s1",
                "lost",
                from_broker="a:1",
                spooled_frames=2,
                outbox_frames=7,
                outbox_bytes=700,
                outbox_max_bytes=1000,
            )
        )
        log_session_event(
            SessionEvent(
                EventKind.SPOOL_DRAINED,
                "s1",
                "every frame the session stored reached a broker",
                to_broker="b:2",
                spooled_frames=0,
                forwarded_frames=5,
                spooled_ms=1200,
            )
        )
    spooling, drained = caplog.records
    assert spooling.levelno == logging.WARNING
    assert spooling.getMessage() == (
        "session s1: SPOOLING: no broker up, SENDs stored in the outbox (2 of the session's, "
        "outbox 7 frame(s), 700 of 1000 bytes): lost"
    )
    assert spooling.__dict__["broker"] == "a:1"
    assert drained.levelno == logging.INFO
    assert drained.getMessage().startswith(
        "session s1: SPOOL_DRAINED: 5 stored frame(s) forwarded to b:2 after 1200 ms"
    )
    assert drained.__dict__["broker"] == "b:2"
    assert drained.__dict__["event"] == "SPOOL_DRAINED"
