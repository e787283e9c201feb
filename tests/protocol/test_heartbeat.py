"""Heart-beat parsing, negotiation and deadline arithmetic; version negotiation."""

from __future__ import annotations

import pytest

from protocol import HeartBeatTimer, negotiate_heartbeat, negotiate_version, parse_heartbeat


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, (0, 0)),
        ("0,0", (0, 0)),
        ("1000,2000", (1000, 2000)),
        (" 10 , 20\t", (10, 20)),
        ("007,0", (7, 0)),
    ],
)
def test_parse_heartbeat(value: str | None, expected: tuple[int, int]) -> None:
    assert parse_heartbeat(value) == expected


@pytest.mark.parametrize(
    "value",
    ["", "1", "1,2,3", "-1,0", "0,-5", "a,b", "1.5,2", ",", "1,", "\u0661,0", "9" * 40 + ",0"],
)
def test_parse_heartbeat_rejects(value: str) -> None:
    with pytest.raises(ValueError, match="heart-beat") as info:
        parse_heartbeat(value)
    assert repr(value) in str(info.value)


# (cx, cy) ours, (sx, sy) theirs -> (send, receive); STOMP 1.2 "Heart-beating".
NEGOTIATION_TABLE = [
    ((0, 0), (0, 0), (0, 0)),
    ((1000, 0), (0, 1000), (1000, 0)),
    ((1000, 0), (0, 5000), (5000, 0)),  # the slower of what we offer and they want
    ((5000, 0), (0, 1000), (5000, 0)),
    ((1000, 0), (0, 0), (0, 0)),  # they don't want any
    ((0, 0), (0, 1000), (0, 0)),  # we can't send any
    ((0, 1000), (2000, 0), (0, 2000)),
    ((0, 3000), (2000, 0), (0, 3000)),
    ((0, 1000), (0, 0), (0, 0)),  # they can't send
    ((0, 0), (1000, 0), (0, 0)),  # we don't want
    ((4000, 4000), (10000, 10000), (10000, 10000)),
    ((10000, 0), (5000, 20000), (20000, 0)),
]


@pytest.mark.parametrize(("local", "remote", "expected"), NEGOTIATION_TABLE)
def test_negotiate_heartbeat(
    local: tuple[int, int], remote: tuple[int, int], expected: tuple[int, int]
) -> None:
    assert negotiate_heartbeat(local, remote) == expected
    # The peer computes the mirror image.
    assert negotiate_heartbeat(remote, local) == expected[::-1]


def test_negotiate_heartbeat_rejects_negative() -> None:
    with pytest.raises(ValueError, match=">= 0"):
        negotiate_heartbeat((-1, 0), (0, 0))


def test_timer_arithmetic() -> None:
    timer = HeartBeatTimer(1000, 4000, 100.0, grace=1.5)
    assert timer.next_send_deadline() == 101.0
    assert timer.receive_deadline() == 106.0
    assert not timer.send_due(100.999)
    assert timer.send_due(101.0)
    timer.data_sent(100.5)
    assert timer.next_send_deadline() == 101.5
    assert not timer.send_due(101.2)
    assert not timer.peer_dead(105.999)
    assert timer.peer_dead(106.0)
    timer.data_received(105.0)
    assert timer.receive_deadline() == 111.0
    assert not timer.peer_dead(110.0)
    assert timer.peer_dead(111.5)


def test_timer_send_share_writes_early() -> None:
    """A send share below 1 moves only the send deadline: the upstream leg beats at half the
    ``cx`` it promised (ActiveMQ judges that with no tolerance), silence is judged as before."""
    timer = HeartBeatTimer(5000, 4000, 100.0, grace=1.5, send_share=0.5)
    assert timer.next_send_deadline() == 102.5
    assert timer.receive_deadline() == 106.0
    timer.data_sent(103.0)
    assert timer.next_send_deadline() == 105.5
    assert HeartBeatTimer(5000, 0, 0.0, send_share=1.0).next_send_deadline() == 5.0


@pytest.mark.parametrize("share", [0.0, -0.5, 1.01])
def test_timer_rejects_a_send_share_outside_zero_to_one(share: float) -> None:
    with pytest.raises(ValueError, match="send_share must be"):
        HeartBeatTimer(1000, 0, 0.0, send_share=share)


def test_timer_default_grace() -> None:
    timer = HeartBeatTimer(0, 10_000, 0.0)
    assert timer.receive_deadline() == 20.0


def test_timer_disabled_directions() -> None:
    timer = HeartBeatTimer(0, 0, 5.0)
    assert timer.next_send_deadline() is None
    assert timer.receive_deadline() is None
    assert not timer.send_due(1e9)
    assert not timer.peer_dead(1e9)


@pytest.mark.parametrize(
    ("send", "receive", "grace"), [(-1, 0, 2.0), (0, -1, 2.0), (0, 0, 0.0), (0, 0, -1.0)]
)
def test_timer_rejects(send: int, receive: int, grace: float) -> None:
    with pytest.raises(ValueError, match="must be"):
        HeartBeatTimer(send, receive, 0.0, grace=grace)


@pytest.mark.parametrize(
    ("accept", "supported", "expected"),
    [
        (None, ("1.0", "1.1", "1.2"), "1.0"),  # no header: a 1.0 client
        (None, ("1.1", "1.2"), None),
        ("1.0,1.1,1.2", ("1.0", "1.1", "1.2"), "1.2"),
        ("1.2,1.0", ("1.0", "1.1", "1.2"), "1.2"),
        ("1.1", ("1.0", "1.1", "1.2"), "1.1"),
        ("1.0, 1.1", ("1.0", "1.1", "1.2"), "1.1"),
        ("1.0,1.1,1.2", ("1.0", "1.1"), "1.1"),
        ("1.2,2.0", ("1.0", "1.1", "1.2"), "1.2"),
        ("2.0,3.1", ("1.0", "1.1", "1.2"), None),
        ("1.2", ("1.0",), None),
        ("", ("1.0", "1.1", "1.2"), None),
    ],
)
def test_negotiate_version(
    accept: str | None, supported: tuple[str, ...], expected: str | None
) -> None:
    assert negotiate_version(accept, supported) == expected


def test_negotiate_version_defaults_and_errors() -> None:
    assert negotiate_version("1.1,1.2") == "1.2"
    assert negotiate_version(None) == "1.0"
    assert negotiate_version("1.1", iter(["1.1"])) == "1.1"
    with pytest.raises(ValueError, match=r"1\.3"):
        negotiate_version("1.2", ["1.2", "1.3"])
