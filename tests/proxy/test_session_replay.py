"""Session: replay after a cut, on scripted brokers and the mock clock (no real broker).

The app SENDs with receipts, the broker holds the receipts, the link drops; the session
reconnects (to a backup, or to the same broker: reattach) and replays the SENDs the old broker
never confirmed, in order, unchanged (same ``mq-sidecar-id``, same sidecar receipt), and the app
gets each RECEIPT exactly once, after a FAILOVER event on its control channel.
"""

from __future__ import annotations

import pytest
import trio

from protocol import Command, Frame
from tests.proxy.scripted_broker import (
    ACTIVEMQ,
    EVENTS,
    RABBITMQ,
    AppClient,
    Network,
    Running,
    ScriptedBroker,
    make_config,
    start_session,
)

QUEUE = "/queue/orders"
#: What the session makes of each way of losing a link (the RECONNECTING event's reason).
LOSS_REASONS = {
    "close": "broker closed the connection",
    "reset": "connection reset by peer",
    "mid_frame": "in the middle of a frame",
}


async def send_all(app: AppClient, receipts: list[str | None]) -> None:
    """One SEND per entry (body ``m<i>``), asking for that receipt (None: no receipt)."""
    for i, receipt in enumerate(receipts):
        headers = {"destination": QUEUE}
        if receipt is not None:
            headers["receipt"] = receipt
        await app.send(Command.SEND, headers, f"m{i}".encode())


def bodies(frames: list[Frame]) -> list[bytes]:
    return [f.body for f in frames]


def dup_ids(frames: list[Frame]) -> list[str | None]:
    return [f.get("mq-sidecar-id") for f in frames]


async def connected_app(
    nursery: trio.Nursery, network: Network, *brokers: ScriptedBroker, **config: object
) -> Running:
    """A running session whose app is CONNECTED and subscribed to the control channel."""
    running = await start_session(nursery, network, make_config(*brokers, **config))
    connected = await running.app.connect()
    assert connected.command is Command.CONNECTED, connected
    await running.app.subscribe_events()
    return running


@pytest.mark.parametrize("how", ["close", "reset", "mid_frame"])
async def test_unconfirmed_sends_are_replayed_on_the_backup_once_each(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    network: Network,
    how: str,
) -> None:
    """Three SENDs the primary never confirmed (receipts held) are replayed on the backup
    after the primary is lost (closed, reset, or cut inside a frame) and goes down: in order,
    byte for byte the frames the primary got (same ``mq-sidecar-id`` and sidecar receipt);
    the app gets RECEIPT r1, r2, r3 exactly once, only once the backup confirmed them, after
    RECONNECTING and FAILOVER events."""
    primary = network.add("primary", 61001)
    backup = network.add("backup", 61002)
    primary.receipts = "hold"
    running = await start_session(nursery, network, make_config(primary, backup))
    app = running.app
    assert (await app.connect()).command is Command.CONNECTED
    await app.subscribe_events()

    await send_all(app, ["r1", "r2", "r3"])
    sent = await primary.wait_for(Command.SEND, 3)
    assert len(primary.link.held) == 3
    stats = running.session.statistics()
    assert stats.window is not None
    assert (stats.window.frames, stats.pending_receipts) == (3, 3)
    assert app.receipt_ids() == ["events-sub"]

    primary.reachable = False
    backup.receipts = "hold"
    await primary.link.drop(how)
    await backup.wait_for(Command.SEND, 3)
    await trio.sleep(10)
    # Replayed is not confirmed: the app's RECEIPTs wait for the backup's.
    assert app.receipt_ids() == ["events-sub"]
    assert running.session.statistics().pending_receipts == 3
    await backup.link.release()
    await app.wait_receipt("r3")
    await trio.sleep(10)  # anything more would have come by now

    assert app.receipt_ids() == ["events-sub", "r1", "r2", "r3"]
    assert app.errors() == []
    replayed = backup.link.received(Command.SEND)
    assert replayed == sent  # same headers (mq-sidecar-id, receipt) and bodies, same order
    assert bodies(replayed) == [b"m0", b"m1", b"m2"]
    assert len(set(dup_ids(replayed))) == 3
    assert backup.link.commands() == [Command.CONNECT, Command.SEND, Command.SEND, Command.SEND]

    reconnecting, failover, outcome = app.events()
    assert reconnecting["event"] == "RECONNECTING"
    assert reconnecting["from_broker"] == primary.label
    assert LOSS_REASONS[how] in reconnecting["reason"]
    assert failover["event"] == "FAILOVER"
    assert failover["from_broker"] == primary.label
    assert failover["to_broker"] == backup.label
    assert failover["reattached"] is False
    assert failover["replayed_frames"] == 3
    # Each replayed frame is named, by receipt id and mq-sidecar-id (docs: "Frame outcomes").
    assert outcome["event"] == "OUTCOME"
    assert [(f["receipt"], f["mq_sidecar_id"], f["outcome"]) for f in outcome["frames"]] == [
        (r, d, "replayed") for r, d in zip(["r1", "r2", "r3"], dup_ids(sent), strict=True)
    ]
    # The app hears of the failover before the replay's first RECEIPT.
    failover_at = app.index(lambda f: f.get("event") == "FAILOVER")
    assert failover_at < app.index(lambda f: f.get("receipt-id") == "r1")

    stats = running.session.statistics()
    assert stats.state == "running"
    assert stats.broker == backup.label
    assert stats.failovers == 1
    assert stats.pending_receipts == 0
    assert stats.window is not None
    assert stats.window.frames == 0


