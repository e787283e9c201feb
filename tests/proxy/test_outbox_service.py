"""The outbox's daemon side (proxy/outbox/service.py, proxy/session/outbox.py) without a broker:
which
destinations are spooled, the stored form of a frame read back, the outbox opened and locked
by the Sidecar object, and the phase a session answered by the sidecar itself is in."""

from __future__ import annotations

from pathlib import Path

import pytest

import protocol
from config import Config
from protocol import Command, Frame
from proxy._errors import OutboxUnusable
from proxy.outbox import OutboxStore, StoredFrame
from proxy.outbox.frames import FETCH_FRAMES, STORED_VERSION, FetchSize, parse
from proxy.outbox.service import open_outbox
from proxy.session.phase import Phase, PhaseMachine
from proxy.telemetry.metrics import Metrics


def _config(directory: Path, **values: object) -> Config:
    return Config(outbox=True, outbox_dir=str(directory), **values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("patterns", "destination", "spooled"),
    [
        (None, "/queue/anything", True),
        (None, None, False),
        (("/queue/orders.*",), "/queue/orders.eu", True),
        (("/queue/orders.*",), "/queue/orders", False),
        (("/queue/orders.*",), "/topic/orders.eu", False),
        (("/queue/a", "/topic/*"), "/topic/x/y", True),  # fnmatch: * crosses "/"
        ((), "/queue/a", False),
    ],
)
async def test_outbox_destinations_are_fnmatch_patterns(
    tmp_path: Path, patterns: tuple[str, ...] | None, destination: str | None, spooled: bool
) -> None:
    async with open_outbox(_config(tmp_path, outbox_destinations=patterns)) as outbox:
        assert outbox.takes(destination) is spooled


def test_a_stored_frame_reads_back_equal() -> None:
    frame = Frame(
        Command.SEND,
        (("destination", "/queue/a"), ("mq-sidecar-id", "s-1"), ("x", "a:b\nc")),
        b"body\0with nul",
    )
    back = parse(protocol.serialize(frame, STORED_VERSION))
    assert back.command is Command.SEND
    assert back.body == frame.body
    assert back.get("x") == "a:b\nc"
    assert back.get("mq-sidecar-id") == "s-1"


def test_a_partial_frame_is_refused() -> None:
    with pytest.raises(protocol.RemoteProtocolError):
        parse(b"SEND\ndestination:/queue/a\n\nbody")


async def test_the_outbox_is_opened_locked_and_reports_its_state(tmp_path: Path) -> None:
    async with open_outbox(_config(tmp_path / "ob")) as outbox:
        stats = outbox.statistics()
        assert (stats.frames, stats.bytes, stats.forwarded_total) == (0, 0, 0)
        assert stats.recovery_problems == ()
        status = stats.status()
        assert status["recovery"] == {"frames": 0, "clean": True, "problems": []}
        with pytest.raises(OutboxUnusable, match="two sidecars cannot share one outbox_dir"):
            async with open_outbox(_config(tmp_path / "ob")):
                pass
    # Closed with the context: the directory can be opened again.
    with OutboxStore.open(tmp_path / "ob", max_bytes=1000) as store:
        assert store.frames == 0


async def test_an_unusable_directory_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(OutboxUnusable) as caught:
        async with open_outbox(_config(blocker / "ob")):
            pass
    assert str(caught.value).startswith(f"outbox_dir {blocker / 'ob'}: ")
    assert "\n" not in str(caught.value)


def test_a_session_answered_by_the_sidecar_starts_reconnecting() -> None:
    phases = PhaseMachine()
    phases.advance(Phase.RECONNECTING)
    phases.advance(Phase.RUNNING)
    assert phases.phase is Phase.RUNNING


def _read(count: int, size: int) -> tuple[StoredFrame, ...]:
    return tuple(
        StoredFrame(n, "k", n, f"id-{n}", "/queue/a", 0.0, b"x" * size) for n in range(count)
    )


def test_a_forwarder_reads_about_a_window_of_bytes_at_once() -> None:
    fetch = FetchSize(budget=10_000)
    assert fetch.frames == 1
    for expected in (2, 4, 8, 16):  # small frames: doubles after each full read
        fetch.update(_read(fetch.frames, 100))
        assert fetch.frames == expected
    fetch.update(_read(3, 100))  # a short read (the session had no more): stays
    assert fetch.frames == 16
    fetch.update(_read(16, 1000))  # 16,000 bytes: past the budget, halves
    assert fetch.frames == 8
    for _ in range(10):
        fetch.update(_read(fetch.frames, 50_000))  # each frame alone is past it: down to 1
    assert fetch.frames == 1
    for _ in range(20):
        fetch.update(_read(fetch.frames, 1))
    assert fetch.frames == FETCH_FRAMES  # never more


async def test_expired_frames_go_to_their_live_session_or_to_the_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """outbox_max_age: frames of a session key with a live listener are handed to it (the
    session names them to its app); those of a key without one are logged by mq-sidecar-id
    (20 named at most, then the count) and counted as outcomes here; all are counted as
    expired."""
    metrics = Metrics()
    config = _config(tmp_path, outbox_max_age=60_000)
    async with open_outbox(config, metrics) as outbox:
        handed: list[list[str]] = []
        outbox.on_expiry("live", lambda frames: handed.append([f.sidecar_id for f in frames]))
        frames = [_stored(n, "live") for n in range(2)] + [_stored(n, "gone") for n in range(25)]
        outbox._expired(frames)
        outbox.forget("live")
        outbox._expired([_stored(99, "live")])  # ended since: logged
    assert handed == [["live-0", "live-1"]]
    lines = [r.getMessage() for r in caplog.records if "dropped (expired)" in r.getMessage()]
    assert len(lines) == 2
    assert "25 frame(s) of session gone not forwarded within outbox_max_age (60000 ms)" in lines[0]
    assert lines[0].endswith("gone-19 and 5 more")
    assert "1 frame(s) of session live" in lines[1]
    assert outbox.expired_total == 28
    registry = metrics.registry
    assert registry.get_sample_value("mq_sidecar_outbox_expired_total") == 28
    assert (
        registry.get_sample_value("mq_sidecar_frame_outcomes_total", {"outcome": "expired"}) == 26
    )


def _stored(n: int, key: str) -> StoredFrame:
    return StoredFrame(n + 1, key, n + 1, f"{key}-{n}", "/queue/a", 0.0, b"")
