"""What the stream tests share (issue 32): the stomp.py app straight to the broker that tracks
its own offset (the comparison for the sidecar, tests/integration/test_streams.py and
test_streams_cluster.py) and the figures printed per case."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from contextlib import suppress
from typing import Any

import stomp

#: Seconds the direct app waits for its first SUBSCRIBE's RECEIPT, or held at ``hold_at``.
WAIT = 30.0


class DirectApp(stomp.ConnectionListener):  # type: ignore[misc]
    """A stomp.py app straight to the nodes that tracks its own offset: ``client-individual``,
    ``prefetch-count`` 50, one ACK per MESSAGE, subscribed at ``position``; when its connection
    ends or an ERROR comes, it connects to the next node of ``nodes`` and re-subscribes at
    ``offset=<last + 1>`` (at ``position`` if it saw nothing yet). With ``hold_at``, its
    listener stops at the MESSAGE with that ``seq`` (``held`` is set) until :meth:`release`:
    the app is mid-read, with MESSAGEs it has not acknowledged, when a test cuts it."""

    def __init__(
        self,
        nodes: list[tuple[str, int]],
        destination: str,
        position: str = "first",
        hold_at: int | None = None,
    ) -> None:
        self.nodes = nodes
        self.destination = destination
        self.position = position
        self.hold_at = hold_at
        self.shown: list[int] = []
        self.errors: list[str] = []
        self.resubscribes = 0
        self.dropped = 0  # MESSAGEs at or before its last offset: redeliveries it hid
        self.refused = 0  # connects or SUBSCRIBEs that failed (a node down, refusing)
        self.last: int | None = None
        self.lock = threading.Lock()
        self.broken = threading.Event()
        self.subscribed = threading.Event()
        self.held = threading.Event()
        self._release = threading.Event()
        self.index = 0
        self.conn: Any = None
        self._open()
        if not self.subscribed.wait(WAIT):  # the SUBSCRIBE is in place before any publish
            raise AssertionError(f"no RECEIPT for the SUBSCRIBE to {destination}")

    def _open(self) -> None:
        self.broken.clear()
        conn = stomp.Connection12([self.nodes[self.index]], heartbeats=(0, 0), vhost="/")
        conn.set_listener("app", self)
        self.conn = conn
        conn.connect(wait=True)
        position = self.position if self.last is None else f"offset={self.last + 1}"
        conn.subscribe(
            self.destination,
            id="s",
            ack="client-individual",
            headers={"prefetch-count": "50", "x-stream-offset": position, "receipt": "sub"},
        )

    def on_receipt(self, frame: Any) -> None:
        self.subscribed.set()

    def on_message(self, frame: Any) -> None:
        offset = int(frame.headers["x-stream-offset"])
        seq = int(frame.headers["seq"])
        with self.lock:
            if self.last is None or offset > self.last:  # its own redelivery check
                self.shown.append(seq)
                self.last = offset
            else:
                self.dropped += 1
        with suppress(Exception):
            self.conn.ack(frame.headers["ack"])
        if seq == self.hold_at:
            self.held.set()
            self._release.wait(WAIT)

    def release(self) -> None:
        """Let a listener held at ``hold_at`` go on."""
        self._release.set()

    def on_error(self, frame: Any) -> None:
        self.errors.append(str(frame.headers.get("message")))
        self.broken.set()

    def on_disconnected(self) -> None:
        self.broken.set()

    def _detach(self) -> None:
        with suppress(Exception):
            self.conn.remove_listener("app")
        with suppress(Exception):
            self.conn.disconnect()

    def keep_up(self, until: Callable[[], bool], timeout: float) -> None:
        """Until ``until()``: re-open on the next node whenever the connection broke (bounded
        by ``timeout`` seconds; a node that refuses is tried again after the others)."""
        deadline = time.monotonic() + timeout
        while not until() and time.monotonic() < deadline:
            if self.broken.wait(0.05):
                self._detach()
                self.index = (self.index + 1) % len(self.nodes)
                try:
                    self._open()
                except Exception:
                    self.refused += 1
                    self.broken.set()
                    time.sleep(0.1)
                else:
                    self.resubscribes += 1

    def close(self) -> None:
        self.release()
        self.broken.set()
        self._detach()


def figures(shown: list[int], expected: Iterable[int]) -> tuple[int, int, int]:
    """(shown, shown twice, missing) of the ``seq`` list ``shown`` against ``expected``."""
    counts = Counter(shown)
    twice = sum(1 for n in counts.values() if n > 1)
    return len(shown), twice, sum(1 for s in expected if s not in counts)
