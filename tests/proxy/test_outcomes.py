"""Frame outcomes (docs/behaviour.md, "Frame outcomes"): every app frame that did not end
plainly confirmed is named to its app in an OUTCOME event, by receipt id and ``mq-sidecar-id``,
with one outcome from :class:`proxy.telemetry.vocabulary.FrameOutcome`, the same word in the
sidecar's ERROR about it (``mq-sidecar-outcome``), in the log and in
``mq_sidecar_frame_outcomes_total{outcome}``. Scripted brokers and the mock clock."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import trio

from protocol import Command, Frame
from proxy.session.confirmations import WATCH_RECHECK
from proxy.telemetry.events import EventKind, FrameReport, SessionEvent
from proxy.telemetry.logs import OUTCOME_NAMES_PER_LINE, log_session_event
from proxy.telemetry.metrics import Metrics
from proxy.telemetry.vocabulary import DrainResult, FrameOutcome, OutcomeCause
from proxy.tracking import DUPLICATE_ID_HEADER
from tests.proxy.scripted_broker import (
    AppClient,
    Network,
    Running,
)
from tests.proxy.test_session_modes import connected, deliver_then_cut, open_dirty_transaction

QUEUE = "/queue/orders"
INBOX = "/queue/in"


def named(app: AppClient) -> list[tuple[Any, ...]]:
    """(command, receipt, mq-sidecar-id, outcome, cause) of every frame in OUTCOME events."""
    return [
        (f["command"], f["receipt"], f["mq_sidecar_id"], f["outcome"], f["cause"])
        for event in app.events("OUTCOME")
        for f in event["frames"]
    ]


def outcomes(running: Running, outcome: str) -> float | None:
    registry = running.session.core.metrics.registry
    return registry.get_sample_value("mq_sidecar_frame_outcomes_total", {"outcome": outcome})


# -- the vocabulary in metrics, events and logs --------------------------------------------------


def test_every_outcome_and_drain_result_is_exported_at_zero() -> None:
    """The dashboard and alert rules query ``{outcome="lost"}``, ``{outcome="unknown"}`` and
    ``{result="deadline"}`` before anything happened: every label value is there at 0."""
    registry = Metrics().registry
    for outcome in FrameOutcome:
        labels = {"outcome": outcome.value}
        assert registry.get_sample_value("mq_sidecar_frame_outcomes_total", labels) == 0
    for result in DrainResult:
        labels = {"result": result.value}
        assert registry.get_sample_value("mq_sidecar_drains_total", labels) == 0
    assert {o.value for o in FrameOutcome} >= {"replayed", "rolled_back", "unknown", "lost"}


def report(n: int, outcome: FrameOutcome = FrameOutcome.UNKNOWN) -> FrameReport:
    return FrameReport(
        command="SEND",
        receipt=f"r{n}" if n % 2 else None,
        mq_sidecar_id=f"s1-{n}",
        seq=n,
        transaction=None,
        outcome=outcome,
        cause=OutcomeCause.DRAIN_DEADLINE,
    )


def test_an_outcome_event_names_each_frame_in_its_json() -> None:
    event = SessionEvent(
        EventKind.OUTCOME, "s1", "why", from_broker="b:1", frames=(report(1), report(2))
    )
    body = event.to_dict()
    assert body["event"] == "OUTCOME"
    assert body["frames"] == [
        {
            "command": "SEND",
            "receipt": "r1",
            "mq_sidecar_id": "s1-1",
            "seq": 1,
            "transaction": None,
            "outcome": "unknown",
            "cause": "drain_deadline",
        },
        {
            "command": "SEND",
            "receipt": None,
            "mq_sidecar_id": "s1-2",
            "seq": 2,
            "transaction": None,
            "outcome": "unknown",
            "cause": "drain_deadline",
        },
    ]
    assert '"outcome": "unknown"' in event.to_json()
    assert report(1).label == "r1"
    assert report(2).label == "s1-2"
    assert report(1).describe() == "r1 (mq-sidecar-id s1-1): unknown"


def test_an_outcome_event_is_logged_naming_every_frame_on_bounded_lines(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Each frame is named in the log, at most OUTCOME_NAMES_PER_LINE a line; a warning, but
    for frames that were only replayed (a failover doing its job: info)."""
    n = OUTCOME_NAMES_PER_LINE + 5
    frames = tuple(report(i) for i in range(1, n + 1))
    with caplog.at_level(logging.INFO, logger="mq_sidecar.events"):
        log_session_event(SessionEvent(EventKind.OUTCOME, "s1", "drain", frames=frames))
        log_session_event(
            SessionEvent(
                EventKind.OUTCOME, "s1", "failover", frames=(report(1, FrameOutcome.REPLAYED),)
            )
        )
    first, second, replayed = caplog.records
    assert first.levelno == second.levelno == logging.WARNING
    assert first.getMessage().startswith(f"session s1: OUTCOME: {n} frame(s) ({n} unknown): drain")
    assert "r1 (mq-sidecar-id s1-1): unknown" in first.getMessage()
    assert second.getMessage().startswith("session s1: OUTCOME (continued): ")
    assert second.getMessage().count(": unknown") == 5
    assert replayed.levelno == logging.INFO
    assert first.__dict__["event"] == "OUTCOME"


