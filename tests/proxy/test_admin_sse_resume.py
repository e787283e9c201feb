"""``GET /events`` resumes (WHATWG "Server-sent events"): every event has an ``id``, the stream
says ``retry``, and a reader that reconnects with ``Last-Event-ID`` gets what it missed from the
bus's bounded history, with a ``GAP`` event when the history does not reach back that far or
the id is of another process."""

from __future__ import annotations

import json

import trio
import trio.testing

from proxy.telemetry.events import EventBus, EventKind
from tests.proxy.test_admin_http import Client, connect, event, make_admin


def blocks(data: bytes) -> list[dict[str, str]]:
    """The stream's messages as ``{field: value}`` (comments left out)."""
    out = []
    for block in data.decode().split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in block.splitlines() if line and not line.startswith(":")
        )
        if fields:
            out.append(fields)
    return out


async def read_messages(client: Client, count: int) -> list[dict[str, str]]:
    data = b""
    with trio.fail_after(5):
        while len(blocks(data)) < count:
            data += await client.read_until(b"\n\n")
    return blocks(data)


async def test_a_reader_reconnecting_gets_what_it_missed_in_order(nursery: trio.Nursery) -> None:
    sidecar, admin = make_admin()
    first = connect(admin, nursery)
    await first.start("GET", "/events")
    opening = await first.read_until(b"\n\n")
    assert b"retry: 5000" in opening
    for n in range(3):
        sidecar.events.publish(event(session=f"s-{n}"))
    got = await read_messages(first, 3)
    last_id = got[0]["id"]  # the reader saw only the first, then its connection broke
    for n in range(3, 5):
        sidecar.events.publish(event(session=f"s-{n}"))
    again = connect(admin, nursery)
    await again.start("GET", "/events", headers=(("Last-Event-ID", last_id),))
    await again.read_until(b"\n\n")  # the opening comment
    resumed = await read_messages(again, 4)
    assert [json.loads(m["data"])["session_id"] for m in resumed] == ["s-1", "s-2", "s-3", "s-4"]
    assert all(m.get("event") != "GAP" for m in resumed)
    sidecar.events.publish(event(session="s-5"))  # live after the missed ones, ids go on
    (live,) = await read_messages(again, 1)
    assert live["id"] == sidecar.events.event_id(6)
    assert json.loads(live["data"])["session_id"] == "s-5"


async def test_a_gap_is_said_when_the_history_no_longer_reaches_back(
    nursery: trio.Nursery,
) -> None:
    sidecar, admin = make_admin()
    sidecar.events = EventBus(history=3)
    for n in range(6):
        sidecar.events.publish(event(session=f"s-{n}"))
    client = connect(admin, nursery)
    await client.start("GET", "/events", headers=(("Last-Event-ID", sidecar.events.event_id(1)),))
    await client.read_until(b"\n\n")
    gap, *missed = await read_messages(client, 4)
    assert gap["event"] == "GAP"
    assert "id" not in gap
    body = json.loads(gap["data"])
    assert body["last_event_id"] == sidecar.events.event_id(1)
    assert body["oldest_available"] == sidecar.events.event_id(4)
    assert "2 event(s) are not shown" in body["reason"]
    assert [m["id"] for m in missed] == [sidecar.events.event_id(n) for n in (4, 5, 6)]


async def test_an_id_of_a_previous_process_is_a_gap(nursery: trio.Nursery) -> None:
    sidecar, admin = make_admin()
    sidecar.events.publish(event(EventKind.RECONNECTING))
    client = connect(admin, nursery)
    await client.start("GET", "/events", headers=(("Last-Event-ID", "0badc0de-41"),))
    await client.read_until(b"\n\n")
    gap, replayed = await read_messages(client, 2)
    assert gap["event"] == "GAP"
    assert "not of this sidecar process" in json.loads(gap["data"])["reason"]
    assert replayed["event"] == "RECONNECTING"


async def test_a_new_reader_gets_no_history(nursery: trio.Nursery) -> None:
    sidecar, admin = make_admin()
    sidecar.events.publish(event(session="old"))
    client = connect(admin, nursery)
    await client.start("GET", "/events")
    await client.read_until(b"\n\n")
    sidecar.events.publish(event(session="new"))
    (message,) = await read_messages(client, 1)
    assert json.loads(message["data"])["session_id"] == "new"
    assert message["id"] == sidecar.events.event_id(2)


def test_the_history_is_bounded() -> None:
    bus = EventBus(history=2)
    for n in range(5):
        bus.publish(event(session=f"s-{n}"))
    with bus.resume(bus.event_id(0)) as resumed:
        assert [e.session_id for _, e in resumed.missed] == ["s-3", "s-4"]
        assert resumed.gap is not None
        assert resumed.next_seq == 6
