"""The control channel's scope rule on scripted brokers and the mock clock: every session's
events (``mq-sidecar-scope:all``) only for an app that presented the sidecar's own
``client_login``; any other app gets an ERROR naming the rule, keeps its session, and still gets
its own session's events (docs/behaviour.md, "Control channel").

The same through a sidecar in front of a real ActiveMQ is in tests/integration/test_admin_auth.py.
"""

from __future__ import annotations

import trio

from config import Secret
from protocol import Command
from proxy.telemetry.events import EventKind, SessionEvent
from tests.proxy.scripted_broker import (
    EVENTS,
    AppClient,
    Network,
    Running,
    make_config,
    start_session,
)

SCOPE_ALL = {"destination": EVENTS, "id": "all", "ack": "auto", "mq-sidecar-scope": "all"}


def other_session_event() -> SessionEvent:
    return SessionEvent(EventKind.FAILOVER, "other-9", "broker closed the connection")


async def subscribe(app: AppClient, receipt: str, **headers: str) -> None:
    await app.send(Command.SUBSCRIBE, {**headers, "receipt": receipt})


def refusals(running: Running) -> float:
    value = running.session.core.metrics.registry.get_sample_value(
        "mq_sidecar_client_protocol_errors_total", {"reason": "invalid_request"}
    )
    assert value is not None
    return value


async def test_scope_all_without_client_login_is_refused_and_the_session_goes_on(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """No ``client_login`` configured: nobody may see other sessions' events. The
    SUBSCRIBE gets an ERROR (with its receipt id) naming the rule, is not taken, and never
    goes upstream; the app keeps its session and its own events."""
    broker = network.add("broker", 61001)
    running = await start_session(nursery, network, make_config(broker))
    app = running.app
    assert (await app.connect(login="app", passcode="pw")).command is Command.CONNECTED
    await subscribe(app, "r-all", **SCOPE_ALL)
    error = await app.wait_error()
    assert error.get("message") == "mq-sidecar-scope:all needs the sidecar's client_login"
    assert error.get("receipt-id") == "r-all"
    assert b"this session's own events" in error.body
    assert refusals(running) == 1
    # The session goes on: its own events on a subscription without the scope.
    await subscribe(app, "r-own", destination=EVENTS, id="own", ack="auto")
    await app.wait_receipt("r-own")
    assert "r-all" not in app.receipt_ids()
    running.session.core.bus.publish(other_session_event())
    await broker.link.drop()
    assert (await app.wait_event("FAILOVER"))["session_id"] == "s1"
    assert [f.get("subscription") for f in app.messages(EVENTS)] == ["own", "own"]
    assert all(e["session_id"] == "s1" for e in app.events())
    assert running.session.statistics().state == "running"
    assert not [f for f in broker.frames() if f.get("destination") == EVENTS]


async def test_scope_all_for_an_app_with_the_sidecars_client_login(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    broker = network.add("broker", 61001)
    config = make_config(broker, client_login="ops", client_passcode=Secret("ops-pw"))
    running = await start_session(nursery, network, config)
    app = running.app
    assert (await app.connect(login="ops", passcode="ops-pw")).command is Command.CONNECTED
    await subscribe(app, "r-all", **SCOPE_ALL)
    await app.wait_receipt("r-all")
    running.session.core.bus.publish(other_session_event())
    event = await app.wait_event("FAILOVER")
    assert event["session_id"] == "other-9"
    assert app.errors() == []
    assert refusals(running) == 0
