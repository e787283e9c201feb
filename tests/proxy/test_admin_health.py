"""Readiness: the pure verdict (evaluate_readiness) and the background BrokerProber.

No real I/O here: the prober gets a scripted probe function and runs on the autojump clock,
so "every 5 s" takes no wall time (docs/architecture.md, "Tests never sleep on the real clock").
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import pytest
import trio
import trio.testing

from config import Broker, Config, Secret
from proxy.admin.health import BrokerProber, evaluate_readiness, stuck_for
from proxy.telemetry.metrics import Metrics
from proxy.telemetry.statistics import (
    BrokerHealth,
    OutboxStatistics,
    Readiness,
    SessionStatistics,
)
from proxy.telemetry.vocabulary import ProbeOutcome
from proxy.tracking.window import WindowStatistics

A = Broker("127.0.0.1", 61001)
B = Broker("127.0.0.1", 61002)

#: Statistics fields readiness reads when the session code provides them; tests set them
#: whether or not SessionStatistics has them yet (a subclass adds the missing ones).
FUTURE_FIELDS: dict[str, object] = {"reconnecting_for": None, "oldest_unconfirmed_age": None}


def _placeholder(annotation: object) -> object:
    # A type where the class is compiled (mypyc keeps the evaluated annotations), else text.
    text = annotation.__name__ if isinstance(annotation, type) else str(annotation)
    if "None" in text:
        return None
    for name, value in (("int", 0), ("float", 0.0), ("bool", False), ("str", ""), ("tuple", ())):
        if text.startswith(name):
            return value
    return None


def _stats_class() -> type[SessionStatistics]:
    have = {f.name for f in dataclasses.fields(SessionStatistics)}
    missing = [
        (name, object, dataclasses.field(default=default))
        for name, default in FUTURE_FIELDS.items()
        if name not in have
    ]
    if not missing:
        return SessionStatistics
    cls: type[SessionStatistics] = dataclasses.make_dataclass(
        "FutureSessionStatistics", missing, bases=(SessionStatistics,), frozen=True
    )
    return cls


_STATS = _stats_class()


def _build(cls: type[Any], values: dict[str, Any]) -> Any:
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            kwargs[f.name] = _placeholder(f.type)
    kwargs.update(values)
    return cls(**kwargs)


def session_stats(
    session_id: str = "s-1",
    state: str = "running",
    broker: str | None = A.label,
    *,
    window_frames: int = 0,
    window_bytes: int = 0,
    **values: Any,
) -> SessionStatistics:
    """A SessionStatistics with the given values and neutral placeholders elsewhere."""
    window = _build(WindowStatistics, {"frames": window_frames, "bytes": window_bytes})
    stats: SessionStatistics = _build(
        _STATS,
        {"session_id": session_id, "state": state, "broker": broker, "window": window, **values},
    )
    return stats


def config(*brokers: Broker, **values: Any) -> Config:
    return Config(brokers=brokers or (A,), **values)


def health(broker: Broker, state: str, detail: str = "") -> BrokerHealth:
    return BrokerHealth(broker.label, state, 1.0, 1.0, None, detail, 1, 0)


# --------------------------------------------------------------------------------------
# evaluate_readiness (pure)


def test_ready_with_one_broker_up() -> None:
    verdict = evaluate_readiness(
        brokers=[health(A, "down", "refused"), health(B, "up")],
        sessions=[session_stats()],
        call_timeout=30.0,
    )
    assert verdict == Readiness(True, (), (B.label,))
    assert verdict.text() == f"ready: broker(s) reachable: {B.label}\n"


def test_not_ready_names_every_broker_and_why() -> None:
    verdict = evaluate_readiness(
        brokers=[health(A, "down", "connection refused"), health(B, "unknown")],
        sessions=[],
        call_timeout=30.0,
    )
    assert not verdict.ready
    assert verdict.reasons == (
        f"broker {A.label}: unreachable: connection refused",
        f"broker {B.label}: not checked yet",
    )
    assert verdict.text().startswith("not ready:\n- broker ")


def test_not_ready_without_brokers_and_while_shutting_down() -> None:
    verdict = evaluate_readiness(brokers=[], sessions=[], call_timeout=1.0, shutting_down=True)
    assert verdict.reasons == ("shutting down: draining sessions", "no brokers configured")


@pytest.mark.parametrize(
    ("values", "stuck"),
    [
        ({}, False),
        ({"reconnecting_for": 29.0}, False),
        ({"reconnecting_for": 31.0}, True),
        ({"oldest_unconfirmed_age": 30.5}, True),
        ({"oldest_unconfirmed_age": 2.0, "reconnecting_for": 40.0}, True),
    ],
)
def test_a_session_stuck_beyond_call_timeout_makes_it_not_ready(
    values: dict[str, Any], stuck: bool
) -> None:
    s = session_stats("s-9", "reconnecting", **values)
    verdict = evaluate_readiness(brokers=[health(A, "up")], sessions=[s], call_timeout=30.0)
    assert verdict.ready is not stuck
    if stuck:
        (reason,) = verdict.reasons
        assert reason.startswith(f"session s-9 (reconnecting, broker {A.label}) stuck for ")
        assert "call_timeout 30 s" in reason


def outbox_stats(held: int = 0, max_bytes: int = 1000, room_waiters: int = 0) -> OutboxStatistics:
    return OutboxStatistics(
        frames=held // 100,
        bytes=held,
        max_bytes=max_bytes,
        oldest_age_seconds=None,
        sessions=1 if held else 0,
        forwarded_total=0,
        commits=0,
        recovered_frames=0,
        recovery_problems=(),
        room_waiters=room_waiters,
    )


def test_outbox_mode_is_ready_with_no_broker_and_sessions_reconnecting() -> None:
    """Outbox mode: the sidecar serves apps with no broker up, so neither the brokers nor
    sessions reconnecting (without end) longer than call_timeout take it out of service."""
    verdict = evaluate_readiness(
        brokers=[health(A, "down", "connection refused"), health(B, "unknown")],
        sessions=[session_stats("s-9", "reconnecting", None, reconnecting_for=600.0)],
        call_timeout=30.0,
        outbox_mode=True,
        outbox=outbox_stats(held=300),
    )
    assert verdict.ready
    assert verdict.brokers_up == ()
    assert verdict.text() == (
        "ready: no broker reachable: SENDs are stored in the outbox; "
        "outbox: 3 frame(s), 300 of 1000 bytes (outbox_max_bytes)\n"
    )


def test_outbox_mode_with_a_broker_up_names_both_and_counts_stuck_sessions() -> None:
    verdict = evaluate_readiness(
        brokers=[health(A, "up")],
        sessions=[session_stats()],
        call_timeout=30.0,
        outbox_mode=True,
        outbox=outbox_stats(),
    )
    assert verdict.text() == (
        f"ready: broker(s) reachable: {A.label}; outbox: 0 frame(s), 0 of 1000 bytes "
        "(outbox_max_bytes)\n"
    )
    stuck = session_stats("s-9", "running", oldest_unconfirmed_age=31.0)
    verdict = evaluate_readiness(
        brokers=[health(A, "up")],
        sessions=[stuck],
        call_timeout=30.0,
        outbox_mode=True,
        outbox=outbox_stats(),
    )
    assert not verdict.ready
    assert verdict.reasons[0].startswith("session s-9 (running")


@pytest.mark.parametrize("broker_state", ["up", "down"])
@pytest.mark.parametrize(
    ("stats", "reason"),
    [
        (None, "outbox not open (outbox_dir)"),
        (outbox_stats(held=1000), "outbox full: 1000 bytes held, outbox_max_bytes 1000"),
        (
            outbox_stats(held=1200),  # recovered over a smaller bound
            "outbox full: 1200 bytes held, outbox_max_bytes 1000",
        ),
        (
            outbox_stats(held=900, room_waiters=2),
            "outbox full: 2 append(s) waiting for room (900 of outbox_max_bytes 1000 bytes held)",
        ),
    ],
)
def test_outbox_mode_is_not_ready_when_the_outbox_is_closed_or_full(
    broker_state: str, stats: OutboxStatistics | None, reason: str
) -> None:
    verdict = evaluate_readiness(
        brokers=[health(A, broker_state, "connection refused")],
        sessions=[],
        call_timeout=30.0,
        outbox_mode=True,
        outbox=stats,
    )
    assert verdict.reasons == (reason,)
    assert verdict.text() == f"not ready:\n- {reason}\n"


def test_outbox_mode_while_shutting_down_is_not_ready() -> None:
    verdict = evaluate_readiness(
        brokers=[],
        sessions=[],
        call_timeout=30.0,
        shutting_down=True,
        outbox_mode=True,
        outbox=outbox_stats(),
    )
    assert verdict.reasons == ("shutting down: draining sessions",)


def test_outbox_mode_while_shutting_down_says_the_outbox_is_forwarded_before_exit() -> None:
    """SIGTERM in outbox mode: sessions draining, then the outbox forwarded until it is empty
    or the drain deadline; /readyz names what is left and the time left."""
    stats = dataclasses.replace(outbox_stats(held=4200, max_bytes=10_000), drain_left_seconds=3.25)
    forwarding = (
        "shutting down: forwarding the outbox before exit: 42 frame(s) left, until it is "
        "empty or the drain deadline, 3.2 s (drain_timeout)"
    )
    verdict = evaluate_readiness(
        brokers=[health(A, "up", "")],
        sessions=[],
        call_timeout=30.0,
        shutting_down=True,
        outbox_mode=True,
        outbox=stats,
    )
    assert verdict.reasons == (forwarding,)
    with_sessions = evaluate_readiness(
        brokers=[health(A, "up", "")],
        sessions=[session_stats("s1")],
        call_timeout=30.0,
        shutting_down=True,
        outbox_mode=True,
        outbox=stats,
    )
    assert with_sessions.reasons == ("shutting down: draining sessions", forwarding)


def test_without_the_outbox_its_statistics_change_nothing() -> None:
    verdict = evaluate_readiness(
        brokers=[health(A, "down", "connection refused")],
        sessions=[],
        call_timeout=30.0,
        outbox=outbox_stats(held=1000),
    )
    assert verdict.reasons == (f"broker {A.label}: unreachable: connection refused",)


def test_stuck_for_takes_the_larger_age() -> None:
    assert stuck_for(session_stats()) == 0.0
    assert stuck_for(session_stats(reconnecting_for=3.0, oldest_unconfirmed_age=7.5)) == 7.5


# --------------------------------------------------------------------------------------
# BrokerProber (autojump clock, scripted probe)


Script = Callable[[Broker], tuple[ProbeOutcome, str]]


def scripted(script: Script, calls: list[tuple[float, str]]) -> Any:
    async def probe(broker: Broker) -> tuple[ProbeOutcome, str]:
        calls.append((trio.current_time(), broker.label))
        await trio.sleep(0.5)  # a probe takes time; requests never wait for it
        return script(broker)

    return probe


async def run_prober(
    prober: BrokerProber, seconds: float, check: Callable[[], None] | None = None
) -> None:
    async with trio.open_nursery() as nursery:
        await nursery.start(prober.run)
        await trio.sleep(seconds)
        if check is not None:
            check()
        nursery.cancel_scope.cancel()


async def test_prober_checks_every_broker_every_interval(
    autojump_clock: trio.testing.MockClock,
) -> None:
    calls: list[tuple[float, str]] = []
    metrics = Metrics(brokers=[A.label, B.label])
    prober = BrokerProber(
        config(A, B, broker_probe_interval=5000),
        lambda: (),
        metrics=metrics,
        probe=scripted(
            lambda b: (
                (ProbeOutcome.CONNECTED, "ok")
                if b is A
                else (ProbeOutcome.FAILED, "connection refused")
            ),
            calls,
        ),
    )
    start = trio.current_time()
    assert [h.state for h in prober.statistics()] == ["unknown", "unknown"]
    await run_prober(prober, 12.0)
    # t = 0, 5.5, 11 (each probe takes 0.5 s, then the interval)
    assert [round(t - start, 1) for t, b in calls if b == A.label] == [0.0, 5.5, 11.0]
    a, b = prober.statistics()
    assert (a.state, a.checks, a.failures, a.last_outcome) == ("up", 3, 0, ProbeOutcome.CONNECTED)
    assert (b.state, b.checks, b.failures, b.detail) == ("down", 3, 3, "connection refused")
    assert prober.first_round_done.is_set()
    value = metrics.registry.get_sample_value(
        "mq_sidecar_broker_probes_total", {"broker": B.label, "outcome": "failed"}
    )
    assert value == 3.0


async def test_a_live_session_leg_is_proof_enough(autojump_clock: trio.testing.MockClock) -> None:
    calls: list[tuple[float, str]] = []
    sessions: list[SessionStatistics] = [session_stats(state="running", broker=A.label)]
    prober = BrokerProber(
        config(A), lambda: sessions, probe=scripted(lambda b: (ProbeOutcome.FAILED, "x"), calls)
    )

    def check() -> None:
        (h,) = prober.statistics()
        assert (h.state, h.last_outcome) == ("up", ProbeOutcome.LIVE_SESSION)

    await run_prober(prober, 11.0, check)
    assert calls == []  # no extra connection while the session's leg is live
    sessions[:] = [session_stats(state="reconnecting", broker=A.label)]
    await run_prober(prober, 1.0)
    assert len(calls) == 1  # a reconnecting session proves nothing: probe


async def test_the_sidecars_live_leg_check_is_used_instead_of_statistics(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """With ``live_leg`` (the sidecar's cheap check), ``sessions()`` is not read for it."""
    calls: list[tuple[float, str]] = []
    live = {A.label}

    def no_statistics() -> tuple[SessionStatistics, ...]:
        raise AssertionError("the prober built every session's statistics")

    prober = BrokerProber(
        config(A),
        no_statistics,
        probe=scripted(lambda b: (ProbeOutcome.FAILED, "x"), calls),
        live_leg=lambda label: label in live,
    )
    await run_prober(prober, 11.0)
    assert calls == []
    assert prober.statistics()[0].last_outcome is ProbeOutcome.LIVE_SESSION
    live.clear()
    await run_prober(prober, 1.0)
    assert len(calls) == 1


@pytest.mark.parametrize(
    ("own_credentials", "state"),
    [(False, "up"), (True, "down")],
    ids=["app-credentials", "sidecar-credentials"],
)
async def test_refused_counts_as_an_answer_unless_our_credentials_were_refused(
    autojump_clock: trio.testing.MockClock, own_credentials: bool, state: str
) -> None:
    extra: dict[str, Any] = {"login": "svc", "passcode": Secret("pw")} if own_credentials else {}
    prober = BrokerProber(
        config(A, **extra),
        lambda: (),
        probe=scripted(lambda b: (ProbeOutcome.REFUSED, "access refused"), []),
    )

    def check() -> None:
        (h,) = prober.statistics()
        assert h.state == state

    await run_prober(prober, 1.0, check)


async def test_a_stale_answer_is_down(autojump_clock: trio.testing.MockClock) -> None:
    gate = trio.Event()
    answered = 0

    async def probe(broker: Broker) -> tuple[ProbeOutcome, str]:
        nonlocal answered
        if answered:
            await gate.wait()  # the second probe hangs (connect_timeout bounds it for real)
        answered += 1
        return ProbeOutcome.CONNECTED, "ok"

    prober = BrokerProber(
        config(A, broker_probe_interval=1000, connect_timeout=1000), lambda: (), probe=probe
    )
    assert prober.stale_after == 4.0

    def check() -> None:
        (h,) = prober.statistics()
        assert h.state == "down"
        assert h.detail == "no answer for 6.0 s (last: ok)"

    await run_prober(prober, 6.0, check)


async def test_a_probe_bug_is_logged_and_counts_as_unreachable(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    async def probe(broker: Broker) -> tuple[ProbeOutcome, str]:
        raise RuntimeError("bug")

    prober = BrokerProber(config(A), lambda: (), probe=probe)

    def check() -> None:
        (h,) = prober.statistics()
        assert (h.state, h.detail) == ("down", "probe error: RuntimeError")

    with caplog.at_level(logging.ERROR, logger="mq_sidecar.health"):
        await run_prober(prober, 1.0, check)
    assert "readiness probe failed" in caplog.text


def test_prober_without_brokers_is_done_at_once() -> None:
    prober = BrokerProber(Config(), lambda: ())
    assert prober.first_round_done.is_set()


async def test_reachability_changes_are_logged_once(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    outcomes = iter([ProbeOutcome.CONNECTED] * 3 + [ProbeOutcome.FAILED] * 3)

    async def probe(broker: Broker) -> tuple[ProbeOutcome, str]:
        outcome = next(outcomes, ProbeOutcome.CONNECTED)
        return outcome, "ok" if outcome is ProbeOutcome.CONNECTED else "connection refused"

    prober = BrokerProber(config(A, broker_probe_interval=1000), lambda: (), probe=probe)
    with caplog.at_level(logging.INFO, logger="mq_sidecar.health"):
        await run_prober(prober, 7.5)
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", f"broker {A.label} reachable: ok"),
        ("WARNING", f"broker {A.label} unreachable: connection refused"),
        ("INFO", f"broker {A.label} reachable: ok"),
    ]
    assert all(r.__dict__["broker"] == A.label for r in caplog.records)
