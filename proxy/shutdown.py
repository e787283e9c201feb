"""Shutting the sidecar down: SIGTERM and SIGINT turned into a shutdown request, every
session's drain with its deadline and backstop, and the one log line on how it went
(docs/architecture.md, "Shutdown is a phase with a deadline"; docs/operations.md, "Drain on
SIGTERM").

:meth:`proxy.app.Sidecar.serve` stops accepting, then calls :func:`drain_sessions`; each
session stops reading its app, relays the broker's RECEIPTs until what it forwarded is
confirmed or the deadline passes, names to its app what is still unconfirmed and says goodbye
(:meth:`proxy.session.Session.request_drain`).
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable, Sequence

import trio

from proxy.session import Session
from proxy.session.session import DRAIN_GOODBYE_MAX
from proxy.telemetry.vocabulary import DrainResult

__all__ = ["DRAIN_BACKSTOP_MARGIN", "drain_sessions", "log_drain", "shutdown_on_signals"]

log = logging.getLogger("mq_sidecar.app")

#: Seconds past the drain's deadline and a session's goodbyes before whatever still runs is
#: cancelled (a backstop: sessions end by themselves by then).
DRAIN_BACKSTOP_MARGIN = 0.25


async def shutdown_on_signals(request_shutdown: Callable[[], None]) -> None:
    """Wait for SIGTERM or SIGINT, log it, call ``request_shutdown`` once and return (run it
    in the sidecar's nursery, from the main thread: trio's signal receiver)."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            log.info("received %s", signal.Signals(signum).name)
            request_shutdown()
            return


def drain_sessions(
    sessions: Sequence[Session], drain_timeout: float, backstop: trio.CancelScope
) -> float:
    """Ask every session to drain within ``drain_timeout`` seconds and set ``backstop`` (the
    sessions' nursery's scope) to cancel whatever still runs :data:`DRAIN_BACKSTOP_MARGIN`
    seconds after the deadline and the goodbyes (``DRAIN_GOODBYE_MAX``). Returns the
    deadline (trio seconds)."""
    log.info("shutting down: draining %d session(s) within %g s", len(sessions), drain_timeout)
    deadline = trio.current_time() + drain_timeout
    for session in sessions:
        session.request_drain(deadline)
    # A backstop that should never fire: each session ends by itself at the deadline and says
    # its goodbyes within DRAIN_GOODBYE_MAX.
    backstop.deadline = deadline + DRAIN_GOODBYE_MAX + DRAIN_BACKSTOP_MARGIN
    return deadline


def log_drain(sessions: Sequence[Session]) -> None:
    """One line on how the drain went (each session's frames are named in its own OUTCOME
    event and log lines)."""
    late = [s for s in sessions if s.drain_result is DrainResult.DEADLINE]
    cut = [s for s in sessions if s.drain_result is None and s.core.ending is None]
    if not late and not cut:
        log.info("drain complete: every frame of %d session(s) confirmed", len(sessions))
        return
    log.warning(
        "drain_timeout reached: %d of %d session(s) had %d frame(s) not confirmed (named "
        "to their apps)%s",
        len(late),
        len(sessions),
        sum(s.drain_unconfirmed for s in late),
        f"; {len(cut)} session(s) cut off" if cut else "",
    )