async def test_reattach_replays_on_a_new_link_to_the_same_broker(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """A broker that drops the link but still accepts connections gets the session back
    (reattach, the current broker is tried first): the unconfirmed SENDs go again on the new
    link, only those (a SEND it had confirmed is not replayed), and the FAILOVER event says
    ``reattached``."""
    primary = network.add("primary", 61001)
    backup = network.add("backup", 61002)
    app = (await connected_app(nursery, network, primary, backup)).app

    await send_all(app, ["r1"])
    await app.wait_receipt("r1")
    primary.receipts = "hold"
    await send_all(app, ["r2", "r3"])
    first = await primary.wait_for(Command.SEND, 3)
    primary.receipts = "auto"  # the next link answers
    await primary.link.drop("reset")
    await app.wait_receipt("r3")
    await trio.sleep(10)

    assert app.receipt_ids() == ["events-sub", "r1", "r2", "r3"]
    assert len(primary.links) == 2
    assert backup.links == []
    second = primary.links[1]
    assert second.received(Command.SEND) == first[1:]
    assert second.held == []
    failover = app.events("FAILOVER")[0]
    assert failover["reattached"] is True
    assert failover["to_broker"] == primary.label
    assert failover["replayed_frames"] == 2


async def test_what_the_app_sends_while_reconnecting_follows_the_replay(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """A SEND the app hands over while no broker is reachable waits in the window and goes,
    after the replayed one, once a broker is back: one ordered stream per session."""
    primary = network.add("primary", 61001)
    backup = network.add("backup", 61002)
    app = (await connected_app(nursery, network, primary, backup)).app
    primary.receipts = "hold"
    await send_all(app, ["r1"])
    (lost,) = await primary.wait_for(Command.SEND)
    primary.reachable = backup.reachable = False
    await primary.link.drop("close")
    await app.wait_event("RECONNECTING")

    await app.send(Command.SEND, {"destination": QUEUE, "receipt": "r2"}, b"later")
    await trio.sleep(3)  # several failed rounds
    assert backup.links == []
    assert app.receipt_ids() == ["events-sub"]
    backup.reachable = True
    await app.wait_receipt("r2")
    await trio.sleep(10)

    assert app.receipt_ids() == ["events-sub", "r1", "r2"]
    sends = backup.link.received(Command.SEND)
    assert sends[0] == lost
    assert bodies(sends) == [b"m0", b"later"]
    assert app.events("FAILOVER")[0]["replayed_frames"] == 2


async def test_rabbitmq_receipts_out_of_order_and_replayed(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """RabbitMQ (``server:RabbitMQ/...``) confirms SENDs out of order, so every SEND carries
    its own sidecar receipt, also those the app asked none for; receipts released in reverse
    reach the app once each. After a cut, the unconfirmed ones are replayed on the RabbitMQ
    backup with the same receipts and ``mq-sidecar-id`` (and no ``_AMQ_DUPL_ID``)."""
    primary = network.add("primary", 61001, server=RABBITMQ)
    backup = network.add("backup", 61002, server=RABBITMQ)
    running = await connected_app(nursery, network, primary, backup)
    app, session = running.app, running.session
    primary.receipts = "hold"

    await send_all(app, ["a1", "a2", "a3"])
    await primary.wait_for(Command.SEND, 3)
    assert await primary.link.release(reverse=True) == [
        f.get("receipt") for f in reversed(primary.link.received(Command.SEND))
    ]
    await app.wait_receipt("a1")
    assert app.receipt_ids() == ["events-sub", "a3", "a2", "a1"]

    await send_all(app, [None, "b2", None])
    sends = await primary.wait_for(Command.SEND, 6)
    unconfirmed = sends[3:]
    assert all(f.has("receipt") for f in unconfirmed)
    assert all(not f.has("_AMQ_DUPL_ID") for f in sends)
    primary.reachable = False
    await primary.link.drop("reset")
    await backup.wait_for(Command.SEND, 3)
    await trio.sleep(10)

    assert backup.link.received(Command.SEND) == unconfirmed
    assert app.receipt_ids() == ["events-sub", "a3", "a2", "a1", "b2"]
    assert app.errors() == []
    stats = session.statistics()
    assert stats.pending_receipts == 0
    assert stats.window is not None
    assert stats.window.out_of_order == 3  # a3 overtook a1, a2; a2 overtook a1


def test_scripted_brokers_speak_as_configured() -> None:
    """The servers named here are those Upstream keys its behaviour on."""
    assert ACTIVEMQ.startswith("ActiveMQ/")
    assert RABBITMQ.startswith("RabbitMQ/")
    assert EVENTS == "/mq-sidecar/events"
