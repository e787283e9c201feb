"""Session: the drain on SIGTERM (``Session.request_drain``; docs/behaviour.md, "Drain on
SIGTERM"), on scripted brokers and the mock clock: no new frames from the app, the receipts of
what is in flight handed over, what is still unconfirmed at the deadline named to the app, then
DISCONNECT upstream and the ERROR that ends the session."""

from __future__ import annotations

import pytest
import trio

from protocol import Command, Frame
from proxy.tracking import DUPLICATE_ID_HEADER
from tests.proxy.scripted_broker import (
    RABBITMQ,
    Network,
    Running,
    ScriptedBroker,
    make_config,
    start_session,
)

QUEUE = "/queue/orders"
INBOX = "/queue/inbox"
#: drain_timeout of these tests, ms.
DRAIN_MS = 5000


async def connected(
    nursery: trio.Nursery, network: Network, *brokers: ScriptedBroker, **config: object
) -> Running:
    """A running session whose app is CONNECTED and subscribed to the control channel."""
    config.setdefault("drain_timeout", DRAIN_MS)
    running = await start_session(nursery, network, make_config(*brokers, **config))
    assert (await running.app.connect()).command is Command.CONNECTED
    await running.app.subscribe_events()
    return running


async def send_all(running: Running, receipts: list[str | None]) -> None:
    """One SEND per item (with that receipt, or none), body ``m<i>``."""
    for i, receipt in enumerate(receipts):
        headers = {"destination": QUEUE}
        if receipt is not None:
            headers["receipt"] = receipt
        await running.app.send(Command.SEND, headers, f"m{i}".encode())


def metric(running: Running, name: str, **labels: str) -> float | None:
    return running.session.core.metrics.registry.get_sample_value(name, labels)


