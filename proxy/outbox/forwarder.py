"""The outbox forwarder (issue 17 part 2, docs/outbox.md): what the outbox holds for no live
session (left by a previous process, found at start, or by a session of this one that ended
before its frames were forwarded) is forwarded over an upstream connection of its own, per
session key in the order of the key's first frame, each key's frames in their order, and
removed when the broker confirms them.

The connection is the sidecar's own: the broker's or the sidecar's ``login``/``passcode``
(:func:`proxy.legs.broker.connect_frame` without an app's CONNECT), made by the reconnect policy
without end over the configured brokers. Every SEND carries a receipt of its own
(``<prefix>-o<seq>``: a RabbitMQ leg confirms out of order, so none confirms another); one
read of them is outstanding at once (:class:`~proxy.outbox.frames.FetchSize`: about
``confirmation_window_size`` bytes, at most :data:`IN_FLIGHT` frames). What was sent and not
confirmed when the connection is lost is sent again on the next one (the consumer side
recognises the copy by its ``mq-sidecar-id``). A broker ERROR answering one of them (a
destination refused) settles that frame: it is logged with its ``mq-sidecar-id`` and removed,
since no app is left to hear of it.

Its progress is told (issue 28): an OUTBOX_FORWARDING event when it begins a session key's
frames and an OUTBOX_FORWARDED event when it is done with them (on the sidecar's bus: ``GET
/events``, the event log, apps subscribed with ``mq-sidecar-scope:all``; ``session_id`` is the
key), and :meth:`OutboxForwarder.statistics` in ``/status``'s ``outbox.forwarder``.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import sqlite3
from typing import Any

import trio

import protocol
from config import Broker, Config
from protocol import Command, ConnectionClosed, Frame
from proxy.legs.broker import Upstream, connect_upstream
from proxy.legs.connect_frame import connect_frame, upstream_heart_beat
from proxy.legs.opening import StreamOpener
from proxy.legs.stream import TransportLost
from proxy.outbox import OutboxError, StoredFrame
from proxy.outbox.frames import FETCH_FRAMES, FetchSize, parse
from proxy.outbox.service import OutboxService
from proxy.reconnect.board import ReconnectBoard
from proxy.reconnect.policy import ReconnectPolicy
from proxy.reconnect.walk import ReconnectExhausted, connect_by_policy
from proxy.telemetry.events import EventBus, EventKind, FrameReport, SessionEvent, report_of_frame
from proxy.telemetry.metrics import Metrics
from proxy.telemetry.statistics import ForwarderStatistics
from proxy.telemetry.vocabulary import FrameOutcome, OutcomeCause

__all__ = ["IN_FLIGHT", "OutboxForwarder"]

log = logging.getLogger("mq_sidecar.outbox")

#: Frames sent and not yet confirmed at once, at most (one read of the outbox).
IN_FLIGHT = FETCH_FRAMES
#: Broker frames a forwarder leg may carry: it takes no MESSAGE, so the app limits do.
_LIMITS = protocol.Limits(max_frame_bytes=1 << 20, max_headers=1000)


class _LegLost(Exception):
    """The forwarder's connection ended (closed, an ERROR not about one frame, silence)."""


