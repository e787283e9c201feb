"""The session's state in small parts (proxy/session/asked.py, leg.py, flow.py, drain.py), each
driven alone on trio's mock clock."""

from __future__ import annotations

import trio
import trio.testing

from proxy.legs.dialect import BrokerDialect
from proxy.session.asked import AppRequests
from proxy.session.drain import DrainState
from proxy.session.flow import FlowControl
from proxy.session.leg import LegState
from proxy.tracking.window import ConfirmationWindow


async def test_a_waiter_for_the_leg_wakes_when_it_is_ready_and_not_before() -> None:
    leg = LegState()
    woke: list[float] = []

    async def waiter() -> None:
        await leg.wait_ready()
        woke.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        assert woke == []
        leg.ready = True
        await trio.testing.wait_all_tasks_blocked()
        assert len(woke) == 1
    leg.ready = False  # a reconnect: the next waiter waits again
    with trio.move_on_after(1) as waited:
        await leg.wait_ready()
    assert waited.cancelled_caught
    leg.ready = True
    await leg.wait_ready()  # at once


async def test_the_leg_starts_with_a_stomp_brokers_dialect() -> None:
    leg = LegState()
    assert leg.dialect == BrokerDialect.from_server(None)
    assert (leg.upstream, leg.broker_index, leg.loss, leg.failovers) == (None, None, None, 0)


async def test_window_changes_wake_every_waiter_once() -> None:
    flow = FlowControl(ConfirmationWindow(1 << 20, receipt_prefix="s-r"))
    flow.window_changed()  # nobody waits: nothing to wake, nothing remembered
    woke = 0

    async def waiter() -> None:
        nonlocal woke
        await flow.window_change()
        woke += 1

    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        assert woke == 0
        flow.window_changed()
    assert woke == 3
    with trio.move_on_after(1) as waited:  # the change was not remembered for a later waiter
        await flow.window_change()
    assert waited.cancelled_caught


def test_what_the_app_asked_for_and_the_drain_start_empty() -> None:
    asked = AppRequests()
    assert (asked.connect, asked.authenticated, asked.disconnect_entry) == (None, False, None)
    assert not asked.disconnected.is_set()
    drain = DrainState()
    assert (drain.requested, drain.deadline, drain.messages_not_shown) == (False, None, 0)
