"""The outbox's errors: what the store and the group committer raise.

A leaf module: the store, the lock and the committer import it, and it imports none of them.
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "OutboxClosed",
    "OutboxError",
    "OutboxFull",
    "OutboxFullTimeout",
    "OutboxLocked",
    "OutboxWriteError",
]


class OutboxError(Exception):
    """Base of every error of the outbox (``proxy.outbox``)."""


class OutboxFull(OutboxError):
    """An append would take the outbox past ``outbox_max_bytes``; nothing of it was stored.

    Attributes:
        needed: bytes (frame bytes) the refused append holds.
        used: bytes the outbox held (or had promised to queued appends) when it refused.
        max_bytes: the bound, ``outbox_max_bytes``.
    """

    def __init__(self, needed: int, used: int, max_bytes: int) -> None:
        self.needed = needed
        self.used = used
        self.max_bytes = max_bytes
        if needed > max_bytes:
            text = (
                f"{needed} bytes to append exceed outbox_max_bytes ({max_bytes}) by themselves; "
                "they can never be stored"
            )
        else:
            text = (
                f"outbox full: {needed} bytes to append, {used} of outbox_max_bytes "
                f"({max_bytes}) in use"
            )
        super().__init__(text)


class OutboxFullTimeout(OutboxFull):
    """The caller's deadline passed while its append waited for room under
    ``outbox_max_bytes`` (back-pressure); nothing of it was stored. The session answers the app
    with an ERROR naming the limit (issue 17: "a frame that would wait past ``call_timeout``
    gets an ERROR naming the limit")."""

    def __init__(self, needed: int, used: int, max_bytes: int, waited: float) -> None:
        super().__init__(needed, used, max_bytes)
        self.waited = waited
        self.args = (f"{self.args[0]}; waited {waited:.3f} s for room",)


class OutboxLocked(OutboxError):
    """Another process holds the outbox directory's lock: two sidecars never share one
    ``outbox_dir`` (issue 17). ``pid`` is the holder's process id as it wrote it into the lock
    file, None if unreadable."""

    def __init__(self, directory: Path, pid: int | None) -> None:
        self.directory = directory
        self.pid = pid
        holder = f"process {pid}" if pid is not None else "another process (PID unknown)"
        super().__init__(
            f"outbox_dir {directory} is in use by {holder}: two sidecars cannot share one "
            "outbox_dir"
        )


class OutboxClosed(OutboxError):
    """The group committer is closing or closed: no new writes are taken."""


class OutboxWriteError(OutboxError):
    """A write transaction failed (SQLite error, disk full, I/O error): nothing of the
    transaction was stored, and no waiter of it may treat its frames as durable. The cause is
    chained (``__cause__``)."""
