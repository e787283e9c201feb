"""One STOMP 1.2 connection to the sidecar (stomp.py) whose every wait is bounded: the data
source's one connection wrapper, used by both halves.

- **The writer** opens one per task attempt, on the executor
  (:func:`mq_sidecar_spark.writer.write_partition`): SENDs with pipelined receipts
  (:meth:`Link.send`, :meth:`Link.wait_below`), then a DISCONNECT once every one is confirmed.
- **The streaming reader** opens one per query, on the driver
  (:class:`mq_sidecar_spark.reader.StompStreamReader`): one ``client-individual`` subscription
  (:meth:`Link.subscribe`), its MESSAGEs handed over through a bounded queue (:meth:`Link.take`),
  ACKs on the same connection (:meth:`Link.ack`; STOMP 1.2, "ACK": the ``id`` is the ``ack``
  header of a MESSAGE of this connection).
- **The stream read** (``stream=true``) has a connection of its own, read on the task's thread
  without stomp.py (:class:`mq_sidecar_spark._stream_link.StreamLink`: a task reads as fast as
  the sidecar relays, and stomp.py's parse and thread handoff cost it most of its CPU); it
  shares this module's error texts (:func:`error_frame`, :func:`refused`, :func:`write_blocked`,
  :func:`write_failed`) and :data:`Delivery`.

stomp.py's own waits are not bounded: ``connect(wait=True)`` polls until CONNECTED with no
deadline, and a blocking ``sendall`` to a peer that stopped reading (the sidecar applies
backpressure by not reading its app while its confirmation window is full, docs/behaviour.md,
"Confirmation window") blocks for good. So :class:`Link` waits for CONNECTED, receipts and the
DISCONNECT itself on a condition with a deadline, and a watchdog thread closes the socket under
a write that has been going on for more than ``timeout`` seconds (the write then fails, and the
task or the query with it).

Confirmation is cumulative: the sidecar answers an app's receipt only once the broker has
confirmed that frame and every earlier one of the session (docs/behaviour.md, "Confirmation
window"), so the last receipt of a task covers every row it sent.

MESSAGEs arrive on stomp.py's receiver thread and go into a queue of at most ``inbox`` frames.
The reader subscribes with a prefetch window of that size (ActiveMQ ``activemq.prefetchSize``,
RabbitMQ ``prefetch-count``: both headers are sent, each broker ignores the other's), so the
queue does not fill; should a broker ignore the window, the receiver thread blocks on the full
queue and TCP pushes back on the sidecar.

Failures raise the errors of :mod:`mq_sidecar_spark.errors` with the writer's texts; the reader
turns them into its one :class:`~mq_sidecar_spark.errors.StompReadError` with its own
(:mod:`mq_sidecar_spark.reader`).
"""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
import time
from typing import Any

from mq_sidecar_spark.errors import (
    StompConnectError,
    StompConnectionLost,
    StompErrorFrame,
    StompTimeout,
)

__all__ = ["Delivery", "Link", "error_frame", "refused", "write_blocked", "write_failed"]

#: A MESSAGE as received: its headers (first entry of each name, STOMP 1.2 "Repeated Header
#: Entries") and its body.
Delivery = tuple[dict[str, str], bytes]

#: Seconds the DISCONNECT's receipt is waited for at most (and never longer than ``timeout``)
#: before the socket is closed anyway (the rows are all confirmed by then; Python workers are
#: reused, so nothing may linger).
_DISCONNECT_WAIT = 5.0
#: Seconds an ERROR frame may trail a failed socket write (the sidecar writes its ERROR,
#: then closes; the write may see the close first).
_ERROR_GRACE = 2.0
#: The receipt id of the DISCONNECT.
_BYE = "mq-sidecar-spark-disconnect"


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return "" if value is None else str(value)


def error_frame(address: str, message: Any, body: Any) -> StompErrorFrame:
    """The :class:`StompErrorFrame` of an ERROR from the sidecar at ``address`` with the
    ``message`` header and the ``body`` given (str, bytes or None)."""
    message, body = _text(message), _text(body).strip()
    text = f"the sidecar at {address} sent ERROR: {message or '(no message header)'}"
    if body:
        text += f"\n{body}"
    return StompErrorFrame(text, message, body)


def refused(address: str, why: str) -> StompConnectError:
    """The :class:`StompConnectError` of a TCP connect to ``address`` that failed with ``why``
    (the socket error's text)."""
    return StompConnectError(
        f"cannot connect to the sidecar at {address}: {why} "
        "(is mq-sidecar running there? options host and port)"
    )


