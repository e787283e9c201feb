"""``max_sessions``: the connection beyond it gets no Session, only an ERROR naming the option
in answer to its CONNECT (or after ``handshake_timeout`` without one), then the close; counted
in ``mq_sidecar_sessions_refused_total`` and logged at most once a minute.

App connections are trio memory streams handed to the sidecar's per-connection task, on the
autojump clock; the apps never get as far as a broker (the sessions that are let in wait for
their CONNECT). The same with stomp.py through a sidecar in front of a real ActiveMQ is in
tests/integration/test_admin_auth.py.
"""

from __future__ import annotations

import logging

import pytest
import trio
import trio.testing

import proxy.app
from config import Broker, Config
from protocol import Command
from proxy.app import Sidecar
from tests.proxy.scripted_broker import AppClient, wait_until

CONNECT = {"accept-version": "1.2", "host": "/", "heart-beat": "0,0"}
MESSAGE = "too many sessions: max_sessions (2) reached"


def refused(sidecar: Sidecar) -> float:
    value = sidecar.registry.get_sample_value("mq_sidecar_sessions_refused_total")
    assert value is not None
    return value


def make_sidecar(**values: object) -> Sidecar:
    base: dict[str, object] = {
        "brokers": (Broker("127.0.0.1", 1),),
        "max_sessions": 2,
        "handshake_timeout": 600_000,
    }
    base.update(values)
    return Sidecar(Config(**base))  # type: ignore[arg-type]


def connect_app(sidecar: Sidecar, nursery: trio.Nursery) -> AppClient:
    """A new app connection, served by the sidecar's per-connection task; its reader runs."""
    app_end, sidecar_end = trio.testing.memory_stream_pair()
    nursery.start_soon(sidecar._run_session, sidecar_end)
    app = AppClient(app_end)
    nursery.start_soon(app.run_reader)
    return app


async def test_the_connection_over_max_sessions_gets_an_error_naming_the_option(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    sidecar = make_sidecar()
    first, _second = connect_app(sidecar, nursery), connect_app(sidecar, nursery)
    await wait_until(lambda: len(sidecar.sessions) == 2)
    third = connect_app(sidecar, nursery)
    answer = await third.connect()
    assert answer.command is Command.ERROR
    assert answer.get("message") == MESSAGE
    assert b"at most 2 app sessions at once (max_sessions)" in answer.body
    await third.wait_closed()
    assert third.frames == [answer]
    assert refused(sidecar) == 1
    # No Session was made for it: the two sessions are still the only ones.
    assert len(sidecar.sessions) == 2
    assert sidecar.sessions_total == 2
    # One session ends (its app leaves): the next connection is let in.
    await first.stream.aclose()
    await wait_until(lambda: len(sidecar.sessions) == 1)
    connect_app(sidecar, nursery)
    await wait_until(lambda: len(sidecar.sessions) == 2)
    assert sidecar.sessions_total == 3
    assert refused(sidecar) == 1


async def test_a_refused_connection_without_connect_is_cut_after_handshake_timeout(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    sidecar = make_sidecar(max_sessions=1, handshake_timeout=3000)
    connect_app(sidecar, nursery)
    await wait_until(lambda: len(sidecar.sessions) == 1)
    started = trio.current_time()
    silent = connect_app(sidecar, nursery)
    await silent.wait_closed()
    assert silent.closed_at is not None
    assert silent.closed_at - started == pytest.approx(3.0)
    (answer,) = silent.frames
    assert answer.get("message") == "too many sessions: max_sessions (1) reached"


async def test_a_refused_connection_is_never_read_past_a_small_frame(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    """A refused connection cannot make the sidecar buffer a large frame: past 64 KiB the
    refusal is answered (and the rest is never read)."""
    sidecar = make_sidecar(max_sessions=1)
    connect_app(sidecar, nursery)
    await wait_until(lambda: len(sidecar.sessions) == 1)
    big = connect_app(sidecar, nursery)
    await big.stream.send_all(b"SEND\ndestination:/queue/q\n\n" + b"x" * (1 << 20) + b"\x00")
    await big.wait_closed()
    assert [f.get("message") for f in big.frames] == ["too many sessions: max_sessions (1) reached"]
    oversized = connect_app(sidecar, nursery)
    await oversized.stream.send_all(b"CONNECT\nlogin:" + b"a" * 70000 + b"\n\n\x00")
    await oversized.wait_closed()
    assert [f.get("message") for f in oversized.frames] == [
        "too many sessions: max_sessions (1) reached"
    ]
    assert refused(sidecar) == 2


async def test_refusals_waiting_for_connect_are_bounded(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(proxy.app, "_MAX_REFUSING", 2)
    sidecar = make_sidecar(max_sessions=1)
    connect_app(sidecar, nursery)
    await wait_until(lambda: len(sidecar.sessions) == 1)
    waiting = [connect_app(sidecar, nursery) for _ in range(2)]
    await wait_until(lambda: refused(sidecar) == 2)
    flood = connect_app(sidecar, nursery)
    await flood.wait_closed()  # at once, without an answer
    assert flood.frames == []
    assert refused(sidecar) == 3
    assert not any(app.closed for app in waiting)
    answer = await waiting[0].connect()
    assert answer.get("message") == "too many sessions: max_sessions (1) reached"


async def test_refusals_are_logged_at_most_once_a_minute(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    caplog: pytest.LogCaptureFixture,
) -> None:
    sidecar = make_sidecar(max_sessions=1)
    connect_app(sidecar, nursery)
    await wait_until(lambda: len(sidecar.sessions) == 1)
    with caplog.at_level(logging.DEBUG, logger="mq_sidecar.app"):
        for _ in range(5):
            await connect_app(sidecar, nursery).connect()
        await trio.sleep(30)
        await connect_app(sidecar, nursery).connect()
        await trio.sleep(31)
        await connect_app(sidecar, nursery).connect()
    lines = [r.getMessage() for r in caplog.records if r.name == "mq_sidecar.app"]
    assert lines == [
        "refused an app connection: max_sessions (1) reached",
        "refused an app connection: max_sessions (1) reached; 5 more refused since the last "
        "such line",
    ]
    assert refused(sidecar) == 7