async def test_a_drain_hands_over_the_receipts_in_flight_then_disconnects(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """Three SENDs the broker has not confirmed yet when the drain starts: the app's frames are
    no longer taken (a SEND it writes afterwards never reaches the broker: the wait under way
    reads it, and it is named ``refused``), the broker is still read: the three RECEIPTs it
    sends 2 s later reach the app, then the sidecar's DISCONNECT goes upstream and the app gets
    the ERROR that ends the session, naming the SEND it did not take."""
    broker = network.add("broker", 61001)
    running = await connected(nursery, network, broker)
    app = running.app
    broker.receipts = "hold"
    await send_all(running, ["r1", "r2", "r3"])
    await broker.wait_for(Command.SEND, 3)

    running.session.request_drain()
    await trio.sleep(0.1)
    await app.send(Command.SEND, {"destination": QUEUE, "receipt": "late"}, b"late")
    await trio.sleep(2.0)
    released_at = trio.current_time()
    await broker.link.release()
    await app.wait_closed()

    assert app.receipt_ids() == ["events-sub", "r1", "r2", "r3"]
    (error,) = app.errors()
    assert error.get("message") == (
        "mq-sidecar is shutting down; 1 frame(s) not confirmed: late: refused"
    )
    assert app.arrival(lambda f: f.command is Command.ERROR) == pytest.approx(released_at)
    (outcome,) = app.events("OUTCOME")
    assert [(f["receipt"], f["outcome"], f["cause"]) for f in outcome["frames"]] == [
        ("late", "refused", "drain")
    ]
    assert broker.link.commands()[-1] is Command.DISCONNECT
    assert len(broker.link.received(Command.SEND)) == 3  # "late" was never taken
    assert running.session.drain_result == "completed"
    assert metric(running, "mq_sidecar_drains_total", result="completed") == 1
    assert metric(running, "mq_sidecar_drains_total", result="deadline") == 0


async def test_an_idle_session_drains_at_once(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """Nothing in flight: DISCONNECT upstream and the ERROR at once."""
    broker = network.add("broker", 61001)
    running = await connected(nursery, network, broker)
    drained_at = trio.current_time()
    running.session.request_drain()
    await running.app.wait_closed()
    assert running.app.arrival(lambda f: f.command is Command.ERROR) == pytest.approx(drained_at)
    assert broker.link.commands()[-1] is Command.DISCONNECT
    assert running.session.drain_result == "completed"


async def test_the_drain_deadline_names_every_unconfirmed_frame_by_receipt_and_id(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """A broker that never confirms: at ``drain_timeout`` (5 s) the app gets one OUTCOME
    event naming each SEND by its receipt id (if any) and its ``mq-sidecar-id`` as
    ``unknown`` (the broker has it, or may), then the ERROR naming them, then the close;
    a DISCONNECT goes upstream. Counted by outcome, and the drain as ``deadline``."""
    broker = network.add("broker", 61001)
    running = await connected(nursery, network, broker)
    app = running.app
    broker.receipts = "hold"
    await app.send(
        Command.SEND, {"destination": QUEUE, "receipt": "r1", DUPLICATE_ID_HEADER: "key-1"}, b"a"
    )
    await send_all(running, [None, "r3"])
    sent = await broker.wait_for(Command.SEND, 3)
    ids = [f.get(DUPLICATE_ID_HEADER) for f in sent]
    assert ids == ["key-1", "s1-1", "s1-2"]

    drained_at = trio.current_time()
    running.session.request_drain()
    await app.wait_closed()

    (outcome,) = app.events("OUTCOME")
    assert [(f["receipt"], f["mq_sidecar_id"], f["outcome"]) for f in outcome["frames"]] == [
        ("r1", "key-1", "unknown"),
        (None, "s1-1", "unknown"),
        ("r3", "s1-2", "unknown"),
    ]
    assert {f["cause"] for f in outcome["frames"]} == {"drain_deadline"}
    assert {f["command"] for f in outcome["frames"]} == {"SEND"}
    assert "drain_timeout (5000 ms)" in outcome["reason"]
    assert outcome["from_broker"] == broker.label
    (error,) = app.errors()
    assert app.arrival(lambda f: f.command is Command.ERROR) == pytest.approx(drained_at + 5.0)
    assert error.get("message") == (
        "mq-sidecar is shutting down; 3 frame(s) not confirmed: r1 (mq-sidecar-id key-1): "
        "unknown, s1-1: unknown, r3 (mq-sidecar-id s1-2): unknown"
    )
    assert app.index(lambda f: f.get("event") == "OUTCOME") < app.index(
        lambda f: f.command is Command.ERROR
    )
    assert app.receipt_ids() == ["events-sub"]
    assert broker.link.commands()[-1] is Command.DISCONNECT
    assert running.session.drain_result == "deadline"
    assert metric(running, "mq_sidecar_drains_total", result="deadline") == 1
    assert metric(running, "mq_sidecar_frame_outcomes_total", outcome="unknown") == 3
    assert metric(running, "mq_sidecar_lost_frames_total") == 3


async def test_a_session_reconnecting_at_sigterm_keeps_trying_and_hands_over_the_replay(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """The primary is lost with two SENDs unconfirmed and the backup is down when the drain
    starts: the session goes on reconnecting; the backup comes back 1 s later, the window is
    replayed there, and its RECEIPTs reach the app before the drain ends (completed)."""
    primary = network.add("primary", 61001)
    backup = network.add("backup", 61002)
    running = await connected(
        nursery, network, primary, backup, reconnect_attempts=-1, max_retry_interval=200
    )
    app = running.app
    primary.receipts = "hold"
    await send_all(running, ["r1", "r2"])
    await primary.wait_for(Command.SEND, 2)
    primary.reachable = backup.reachable = False
    await primary.link.drop("reset")
    await app.wait_event("RECONNECTING")

    running.session.request_drain()
    await trio.sleep(1.0)
    assert running.session.statistics().state == "reconnecting"
    backup.reachable = True
    await app.wait_closed()

    assert app.receipt_ids() == ["events-sub", "r1", "r2"]
    assert len(backup.link.received(Command.SEND)) == 2
    assert backup.link.commands()[-1] is Command.DISCONNECT
    (outcome,) = app.events("OUTCOME")  # the replay's, not the drain's
    assert {f["outcome"] for f in outcome["frames"]} == {"replayed"}
    assert running.session.drain_result == "completed"


async def test_a_session_still_reconnecting_at_the_deadline_names_unknown_and_lost(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """Every broker down until the deadline: the SEND the lost broker had is ``unknown``, the
    one handed over during the outage (never sent anywhere) ``lost``; no DISCONNECT (no leg)."""
    primary = network.add("primary", 61001)
    running = await connected(
        nursery, network, primary, reconnect_attempts=-1, max_retry_interval=200
    )
    app = running.app
    primary.receipts = "hold"
    await send_all(running, ["r1"])
    await primary.wait_for(Command.SEND, 1)
    primary.reachable = False
    await primary.link.drop("reset")
    await app.wait_event("RECONNECTING")
    await app.send(Command.SEND, {"destination": QUEUE, "receipt": "r2"}, b"during")
    await trio.sleep(0.1)

    running.session.request_drain()
    await app.wait_closed()
    (outcome,) = app.events("OUTCOME")
    assert [(f["receipt"], f["outcome"]) for f in outcome["frames"]] == [
        ("r1", "unknown"),
        ("r2", "lost"),
    ]
    assert metric(running, "mq_sidecar_frame_outcomes_total", outcome="lost") == 1
    assert len(primary.links) == 1
    assert running.session.drain_result == "deadline"


async def test_a_frame_written_after_the_drain_began_is_named_once_at_the_deadline(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """A session reconnecting at SIGTERM until the deadline, its app waiting between bursts:
    the SEND the app writes after the drain began is read by the wait under way, not taken,
    and named once, ``refused`` (cause ``drain``), after the window's ``lost`` one at the
    deadline (not again as ``lost`` by the deadline's walk of what the app side read)."""
    primary = network.add("primary", 61001)
    running = await connected(
        nursery, network, primary, reconnect_attempts=-1, max_retry_interval=200
    )
    app = running.app
    primary.reachable = False
    await primary.link.drop("reset")
    await app.wait_event("RECONNECTING")
    await app.send(Command.SEND, {"destination": QUEUE, "receipt": "r1"}, b"during")
    await trio.sleep(0.1)

    running.session.request_drain()
    await trio.sleep(0.1)
    await app.send(Command.SEND, {"destination": QUEUE, "receipt": "late"}, b"late")
    await app.wait_closed()
    named = [
        (f["receipt"], f["outcome"], f["cause"])
        for event in app.events("OUTCOME")
        for f in event["frames"]
    ]
    assert named == [("r1", "lost", "drain_deadline"), ("late", "refused", "drain")]
    (error,) = app.errors()
    assert error.get("message") == (
        "mq-sidecar is shutting down; 2 frame(s) not confirmed: r1 (mq-sidecar-id s1-1): lost, "
        "late: refused"
    )
    assert running.session.drain_result == "deadline"


async def test_messages_arriving_during_the_drain_are_held_back_and_not_acknowledged(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """The app can no longer acknowledge: a MESSAGE of its client subscription that arrives
    during the drain is neither shown nor acknowledged (the broker redelivers it to another
    consumer after the DISCONNECT); the receipt the drain waits for still gets through."""
    broker = network.add("broker", 61001)
    running = await connected(nursery, network, broker)
    app = running.app
    await app.send(
        Command.SUBSCRIBE,
        {"destination": INBOX, "id": "sub1", "ack": "client-individual", "receipt": "sub"},
    )
    await app.wait_receipt("sub")
    broker.receipts = "hold"
    await send_all(running, ["r1"])
    await broker.wait_for(Command.SEND, 1)

    running.session.request_drain()
    await broker.link.deliver(INBOX, b"not now", message_id="ID:m1")
    await broker.link.release()
    await app.wait_closed()

    assert app.messages(INBOX) == []
    assert app.receipt_ids() == ["events-sub", "sub", "r1"]
    assert Command.ACK not in broker.link.commands()
    assert running.session.core.drain.messages_not_shown == 1


async def test_an_open_transaction_is_rolled_back_and_not_waited_for(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """RabbitMQ confirms a transaction's SENDs only at COMMIT, which the drain no longer reads:
    the drain does not wait for them; they are named ``rolled_back`` (the broker aborts the
    transaction at the DISCONNECT), and the drain counts as completed."""
    broker = network.add("broker", 61001, server=RABBITMQ)
    running = await connected(nursery, network, broker)
    app = running.app
    await app.send(Command.BEGIN, {"transaction": "tx1", "receipt": "b1"})
    await app.wait_receipt("b1")
    broker.receipts = "hold"
    await app.send(
        Command.SEND, {"destination": QUEUE, "transaction": "tx1", "receipt": "t1"}, b"x"
    )
    await broker.wait_for(Command.SEND, 1)

    drained_at = trio.current_time()
    running.session.request_drain()
    await app.wait_closed()
    assert app.arrival(lambda f: f.command is Command.ERROR) == pytest.approx(drained_at)
    (outcome,) = app.events("OUTCOME")
    assert [
        (f["receipt"], f["transaction"], f["outcome"], f["cause"]) for f in outcome["frames"]
    ] == [("t1", "tx1", "rolled_back", "drain")]
    assert running.session.drain_result == "completed"


async def test_a_drain_of_a_session_that_has_ended_changes_nothing(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """SIGTERM reaching a session that already ended (its app side gone) is a no-op, never an
    error that would stop the sidecar's drain of the others."""
    broker = network.add("broker", 61001)
    running = await connected(nursery, network, broker)
    await running.app.send(Command.DISCONNECT, {"receipt": "bye"})
    await running.done.wait()
    running.session.request_drain()
    assert running.session.drain_result is None


async def test_frames_held_up_by_a_full_window_at_the_deadline_are_named_lost(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """A window with room for one SEND and a broker that never confirms: of the app's burst
    of three, the first is in the window (``unknown`` at the deadline), the second waits for
    room and the third was read ahead of it: both were read from the app and never went
    anywhere, so they are named ``lost``, with the receipt ids and any ``mq-sidecar-id`` the
    app gave them."""
    broker = network.add("broker", 61001)
    running = await connected(nursery, network, broker, confirmation_window_size=300)
    app = running.app
    broker.receipts = "hold"
    body = b"x" * 200
    frames = [
        Frame.build(Command.SEND, {"destination": QUEUE, "receipt": f"r{n}"}, body) for n in (1, 2)
    ]
    frames.append(
        Frame.build(
            Command.SEND,
            {"destination": QUEUE, "receipt": "r3", DUPLICATE_ID_HEADER: "key-3"},
            body,
        )
    )
    await app.stream.send_all(b"".join(app.conn.send(f) for f in frames))  # one burst
    await broker.wait_for(Command.SEND, 1)
    await trio.sleep(1.0)
    assert running.session.confirmations.waiting is not None

    running.session.request_drain()
    await app.wait_closed()
    (outcome,) = app.events("OUTCOME")
    assert [
        (f["receipt"], f["mq_sidecar_id"], f["outcome"], f["seq"]) for f in outcome["frames"]
    ] == [
        ("r1", "s1-1", "unknown", 1),
        ("r2", "s1-2", "lost", 0),
        ("r3", "key-3", "lost", 0),
    ]
    assert len(broker.link.received(Command.SEND)) == 1
    assert "3 frame(s) not confirmed" in (app.errors()[0].get("message") or "")
