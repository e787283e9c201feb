"""How a session ends and what each side is told: the :class:`Ending` value, the ERROR frames
the sidecar itself writes to an app, and the endings of the usual causes.

Pure values (no I/O): whoever decides that a session is over builds an :class:`Ending` here and
hands it to :meth:`proxy.session.core.SessionCore.end`; the first one wins.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from protocol import Command, Frame
from proxy.failover import ReconnectExhausted
from proxy.upstream import UpstreamRefused, UpstreamUnavailable
from proxy.vocabulary import FailoverReason

__all__ = [
    "Ending",
    "Loss",
    "draining",
    "error_frame",
    "exhausted_initially",
    "no_broker",
]


def error_frame(message: str, *, receipt_id: str | None = None, detail: str = "") -> Frame:
    """An ERROR frame for the app: one-line ``message`` header, optional ``receipt-id``.

    STOMP 1.2 "ERROR": the ``message`` header is a short description, the body may hold more;
    ``receipt-id`` is set when the frame that caused it asked for a receipt.
    """
    headers: list[tuple[str, str]] = [("message", message)]
    if receipt_id is not None:
        headers.append(("receipt-id", receipt_id))
    headers.append(("content-type", "text/plain"))
    return Frame(Command.ERROR, tuple(headers), (detail or message).encode() + b"\n")


@dataclass(frozen=True, slots=True)
class Ending:
    """Why a session ends and what each side is told.

    ``app_error``: the ERROR frame the app gets before its connection closes (None: nothing,
    e.g. the app went away or already got its RECEIPT). ``disconnect_upstream``: send the broker
    a DISCONNECT (and wait for its receipt) rather than just closing the socket. ``level``: the
    log level of the session's closing line.
    """

    reason: str
    app_error: Frame | None = None
    disconnect_upstream: bool = True
    level: int = logging.INFO


@dataclass(frozen=True, slots=True)
class Loss:
    """The loss of an upstream leg: when (trio seconds), which broker (its label), why."""

    at: float
    broker: str | None
    reason: str
    kind: FailoverReason = FailoverReason.CONNECTION_LOST


def draining() -> Ending:
    """The sidecar is shutting down (SIGTERM): DISCONNECT upstream, ERROR to the app."""
    return Ending(
        "sidecar shutting down",
        app_error=error_frame("mq-sidecar is shutting down; reconnect to continue"),
    )


def no_broker(exc: UpstreamUnavailable) -> Ending:
    """A session's first connection failed on ``exc``. A broker's refusal reaches the app with
    the broker's own ERROR (its ``message`` kept, its ``receipt-id`` dropped); anything else is
    the sidecar's ERROR naming the cause."""
    if isinstance(exc, UpstreamRefused):
        message = exc.error.get("message") or "broker refused the connection"
        err = exc.error.without("receipt-id").with_header("message", message)
        return Ending(f"broker refused CONNECT: {exc}", app_error=err, level=logging.WARNING)
    return Ending(
        f"no broker available: {exc}",
        app_error=error_frame(f"mq-sidecar could not connect to a broker: {exc}"),
        level=logging.WARNING,
    )


def exhausted_initially(exc: ReconnectExhausted) -> Ending:
    """The policy gave up on a session's first connection: the last failure is reported
    (a refusal as the broker's own ERROR, :func:`no_broker`)."""
    if exc.last is not None:
        return no_broker(exc.last)
    return Ending(
        f"no broker available: {exc}",
        app_error=error_frame(f"mq-sidecar could not connect to a broker: {exc}"),
        level=logging.WARNING,
    )
