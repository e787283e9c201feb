"""The drain of one session on SIGTERM (docs/behaviour.md, "Drain on SIGTERM"): whether it
was asked for, until when the session waits for receipts, and what it kept from the app."""

from __future__ import annotations

__all__ = ["DrainState"]


class DrainState:
    """One session's drain.

    Attributes:
        requested: the sidecar asked the session to drain (:meth:`Session.request_drain
            <proxy.session.Session.request_drain>`): the app is no longer read.
        deadline: when the wait for the broker's receipts ends (trio seconds), once
            requested.
        messages_not_shown: MESSAGEs the broker delivered during the drain and the app was
            not shown; unacknowledged, they go back to the broker with the DISCONNECT.
    """

    __slots__ = ("deadline", "messages_not_shown", "requested")

    def __init__(self) -> None:
        self.requested = False
        self.deadline: float | None = None
        self.messages_not_shown = 0
