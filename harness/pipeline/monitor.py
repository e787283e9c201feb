"""An event watcher: every session's RECONNECTING/FAILOVER/DISCONNECT events of one sidecar.

It reads the sidecar's ``GET /events`` (Server-Sent Events on the admin plane, docs/operations.md,
"Admin plane"): an operator's view of every session, which needs no STOMP session of its own
(the in-band ``mq-sidecar-scope:all`` subscription is only for an app that authenticated with
the sidecar's ``client_login``: docs/behaviour.md, "Control channel"). Event bodies are the JSON
of ``proxy.telemetry.events.SessionEvent`` (``session_id``, ``from_broker``, ``to_broker``,
``outage_ms``, ``replayed_frames``, ``duplicates_hidden``, ``redeliveries_hidden``, ``timestamp`` in
Unix seconds...).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["EventMonitor", "ObservedEvent"]


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
    """Reads every session's events from the sidecar whose admin plane is at ``host:port``.

    ``name`` labels the events (e.g. ``producer``). ``start()`` waits until the stream is open
    (raises ``OSError``/``TimeoutError`` after ``timeout`` seconds); ``close()`` ends it. A
    reader thread parses the stream (``event: KIND`` / ``data: JSON`` / blank line).
    """

    def __init__(
        self,
        name: str,
        *,
        host: str = "127.0.0.1",
        port: int = 9464,
        timeout: float = 30.0,
        token: str | None = None,
    ) -> None:
        self.name = name
        self.timeout = timeout
        self._lock = threading.Lock()
        self._events: list[ObservedEvent] = []
        self._conn = http.client.HTTPConnection(host, port, timeout=timeout)
        self._headers = {"Accept": "text/event-stream"}
        if token is not None:
            self._headers["Authorization"] = f"Bearer {token}"
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Open ``GET /events`` and start reading it."""
        self._conn.request("GET", "/events", headers=self._headers)
        response = self._conn.getresponse()
        if response.status != 200:
            raise OSError(f"{self.name}: GET /events answered {response.status}")
        if self._conn.sock is not None:
            self._conn.sock.settimeout(None)  # idle streams only carry keep-alive comments
        self._thread = threading.Thread(
            target=self._read, args=(response,), name=f"events-{self.name}", daemon=True
        )
        self._thread.start()

    def _read(self, response: http.client.HTTPResponse) -> None:
        data: list[str] = []
        try:
            while line := response.readline():
                text = line.decode("utf-8", "replace").rstrip("\r\n")
                if text.startswith("data:"):
                    data.append(text[5:].strip())
                elif not text and data:
                    self._record("\n".join(data))
                    data = []
        except (OSError, ValueError, http.client.HTTPException):
            pass  # closed by close(), or the sidecar went away

    def _record(self, text: str) -> None:
        try:
            body = json.loads(text)
        except ValueError:
            return
        if isinstance(body, dict):
            with self._lock:
                self._events.append(ObservedEvent(self.name, time.monotonic(), body))

    def events(self, kind: str | None = None) -> list[ObservedEvent]:
        """The events received so far (of ``kind`` only, if given), in arrival order."""
        with self._lock:
            return [e for e in self._events if kind is None or e.kind == kind]

    def close(self, timeout: float = 10.0) -> None:
        """End the stream and wait (bounded) for the reader thread: the socket is shut down
        first (the reader sees the end of the stream), the connection closed after the reader
        is done with it (closing it under the reader breaks http.client's chunked reading)."""
        sock = self._conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout)
        self._conn.close()
