"""A control-channel subscriber: every session's RECONNECTING/FAILOVER/DISCONNECT events.

One stomp.py connection to a sidecar subscribes to ``/mq-sidecar/events`` with
``mq-sidecar-scope:all`` (docs/behaviour.md, "Control channel"): it then gets the events of every
session of that sidecar, its own included. Event bodies are the JSON of
``proxy.events.SessionEvent`` (``session_id``, ``from_broker``, ``to_broker``, ``outage_ms``,
``replayed_frames``, ``duplicates_hidden``, ``redeliveries_hidden``, ``timestamp`` in Unix
seconds...).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["EVENTS_DESTINATION", "EventMonitor", "ObservedEvent"]

#: The sidecar's default ``events_destination``.
EVENTS_DESTINATION = "/mq-sidecar/events"


@dataclass(frozen=True)
class ObservedEvent:
    """One event as the monitor received it: which sidecar, when (monotonic), the body."""

    sidecar: str
    received_at: float
    body: dict[str, Any]

    @property
    def kind(self) -> str:
        """``RECONNECTING``, ``FAILOVER`` or ``DISCONNECT``."""
        return str(self.body.get("event", ""))


class EventMonitor:
    """Subscribes to every session's events on the sidecar at ``host:port``.

    ``name`` labels the events (e.g. ``producer``). ``start()`` waits for the subscription's
    RECEIPT (raises ``TimeoutError`` after ``timeout`` seconds); ``close()`` disconnects.
    """

    def __init__(
        self, name: str, *, host: str = "127.0.0.1", port: int = 61613, timeout: float = 30.0
    ) -> None:
        import stomp  # noqa: PLC0415

        self.name = name
        self.timeout = timeout
        self._lock = threading.Lock()
        self._events: list[ObservedEvent] = []
        self._subscribed = threading.Event()
        self._closed = threading.Event()
        self.conn: Any = stomp.Connection12([(host, port)], heartbeats=(0, 0))
        self.conn.set_listener("events", self)

    def on_message(self, frame: Any) -> None:
        if frame.headers.get("destination") != EVENTS_DESTINATION:
            return
        try:
            body = json.loads(frame.body)
        except ValueError:
            return
        if isinstance(body, dict):
            with self._lock:
                self._events.append(ObservedEvent(self.name, time.monotonic(), body))

    def on_receipt(self, frame: Any) -> None:
        if frame.headers.get("receipt-id") == "events-sub":
            self._subscribed.set()

    def on_disconnected(self) -> None:
        self._closed.set()

    def start(self) -> None:
        """Connect and subscribe with ``mq-sidecar-scope:all``."""
        self.conn.connect(wait=True)
        self.conn.subscribe(
            EVENTS_DESTINATION,
            id="events",
            ack="auto",
            headers={"mq-sidecar-scope": "all", "receipt": "events-sub"},
        )
        if not self._subscribed.wait(self.timeout):
            raise TimeoutError(f"{self.name}: no RECEIPT for the events subscription")

    def events(self, kind: str | None = None) -> list[ObservedEvent]:
        """The events received so far (of ``kind`` only, if given), in arrival order."""
        with self._lock:
            return [e for e in self._events if kind is None or e.kind == kind]

    def close(self, timeout: float = 10.0) -> None:
        """DISCONNECT and wait (bounded) for the connection to close."""
        if self.conn.is_connected():
            self.conn.disconnect()
            if not self._closed.wait(timeout):
                self.conn.transport.disconnect_socket()
