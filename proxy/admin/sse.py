"""``GET /events``: the session events as a Server-Sent Events stream (docs/operations.md,
"/events"), one bounded subscription of the event bus per reader; a reader too slow to keep up
is dropped and counted, never waited for.

Every event carries an ``id:`` and the stream opens with ``retry: 5000``; a reader that
reconnects with ``Last-Event-ID`` (as a browser's EventSource does by itself) first gets what it
missed from the bus's bounded history, and a ``GAP`` event when the history does not reach back
that far (WHATWG HTML, "Server-sent events": ``id``, ``retry``, ``Last-Event-ID``)."""

from __future__ import annotations

import json
import logging
from typing import Protocol

import h11
import trio

from proxy.admin.http import GONE, RECEIVE_SIZE, SERVER_HEADER, HTTPConnection, header_value
from proxy.telemetry.events import Resumption, SessionEvent
from proxy.telemetry.statistics import SidecarView


class SseLimits(Protocol):
    """The admin plane's bounds an event stream reads (``proxy.admin.server.AdminLimits``)."""

    @property
    def max_sse_clients(self) -> int: ...
    @property
    def send_timeout(self) -> float: ...
    @property
    def sse_keepalive(self) -> float: ...


__all__ = ["EventStream", "SseLimits", "sse_message"]

log = logging.getLogger("mq_sidecar.admin")


class EventStream:
    """The SSE endpoint of one admin plane.

    Args:
        sidecar: the daemon whose ``events`` bus is streamed (read at each request) and whose
            ``metrics`` count a dropped reader (``mq_sidecar_sse_clients_dropped_total``).
        limits: the admin plane's bounds: ``max_sse_clients`` readers at once (more get 503
            with ``Retry-After: 5``), ``send_timeout`` seconds per write, ``sse_keepalive``
            seconds between keep-alive comments on an idle stream.

    Attributes:
        clients: readers now.
        dropped: readers dropped for being slow, so far.
    """

    def __init__(self, sidecar: SidecarView, limits: SseLimits) -> None:
        self.sidecar = sidecar
        self.limits = limits
        self.clients = 0
        self.dropped = 0

    async def serve(self, http: HTTPConnection, request: h11.Request) -> int:
        """Answer one ``GET /events``: 200 and events until the reader goes or is dropped
        (the connection then closes), or 503 past ``max_sse_clients``. Returns the status."""
        limits = self.limits
        if self.clients >= limits.max_sse_clients:
            with trio.move_on_after(limits.send_timeout):
                await http.respond(
                    503, b"too many event stream readers\n", headers=((b"retry-after", b"5"),)
                )
            return 503
        self.clients += 1
        dropped = False
        try:
            last_event_id = header_value(request, b"last-event-id") or None
            with self.sidecar.events.resume(last_event_id) as resumed:
                with trio.move_on_after(limits.send_timeout) as opening:
                    await http.send(
                        h11.Response(
                            status_code=200,
                            reason=b"OK",
                            headers=[
                                (b"server", SERVER_HEADER),
                                (b"content-type", b"text/event-stream; charset=utf-8"),
                                (b"cache-control", b"no-store"),
                                (b"x-accel-buffering", b"no"),
                            ],
                        )
                    )
                    await http.send(h11.Data(data=b": mq-sidecar session events\nretry: 5000\n\n"))
                    await http.send(h11.Data(data=_catch_up(resumed, last_event_id)))
                if opening.cancelled_caught:
                    return 200
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._watch_reader_gone, http, nursery.cancel_scope)
                    dropped = await self._pump_events(http, resumed)
                    nursery.cancel_scope.cancel()
            if dropped:
                self.dropped += 1
                self.sidecar.metrics.sse_dropped()
                log.warning("admin plane: /events reader too slow; disconnected it")
        finally:
            self.clients -= 1
        # The stream has no end we could announce cleanly after a drop or a vanished reader:
        # the connection closes (our state is not DONE, so no keep-alive).
        return 200

    async def _pump_events(self, http: HTTPConnection, resumed: Resumption) -> bool:
        """Forward events until the reader is dropped (True) or goes away (cancelled)."""
        limits = self.limits
        bus = self.sidecar.events
        seq = resumed.next_seq
        while True:
            with trio.move_on_after(limits.sse_keepalive) as idle:
                try:
                    event = await resumed.events.receive()
                except trio.EndOfChannel:
                    return True  # the bus dropped us: our buffer was full
            if idle.cancelled_caught:
                data = b": keep-alive\n\n"
            else:
                data = sse_message(bus.event_id(seq), event)
                seq += 1
            with trio.move_on_after(limits.send_timeout) as write:
                await http.send(h11.Data(data=data))
            if write.cancelled_caught:
                return True  # a reader that stopped reading

    @staticmethod
    async def _watch_reader_gone(http: HTTPConnection, scope: trio.CancelScope) -> None:
        """End the event stream when the reader closes its side (bytes after are ignored)."""
        try:
            while await http.stream.receive_some(RECEIVE_SIZE):
                pass
        except GONE:
            pass
        scope.cancel()


def sse_message(event_id: str, event: SessionEvent) -> bytes:
    """One event on the stream: ``id``, ``event`` (its kind) and ``data`` (its JSON, one
    line), then the blank line that ends it."""
    return f"id: {event_id}\nevent: {event.kind}\ndata: {event.to_json()}\n\n".encode()


def _catch_up(resumed: Resumption, last_event_id: str | None) -> bytes:
    """What a reconnecting reader gets before the live events: a ``GAP`` event (no id, so the
    reader's last id stays) when the history does not reach back to ``last_event_id``, then
    every event it missed that the history holds."""
    out = []
    if resumed.gap is not None:
        body = json.dumps(
            {
                "last_event_id": last_event_id,
                "oldest_available": resumed.oldest,
                "reason": resumed.gap,
            },
            sort_keys=True,
        )
        out.append(f"event: GAP\ndata: {body}\n\n".encode())
    out += (sse_message(event_id, event) for event_id, event in resumed.missed)
    return b"".join(out)