class OutboxForwarder:
    """Forwards the outbox's frames of no live session (see the module docstring); run
    :meth:`run` in a nursery of the sidecar's.

    Args:
        config: brokers, the sidecar's credentials, policy delays, timeouts.
        outbox: the sidecar's outbox (its committer, the keys left to it).
        open_stream: opens the byte stream to a broker (the sidecar's ``BrokerStreams``).
        metrics: ``mq_sidecar_outbox_forwarded_total`` is counted there.
        prefix: the sidecar's id prefix: its receipt ids are ``<prefix>-o<seq>``.
        reconnects: the sidecar's board: its broker list in force is walked, the brokers
            evacuated there are skipped.
        events: where its OUTBOX_FORWARDING and OUTBOX_FORWARDED events go (the sidecar's
            bus; a private one when None).
    """

    def __init__(
        self,
        config: Config,
        outbox: OutboxService,
        open_stream: StreamOpener,
        metrics: Metrics,
        prefix: str,
        *,
        reconnects: ReconnectBoard | None = None,
        events: EventBus | None = None,
    ) -> None:
        self.config = config
        self.outbox = outbox
        self.open_stream = open_stream
        self.metrics = metrics
        self.prefix = prefix
        self.reconnects = reconnects
        self.events = events if events is not None else EventBus()
        outbox.forwarder_statistics = self.statistics
        # Without end, as the sessions' in outbox mode (proxy.session.core).
        self.policy = dataclasses.replace(
            ReconnectPolicy.from_config(config), reconnect_attempts=-1, reconnect_period=None
        )
        self.rng = random.Random()
        #: Frames forwarded and removed by this forwarder since start; refused by a broker.
        self.forwarded = 0
        self.refused = 0
        self._fetch = FetchSize(config.confirmation_window_size)
        #: Progress (:meth:`statistics`): the leg's broker, the key in progress and its frames
        #: forwarded so far, keys finished, why the last leg ended.
        self._broker: str | None = None
        self._key: str | None = None
        self._key_forwarded = 0
        self._keys_done = 0
        self._last_error: str | None = None
        #: Frames of the key in progress a broker refused (named in its OUTBOX_FORWARDED).
        self._key_refused: list[FrameReport] = []

    def statistics(self) -> ForwarderStatistics:
        """Its progress now (``/status``'s ``outbox.forwarder``)."""
        left = len(self.outbox.unowned)
        state = "forwarding" if self._broker is not None else "connecting" if left else "idle"
        return ForwarderStatistics(
            state=state,
            broker=self._broker,
            session=self._key,
            session_forwarded=self._key_forwarded,
            sessions_left=left,
            sessions_done=self._keys_done,
            forwarded_total=self.forwarded,
            refused_total=self.refused,
            last_error=self._last_error,
        )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Take the keys the outbox holds at start (``backlog()``: none is of this process
        yet), report started, then forward whatever is left to it, until cancelled."""
        outbox = self.outbox
        for backlog in await outbox.committer.backlog():
            outbox.leave_unowned(backlog.session_key)
        if outbox.unowned:
            log.info(
                "outbox: forwarding %d frame(s) of %d earlier session(s)",
                outbox.committer.statistics().frames,
                len(outbox.unowned),
            )
        task_status.started()
        while True:
            await outbox.wait_unowned()
            upstream = await self._connect()
            self._broker = upstream.broker.label
            try:
                async with trio.open_nursery() as leg:
                    leg.start_soon(upstream.keep_alive)
                    await self._forward_all(upstream)
                    leg.cancel_scope.cancel()
                await self._goodbye(upstream)
            except (_LegLost, TransportLost, protocol.ProtocolError) as exc:
                self._last_error = f"lost {upstream.broker.label}: {exc}"
                log.warning("outbox: outbox forwarder lost %s: %s", upstream.broker.label, exc)
            except (OutboxError, sqlite3.Error) as exc:
                # The store failed a read or a removal: not this process's end; try later.
                self._last_error = f"the store: {exc}"
                log.error("outbox: outbox forwarder stopped by the store: %s", exc)
                await trio.sleep(self.policy.max_retry_interval)
            finally:
                self._broker = None
                await upstream.aclose()

    async def _connect(self) -> Upstream:
        """A leg to the first broker that answers, by the policy, without end."""
        config = self.config

        async def connect_one(broker: Broker) -> Upstream:
            return await connect_upstream(
                broker,
                connect_frame(broker, config, heart_beat=upstream_heart_beat(config)),
                limits=_LIMITS,
                grace=config.heartbeat_grace,
                connect_timeout=config.durations.connect_timeout,
                open_stream=self.open_stream,
            )

        while True:
            try:
                upstream, _, _ = await connect_by_policy(
                    config.brokers if self.reconnects is None else self.reconnects.brokers,
                    self.policy,
                    self.rng,
                    connect_one,
                    current=None,
                    initial=False,
                    evacuations=self.reconnects,
                )
            except ReconnectExhausted as exc:  # every broker refused the sidecar's login
                self._last_error = f"cannot connect: {exc}"
                log.warning("outbox: outbox forwarder cannot connect: %s", exc)
                await trio.sleep(self.policy.max_retry_interval)
                continue
            log.info("outbox: outbox forwarder connected to %s", upstream.broker.label)
            return upstream

    async def _forward_all(self, upstream: Upstream) -> None:
        """Forward every key left to the forwarder, oldest first, until none is left."""
        outbox = self.outbox
        while outbox.unowned:
            key = outbox.unowned[0]
            await self._forward_key(upstream, key)
            outbox.unowned.popleft()
            self._keys_done += 1

    async def _forward_key(self, upstream: Upstream, key: str) -> None:
        """Forward every frame of ``key``, between its OUTBOX_FORWARDING and OUTBOX_FORWARDED
        events (none when it has no frame left). A leg lost half way raises; the next leg
        begins the key again, with an OUTBOX_FORWARDING of what is left."""
        label = upstream.broker.label
        frames = await self.outbox.committer.count(key)
        if not frames:
            return
        mine = key.startswith(f"{self.prefix}-")
        whose = "an ended session of this process" if mine else "a previous process"
        self._key, self._key_forwarded, self._key_refused = key, 0, []
        started = trio.current_time()
        self._publish(
            EventKind.OUTBOX_FORWARDING,
            key,
            f"forwarding what {whose} stored",
            to_broker=label,
            stored_frames=frames,
            spooled_frames=frames,  # its first name, deprecated (docs/behaviour.md)
        )
        try:
            while await self._forward_some(upstream, key):
                pass
        finally:
            self._key = None
        forwarding_ms = round((trio.current_time() - started) * 1000)
        self._publish(
            EventKind.OUTBOX_FORWARDED,
            key,
            f"every frame {whose} stored was forwarded",
            to_broker=label,
            forwarded_frames=self._key_forwarded,
            forwarding_ms=forwarding_ms,
            spooled_ms=forwarding_ms,  # its first name, deprecated (docs/behaviour.md)
            frames=tuple(self._key_refused),
        )

    def _publish(self, kind: EventKind, key: str, reason: str, **fields: Any) -> None:
        """An event of the outbox forwarder about session ``key``, with the outbox's depth."""
        stats = self.outbox.committer.statistics()
        self.events.publish(
            SessionEvent(
                kind,
                key,
                reason,
                outbox_frames=stats.frames,
                outbox_bytes=stats.bytes,
                outbox_max_bytes=stats.max_bytes,
                **fields,
            )
        )

    async def _forward_some(self, upstream: Upstream, key: str) -> bool:
        """Send a read of ``key``'s frames (:class:`~proxy.outbox.frames.FetchSize`), wait for
        their receipts, remove them; False when ``key`` has none left."""
        committer = self.outbox.committer
        stored = await committer.pending(key, limit=self._fetch.frames)
        self._fetch.update(stored)
        if not stored:
            return False
        by_receipt: dict[str, StoredFrame] = {}
        for item in stored:
            receipt = f"{self.prefix}-o{item.seq}"
            by_receipt[receipt] = item
            frame = parse(item.frame).without("receipt").with_header("receipt", receipt)
            if upstream.needs_flush:
                await upstream.flush()
            upstream.queue(frame)
        await upstream.flush()
        settled: set[int] = set()
        try:
            while len(settled) < len(stored):
                settled.add(await self._next_settled(upstream, by_receipt))
        finally:
            with trio.CancelScope(shield=True):
                await self._remove(key, stored, settled)
        return True

    async def _next_settled(self, upstream: Upstream, by_receipt: dict[str, StoredFrame]) -> int:
        """Read the leg until one of the frames sent is settled; its seq."""
        while True:
            event = await upstream.receive_event()
            if isinstance(event, ConnectionClosed):
                raise _LegLost("the broker closed the connection")
            if not isinstance(event, Frame):
                continue
            if event.command is Command.RECEIPT:
                item = by_receipt.get(event.get("receipt-id") or "")
                if item is not None:
                    return item.seq
            elif event.command is Command.ERROR:
                item = by_receipt.get(event.get("receipt-id") or "")
                if item is None:
                    raise _LegLost(f"ERROR {event.get('message')!r}")
                log.warning(
                    "outbox: the broker refused frame mq-sidecar-id %s (to %s): %s; removed",
                    item.sidecar_id,
                    item.destination,
                    event.get("message"),
                )
                self.refused += 1
                self._key_refused.append(
                    report_of_frame(
                        parse(item.frame), None, FrameOutcome.REFUSED, OutcomeCause.BROKER_ERROR
                    )
                )
                return item.seq

    async def _remove(self, key: str, stored: tuple[StoredFrame, ...], settled: set[int]) -> None:
        """Remove the settled frames of ``stored`` (in order), one range per run of them."""
        runs: list[tuple[int, int, int]] = []  # first seq, last seq, count
        first = last = count = 0
        for item in (*stored, None):
            if item is not None and item.seq in settled:
                first = first or item.seq
                last = item.seq
                count += 1
            elif count:
                runs.append((first, last, count))
                first = last = count = 0
        for first, last, count in runs:
            try:
                await self.outbox.committer.remove(key, first, last)
            except OutboxError as exc:
                log.warning("outbox: removal failed (forwarded again later): %s", exc)
                return
            self.forwarded += count
            self._key_forwarded += count
            self.outbox.forwarded_total += count
            self.metrics.outbox_forwarded(count)

    async def _goodbye(self, upstream: Upstream) -> None:
        """DISCONNECT with a receipt, bounded; the broker closes."""
        with trio.move_on_after(self.config.durations.connect_timeout):
            receipt = f"{self.prefix}-obye"
            await upstream.send(Frame(Command.DISCONNECT, (("receipt", receipt),)))
            while True:
                event = await upstream.receive_event()
                if isinstance(event, ConnectionClosed) or (
                    isinstance(event, Frame) and event.get("receipt-id") == receipt
                ):
                    return