# -- call_timeout -------------------------------------------------------------------------------


async def test_call_timeout_names_a_frame_on_the_live_leg_timed_out(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """A SEND the broker does not confirm within call_timeout: the ERROR carries its outcome
    (``timed_out``: it may still take effect) and its ``mq-sidecar-id``; an OUTCOME event
    names it too."""
    broker = network.add("broker", 61001)
    running = await connected(nursery, network, broker, call_timeout=1000)
    app = running.app
    broker.receipts = "hold"
    await app.send(Command.SEND, {"destination": QUEUE, "receipt": "r1"}, b"x")
    error = await app.wait_error()
    await app.wait_event("OUTCOME")
    assert error.get("receipt-id") == "r1"
    assert error.get("mq-sidecar-outcome") == "timed_out"
    assert error.get(DUPLICATE_ID_HEADER) == "s1-1"
    assert named(app) == [("SEND", "r1", "s1-1", "timed_out", "call_timeout")]
    assert outcomes(running, "timed_out") == 1


async def test_the_call_timeout_watch_ends_soon_after_the_last_receipt_is_answered(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """The watch runs while an app receipt waits and ends within WATCH_RECHECK of the last
    one answered, not call_timeout later: an idle session holds no task for it (memory of
    idle sessions, docs/architecture.md). A later receipt starts it again, and it still
    times out what the broker never confirms."""
    broker = network.add("broker", 61001)
    running = await connected(nursery, network, broker, call_timeout=30_000)
    app, confirmations = running.app, running.session.confirmations

    def watching() -> bool:
        return confirmations.watching

    await app.send(Command.SEND, {"destination": QUEUE, "receipt": "r1"}, b"x")
    await app.wait_receipt("r1")
    assert watching()
    await trio.sleep(WATCH_RECHECK + 0.1)
    assert not watching()
    broker.receipts = "hold"
    await app.send(Command.SEND, {"destination": QUEUE, "receipt": "r2"}, b"y")
    await broker.wait_for(Command.SEND, 2)
    assert watching()
    started = trio.current_time()
    error = await app.wait_error()
    assert error.get("receipt-id") == "r2"
    assert 30.0 <= trio.current_time() - started <= 30.0 + WATCH_RECHECK


async def test_call_timeout_while_reconnecting_names_unknown_and_lost_in_one_event(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """Reconnecting when call_timeout passes: the SEND the lost broker had is ``unknown``
    (it may have been stored), the one handed over during the outage ``lost`` (dropped, never
    sent); both were due at once: one OUTCOME event names both, each ERROR names its own."""
    broker = network.add("broker", 61001)
    running = await connected(nursery, network, broker, call_timeout=1000, reconnect_attempts=-1)
    app = running.app
    broker.receipts = "hold"
    await app.send(Command.SEND, {"destination": QUEUE, "receipt": "r1"}, b"x")
    await broker.wait_for(Command.SEND, 1)
    broker.reachable = False
    await broker.link.drop("reset")
    await app.wait_event("RECONNECTING")
    await app.send(Command.SEND, {"destination": QUEUE, "receipt": "r2"}, b"y")
    await app.wait_error(2)
    event = await app.wait_event("OUTCOME")
    assert len(app.events("OUTCOME")) == 1
    assert [(f["receipt"], f["outcome"]) for f in event["frames"]] == [
        ("r1", "unknown"),
        ("r2", "lost"),
    ]
    assert [e.get("mq-sidecar-outcome") for e in app.errors()] == ["unknown", "lost"]
    assert [e.get(DUPLICATE_ID_HEADER) for e in app.errors()] == ["s1-1", "s1-2"]
    assert (outcomes(running, "unknown"), outcomes(running, "lost")) == (1, 1)


# -- refusals -----------------------------------------------------------------------------------


async def test_a_broker_error_is_passed_on_unchanged_and_names_the_refused_frame(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """The broker's ERROR in answer to a SEND reaches the app unchanged but for its
    receipt-id (transparency: no header of the sidecar's); the OUTCOME event after it names
    the SEND by its mq-sidecar-id as ``refused``."""
    broker = network.add("broker", 61001)
    running = await connected(nursery, network, broker)
    app = running.app
    broker.receipts = "hold"
    await app.send(
        Command.SEND, {"destination": QUEUE, "receipt": "r1", DUPLICATE_ID_HEADER: "k1"}, b"x"
    )
    await broker.wait_for(Command.SEND, 1)
    (held,) = broker.link.held
    await broker.link.send(
        Frame(Command.ERROR, (("message", "no permission"), ("receipt-id", held)), b"denied")
    )
    error = await app.wait_error()
    await app.wait_event("OUTCOME")
    assert error.headers == (("message", "no permission"), ("receipt-id", "r1"))
    assert named(app) == [("SEND", "r1", "k1", "refused", "broker_error")]
    assert app.events("OUTCOME")[0]["reason"] == "the broker refused it: no permission"


async def test_a_stale_ack_refused_by_the_sidecar_is_named_refused(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """``strict`` mode: an ACK with an ack id from before the failover gets the sidecar's
    ERROR with ``mq-sidecar-outcome: refused`` and an OUTCOME event (a failed ACK is
    reported)."""
    broker = network.add("broker", 61001)
    running = await connected(nursery, network, broker, failover_mode="strict")
    app = running.app
    app_ack, _ = await deliver_then_cut(app, broker)
    await app.send(Command.ACK, {"id": app_ack, "receipt": "a1"})
    error = await app.wait_error()
    await app.wait_event("OUTCOME")
    assert error.get("mq-sidecar-outcome") == "refused"
    assert named(app)[-1] == ("ACK", "a1", None, "refused", "sidecar_error")


# -- failover -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("mode", "outcome"), [("transparent", "replayed"), ("strict", "lost")])
async def test_an_ack_in_flight_at_a_failover_is_named(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    network: Network,
    mode: str,
    outcome: str,
) -> None:
    """An ACK the lost broker never confirmed is not replayed (its delivery belonged to the old
    leg); its app still gets its RECEIPT. ``transparent``: the sidecar settles the redelivery
    when it comes (``replayed``); ``strict``: the message will be shown again, the ACK did
    not take effect (``lost``)."""
    broker = network.add("broker", 61001)
    running = await connected(nursery, network, broker, failover_mode=mode)
    app = running.app
    await app.send(
        Command.SUBSCRIBE,
        {"destination": INBOX, "id": "sub1", "ack": "client-individual", "receipt": "sub"},
    )
    await app.wait_receipt("sub")
    await broker.link.deliver(INBOX, b"hello", message_id="ID:m1")
    await app.signal.wait_until(lambda: len(app.messages(INBOX)) == 1)
    broker.receipts = "hold"
    await app.send(Command.ACK, {"id": app.messages(INBOX)[0].get("ack") or "", "receipt": "a1"})
    await broker.wait_for(Command.ACK, 1)
    await broker.link.drop("reset")
    await app.wait_receipt("a1")
    await app.wait_event("OUTCOME")
    assert named(app) == [("ACK", "a1", None, outcome, "failover")]


async def test_rollback_mode_names_the_frames_it_rolled_back_and_the_commit(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """``transaction_failover = rollback``: the unconfirmed SEND of the transaction is named
    ``rolled_back`` at the failover; the COMMIT's ERROR says ``rolled_back`` too, and so does
    the OUTCOME event about it."""
    primary = network.add("primary", 61001)
    backup = network.add("backup", 61002)
    running = await connected(nursery, network, primary, backup, transaction_failover="rollback")
    app = running.app
    await open_dirty_transaction(app, primary)
    primary.reachable = False
    await primary.link.drop("close")
    await app.wait_event("OUTCOME")
    assert named(app) == [("SEND", "s2", "s1-2", "rolled_back", "failover")]
    await app.send(Command.COMMIT, {"transaction": "tx1", "receipt": "c1"})
    error = await app.wait_error()
    await app.wait_event("OUTCOME", 2)
    assert error.get("mq-sidecar-outcome") == "rolled_back"
    assert named(app)[-1] == ("COMMIT", "c1", None, "rolled_back", "sidecar_error")
    assert app.events("OUTCOME")[1]["frames"][0]["transaction"] == "tx1"


async def test_a_commit_in_doubt_is_named_unknown(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """``rollback`` mode, the COMMIT sent and the leg lost before its receipt: an ERROR
    ``transaction outcome in doubt`` with ``mq-sidecar-outcome: unknown``, and the event."""
    primary = network.add("primary", 61001)
    backup = network.add("backup", 61002)
    running = await connected(nursery, network, primary, backup, transaction_failover="rollback")
    app = running.app
    await app.send(Command.BEGIN, {"transaction": "tx1", "receipt": "b1"})
    await app.wait_receipt("b1")
    primary.receipts = "hold"
    await app.send(Command.COMMIT, {"transaction": "tx1", "receipt": "c1"})
    await primary.wait_for(Command.COMMIT, 1)
    primary.reachable = False
    await primary.link.drop("close")
    error = await app.wait_error()
    await app.wait_event("OUTCOME")
    assert (error.get("message") or "").startswith("transaction outcome in doubt")
    assert error.get("mq-sidecar-outcome") == "unknown"
    assert named(app) == [("COMMIT", "c1", None, "unknown", "failover")]


async def test_frames_unconfirmed_when_the_app_disconnects_are_named(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """The app's DISCONNECT gets no receipt within call_timeout (the broker confirms
    nothing): the SEND before it is named ``unknown``, on the bus and in metrics."""
    broker = network.add("broker", 61001)
    running = await connected(nursery, network, broker, call_timeout=1000)
    app = running.app
    broker.receipts = "hold"
    with running.session.core.bus.subscribe() as events:
        await app.send(Command.SEND, {"destination": QUEUE}, b"x")
        await broker.wait_for(Command.SEND, 1)
        await app.send(Command.DISCONNECT, {"receipt": "bye"})
        await app.wait_closed()
        event = events.receive_nowait()
    assert event.kind is EventKind.OUTCOME
    assert [(f.mq_sidecar_id, f.outcome, f.cause) for f in event.frames] == [
        ("s1-1", "unknown", "app_disconnect")
    ]
    assert outcomes(running, "unknown") == 1


# -- every ending names what it leaves (issue 25 part 5) ---------------------------------------


def lost_total(running: Running) -> float | None:
    registry = running.session.core.metrics.registry
    return registry.get_sample_value("mq_sidecar_lost_frames_total")


async def test_frames_unconfirmed_when_the_broker_closes_after_an_error_are_named(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """RabbitMQ's ERROR ``not_found`` (a queue whose home node is down) is followed by its
    close, and the session ends with it: the ERROR's own SEND is ``refused``, the SENDs after
    it that the broker never confirmed are named ``unknown`` (cause ``broker_closed``) in an
    OUTCOME event before the end, and counted as lost."""
    broker = network.add("broker", 61001)
    running = await connected(nursery, network, broker)
    app = running.app
    broker.receipts = "hold"
    for n in range(3):
        await app.send(Command.SEND, {"destination": QUEUE, "receipt": f"r{n}"}, b"x")
    await broker.wait_for(Command.SEND, 3)
    first = broker.link.held[0]
    await broker.link.send(
        Frame(Command.ERROR, (("message", "not_found"), ("receipt-id", first)), b"home node down")
    )
    await broker.link.drop("close")
    await app.wait_closed()
    assert [(r, o, c) for _, r, _, o, c in named(app)] == [
        ("r0", "refused", "broker_error"),
        ("r1", "unknown", "broker_closed"),
        ("r2", "unknown", "broker_closed"),
    ]
    assert lost_total(running) == 2
    assert outcomes(running, "unknown") == 2


async def test_frames_unconfirmed_when_the_app_breaks_stomp_are_named_on_the_bus(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """Any other end (here the app's protocol error) names what it left unconfirmed too:
    cause ``session_ended``, on the bus, in the event and in the lost-frame count."""
    broker = network.add("broker", 61001)
    running = await connected(nursery, network, broker)
    app = running.app
    broker.receipts = "hold"
    with running.session.core.bus.subscribe() as events:
        await app.send(Command.SEND, {"destination": QUEUE, "receipt": "r1"}, b"x")
        await broker.wait_for(Command.SEND, 1)
        await app.stream.send_all(b"SEND\ndestination\n\nx\x00")  # a line without colon
        await app.wait_closed()
        kinds = []
        while True:
            try:
                event = events.receive_nowait()
            except trio.WouldBlock:
                break
            kinds.append(event)
    (outcome,) = [e for e in kinds if e.kind is EventKind.OUTCOME]
    assert [(f.receipt, f.outcome, f.cause) for f in outcome.frames] == [
        ("r1", "unknown", "session_ended")
    ]
    assert lost_total(running) == 1


async def test_a_drained_session_names_its_frames_once(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, network: Network
) -> None:
    """The drain names what is unconfirmed at its deadline; the end of the session after it
    names nothing again."""
    broker = network.add("broker", 61001)
    running = await connected(nursery, network, broker, drain_timeout=500)
    app = running.app
    broker.receipts = "hold"
    await app.send(Command.SEND, {"destination": QUEUE, "receipt": "r1"}, b"x")
    await broker.wait_for(Command.SEND, 1)
    running.session.request_drain()
    await app.wait_closed()
    assert [(r, c) for _, r, _, _, c in named(app)] == [("r1", "drain_deadline")]
    assert lost_total(running) == 1
