"""Waiting for the process's memory budget before an app leg reads (issue 28; the accounting
is :mod:`proxy.tracking.budget`'s, pure).

:class:`MemoryBudgetGate` is one per process: the budget and the app reads waiting for it.
:meth:`MemoryBudgetGate.before_read` runs before each read of an app leg
(:meth:`proxy.legs.stream.FrameStream.receive_fast_event`): between frames it waits while the
budget is over (the app's next frame stays in TCP: backpressure, as for one session's full
window) and, once bytes are ready, until one read fits (:meth:`MemoryBudgetGate.reserve_read`);
inside a frame it holds the whole frame once its ``content-length`` is known (else one more
read) and waits until that fits. Broker legs are charged the same way
(:meth:`MemoryBudgetGate.account`: the MESSAGE being read) and never held back: their RECEIPTs are
what frees memory; app reads leave them room.

:func:`keep_mmap_threshold` keeps glibc's malloc from holding on to freed frames, so the
process's RSS follows what the budget counts; :func:`tune_garbage_collector` keeps Python's
cyclic garbage collector from rescanning thousands of sessions over and over.
"""

from __future__ import annotations

import ctypes
import gc

import trio

from proxy.tracking.budget import FRAME_COST, SHORT_HELD, MemoryBudget, ReadCharge

__all__ = [
    "GC_YOUNG_THRESHOLD",
    "MMAP_THRESHOLD",
    "MemoryBudgetGate",
    "keep_mmap_threshold",
    "refusal",
    "tune_garbage_collector",
]

#: Allocations (less deallocations) of container objects between two collections of the
#: youngest generation of Python's cyclic garbage collector: CPython's default is 700. A frame
#: and the objects around it live until its broker confirms it (milliseconds to seconds), so at
#: 700 nearly all of them outlived two young collections and reached the oldest generation,
#: whose full collections scan every session: with 5,000 sessions (bench/admission.py
#: --no-kill, 102,000 SENDs), 27 full collections took 26 of the process's 41 CPU seconds and
#: paused it up to 2.7 s each (late heart-beats, /status answering 6 s late). At 100,000 they
#: die young: no full collection, 17 young ones, 23 CPU seconds in all, the RSS the same.
GC_YOUNG_THRESHOLD = 100_000

#: Blocks of this many bytes or more get a mapping of their own, returned to the kernel when
#: freed: glibc's default threshold, kept (``mallopt(M_MMAP_THRESHOLD)``). Left alone, glibc
#: raises it to the size of each large block freed (up to 32 MiB), so frames of a MiB come from
#: the heap after the first, and the heap keeps what they leave: measured with 40 sessions of
#: 1 MiB SENDs and a 32 MiB budget (tests/integration/test_memory_budget.py), the peak RSS was
#: 36-43 MiB over the idle process with it left alone, 32-35 MiB with it kept. A read of
#: ``RECEIVE_SIZE`` (64 KiB) stays on the heap (no system call per read).
MMAP_THRESHOLD = 131072
#: ``M_MMAP_THRESHOLD`` of glibc's ``<malloc.h>``.
_M_MMAP_THRESHOLD = -3


def _must_read(charge: ReadCharge) -> bool:
    return charge.must_read is not None and charge.must_read()


def keep_mmap_threshold() -> bool:
    """Keep glibc's malloc from raising its mmap threshold (:data:`MMAP_THRESHOLD`), once per
    process, before the daemon starts. Returns whether it applied: False where the C library
    has no ``mallopt`` (musl, macOS), where nothing changes."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))


def tune_garbage_collector() -> None:
    """Once per process, before the daemon starts: move what start-up created (modules,
    classes, the configuration) out of the collector's sight (``gc.freeze``: it is never
    garbage) and collect the youngest generation every :data:`GC_YOUNG_THRESHOLD` allocations
    (``gc.set_threshold``; the older generations' thresholds are CPython's)."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)


