"""Session: connecting and giving up, on scripted brokers and the mock clock: a login the
broker refuses, reconnect attempts exhausted (``priority_backup`` failback:
test_session_failover_signals_failback.py)."""

from __future__ import annotations

import trio

from protocol import Command, Frame
from tests.proxy.scripted_broker import (
    Network,
    make_config,
    start_session,
)

QUEUE = "/queue/orders"


async def test_a_login_refused_at_first_connect_reaches_the_app_as_the_brokers_error(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """The only broker answers CONNECT with an ERROR: the app's CONNECT is answered with an
    ERROR carrying the broker's own message, and its connection is closed. The broker got the
    app's credentials (the sidecar has none of its own)."""
    broker = network.add("broker", 61001)
    broker.refuse = "Authentication failed: bad login"
    running = await start_session(nursery, network, make_config(broker))
    app = running.app

    answer = await app.connect(login="app", passcode="wrong")
    assert answer.command is Command.ERROR
    assert answer.get("message") == "Authentication failed: bad login"
    assert answer.get("receipt-id") is None
    await app.wait_closed()
    with trio.fail_after(10):
        await running.done.wait()
    assert app.frames == [answer]
    (connect,) = broker.link.frames
    assert (connect.get("login"), connect.get("passcode")) == ("app", "wrong")
    assert running.session.statistics().state == "closed"


async def test_a_refusing_first_broker_is_skipped_for_the_next_one(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """A refusal is one failed attempt: the session goes on to the next broker of the round
    and the app is CONNECTED there (its CONNECTED names that broker's server)."""
    primary = network.add("primary", 61001)
    backup = network.add("backup", 61002, server="RabbitMQ/3.10.8")
    primary.refuse = "Authentication failed"
    running = await start_session(nursery, network, make_config(primary, backup))

    answer = await running.app.connect()
    assert answer.command is Command.CONNECTED
    assert answer.get("server") == "RabbitMQ/3.10.8"
    assert running.session.statistics().broker == backup.label
    assert len(primary.links) == 1
    assert len(backup.links) == 1


async def test_reconnect_exhausted_ends_the_session_naming_the_unconfirmed_frames(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """Every broker down and ``reconnect_attempts = 2``: after two rounds over both brokers
    the session gives up: an OUTCOME event naming each frame the lost broker never confirmed
    by receipt id and mq-sidecar-id (``unknown``: it had them), a DISCONNECT event naming them
    (the app's receipt id, else the SEND's ``mq-sidecar-id``), then an ERROR saying so, then
    the app's connection is closed. No RECEIPT ever comes for them."""
    primary = network.add("primary", 61001)
    backup = network.add("backup", 61002)
    running = await start_session(
        nursery, network, make_config(primary, backup, reconnect_attempts=2)
    )
    app = running.app
    assert (await app.connect()).command is Command.CONNECTED
    await app.subscribe_events()
    primary.receipts = "hold"
    await app.send(Command.SEND, {"destination": QUEUE, "receipt": "r1"}, b"one")
    await app.send(Command.SEND, {"destination": QUEUE}, b"two")
    await primary.wait_for(Command.SEND, 2)

    primary.reachable = backup.reachable = False
    lost_at = trio.current_time()
    await primary.link.drop("reset")
    await app.wait_closed()
    with trio.fail_after(10):
        await running.done.wait()

    (outcome,) = app.events("OUTCOME")
    assert [(f["receipt"], f["mq_sidecar_id"], f["outcome"]) for f in outcome["frames"]] == [
        ("r1", "s1-1", "unknown"),
        (None, "s1-2", "unknown"),
    ]
    assert {f["cause"] for f in outcome["frames"]} == {"reconnect_exhausted"}
    disconnect = app.events("DISCONNECT")[0]
    assert disconnect["frames_lost"] == ["r1", "s1-2"]
    assert disconnect["attempts"] == 4  # 2 rounds x 2 brokers
    assert disconnect["from_broker"] == primary.label
    (error,) = app.errors()
    assert error.get("message") == (
        "mq-sidecar lost the broker connection and could not reconnect; "
        "2 frame(s) not confirmed: r1 (mq-sidecar-id s1-1): unknown, s1-2: unknown"
    )
    assert error.get("mq-sidecar-outcome") is None  # about several frames: in the message
    kinds = [f.get("event") or f.command for f in app.frames]
    assert kinds[-4:] == ["RECONNECTING", "OUTCOME", "DISCONNECT", Command.ERROR]
    assert app.receipt_ids() == ["events-sub"]
    # Backoff 100 ms before round 1, 200 ms before round 2 (no jitter), then it gives up.
    assert app.closed_at is not None
    assert 0.3 <= app.closed_at - lost_at < 0.5
    assert [label for _, label, _ in network.attempts[-4:]] == [
        primary.label,
        backup.label,
        primary.label,
        backup.label,
    ]
    assert running.session.statistics().state == "closed"


async def test_reconnect_exhausted_names_the_frames_a_full_window_held_up_as_lost(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """A window with room for one SEND, a broker that never confirms it and then goes away
    for good: of the app's burst of three, the first was sent (``unknown``), the second was
    waiting for room and the third was read ahead of it: both were read from the app and
    never went anywhere, so the exhausted reconnect names them ``lost`` too (as the drain
    does at its deadline): no frame the app handed over goes unnamed."""
    primary = network.add("primary", 61001)
    running = await start_session(
        nursery,
        network,
        make_config(primary, reconnect_attempts=1, confirmation_window_size=300),
    )
    app = running.app
    assert (await app.connect()).command is Command.CONNECTED
    await app.subscribe_events()
    primary.receipts = "hold"
    body = b"x" * 200
    frames = [
        Frame.build(Command.SEND, {"destination": QUEUE, "receipt": f"r{n}"}, body)
        for n in (1, 2, 3)
    ]
    await app.stream.send_all(b"".join(app.conn.send(f) for f in frames))  # one burst
    await primary.wait_for(Command.SEND, 1)
    await trio.sleep(1.0)
    assert running.session.confirmations.waiting is not None

    primary.reachable = False
    await primary.link.drop("reset")
    await app.wait_closed()
    (outcome,) = app.events("OUTCOME")
    assert [(f["receipt"], f["outcome"]) for f in outcome["frames"]] == [
        ("r1", "unknown"),
        ("r2", "lost"),
        ("r3", "lost"),
    ]
    assert app.events("DISCONNECT")[0]["frames_lost"] == ["r1", "r2", "r3"]
    assert "3 frame(s) not confirmed" in (app.errors()[0].get("message") or "")
    assert len(primary.link.received(Command.SEND)) == 1
