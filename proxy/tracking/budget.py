"""The process's memory budget: what every session holds together, in bytes, against
``max_memory_bytes`` (docs/behaviour.md, "Limits and bad input"; issue 28).

Each session's limits (``confirmation_window_size``, ``max_frame_bytes``,
``max_transaction_size``) bound one session; times ``max_sessions`` they allow far more than a
container's memory limit. This budget bounds their sum: the confirmation windows' bytes (charged
by :class:`~proxy.tracking.window.ConfirmationWindow` itself, from the byte counts it keeps
anyway), what open transactions keep for replay (:class:`~proxy.tracking.TransactionBytes`),
and the frames being read (:class:`ReadCharge`, by each leg before each read: an app's, which
waits for room, or a broker's, which never waits).

Over it, apps are not read (their frames wait in TCP, as for one session's full window) and new
sessions are refused; what frees memory goes on: broker RECEIPTs confirm windows, frames being
read complete. The one wait here that could hold memory hostage, reads that need more room to
finish their frames and wait on each other, is broken by the overdraft
(:meth:`MemoryBudget.grants`): once everything else held belongs to waiting reads, one of them
at a time goes past the budget. Past it by at most one read (64 KiB) per session that started
a frame under it, the overdraft's frame, and what broker legs are reading (charged, never held
back); a session that only its app can free (:attr:`ReadCharge.must_read`) is read regardless.

Pure: no trio, no clock; the waiting is :mod:`proxy.legs.memory`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["FRAME_COST", "BudgetStatistics", "MemoryBudget", "ReadCharge"]

#: What a frame being read from an app costs, in multiples of its size: the read buffer and
#: the frame taken from it (measured on a sidecar process: a 64 MiB SEND raises the peak RSS
#: by 2.0x the frame, docs/behaviour.md "Limits and bad input"). So one frame of
#: ``max_frame_bytes`` needs twice that of the budget.
FRAME_COST = 2


@dataclass(frozen=True, slots=True)
class BudgetStatistics:
    """The budget now (``/status``, gauges): ``held`` of ``limit`` bytes, the most ever held
    (``peak``), reads waiting for room (``waiting``), sessions refused for it
    (``refused_total``)."""

    held: int
    limit: int
    peak: int
    waiting: int
    refused_total: int


class MemoryBudget:
    """Bytes held by every session of the process, against ``limit``.

    Args:
        limit: ``max_memory_bytes`` (> 0).

    Attributes:
        held: bytes charged now. peak: the most ever charged.
        waiting_bytes: what reads waiting for room hold (:meth:`fits`).
        on_release: called (synchronously) after every release while a read waits, so the
            I/O layer can wake it; None when nothing waits.

    Raises:
        ValueError: ``limit`` <= 0.
    """

    __slots__ = (
        "held",
        "limit",
        "on_release",
        "overdraft",
        "peak",
        "refused_total",
        "waiting",
        "waiting_bytes",
    )

    def __init__(self, limit: int) -> None:
        if limit <= 0:
            raise ValueError("limit must be > 0")
        self.limit = limit
        self.held = 0
        self.peak = 0
        self.waiting = 0
        self.waiting_bytes = 0
        self.refused_total = 0
        self.on_release: Callable[[], None] | None = None
        #: The one read allowed past the budget (:meth:`grants`), until its frame is handed on.
        self.overdraft: ReadCharge | None = None

    @property
    def over(self) -> bool:
        """Whether everything allowed is held: apps are not read, new sessions refused."""
        return self.held >= self.limit

    def charge(self, nbytes: int) -> None:
        """Hold ``nbytes`` more (a negative count releases: see :meth:`release`)."""
        held = self.held + nbytes
        self.held = held
        self.peak = max(self.peak, held)
        if nbytes < 0 and self.waiting and self.on_release is not None:
            self.on_release()

    def release(self, nbytes: int) -> None:
        """Hold ``nbytes`` less."""
        self.charge(-nbytes)

    def grants(self, charge: ReadCharge, nbytes: int) -> bool:
        """Whether the read of ``charge`` may take ``nbytes`` more now: when they fit under
        the limit; or, past it, when everything else held belongs to reads waiting for room
        (nothing else will drain: windows are confirmed, frames being read on were handed on)
        and no other read holds the overdraft: then this read holds it until its frame is
        handed on. So reads waiting on each other never wait forever, and only one at a time
        goes past the budget, by at most one frame."""
        if self.held + nbytes <= self.limit:
            return True
        if self.overdraft is not None and self.overdraft is not charge:
            return False
        if self.held - self.waiting_bytes - charge.charged > 0:
            return False
        self.overdraft = charge
        return True

    def statistics(self) -> BudgetStatistics:
        """The budget now."""
        return BudgetStatistics(
            held=self.held,
            limit=self.limit,
            peak=self.peak,
            waiting=self.waiting,
            refused_total=self.refused_total,
        )


class ReadCharge:
    """What one app leg's read buffer holds against the budget (``charged``): the frame being
    read, or (between frames) nothing. Updated before each read by :meth:`wanted`.

    Args:
        budget: the process's budget.
        chunk: the most one read brings (``proxy.legs.stream.RECEIVE_SIZE``).
    """

    __slots__ = ("budget", "charged", "chunk", "frame", "must_read")

    def __init__(self, budget: MemoryBudget, chunk: int) -> None:
        self.budget = budget
        self.chunk = chunk
        self.charged = 0
        self.frame = 0
        #: Whether only the app's next frames can free what its session holds (its window
        #: waits for a COMMIT, its broker relay for ACKs): then its reads never wait for the
        #: budget (they are charged all the same), or the session would wait for itself.
        self.must_read: Callable[[], bool] | None = None

    def wanted(self, buffered: int, total: int, frame: int) -> int:
        """What to hold before the next read, given the frame in progress (``(buffered,
        total)``, :meth:`protocol.Connection.frame_in_progress`; ``frame``: how many frames
        the leg has returned, so a frame that began after the charged one is told apart): 0
        between frames (then the charge is released here: the read waits only while the
        budget is over), the whole frame once its size is known, else what is buffered plus
        one read. A frame returned leaves its charge (its bytes are the window's now): a new
        frame is charged what of it is buffered, and reserves its own size."""
        if frame != self.frame:
            self.frame = frame
            self.handed(buffered)
        if not buffered:
            if self.charged:
                self.budget.release(self.charged)
                self.charged = 0
            return 0
        if total >= 0:
            return FRAME_COST * max(total, buffered)
        return FRAME_COST * buffered + self.chunk

    def handed(self, buffered: int) -> None:
        """The frame read was handed on (into the confirmation window, which charges its
        bytes): hold only what is ``buffered`` after it (a reservation for the next frame is
        made before the next read), and give the overdraft back."""
        budget = self.budget
        if budget.overdraft is self:
            budget.overdraft = None
            if budget.waiting and budget.on_release is not None:
                budget.on_release()
        if self.charged > buffered:
            self.take(buffered)

    def take(self, nbytes: int) -> None:
        """Hold ``nbytes`` from now on (granted, or what a read brought)."""
        self.budget.charge(nbytes - self.charged)
        self.charged = nbytes

    def close(self) -> None:
        """The leg is gone: release what it held."""
        if self.budget.overdraft is self:
            self.budget.overdraft = None
        if self.charged:
            self.budget.release(self.charged)
            self.charged = 0
