"""The process's memory budget: what every session holds together, in bytes, against
``max_memory_bytes`` (docs/behaviour.md, "One memory budget"; issues 28 and 34).

Each session's limits (``confirmation_window_size``, ``max_frame_bytes``,
``max_transaction_size``) bound one session; times ``max_sessions`` they allow far more than a
container's memory limit. This budget bounds their sum: the confirmation windows' bytes (charged
by :class:`~proxy.tracking.window.ConfirmationWindow` itself, from the byte counts it keeps
anyway), what open transactions keep for replay (:class:`~proxy.tracking.TransactionBytes`),
and the frames being read (:class:`ReadCharge`, by each leg before each read: an app's, which
waits for room, or a broker's, which never waits).

Over it, apps are not read (their frames wait in TCP, as for one session's full window) and new
sessions are refused; what frees memory goes on: broker RECEIPTs confirm windows, frames being
read complete. App reads leave two reserves, each sized by what can happen while they are
held (issue 34), so that what goes on regardless stays inside the limit:

- the broker legs' room (:attr:`MemoryBudget.broker_room`): one read, twice, shared by the
  legs that get only RECEIPTs (and for each of them that once held more, the most it held),
  and for each leg that receives MESSAGEs (:meth:`ReadCharge.receives`) room for the largest
  MESSAGE any such leg held (:attr:`MemoryBudget.message_room`; the broker chooses their
  sizes, and consumers of one destination get alike ones).
- the overdraft's reserve (:attr:`MemoryBudget.reserve`, twice one frame of
  ``max_frame_bytes`` and a read), once for the process.

App reads leave both under the limit whatever they hold. (A first version let windows use the
overdraft's reserve, and kept each receiving leg only its own largest: eight consumers'
first 1 MiB MESSAGEs then took a 32 MiB budget 1-2 MiB past its limit, measured.)

The one wait here that could hold memory hostage, reads that need more room to finish their
frames and wait on each other, is broken by the overdraft (:meth:`MemoryBudget.grants`): one of
them at a time takes the reserve. A read is held before it reads (an app leg between frames
holds one read once bytes are ready, and what it brought once it has read,
:meth:`ReadCharge.wanted` one read more inside a frame), and a frame entering the window moves
its charge there (:meth:`ReadCharge.to_window`), so the sum stays under the limit; what can
still go past it: a session that only its app can free (:attr:`ReadCharge.must_read`, read
regardless), a receiving broker leg reading a MESSAGE larger than any such leg held before (by
the difference), and one read per TLS app leg (no readiness to wait for apart from the
read).

Pure: no trio, no clock; the waiting is :mod:`proxy.legs.memory`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "FRAME_COST",
    "SHORT_HELD",
    "SHORT_RESERVES",
    "BudgetStatistics",
    "MemoryBudget",
    "ReadCharge",
]

#: What a frame being read from an app costs, in multiples of its size: the read buffer and
#: the frame taken from it (measured on a sidecar process: a 64 MiB SEND raises the peak RSS
#: by 2.0x the frame, docs/behaviour.md "Limits and bad input"). So one frame of
#: ``max_frame_bytes`` needs twice that of the budget.
FRAME_COST = 2


#: Why a new session is refused (:meth:`MemoryBudget.short`): what it holds fills the budget
#: (windows, transactions, frames being read, with the broker legs' room: "memory is full"), or
#: only with the overdraft's reserve does ("reserves are large").
SHORT_HELD = "held"
SHORT_RESERVES = "reserves"


@dataclass(frozen=True, slots=True)
class BudgetStatistics:
    """The budget now (``/status``, gauges), in bytes: ``held`` of ``limit``, ``reserved``
    (kept back from app reads: the broker legs' room and the overdraft's frame), ``free``
    (what app reads may still take: ``held + reserved + free == limit`` while held is under
    the limit), the most ever held (``peak``), reads waiting for room (``waiting``), sessions
    refused for it (``refused_total``)."""

    held: int
    reserved: int
    free: int
    limit: int
    peak: int
    waiting: int
    refused_total: int


class MemoryBudget:
    """Bytes held by every session of the process, against ``limit``.

    Args:
        limit: ``max_memory_bytes`` (> 0).
        reserve: bytes app reads leave for the overdraft's frame (the sidecar's: twice
            ``max_frame_bytes`` and one read; 0: none).
        broker_read: room every broker leg shares for the read it is making (the sidecar's:
            one read, twice; 0: none).

    Attributes:
        held: bytes charged now. peak: the most ever charged.
        reading: what app legs' reads hold of it (frames being read from apps).
        waiting_bytes: what reads waiting for room hold (:meth:`fits`).
        on_release: called (synchronously) after every release while a read waits, so the
            I/O layer can wake it; None when nothing waits.

    Raises:
        ValueError: ``limit`` <= 0.
    """

    __slots__ = (
        "held",
        "leg_room",
        "limit",
        "message_room",
        "on_release",
        "overdraft",
        "peak",
        "reading",
        "receiving",
        "receiving_held",
        "refused_total",
        "reserve",
        "waiting",
        "waiting_bytes",
    )

    def __init__(self, limit: int, reserve: int = 0, broker_read: int = 0) -> None:
        if limit <= 0:
            raise ValueError("limit must be > 0")
        self.limit = limit
        #: Kept for the overdraft's frame: app reads stop this far under the limit (and
        #: under the broker legs' room).
        self.reserve = reserve
        #: Kept for the broker legs that get no MESSAGEs: one read shared by all, and what
        #: each may take again, up to the most it ever held.
        self.leg_room = broker_read
        #: Kept for each broker leg that receives MESSAGEs (:meth:`ReadCharge.receives`): the
        #: most any of them held since one first received (at least one read, twice): the
        #: broker chooses their sizes, and a leg's next MESSAGE may be as large as another's.
        self.message_room = 0
        #: How many broker legs receive MESSAGEs, and what they hold together.
        self.receiving = 0
        self.receiving_held = 0
        self.held = 0
        self.reading = 0
        self.peak = 0
        self.waiting = 0
        self.waiting_bytes = 0
        self.refused_total = 0
        self.on_release: Callable[[], None] | None = None
        #: The one read allowed past the budget (:meth:`grants`), until its frame is handed on.
        self.overdraft: ReadCharge | None = None

    @property
    def broker_room(self) -> int:
        """Bytes kept for broker legs (they never wait for the budget): :attr:`leg_room`, and
        for each leg that receives MESSAGEs what it may take before it holds
        :attr:`message_room`."""
        return self.leg_room + self.receiving * self.message_room - self.receiving_held

    @property
    def over(self) -> bool:
        """Whether everything apps may hold is held (the reserves left): apps are not read,
        new sessions refused. Never while nothing is held: reserves larger than the budget
        slow reads down, never stop them."""
        return self.held > 0 and self.free_bytes() <= 0

    def free_bytes(self) -> int:
        """What app reads may still take (may be negative): the limit less what is held, the
        broker legs' room and the overdraft's reserve."""
        return self.limit - self.broker_room - self.reserve - self.held

    def short(self) -> str:
        """Which is short when the budget is over: :data:`SHORT_HELD` (what is held and the
        broker legs' room fill it) or :data:`SHORT_RESERVES` (only with the overdraft's
        reserve do they)."""
        if self.held + self.broker_room >= self.limit:
            return SHORT_HELD
        return SHORT_RESERVES

    def fits(self, nbytes: int) -> bool:
        """Whether an app read may take ``nbytes`` more and leave the reserves (the broker
        legs' room, the overdraft's), or nothing is held at all
        (so reserves larger than the budget slow reads down, never stop them)."""
        held = self.held
        return held == 0 or held + nbytes + self.reserve + self.broker_room <= self.limit

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
        the limit with the reserves left (:meth:`fits`); or, when everything else held
        belongs to reads waiting for room (nothing else will drain: windows are confirmed,
        frames being read on were handed on) and no other read holds the overdraft: then this
        read holds it until its frame is handed on, out of :attr:`reserve`. So reads waiting
        on each other never wait forever, and only one at a time takes the reserve, one frame
        of at most ``max_frame_bytes``."""
        if self.fits(nbytes):
            return True
        if self.overdraft is not None and self.overdraft is not charge:
            return False
        if self.held - self.waiting_bytes - charge.charged > 0:
            return False
        self.overdraft = charge
        return True

    def statistics(self) -> BudgetStatistics:
        """The budget now."""
        held = self.held
        free = max(0, self.free_bytes())
        return BudgetStatistics(
            held=held,
            reserved=max(0, self.limit - held - free),
            free=free,
            limit=self.limit,
            peak=self.peak,
            waiting=self.waiting,
            refused_total=self.refused_total,
        )


