"""The outbox directory's lock: one sidecar process per ``outbox_dir`` (issue 17).

``fcntl.flock`` on ``<outbox_dir>/outbox.lock``, taken without waiting and held as long as the
file stays open, that is for the life of the store (and so of the process that opened it): the
kernel drops it when the process dies, even by kill -9, so a crash never leaves a stale lock.
The holder writes its PID into the file, so that a second sidecar can say who holds it. flock
locks are advisory and per open file: a second open in the same process conflicts too.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from proxy.outbox.errors import OutboxLocked

__all__ = ["LOCK_NAME", "DirectoryLock"]

#: The lock file's name inside ``outbox_dir``.
LOCK_NAME = "outbox.lock"


class DirectoryLock:
    """An exclusive lock on one directory, held from :meth:`acquire` until :meth:`release`.

    Raises:
        OutboxLocked: from :meth:`acquire`, when another open file (another process, or another
            :class:`DirectoryLock` here) holds it; the message names the holder's PID.
        OSError: the directory or the lock file cannot be created or opened.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / LOCK_NAME
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        """True between a successful :meth:`acquire` and :meth:`release`."""
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock now or raise :class:`OutboxLocked` (never waits)."""
        if self._fd is not None:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_pid(fd)
            os.close(fd)
            raise OutboxLocked(self.directory, pid) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Drop the lock (closing the file drops it); idempotent."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def _read_pid(fd: int) -> int | None:
    """The PID the holder wrote, None if the file holds none (yet)."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii").strip()
        return int(text) if text else None
    except (OSError, UnicodeDecodeError, ValueError):
        return None