def write_blocked(address: str, what: str, timeout: float) -> StompTimeout:
    """The :class:`StompTimeout` of a write of ``what`` to ``address`` that did not end within
    ``timeout`` s."""
    return StompTimeout(
        f"writing {what} to {address} blocked for more than {timeout:g} s (option timeout): "
        "the sidecar stopped reading"
    )


def write_failed(address: str, what: str, exc: Exception) -> StompConnectionLost:
    """The :class:`StompConnectionLost` of a write of ``what`` to ``address`` that failed with
    ``exc`` (no ERROR came)."""
    return StompConnectionLost(
        f"the connection to the sidecar at {address} failed while writing {what}: {exc!r}"
    )


class Link:
    """A STOMP connection to ``host:port``: one per write task attempt, one per read query.

    Args:
        host, port: the sidecar's STOMP listener.
        login, passcode: the CONNECT credentials, or None.
        timeout: seconds any one wait may take: the TCP connect, the CONNECTED, one frame's
            write, a receipt.
        vhost: the CONNECT's ``host`` header (RabbitMQ's vhost), or None for none.
        inbox: MESSAGEs held at most until :meth:`take` (the reader's prefetch); 0 for a
            connection that subscribes to nothing (the writer), whose MESSAGEs are dropped.

    Called from one thread (the task's, the driver's); stomp.py's receiver thread calls the
    ``on_*`` methods. Raises the errors of :mod:`mq_sidecar_spark.errors`.
    """

    def __init__(
        self,
        host: str,
        port: int,
        login: str | None,
        passcode: str | None,
        timeout: float,
        *,
        vhost: str | None = None,
        inbox: int = 0,
    ) -> None:
        self.address = f"{host}:{port}"
        self._host, self._port = host, port
        self._login, self._passcode = login, passcode
        self._vhost = vhost
        self.timeout = timeout
        self._inbox: queue.Queue[Delivery] | None = queue.Queue(inbox) if inbox > 0 else None
        self._closing = threading.Event()
        self._cond = threading.Condition()
        self._pending: set[str] = set()
        self._error: StompErrorFrame | None = None
        self._connected = False
        self._closed = False
        self._bye = False
        self._writing_since: float | None = None
        self._watchdog_fired = False
        self._stop = threading.Event()
        self._conn: Any = None
        self.receipts = 0

    # -- stomp.py listener -----------------------------------------------------------------

    def on_connected(self, frame: Any) -> None:
        with self._cond:
            self._connected = True
            self._cond.notify_all()

    def on_message(self, frame: Any) -> None:
        inbox = self._inbox
        if inbox is None:
            return
        body = frame.body if isinstance(frame.body, bytes) else str(frame.body).encode()
        item: Delivery = (dict(frame.headers), body)
        while not self._closing.is_set():
            try:
                inbox.put(item, timeout=0.5)
                return
            except queue.Full:
                continue

    def on_receipt(self, frame: Any) -> None:
        with self._cond:
            receipt = frame.headers.get("receipt-id", "")
            if receipt == _BYE:
                self._bye = True
            elif receipt in self._pending:
                self._pending.discard(receipt)
                self.receipts += 1
            self._cond.notify_all()

    def on_error(self, frame: Any) -> None:
        error = error_frame(self.address, frame.headers.get("message", ""), frame.body)
        with self._cond:
            if self._error is None:
                self._error = error
            self._cond.notify_all()

    def on_disconnected(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # -- the owner's side (the task's thread, the driver's) -----------------------------------

    @property
    def lost(self) -> bool:
        """True once the connection closed without :meth:`close` (the peer closed it, or a
        failed write did)."""
        return self._closed and not self._closing.is_set()

    def open(self) -> None:
        """:meth:`start`, then :meth:`connect`."""
        self.start()
        self.connect()

    def start(self) -> None:
        """Open the TCP connection and stomp.py's receiver thread (at most ``timeout`` s).

        Raises :class:`StompConnectError` when nothing listens at host:port (with the socket
        error).
        """
        import stomp  # noqa: PLC0415 (imported where the task runs)

        conn = stomp.Connection12(
            [(self._host, self._port)],
            heartbeats=(0, 0),
            auto_content_length=True,
            auto_decode=False,
            reconnect_attempts_max=1,
            prefer_localhost=False,
            try_loopback_connect=False,
            timeout=self.timeout,
            vhost=self._vhost,
        )
        conn.set_listener("mq-sidecar-spark", self)
        self._conn = conn
        try:
            conn.transport.start()
        except stomp.exception.ConnectFailedException:
            raise refused(self.address, self._why_refused()) from None
        # The socket timeout stomp.py set for the TCP connect would also end its reader
        # after `timeout` seconds of silence; waits are bounded here instead.
        with contextlib.suppress(OSError, AttributeError):
            conn.transport.socket.settimeout(None)
        threading.Thread(target=self._watch, name="mq-sidecar-spark-watchdog", daemon=True).start()

    def connect(self) -> None:
        """Send CONNECT and wait for CONNECTED (at most ``timeout`` seconds), after :meth:`start`.

        Raises :class:`StompConnectError` (no CONNECTED in time; the connection closed before
        it: see :attr:`lost`), :class:`StompErrorFrame` (the CONNECT refused).
        """
        import stomp.protocol  # noqa: PLC0415 (imported where the task runs)

        conn = self._conn
        # Protocol12.connect, not conn.connect: Connection12.connect starts the transport again,
        # a second receiver thread reading the same socket.
        self._write(
            lambda: stomp.protocol.Protocol12.connect(conn, self._login, self._passcode, wait=False)
        )
        deadline = time.monotonic() + self.timeout
        with self._cond:
            while not self._connected:
                if self._error is not None:
                    raise self._error
                if self._closed:
                    raise StompConnectError(
                        f"the sidecar at {self.address} closed the connection before CONNECTED"
                    )
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise StompConnectError(
                        f"no CONNECTED from {self.address} within {self.timeout:g} s "
                        "(option timeout)"
                    )
                self._cond.wait(remaining)

    def _why_refused(self) -> str:
        """The socket error of one more TCP connect (only on the failure path)."""
        try:
            with socket.create_connection((self._host, self._port), timeout=self.timeout):
                return "the connection attempt failed once, then succeeded"
        except OSError as exc:
            return exc.strerror or str(exc)

    def _watch(self) -> None:
        """Watchdog thread: close the socket under a write older than ``timeout``."""
        poll = min(1.0, self.timeout / 10)
        while not self._stop.wait(poll):
            since = self._writing_since
            if since is not None and time.monotonic() - since > self.timeout:
                self._watchdog_fired = True
                self._abort_socket()
                return

    def _abort_socket(self) -> None:
        conn = self._conn
        sock = getattr(getattr(conn, "transport", None), "socket", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def _write(self, write: Any, what: str = "CONNECT") -> None:
        """Run ``write`` (a stomp.py send) under the watchdog; a failure becomes the ERROR
        that caused it (waited for up to ``_ERROR_GRACE`` s), or one of ours."""
        self._writing_since = time.monotonic()
        try:
            write()
        except Exception as exc:
            if self._watchdog_fired:
                raise write_blocked(self.address, what, self.timeout) from exc
            with self._cond:
                self._cond.wait_for(lambda: self._error is not None, _ERROR_GRACE)
                if self._error is not None:
                    raise self._error from exc
            raise write_failed(self.address, what, exc) from exc
        finally:
            self._writing_since = None

    def send(
        self, destination: str, body: bytes, headers: dict[str, str], receipt: str | None
    ) -> None:
        """SEND ``body`` to ``destination``; with ``receipt``, ask for (and track) it.

        Raises the sidecar's :class:`StompErrorFrame` once one arrived, or what
        :meth:`_write` raises.
        """
        with self._cond:
            if self._error is not None:
                raise self._error
            if receipt is not None:
                self._pending.add(receipt)
                headers["receipt"] = receipt
        self._write(lambda: self._conn.send(destination, body, headers=headers), "a SEND")

    def wait_below(self, limit: int, what: str) -> None:
        """Wait until fewer than ``limit`` receipts are outstanding (at most ``timeout`` s).

        ``what`` completes the error messages (e.g. "after 200 SENDs"). Raises
        :class:`StompErrorFrame`, :class:`StompConnectionLost`, :class:`StompTimeout`.
        """
        deadline = time.monotonic() + self.timeout
        with self._cond:
            while True:
                if self._error is not None:
                    raise self._error
                if len(self._pending) < limit:
                    return
                if self._closed:
                    raise StompConnectionLost(
                        f"the sidecar at {self.address} closed the connection {what} "
                        f"({len(self._pending)} receipt(s) outstanding, no ERROR)"
                    )
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise StompTimeout(
                        f"no receipt from the sidecar at {self.address} within "
                        f"{self.timeout:g} s {what} ({len(self._pending)} outstanding; "
                        "option timeout)"
                    )
                self._cond.wait(remaining)

    def subscribe(
        self,
        destination: str,
        ident: str,
        headers: dict[str, str],
        *,
        ack: str = "client-individual",
    ) -> None:
        """SUBSCRIBE to ``destination`` (``id`` ``ident``, ``ack`` mode, plus ``headers``) and
        wait for its RECEIPT (at most ``timeout`` s). Its MESSAGEs go into the inbox
        (:meth:`take`, :meth:`take_wait`).

        Raises :class:`StompErrorFrame` (the broker refused it), :class:`StompConnectionLost`,
        :class:`StompTimeout` (no RECEIPT in time), or what :meth:`_write` raises.
        """
        receipt = f"{ident}-sub"
        with self._cond:
            self._pending.add(receipt)
        conn = self._conn
        self._write(
            lambda: conn.subscribe(
                destination,
                id=ident,
                ack=ack,
                headers={**headers, "receipt": receipt},
            ),
            "the SUBSCRIBE",
        )
        self.wait_below(1, f"after the SUBSCRIBE to {destination}")

    def check(self) -> None:
        """Raise the sidecar's :class:`StompErrorFrame` once one arrived, or
        :class:`StompConnectionLost` once the connection is :attr:`lost`; else nothing."""
        with self._cond:
            if self._error is not None:
                raise self._error
            if self.lost:
                raise StompConnectionLost(
                    f"the connection to the sidecar at {self.address} was lost"
                )

    def take(self, limit: int) -> list[Delivery]:
        """Up to ``limit`` MESSAGEs received so far, oldest first (never waits)."""
        taken: list[Delivery] = []
        inbox = self._inbox
        while inbox is not None and len(taken) < limit:
            try:
                taken.append(inbox.get_nowait())
            except queue.Empty:
                break
        return taken

    def take_wait(self, limit: int, wait: float) -> list[Delivery]:
        """Up to ``limit`` MESSAGEs, oldest first: waits at most ``wait`` seconds for the first
        one (none arrived: ``[]``), then takes what else is there without waiting. Raises what
        :meth:`check` raises (an ERROR arrived, the connection was lost) when none is there."""
        inbox = self._inbox
        if inbox is None or limit < 1:
            return []
        try:
            first = inbox.get_nowait()
        except queue.Empty:
            self.check()
            try:
                first = inbox.get(timeout=max(wait, 0.0))
            except queue.Empty:
                self.check()
                return []
        return [first, *self.take(limit - 1)]

    def unsubscribe(self, ident: str) -> None:
        """UNSUBSCRIBE ``ident`` and wait for its RECEIPT (at most ``timeout`` s). MESSAGEs of
        it may still be in the inbox (their ``subscription`` header tells). Raises what
        :meth:`wait_below` and :meth:`_write` raise."""
        receipt = f"{ident}-unsub"
        with self._cond:
            if self._error is not None:
                raise self._error
            self._pending.add(receipt)
        conn = self._conn
        self._write(
            lambda: conn.unsubscribe(ident, headers={"receipt": receipt}), "the UNSUBSCRIBE"
        )
        self.wait_below(1, f"after the UNSUBSCRIBE of {ident}")

    def ack(self, ack_id: str) -> None:
        """ACK one MESSAGE of this connection (``client-individual``: only that one), its
        write bounded as every write is. Raises what :meth:`check` and :meth:`_write` raise."""
        self.check()
        conn = self._conn
        self._write(lambda: conn.ack(ack_id), "an ACK")

    def close(self, *, graceful: bool = True) -> None:
        """With ``graceful``, DISCONNECT and wait for its receipt (at most ``timeout`` and
        ``_DISCONNECT_WAIT`` s); then close the socket and stop the watchdog. Never raises
        (the task's outcome is decided before). A failed task closes without DISCONNECT: its
        frames may be stuck, and a DISCONNECT's receipt would wait behind them. A receiver
        thread waiting for room in the inbox stops waiting (what was not ACKed is redelivered
        by the broker)."""
        self._closing.set()
        conn = self._conn
        if conn is None:
            self._stop.set()
            return
        if graceful and not self._closed and self._error is None and self._connected:
            with contextlib.suppress(Exception):
                self._write(
                    lambda: conn.send_frame("DISCONNECT", {"receipt": _BYE}), "the DISCONNECT"
                )
                with self._cond:
                    self._cond.wait_for(
                        lambda: self._bye or self._closed, min(self.timeout, _DISCONNECT_WAIT)
                    )
        self._stop.set()
        with contextlib.suppress(Exception):
            conn.transport.disconnect_socket()
        self._conn = None