class ReadCharge:
    """What one leg's read buffer holds against the budget (``charged``): the frame being
    read, or (between frames) nothing, or the read about to be made. Updated before each read
    by :meth:`wanted`.

    Args:
        budget: the process's budget.
        chunk: the most one read brings (``proxy.legs.stream.RECEIVE_SIZE``).
        broker: a broker leg's, never held back: the budget keeps room for it
            (:attr:`MemoryBudget.broker_room`): the read all legs share, and the most this
            one ever held, until :meth:`close`; it is charged what it holds (a frame of
            unknown size: what arrived, twice), since it never waits before a read.
    """

    __slots__ = (
        "broker",
        "budget",
        "charged",
        "chunk",
        "frame",
        "largest",
        "must_read",
        "position",
        "receiving",
    )

    def __init__(self, budget: MemoryBudget, chunk: int, *, broker: bool = False) -> None:
        self.budget = budget
        self.chunk = chunk
        self.charged = 0
        self.frame = 0
        self.broker = broker
        #: An app leg's: what is buffered of its next frame and how many frames it returned
        #: (:meth:`to_window`); None: a frame's charge goes at the next read.
        self.position: Callable[[], tuple[int, int]] | None = None
        #: A broker leg's: the most it ever held (its room is kept: MemoryBudget.broker_room;
        #: a leg that only ever held frames smaller than a read needs little beyond the read
        #: all legs share).
        self.largest = 0
        #: A broker leg's: whether it receives MESSAGEs (:meth:`receives`), whose size the
        #: broker chooses: then its room is at least one read, twice, from then on.
        self.receiving = False
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
                self.take(0)
            return 0
        if total >= 0:
            return FRAME_COST * max(total, buffered)
        if self.broker:  # charged after each read, never waits: what it holds
            return FRAME_COST * buffered
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

    def to_window(self) -> None:
        """A frame entered the confirmation window, which charges it now: when it is one
        this leg returned since its last read, this charge keeps only what is buffered after
        it (as :meth:`wanted` would at the next read)."""
        if self.position is not None:
            buffered, frame = self.position()
            if frame != self.frame:
                self.frame = frame
                self.handed(buffered)

    def receives(self) -> None:
        """The broker leg's session subscribed (or a MESSAGE came): the broker may send it
        MESSAGEs of any size, so its room is at least one read, twice, like every leg's before
        issue 34; a leg that only gets RECEIPTs (a producer's) shares one read with the
        others. Once per leg; nothing for an app leg's charge."""
        if self.broker and not self.receiving:
            budget = self.budget
            self.receiving = True
            budget.leg_room -= max(0, self.largest - self.charged)  # now in message_room
            if not budget.receiving:  # the first: the room starts again from one read
                budget.message_room = FRAME_COST * self.chunk
            budget.message_room = max(budget.message_room, self.largest)
            budget.receiving += 1
            budget.receiving_held += self.charged

    def take(self, nbytes: int) -> None:
        """Hold ``nbytes`` from now on (granted, or what a read brought)."""
        budget = self.budget
        if self.receiving:
            self.largest = max(self.largest, nbytes)
            budget.message_room = max(budget.message_room, nbytes)
            budget.receiving_held += nbytes - self.charged
        elif self.broker:
            before = max(0, self.largest - self.charged)
            self.largest = max(self.largest, nbytes)
            budget.leg_room += max(0, self.largest - nbytes) - before
        else:
            budget.reading += nbytes - self.charged
        budget.charge(nbytes - self.charged)
        self.charged = nbytes

    def close(self) -> None:
        """The leg is gone: release what it held."""
        if self.budget.overdraft is self:
            self.budget.overdraft = None
        budget = self.budget
        if not self.broker:
            budget.reading -= self.charged
        elif self.receiving or self.largest:
            if self.receiving:
                budget.receiving -= 1
                budget.receiving_held -= self.charged
                self.receiving = False
            else:
                budget.leg_room -= max(0, self.largest - self.charged)
            self.largest = 0
            if budget.waiting and budget.on_release is not None:
                budget.on_release()  # its room is free: reads waiting may fit now
        if self.charged:
            budget.release(self.charged)
            self.charged = 0
