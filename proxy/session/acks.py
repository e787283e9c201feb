"""The sidecar's own ACKs: for messages of the app's ``ack:auto`` subscriptions (which the
sidecar subscribes with a client ack mode upstream, so that an unconfirmed delivery survives a
failover) and for redeliveries it hides from the app.

An auto-acked message is acknowledged upstream only after the app's out-buffer holding it has
been written (:meth:`SidecarAcks.take` is called by the app flush); a hidden message's ACK goes
at once. The relay (the leg's only reader) never writes these itself: it queues them on the leg
and :meth:`SidecarAcks.flush_loop` writes them, since a broker blocked writing to us may not
read (see :mod:`proxy.session.link`). Nor does the relay wait for that writer while the leg's
out-buffer is merely full: only past ``max_unacked`` ACKs queued and not yet written as well
(:meth:`SidecarAcks.send`). ActiveMQ stops reading while its writes to us are blocked, so a
relay waiting for its ACKs to be written stops reading, and neither side moves again: after a
failover the new broker redelivers a prefetch window of messages the app had acknowledged,
which the sidecar hides and acknowledges itself (measured: 5,800-8,250 hidden redeliveries,
the relay waiting for the write of their ACKs and the writer waiting for the socket, for
good; docs/behaviour.md, "Acknowledgement modes upstream").
"""

from __future__ import annotations

import trio

import protocol
from protocol import Frame
from proxy.legs.broker import Upstream
from proxy.legs.stream import TransportLost

__all__ = ["SidecarAcks"]


class SidecarAcks:
    """The ACKs the sidecar owes the broker on the current leg.

    Args:
        max_unacked: ``max_unacked``: past this many held ACKs the relay flushes the app
            (:meth:`defer` and :meth:`coalesce` say so), and past this many ACKs queued on the
            leg and not yet written (and 64 KiB) :meth:`send` waits for the writer.
    """

    def __init__(self, max_unacked: int) -> None:
        self.max_unacked = max_unacked
        #: ACKs :meth:`send` queued on the leg that no write has handed to the stream yet.
        self._unwritten = 0
        #: The writer's last write failed: the leg is lost, nothing waits for it any more.
        self._lost = False
        #: ACKs of auto-acked messages, held until the app flush.
        self._deferred: list[Frame] = []
        #: Cumulative ACKs of auto subscriptions (``Delivered.coalesce``): the latest of each,
        #: and how many messages they settle, until the app flush.
        self._latest: dict[str, Frame] = {}
        self._latest_count = 0
        self._flush_wanted = False
        #: The writer's wake-up and the senders' "written" signal, made when first needed.
        self._queued: trio.Event | None = None
        self._sent: trio.Event | None = None
        #: The current leg's nursery and upstream (:meth:`attach`); the writer
        #: (:meth:`flush_loop`) starts there at the first ACK to write, so a session that
        #: never acknowledged anything itself holds no task for it.
        self._leg: tuple[trio.Nursery, Upstream] | None = None
        self._writing = False

    def attach(self, leg: trio.Nursery, upstream: Upstream) -> None:
        """A new leg: the writer of its ACKs will run in ``leg`` (the leg's nursery, which
        ends with the leg) once there is one to write."""
        self._leg = (leg, upstream)
        self._writing = False
        if self._flush_wanted:  # queued before the leg's nursery opened (the restore)
            self._start_writer()

    def reset(self) -> None:
        """Forget everything owed: a new leg (ack ids of the old one mean nothing there)."""
        self._deferred.clear()
        self._latest.clear()
        self._latest_count = 0
        self._flush_wanted = False
        self._unwritten = 0
        self._lost = False
        self._leg = None  # the old leg's nursery is closing: no writer starts there
        self._writing = False

    @property
    def pending(self) -> bool:
        """Whether any ACK of the sidecar's is held or queued (a ``priority_backup`` quiet
        point needs none)."""
        return bool(self._deferred or self._latest or self._flush_wanted)

    def defer(self, ack: Frame) -> bool:
        """Defer an auto-acked message's ACK until the app flush. True when ``max_unacked``
        are deferred: the caller should flush the app now."""
        self._deferred.append(ack)
        return len(self._deferred) >= self.max_unacked

    def coalesce(self, key: str, ack: Frame) -> bool:
        """Keep ``ack`` as the latest cumulative ACK of subscription ``key`` (it settles the
        earlier ones). True when it settles ``max_unacked`` messages: flush the app now."""
        self._latest[key] = ack
        self._latest_count += 1
        return self._latest_count >= self.max_unacked

    def take(self) -> list[Frame]:
        """Every ACK held so far (the app flush about to happen writes their messages)."""
        held, self._deferred = self._deferred, []
        if self._latest:
            held.extend(self._latest.values())
            self._latest = {}
            self._latest_count = 0
        return held

    async def send(self, upstream: Upstream, ack: Frame) -> None:
        """Queue one ACK on ``upstream`` (no I/O) and have :meth:`flush_loop` write it.

        Waits for the writer only while ``max_unacked`` ACKs are queued and not yet written
        and the leg's out-buffer is past its flush threshold (64 KiB, about 1,000 ACKs),
        which bounds the buffer; not at that threshold alone: the caller is the relay, the
        leg's only reader, and a broker that cannot write to us may stop reading (ActiveMQ
        does), so a relay waiting for that write would never read again (measured after a
        failover, see the module docstring). The broker sends no more than its prefetch window
        of messages unacknowledged, so the ACKs it owes are bounded by that window: a window
        above ``max_unacked`` can still bring that wait."""
        while self._unwritten >= self.max_unacked and upstream.needs_flush and not self._lost:
            self._want_flush()
            if self._sent is None or self._sent.is_set():
                self._sent = trio.Event()
            await self._sent.wait()
        try:
            upstream.queue(ack)
        except (TransportLost, protocol.LocalProtocolError):
            # The leg is lost (the redelivery will be hidden again on the next one), or the
            # app's DISCONNECT went up before this delivery arrived: nothing to acknowledge.
            return
        self._unwritten += 1
        self._want_flush()

    def _want_flush(self) -> None:
        self._flush_wanted = True
        if self._queued is not None:
            self._queued.set()
        if not self._writing:
            self._start_writer()

    def _start_writer(self) -> None:
        if self._leg is not None:
            self._writing = True
            leg, upstream = self._leg
            leg.start_soon(self.flush_loop, upstream)

    async def flush_loop(self, upstream: Upstream) -> None:
        """Write the ACKs queued on ``upstream`` by :meth:`send`, until cancelled or the leg
        is lost. Started by the first ACK to write in the leg's nursery (:meth:`attach`), it
        then stays for the leg's life: a task per burst would cost more CPU than it saves."""
        while True:
            while not self._flush_wanted:
                self._queued = trio.Event()
                await self._queued.wait()
            self._flush_wanted = False
            queued = self._unwritten  # the flush hands every one of these to the stream
            try:
                await upstream.flush()
                self._unwritten -= queued
            except TransportLost:
                self._lost = True  # queue() raises from now on: send() waits no more
                return  # the relay sees the loss; the redelivery will be hidden again
            finally:
                if self._sent is not None:
                    self._sent.set()