def refusal(budget: MemoryBudget, max_frame_bytes: int) -> tuple[str, str, str]:
    """The ERROR that refuses a new session while ``budget`` is over: ``(why, what,
    detail)`` for :meth:`proxy.app.Sidecar._refuse` (message ``<what>: <why>``), saying which
    was short (:meth:`~proxy.tracking.budget.MemoryBudget.short`): "memory is full" (what the
    sessions hold) or "reserves are large" (what the budget keeps back for frames being read
    and broker legs, naming ``max_frame_bytes``), with held, reserved and free in bytes."""
    stats = budget.statistics()
    limit = stats.limit
    figures = (
        f"the sessions of this mq-sidecar hold {stats.held} bytes ({budget.reading} of them "
        f"frames being read), {stats.reserved} are kept in reserve and {stats.free} are free, "
        f"of its budget for all of them (max_memory_bytes = {limit})"
    )
    if budget.short() == SHORT_HELD:
        short = "memory is full"
        advice = "Connect again once the brokers have confirmed what the others sent."
    else:
        short = "reserves are large"
        advice = (
            f"The reserve for the frames being read is one frame of max_frame_bytes "
            f"({max_frame_bytes}) twice and a read ({budget.reserve} bytes), the broker legs' "
            f"room {budget.broker_room} bytes: lower max_frame_bytes or raise max_memory_bytes."
        )
    return (
        f"max_memory_bytes ({limit}) reached: {short}",
        "out of memory",
        f"{short}: {figures}; this connection is closed. {advice}",
    )


class MemoryBudgetGate:
    """The budget of the process and the reads that wait for it.

    Args:
        budget: the process's :class:`~proxy.tracking.budget.MemoryBudget`.
    """

    __slots__ = ("_room", "budget")

    def __init__(self, budget: MemoryBudget) -> None:
        self.budget = budget
        self._room = trio.Event()
        budget.on_release = self._released

    def _released(self) -> None:
        """Memory was released while reads wait: let them look again."""
        self._room.set()
        self._room = trio.Event()

    def charge_for(self, chunk: int, *, broker: bool = False) -> ReadCharge:
        """A new leg's charge (``chunk``: the most one read brings; ``broker``: a broker
        leg's, whose room the budget keeps)."""
        return ReadCharge(self.budget, chunk, broker=broker)

    async def reserve_read(self, charge: ReadCharge) -> None:
        """Before an app leg reads between frames, with bytes ready: wait until its read
        (twice one read's size) fits, then hold it. Returns at once when it fits."""
        budget = self.budget
        wanted = FRAME_COST * charge.chunk
        while not budget.fits(wanted - charge.charged) and not _must_read(charge):
            await self._wait(charge)
        if wanted > charge.charged:
            charge.take(wanted)

    def brought(self, charge: ReadCharge, nbytes: int) -> None:
        """After the read :meth:`reserve_read` held room for: hold what it brought
        (``nbytes``, twice: the buffer and the frames taken from it), no longer the read it
        might have been, so a busy session between bursts holds its bytes, not 128 KiB."""
        if FRAME_COST * nbytes < charge.charged:
            charge.take(FRAME_COST * nbytes)

    def account(self, charge: ReadCharge, buffered: int, total: int, frame: int) -> None:
        """:meth:`before_read` for a leg that never waits (a broker's): what it holds is
        charged all the same (a MESSAGE being read, twice its size once known)."""
        wanted = charge.wanted(buffered, total, frame)
        if wanted > charge.charged:
            charge.take(wanted)

    async def before_read(self, charge: ReadCharge, buffered: int, total: int, frame: int) -> None:
        """Wait until the leg of ``charge`` may read: ``(buffered, total)`` is its frame in
        progress (:meth:`protocol.Connection.frame_in_progress`), ``frame`` the number of
        frames the leg returned so far. Returns at once, without a checkpoint, when the budget
        allows (the common case costs a few comparisons)."""
        budget = self.budget
        wanted = charge.wanted(buffered, total, frame)
        if not wanted:
            while budget.over and not _must_read(charge):
                await self._wait(charge)
            return
        if buffered > charge.charged:
            charge.take(buffered)  # what the last read brought is held, granted or not
        while (
            wanted > charge.charged
            and not budget.grants(charge, wanted - charge.charged)
            and not _must_read(charge)
        ):
            await self._wait(charge)
        if wanted > charge.charged:
            charge.take(wanted)

    async def _wait(self, charge: ReadCharge) -> None:
        budget = self.budget
        room = self._room
        budget.waiting += 1
        budget.waiting_bytes += charge.charged
        try:
            await room.wait()
        finally:
            budget.waiting -= 1
            budget.waiting_bytes -= charge.charged
