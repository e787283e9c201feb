"""The streaming reader's STOMP session: one stomp.py connection on the driver, one
``client-individual`` subscription, and a bounded hand-over queue.

stomp.py delivers MESSAGE frames on its own receiver thread; they are put into a queue of at most
``prefetch`` frames that the driver's reader drains on each ``latestOffset``/``commit``. The
broker sends at most ``prefetch`` unacknowledged messages (ActiveMQ ``activemq.prefetchSize``,
RabbitMQ ``prefetch-count``: both headers are sent, each broker ignores the other's), so the queue
does not fill; should a broker ignore the window, the receiver thread blocks on the full queue
and TCP pushes back on the sidecar. ACKs go on this same connection (STOMP 1.2, "ACK": the
``id`` is the ``ack`` header of a MESSAGE of this connection).

Every wait is bounded by the ``timeout`` option; any failure (no sidecar at ``host:port``, an
ERROR frame, the connection lost) raises :class:`StompReadError` with the reason.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from typing import Any

import stomp
import stomp.exception
import stomp.protocol

from ._read_options import ReadOptions

__all__ = ["Delivery", "StompReadError", "StompSession"]

#: The subscription id and receipt ids of the session.
SUBSCRIPTION_ID = "mq-sidecar-spark-read"

#: A MESSAGE as received: its headers (first entry of each name, STOMP 1.2 "Repeated Header
#: Entries") and its body.
Delivery = tuple[dict[str, str], bytes]


class StompReadError(RuntimeError):
    """The STOMP session of the streaming reader failed (the message says how)."""


class StompSession:
    """Connect to the sidecar, subscribe to ``options.destination``; see module docstring.

    :meth:`start` raises :class:`StompReadError` if nothing listens at ``host:port``, CONNECT or
    SUBSCRIBE is refused (the broker's ERROR ``message`` and body in the text), or no answer
    comes within ``timeout`` seconds.
    """

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self.where = f"{options.host}:{options.port}"
        self._queue: queue.Queue[Delivery] = queue.Queue(maxsize=options.prefetch)
        self._connected = threading.Event()
        self._subscribed = threading.Event()
        self._failed = threading.Event()
        self._closing = threading.Event()
        self._bye = threading.Event()
        self._error: str | None = None
        self._conn: Any = None

    # -- stomp.py listener (receiver thread) --------------------------------------------------

    def on_connected(self, frame: Any) -> None:
        self._connected.set()

    def on_message(self, frame: Any) -> None:
        body = frame.body if isinstance(frame.body, bytes) else str(frame.body).encode()
        item: Delivery = (dict(frame.headers), body)
        while not self._closing.is_set():
            try:
                self._queue.put(item, timeout=0.5)
                return
            except queue.Full:
                continue

    def on_receipt(self, frame: Any) -> None:
        receipt = frame.headers.get("receipt-id")
        if receipt == f"{SUBSCRIPTION_ID}-sub":
            self._subscribed.set()
        elif receipt == f"{SUBSCRIPTION_ID}-bye":
            self._bye.set()

    def on_error(self, frame: Any) -> None:
        body = frame.body.decode(errors="replace") if isinstance(frame.body, bytes) else frame.body
        message = frame.headers.get("message", "ERROR")
        text = f"{message}: {body.strip()}" if body and body.strip() else str(message)
        if self._error is None:
            self._error = f"the sidecar at {self.where} sent ERROR {text}"
        self._failed.set()

    def on_disconnected(self) -> None:
        if not self._closing.is_set() and self._error is None:
            self._error = f"the connection to the sidecar at {self.where} was lost"
        self._failed.set()

    # -- driver thread ------------------------------------------------------------------------

    def _wait(self, event: threading.Event, what: str) -> None:
        deadline = time.monotonic() + self.options.timeout
        while not event.is_set():
            if self._failed.is_set():
                self.check()
            left = deadline - time.monotonic()
            if left <= 0:
                raise StompReadError(
                    f"no answer to {what} from the sidecar at {self.where} within "
                    f"{self.options.timeout:g} s (option timeout)"
                )
            event.wait(min(left, 0.1))
        self.check()

    def start(self) -> None:
        """Connect and subscribe (waits for the CONNECTED and the SUBSCRIBE's RECEIPT)."""
        opts = self.options
        conn = stomp.Connection12(
            [(opts.host, opts.port)],
            heartbeats=(0, 0),
            auto_decode=False,
            reconnect_attempts_max=1,
            timeout=opts.timeout,
            vhost=opts.vhost,
        )
        conn.set_listener("mq-sidecar-spark-read", self)
        self._conn = conn
        try:
            # Connection12.connect starts the transport (socket and receiver thread) itself:
            # starting it before as well makes a second receiver thread on the same socket.
            conn.connect(opts.login, opts.passcode, wait=False)
        except stomp.exception.ConnectFailedException:
            raise StompReadError(
                f"cannot connect to the sidecar at {self.where} (is mq-sidecar running there? "
                "options host and port)"
            ) from None
        self._wait(self._connected, "CONNECT")
        headers = {
            **opts.subscription_headers,
            "activemq.prefetchSize": str(opts.prefetch),
            "prefetch-count": str(opts.prefetch),
            "receipt": f"{SUBSCRIPTION_ID}-sub",
        }
        conn.subscribe(
            opts.destination, id=SUBSCRIPTION_ID, ack="client-individual", headers=headers
        )
        try:
            self._wait(self._subscribed, f"SUBSCRIBE to {opts.destination}")
        except StompReadError as exc:
            raise StompReadError(f"SUBSCRIBE to {opts.destination} failed: {exc}") from None

    def check(self) -> None:
        """Raise :class:`StompReadError` if the session failed (ERROR, connection lost)."""
        if self._failed.is_set():
            raise StompReadError(self._error or f"the session with {self.where} failed")

    def take(self, limit: int) -> list[Delivery]:
        """Up to ``limit`` deliveries received so far, oldest first (never waits)."""
        taken: list[Delivery] = []
        while len(taken) < limit:
            try:
                taken.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return taken

    def ack(self, ack_id: str) -> None:
        """ACK one delivery of this connection (``client-individual``: only that one)."""
        self.check()
        self._conn.ack(ack_id)

    def close(self) -> None:
        """DISCONNECT (bounded by ``timeout``) and stop the receiver thread; what was not ACKed
        is redelivered by the broker. Never raises."""
        self._closing.set()
        conn, self._conn = self._conn, None
        if conn is None:
            return
        with contextlib.suppress(Exception):
            if conn.is_connected():
                stomp.protocol.Protocol12.disconnect(conn, receipt=f"{SUBSCRIPTION_ID}-bye")
                self._bye.wait(min(self.options.timeout, 5.0))
        with contextlib.suppress(Exception):
            conn.transport.disconnect_socket()
