"""The session's state in small parts (proxy/session/asked.py, leg.py, flow.py, drain.py,
acks.py), each driven alone on trio's mock clock."""

from __future__ import annotations

from typing import cast

import trio
import trio.testing

from protocol import Command, Frame
from proxy.legs.broker import Upstream
from proxy.legs.dialect import BrokerDialect
from proxy.legs.stream import FLUSH_THRESHOLD, TransportLost
from proxy.session.acks import SidecarAcks
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


class _UnreadLeg:
    """A leg to a broker that reads nothing while its own writes to us are blocked (ActiveMQ,
    measured): :meth:`flush` waits until ``reading`` is set, or fails once ``lost`` is; the
    out-buffer is "full" (``needs_flush``) past 64 KiB, as a :class:`FrameStream`'s is."""

    def __init__(self) -> None:
        self.queued: list[Frame] = []
        self.written = 0
        self.reading = trio.Event()
        self.lost = False

    @property
    def upstream(self) -> Upstream:
        """This fake as the leg :class:`SidecarAcks` takes (only these members are used)."""
        return cast("Upstream", self)

    @property
    def needs_flush(self) -> bool:
        return 60 * (len(self.queued) - self.written) >= FLUSH_THRESHOLD

    def queue(self, frame: Frame) -> None:
        if self.lost:
            raise TransportLost("connection reset")
        self.queued.append(frame)

    async def flush(self) -> None:
        upto = len(self.queued)
        await self.reading.wait()
        if self.lost:
            raise TransportLost("connection reset")
        self.written = max(self.written, upto)


def _ack(n: int) -> Frame:
    return Frame(Command.ACK, (("id", f"ID:broker-1:{n}"),))


async def test_the_relay_queues_the_sidecars_acks_while_the_broker_reads_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The relay hides a burst of redeliveries the app had acknowledged and queues an ACK for
    each (docs/results.md, "Stalled after the broker's failover"): with the leg's out-buffer
    full and the broker not reading, it goes on (it is the leg's only reader: waiting here
    stalled the session for good); the writer sends them all once the broker reads."""
    leg = _UnreadLeg()
    acks = SidecarAcks(max_unacked=10_000)
    async with trio.open_nursery() as nursery:
        acks.attach(nursery, leg.upstream)
        with trio.move_on_after(5) as waited:
            for n in range(5_000):  # about 300 KB of ACKs: past the 64 KiB threshold
                await acks.send(leg.upstream, _ack(n))
        assert not waited.cancelled_caught, "the relay waited for a broker that reads nothing"
        assert len(leg.queued) == 5_000
        assert leg.written == 0
        leg.reading.set()
        await trio.testing.wait_all_tasks_blocked()
        assert leg.written == 5_000
        assert not acks.pending
        nursery.cancel_scope.cancel()


async def test_past_max_unacked_unwritten_acks_the_relay_waits_for_the_writer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The out-buffer stays bounded: the ACK after ``max_unacked`` unwritten ones (past 64 KiB)
    waits until the writer has written them; and a leg lost meanwhile ends the wait (nothing
    to ACK)."""
    leg = _UnreadLeg()
    acks = SidecarAcks(max_unacked=2_000)
    async with trio.open_nursery() as nursery:
        acks.attach(nursery, leg.upstream)
        for n in range(2_000):
            await acks.send(leg.upstream, _ack(n))
        with trio.move_on_after(5) as waited:
            await acks.send(leg.upstream, _ack(2_000))
        assert waited.cancelled_caught
        leg.reading.set()
        await acks.send(leg.upstream, _ack(2_001))
        await trio.testing.wait_all_tasks_blocked()
        assert [f.get("id") for f in leg.queued][-1] == "ID:broker-1:2001"
        assert leg.written == len(leg.queued)
        nursery.cancel_scope.cancel()

    lost = _UnreadLeg()
    acks.reset()
    async with trio.open_nursery() as nursery:
        acks.attach(nursery, lost.upstream)
        for n in range(2_000):
            await acks.send(lost.upstream, _ack(n))

        async def reset_by_peer() -> None:
            await trio.sleep(1)
            lost.lost = True
            lost.reading.set()

        nursery.start_soon(reset_by_peer)
        with trio.fail_after(5):
            await acks.send(lost.upstream, _ack(2_000))  # returns: the leg is lost
        assert len(lost.queued) == 2_000
