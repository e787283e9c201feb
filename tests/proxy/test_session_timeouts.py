"""Session: call_timeout, the confirmation window's backpressure and heart-beat timeouts, on
scripted brokers and the mock clock (durations in the config are milliseconds)."""

from __future__ import annotations

import itertools

import trio

from protocol import Command
from proxy.tracking.window import frame_size
from tests.proxy.scripted_broker import (
    Network,
    Running,
    ScriptedBroker,
    make_config,
    start_session,
    wait_until,
)

QUEUE = "/queue/orders"


async def connected(
    nursery: trio.Nursery,
    network: Network,
    *brokers: ScriptedBroker,
    lockstep: bool = False,
    **config: object,
) -> Running:
    """A running session whose app is CONNECTED and subscribed to the control channel."""
    running = await start_session(
        nursery, network, make_config(*brokers, **config), lockstep=lockstep
    )
    assert (await running.app.connect()).command is Command.CONNECTED
    await running.app.subscribe_events()
    return running


# -- call_timeout -------------------------------------------------------------------------------


async def test_a_receipt_the_broker_never_sends_ends_in_an_error_after_call_timeout(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """A SEND the broker took but does not confirm: after ``call_timeout`` (1000 ms) the app
    gets an ERROR with that receipt-id, and nothing more when the RECEIPT comes late (each
    app receipt is answered once). The session goes on."""
    broker = network.add("broker", 61001)
    running = await connected(nursery, network, broker, call_timeout=1000)
    app = running.app
    broker.receipts = "hold"
    sent_at = trio.current_time()
    await app.send(Command.SEND, {"destination": QUEUE, "receipt": "r1"}, b"x")

    error = await app.wait_error()
    waited = app.arrival(lambda f: f.command is Command.ERROR) - sent_at
    assert 1.0 <= waited < 1.1
    assert error.get("receipt-id") == "r1"
    assert error.get("message") == "SEND not confirmed by the broker within 1000 ms"
    assert b"it may still be" in error.body
    assert running.session.statistics().state == "running"

    await broker.link.release()  # the broker confirms at last
    await trio.sleep(5)
    assert app.receipt_ids() == ["events-sub"]
    assert len(app.errors()) == 1
    stats = running.session.statistics()
    assert stats.pending_receipts == 0
    assert stats.window is not None
    assert stats.window.frames == 0

    broker.receipts = "auto"
    await app.send(Command.SEND, {"destination": QUEUE, "receipt": "r2"}, b"y")
    await app.wait_receipt("r2")
    assert app.closed is False


async def test_a_frame_handed_over_while_reconnecting_times_out_and_is_dropped(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """A SEND the app hands over while every broker is down: after ``call_timeout`` the app
    gets an ERROR "while reconnecting" saying it was never sent, and it is dropped: the broker
    that comes back later never gets it, while the app's next SEND goes through."""
    broker = network.add("broker", 61001)
    running = await connected(nursery, network, broker, call_timeout=1000)
    app = running.app
    broker.reachable = False
    await broker.link.drop("reset")
    await app.wait_event("RECONNECTING")

    sent_at = trio.current_time()
    await app.send(Command.SEND, {"destination": QUEUE, "receipt": "r1"}, b"never")
    error = await app.wait_error()
    waited = app.arrival(lambda f: f.command is Command.ERROR) - sent_at
    assert 1.0 <= waited < 1.1
    assert error.get("receipt-id") == "r1"
    assert error.get("message") == "SEND not confirmed while reconnecting within 1000 ms"
    assert b"it was never sent and is dropped" in error.body
    assert running.session.statistics().state == "reconnecting"

    broker.reachable = True
    failover = await app.wait_event("FAILOVER")
    assert failover["replayed_frames"] == 0
    await app.send(Command.SEND, {"destination": QUEUE, "receipt": "r2"}, b"after")
    await app.wait_receipt("r2")
    await trio.sleep(5)
    assert [f.body for f in broker.links[1].received(Command.SEND)] == [b"after"]
    assert app.receipt_ids() == ["events-sub", "r2"]
    assert len(app.errors()) == 1


async def test_a_frame_sent_to_a_lost_broker_times_out_in_doubt_and_is_not_replayed(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """A SEND written to a broker that was lost before confirming it, with no broker back
    within ``call_timeout``: the app gets an ERROR saying it may have taken effect, and it is
    not replayed once a broker is back (the app was told; a replay could double it)."""
    broker = network.add("broker", 61001)
    running = await connected(nursery, network, broker, call_timeout=1000)
    app = running.app
    broker.receipts = "hold"
    sent_at = trio.current_time()
    await app.send(Command.SEND, {"destination": QUEUE, "receipt": "r1"}, b"maybe")
    await broker.wait_for(Command.SEND)
    broker.reachable = False
    await broker.link.drop("close")

    error = await app.wait_error()
    waited = app.arrival(lambda f: f.command is Command.ERROR) - sent_at
    assert 1.0 <= waited < 1.1
    assert error.get("receipt-id") == "r1"
    assert error.get("message") == "SEND not confirmed while reconnecting within 1000 ms"
    assert b"it reached a broker that was lost before confirming it" in error.body
    assert b"not replayed" in error.body

    broker.reachable = True
    broker.receipts = "auto"
    failover = await app.wait_event("FAILOVER")
    await trio.sleep(5)
    assert failover["replayed_frames"] == 0
    assert broker.links[1].received(Command.SEND) == []
    assert app.receipt_ids() == ["events-sub"]
    assert len(app.errors()) == 1


# -- the confirmation window --------------------------------------------------------------------


async def test_a_full_window_stops_reading_the_app_until_receipts_make_room(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """With a 1000-byte window and a broker holding its receipts, the session takes SENDs
    until the window is full, then stops reading the app: the app's writes block (a lockstep
    stream: a write returns only when the session reads it), the broker gets nothing more,
    the window stays within its bound. Each batch of receipts released lets the next SENDs
    through; in the end every SEND reached the broker once, in order, and every RECEIPT the
    app."""
    broker = network.add("broker", 61001)
    running = await connected(
        nursery, network, broker, lockstep=True, confirmation_window_size=1000
    )
    app, session = running.app, running.session
    broker.receipts = "hold"
    total = 20
    body = b"x" * 200

    async def produce() -> None:
        for i in range(total):
            await app.send(Command.SEND, {"destination": QUEUE, "receipt": f"r{i}"}, body)

    nursery.start_soon(produce)
    batches: list[int] = []
    for _ in range(total):  # bounded: each round lets at least one SEND through
        await trio.sleep(5)  # the session is as far as it gets
        stats = session.statistics()
        assert stats.window is not None
        in_window = len(broker.link.held)
        n_sent = len(broker.link.received(Command.SEND))
        assert stats.window.frames == in_window
        assert stats.window.bytes <= 1000
        if n_sent == total:
            break
        # Stopped: the broker has what fits, the session read one SEND more (waiting for
        # room) and the app's next write is blocked.
        assert 0 < in_window < total
        assert stats.frames_from_app == 2 + n_sent + 1  # CONNECT, SUBSCRIBE, SENDs, the waiting one
        assert app.writes_done == stats.frames_from_app
        batches.append(in_window)
        await broker.link.release()
    await broker.link.release()
    await app.wait_receipt(f"r{total - 1}")

    sends = broker.link.received(Command.SEND)
    # The window filled again and again, each time with as many SENDs as fit in its bytes
    # (counted without the receipt header the window adds).
    fit = 1000 // frame_size(sends[0].without("receipt"))
    assert fit >= 2
    assert batches == [fit] * (total // fit)
    assert [f.get("mq-sidecar-id") for f in sends] == [f"s1-{i + 1}" for i in range(total)]
    assert app.receipt_ids() == ["events-sub", *(f"r{i}" for i in range(total))]
    assert app.errors() == []


# -- heart-beats --------------------------------------------------------------------------------


async def test_an_idle_leg_beats_every_cx_and_promises_the_broker_twice_that(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """upstream_heartbeat 1000,1000: an idle leg writes a beat every 1000 ms (``cx``) and its
    CONNECT promises the broker one every 2000 ms (proxy.legs.connect_frame.UPSTREAM_SEND_SHARE),
    so a broker that judges the promise with no tolerance (ActiveMQ) does not find the leg
    silent when a beat runs late."""
    broker = network.add("broker", 61001, heart_beat="500,1000")
    await connected(nursery, network, broker, upstream_heartbeat=(1000, 1000))
    assert broker.link.frames[0].get("heart-beat") == "2000,500"
    start = trio.current_time()
    await trio.sleep(10)
    beats = [t - start for t in broker.link.beats if t >= start]
    gaps = [b - a for a, b in itertools.pairwise([0.0, *beats])]
    assert 9 <= len(beats) <= 11
    assert max(gaps) <= 1.0 + 1e-6


async def test_a_silent_broker_is_found_by_heartbeat_and_the_session_reconnects(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """upstream_heartbeat 1000,1000 (the sidecar asks the broker for beats every 500 ms and
    judges silence by 1000 ms x grace 2.0): a broker that beats keeps the link for 30 s; one
    that goes silent (stops reading and writing, socket open) is declared dead 2 s after its
    last beat, and the session reconnects (reattach on a new link) and carries on."""
    broker = network.add("broker", 61001, heart_beat="500,0")
    running = await connected(nursery, network, broker, upstream_heartbeat=(1000, 1000))
    app = running.app
    connect = broker.link.frames[0]
    assert connect.get("heart-beat") == "2000,500"

    await trio.sleep(30)
    assert len(broker.links) == 1
    assert app.events() == []

    silent_at = trio.current_time()
    broker.link.go_silent()
    event = await app.wait_event("RECONNECTING")
    detected = app.arrival(lambda f: f.get("event") == "RECONNECTING") - silent_at
    assert 1.5 <= detected <= 2.0  # the last beat came up to 500 ms before the silence
    assert event["reason"].startswith("broker silent: no data for 2.0 s")
    failover = await app.wait_event("FAILOVER")
    assert failover["reattached"] is True
    assert len(broker.links) == 2
    assert broker.links[0].closed is False  # still silent: nobody tells it anything

    await app.send(Command.SEND, {"destination": QUEUE, "receipt": "r1"}, b"on")
    await app.wait_receipt("r1")
    await wait_until(lambda: running.session.statistics().failovers == 1)
    assert running.session.statistics().state == "running"
