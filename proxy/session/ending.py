"""How a session ends and what each side is told: the :class:`Ending` value, the ERROR frames
the sidecar itself writes to an app, and the endings of the usual causes.

Pure values (no I/O): whoever decides that a session is over builds an :class:`Ending` here and
hands it to :meth:`proxy.session.core.SessionCore.end`; the first one wins.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from protocol import Command, Frame
from proxy.legs.broker import UpstreamRefused, UpstreamUnavailable
from proxy.reconnect.walk import ReconnectExhausted
from proxy.telemetry.events import FrameReport
from proxy.telemetry.vocabulary import FailoverReason, FrameOutcome
from proxy.tracking import DUPLICATE_ID_HEADER

__all__ = [
    "OUTCOME_HEADER",
    "SUMMARY_NAMES",
    "Ending",
    "Loss",
    "drained",
    "draining",
    "error_frame",
    "exhausted_initially",
    "no_broker",
    "rolled_back_message",
    "summary",
]

#: Header of the sidecar's ERROR about one frame: that frame's :class:`FrameOutcome`
#: (docs/behaviour.md, "Frame outcomes").
OUTCOME_HEADER = "mq-sidecar-outcome"


def rolled_back_message(transaction: str, reason: str) -> str:
    """The ``message`` of the ERROR answering the COMMIT of a transaction the sidecar rolled
    back (:meth:`proxy.tracking.SessionState.roll_back`): "transaction 'tx' rolled back: ..."."""
    return f"transaction '{transaction}' rolled back: {reason}"


def error_frame(
    message: str,
    *,
    receipt_id: str | None = None,
    detail: str = "",
    outcome: FrameOutcome | None = None,
    duplicate_id: str | None = None,
) -> Frame:
    """An ERROR frame for the app: one-line ``message`` header, optional ``receipt-id``.

    STOMP 1.2 "ERROR": the ``message`` header is a short description, the body may hold more;
    ``receipt-id`` is set when the frame that caused it asked for a receipt. An ERROR about
    one frame also names its outcome (:data:`OUTCOME_HEADER`) and, for a SEND, its
    ``mq-sidecar-id`` (``duplicate_id``).
    """
    headers: list[tuple[str, str]] = [("message", message)]
    if receipt_id is not None:
        headers.append(("receipt-id", receipt_id))
    if outcome is not None:
        headers.append((OUTCOME_HEADER, str(outcome)))
    if duplicate_id is not None:
        headers.append((DUPLICATE_ID_HEADER, duplicate_id))
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


#: Frames an ERROR's ``message`` header names at most (its body names them all): a header
#: line stays short enough for any STOMP client's limits.
SUMMARY_NAMES = 20


def summary(reports: Sequence[FrameReport], *, limit: int | None = None) -> str:
    """``N frame(s) not confirmed: <each frame and its outcome>`` for an ERROR or a log line:
    every frame named (nothing unconfirmed is dropped silently, docs/behaviour.md), or the
    first ``limit`` and how many more."""
    shown = reports if limit is None else reports[:limit]
    named = ", ".join(r.describe() for r in shown)
    if len(shown) < len(reports):
        named += f" and {len(reports) - len(shown)} more"
    return f"{len(reports)} frame(s) not confirmed" + (f": {named}" if named else "")


def drained(reports: Sequence[FrameReport]) -> Ending:
    """The drain on SIGTERM is over: everything the session forwarded was confirmed and
    handed to the app (``reports`` empty), or ``reports`` name what was not (``drain_timeout``
    ran out, or a transaction was left open). DISCONNECT upstream, ERROR to the app naming
    those frames (the first :data:`SUMMARY_NAMES` in its ``message``, all in its body)."""
    if not reports:
        return Ending(
            "sidecar shutting down; every frame was confirmed",
            app_error=error_frame(
                "mq-sidecar is shutting down; reconnect to continue",
                detail="mq-sidecar is shutting down (SIGTERM); every frame it took from this "
                "connection was confirmed by the broker. Reconnect to continue.",
            ),
        )
    every = "\n".join(r.describe() for r in reports)
    return Ending(
        f"sidecar shutting down; {len(reports)} frame(s) not confirmed (named in the OUTCOME "
        "event)",
        app_error=error_frame(
            f"mq-sidecar is shutting down; {summary(reports, limit=SUMMARY_NAMES)}",
            detail="mq-sidecar is shutting down (SIGTERM); these frames were not confirmed "
            "(unknown: it reached the broker, which did not confirm it, so it may have taken "
            "effect; lost: it never reached a broker; rolled_back: its transaction was open "
            "and the broker rolls it back; refused: written after the drain began, it was not "
            f"taken and never reached a broker):\n{every}",
        ),
        level=logging.WARNING,
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
