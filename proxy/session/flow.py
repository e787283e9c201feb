"""Flow control of one session: the confirmation window, who waits for it to change, the
app's settlements the broker relay may wait for, and a failback's pause of the app's frames
(docs/architecture.md, "Bounded buffers and backpressure by not reading")."""

from __future__ import annotations

import trio

from proxy.tracking.window import ConfirmationWindow

__all__ = ["FlowControl"]


class FlowControl:
    """What makes one session's reads wait.

    Args:
        window: the session's confirmation window.

    Attributes:
        window: frames sent (or to be sent) upstream and not yet confirmed, bounded in bytes
            (``confirmation_window_size``): the app is not read while it is full.
        acks_freed: set when the app settles messages or unsubscribes (the broker relay waits
            for it while ``max_unacked`` messages are outstanding); replaced once waited for.
        failback_hold: while a ``priority_backup`` failback waits for a quiet point
            (proxy.session.link), the event the app's next frame waits for; None otherwise.
        named: every frame still unconfirmed in the window has been named to the app in an
            OUTCOME event as the session ends (a drain, the app's DISCONNECT, a broker's close
            after an ERROR); what ends the session names nothing more.
    """

    __slots__ = ("_changed", "_waiters", "acks_freed", "failback_hold", "named", "window")

    def __init__(self, window: ConfirmationWindow) -> None:
        self.window = window
        self.acks_freed = trio.Event()
        self.failback_hold: trio.Event | None = None
        self.named = False
        self._changed = trio.Event()
        self._waiters = 0

    def window_changed(self) -> None:
        """Wake the tasks waiting for the window to change (room, a new app receipt to
        watch). Called on every relayed frame, so it costs nothing when nobody waits."""
        if self._waiters:
            self._changed.set()
            self._changed = trio.Event()

    async def window_change(self) -> None:
        """Wait for the next :meth:`window_changed`."""
        self._waiters += 1
        try:
            await self._changed.wait()
        finally:
            self._waiters -= 1
