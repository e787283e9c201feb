"""The session's phases and the transitions between them, as a table (h11's ``_state.py``
style): a transition that is not in the table raises :class:`PhaseError`, so a bug that would
put a session in an impossible phase fails loudly at the point where it happens.

::

    HANDSHAKE ──► RUNNING ◄──► RECONNECTING
        │  │         │              │ ▲
        │  └─────────┼──────────────┼─┘  (outbox: CONNECT answered with no broker up)
        └────────────┴──► CLOSING ◄─┘          every phase ──► CLOSED
"""

from __future__ import annotations

import enum

__all__ = ["TRANSITIONS", "Phase", "PhaseError", "PhaseMachine"]


class Phase(enum.StrEnum):
    """Where a session is (``SessionStatistics.state``, the ``state`` label of
    ``mq_sidecar_sessions``)."""

    #: Waiting for the app's CONNECT, then for the first broker to accept.
    HANDSHAKE = "handshake"
    #: Relaying both ways over a live upstream leg.
    RUNNING = "running"
    #: The leg was lost: nothing goes to the app, its frames wait in the window ("stop the
    #: world"), the reconnect policy runs.
    RECONNECTING = "reconnecting"
    #: An :class:`~proxy.session.ending.Ending` was decided; the tasks are unwinding.
    CLOSING = "closing"
    #: The app's socket is closed.
    CLOSED = "closed"


#: Every allowed transition. A session may be cancelled (the sidecar stops) in any phase,
#: hence CLOSED from everywhere; nothing leaves CLOSED.
TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    # RECONNECTING from HANDSHAKE: in outbox mode the sidecar answers the app's CONNECT
    # itself when no broker answers the first round (docs/outbox.md), and keeps trying.
    Phase.HANDSHAKE: frozenset({Phase.RUNNING, Phase.RECONNECTING, Phase.CLOSING, Phase.CLOSED}),
    Phase.RUNNING: frozenset({Phase.RECONNECTING, Phase.CLOSING, Phase.CLOSED}),
    # RECONNECTING again: the new leg was lost before its restore finished.
    Phase.RECONNECTING: frozenset({Phase.RUNNING, Phase.RECONNECTING, Phase.CLOSING, Phase.CLOSED}),
    Phase.CLOSING: frozenset({Phase.CLOSED}),
    Phase.CLOSED: frozenset(),
}


class PhaseError(RuntimeError):
    """A transition not in :data:`TRANSITIONS` was attempted (a bug in the session)."""


class PhaseMachine:
    """The current :class:`Phase` of one session; changed only through :meth:`advance`."""

    __slots__ = ("phase",)

    def __init__(self) -> None:
        self.phase = Phase.HANDSHAKE

    def advance(self, to: Phase) -> None:
        """Move to ``to``. Raises :class:`PhaseError` if the table does not allow it."""
        if to not in TRANSITIONS[self.phase]:
            raise PhaseError(f"session phase {self.phase} cannot become {to}")
        self.phase = to
