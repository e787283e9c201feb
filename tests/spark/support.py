"""A stomp.py consumer for the write tests: every message of one destination, through a sidecar.

:class:`Drain` subscribes (``ack:auto``) and keeps every MESSAGE's headers and body bytes, so a
test can count what the consuming app was shown, by ``row-id`` (the sidecars never show
``mq-sidecar-id`` to an app, docs/behaviour.md, "Duplicate detection"). Every wait is bounded.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any

import stomp

__all__ = ["WAIT", "Drain", "Message", "unique"]

#: Generous bound of one wait on a loaded 2-core machine (no test normally waits this long).
WAIT = 60.0


def unique(prefix: str = "/queue/spark") -> str:
    """A destination name no other test uses."""
    return f"{prefix}.{uuid.uuid4().hex[:10]}"


@dataclass(frozen=True)
class Message:
    """One MESSAGE as the consuming app got it."""

    headers: dict[str, str]
    body: bytes


class Drain:
    """A consumer of ``destination`` through the sidecar at ``127.0.0.1:port``.

    ``connect()`` waits for CONNECTED and the SUBSCRIBE's receipt (each within :data:`WAIT`
    seconds); ``close()`` disconnects. Use as a context manager.
    """

    def __init__(self, port: int, destination: str) -> None:
        self.destination = destination
        self._cond = threading.Condition()
        self._messages: list[Message] = []
        self._receipts: set[str] = set()
        self._connected = False
        self._errors: list[str] = []
        self._last = time.monotonic()
        self.conn = stomp.Connection12(
            [("127.0.0.1", port)], heartbeats=(0, 0), auto_decode=False, reconnect_attempts_max=1
        )
        self.conn.set_listener("drain", self)

    # stomp.py listener
    def on_connected(self, frame: Any) -> None:
        with self._cond:
            self._connected = True
            self._cond.notify_all()

    def on_message(self, frame: Any) -> None:
        headers = {str(k): str(v) for k, v in frame.headers.items()}
        with self._cond:
            self._messages.append(Message(headers, bytes(frame.body)))
            self._last = time.monotonic()
            self._cond.notify_all()

    def on_receipt(self, frame: Any) -> None:
        with self._cond:
            self._receipts.add(frame.headers.get("receipt-id", ""))
            self._cond.notify_all()

    def on_error(self, frame: Any) -> None:
        with self._cond:
            self._errors.append(f"{frame.headers.get('message')}: {frame.body!r}")
            self._cond.notify_all()

    def _wait(self, what: str, done: Any, timeout: float = WAIT) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: done() or bool(self._errors), timeout):
                raise AssertionError(f"drain of {self.destination}: no {what} in {timeout} s")
            if self._errors:
                raise AssertionError(f"drain of {self.destination}: ERROR {self._errors}")

    def connect(self) -> Drain:
        """Connect and subscribe; return self."""
        self.conn.connect(wait=False)
        self._wait("CONNECTED", lambda: self._connected)
        self.conn.subscribe(self.destination, id="drain", ack="auto", headers={"receipt": "sub"})
        self._wait("SUBSCRIBE receipt", lambda: "sub" in self._receipts)
        return self

    def wait_for(self, count: int, timeout: float = WAIT) -> list[Message]:
        """Wait until at least ``count`` messages arrived (raises AssertionError after
        ``timeout`` s); return them all."""
        self._wait(f"{count} messages", lambda: len(self._messages) >= count, timeout)
        return self.messages()

    def settle(self, quiet: float = 1.0, timeout: float = WAIT) -> list[Message]:
        """Wait until no message arrived for ``quiet`` s (at most ``timeout`` s); return all."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._cond:
                idle = time.monotonic() - self._last
            if idle >= quiet:
                break
            time.sleep(min(quiet - idle, max(0.0, deadline - time.monotonic())) + 0.01)
        return self.messages()

    def messages(self) -> list[Message]:
        with self._cond:
            return list(self._messages)

    def row_ids(self) -> Counter[str]:
        """How often each ``row-id`` was shown."""
        return Counter(m.headers.get("row-id", "") for m in self.messages())

    def close(self) -> None:
        if self.conn.is_connected():
            self.conn.transport.disconnect_socket()

    def __enter__(self) -> Drain:
        return self.connect()

    def __exit__(self, *exc: object) -> None:
        self.close()
