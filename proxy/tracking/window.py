"""The confirmation window: every frame sent upstream, kept until the broker confirms it.

docs/behaviour.md, "Confirmation window", after Artemis' ``confirmationWindowSize`` ("Client
Reconnection and Session Reattachment"): each frame bound for the broker gets a sequence number and
stays here until a RECEIPT covers it, so that after a reconnect whatever the old broker never
confirmed can be replayed, and whatever cannot be replayed can be reported by id.

Confirmation is cumulative, because a broker processes one connection's frames in order: the
RECEIPT for entry *k* confirms *k* and every earlier entry. One caution: RabbitMQ sends a SEND's
RECEIPT when the message is confirmed (publisher confirms), which its documentation allows to
happen out of order. So an earlier entry that carries a receipt of its own is only confirmed by
that receipt; when a later receipt overtakes it, it stays, and ``out_of_order`` counts it (the
integration tests assert that both brokers keep this at 0).

Pure: no trio, no clock (``now`` is passed in). Bounded in bytes: :meth:`has_room` says when
the session must stop reading from the app (backpressure through TCP).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from protocol import Command, Frame, RawFrame
from proxy.tracking.budget import MemoryBudget, ReadCharge

__all__ = ["ConfirmationWindow", "Entry", "EntryContext", "WindowStatistics", "frame_size"]


def frame_size(frame: Frame | RawFrame) -> int:
    """Bytes a frame counts against the window: about its size on the wire (exactly, for a
    :class:`protocol.RawFrame`, whose head is ASCII: the same number either way)."""
    if isinstance(frame, RawFrame):
        return frame.size
    size = len(frame.command) + len(frame.body) + 3
    for name, value in frame.headers:
        size += len(name) + len(value) + 2
    return size


class EntryContext:
    """Base of what a window entry carries for the session's replay
    (:class:`proxy.tracking.Transaction`, :class:`proxy.tracking.DurableRemoval`,
    :data:`proxy.tracking.PASS_THROUGH`): a closed set of types the window itself never
    looks into, defined here so the window needs nothing from the tracking module."""

    __slots__ = ()


@dataclass(eq=False, slots=True)
class Entry:
    """One frame in the window.

    Attributes:
        seq: position in the session's upstream stream (1-based, never reused).
        outgoing: the frame as sent upstream (sidecar receipt id, duplicate-detection id), as a
            :class:`protocol.RawFrame` (its bytes) when it came by the fast lane.
        frame: ``outgoing`` as a :class:`Frame` (a RawFrame is parsed once, when first asked:
            replays and reports; the bytes it writes are the same).
        size: bytes counted against the window.
        app_receipt: the receipt id the app asked for, if any (answered when confirmed).
        receipt: the sidecar's receipt id requested on this frame, if any.
        enqueued_at: when the app handed the frame over (seconds, caller's clock).
        sent: written to the current upstream leg (``sent_at``: when, caller's clock).
        sent_before: written to an earlier leg that was lost before confirming it, so it may
            have taken effect there (a broker can store a frame and die before its RECEIPT).
        answered: the app's receipt was answered (RECEIPT, or ERROR after ``call_timeout``).
        confirmed: a RECEIPT covered it; dropped: removed unconfirmed (:meth:`drop`).
        charged: what it is charged in the process's memory budget (``ConfirmationWindow``'s
            ``budget``).
        deferred: the broker answers its receipt only after the app does something more (a
            SEND or ACK in a transaction on RabbitMQ: at COMMIT), so waiting for it cannot make
            room (:attr:`ConfirmationWindow.receipts_pending` leaves it out).
        context: what the session needs to replay it (:class:`EntryContext`: the
            transaction a frame belongs to, an UNSUBSCRIBE that removes a durable
            subscription or one passed through as it is), or None.
    """

    seq: int
    outgoing: Frame | RawFrame
    size: int
    app_receipt: str | None
    receipt: str | None
    enqueued_at: float
    sent: bool = False
    sent_at: float = 0.0
    sent_before: bool = False
    answered: bool = False
    confirmed: bool = False
    dropped: bool = False
    context: EntryContext | None = field(default=None)
    deferred: bool = False
    charged: int = 0

    @property
    def frame(self) -> Frame:
        """``outgoing`` as a :class:`Frame`; a RawFrame is parsed now, and kept parsed."""
        outgoing = self.outgoing
        if isinstance(outgoing, RawFrame):
            outgoing = self.outgoing = outgoing.to_frame()
        return outgoing

    @frame.setter
    def frame(self, frame: Frame) -> None:
        self.outgoing = frame

    @property
    def command(self) -> Command:
        """The frame's command (without parsing a RawFrame)."""
        return self.outgoing.command

    @property
    def label(self) -> str:
        """How reports name this frame: the app's receipt id, else ``COMMAND #seq``."""
        if self.app_receipt is not None:
            return self.app_receipt
        return f"{self.command} #{self.seq}"


@dataclass(frozen=True, slots=True)
class WindowStatistics:
    """Occupancy and counters of a window (``/status``, metrics)."""

    frames: int
    bytes: int
    max_bytes: int
    unsent: int
    receipts_pending: int
    confirmed_total: int
    out_of_order: int


class ConfirmationWindow:
    """Frames sent (or to be sent) upstream and not yet confirmed, in order.

    Args:
        max_bytes: the bound (``confirmation_window_size``). A frame larger than the whole
            window is admitted when the window is empty, so it travels alone and can never
            deadlock (and see :attr:`receipts_pending`).
        receipt_prefix: prefix of the receipt ids the window requests (``<session>-r``).
        receipt_fraction: request a receipt once this fraction of ``max_bytes`` was appended
            since the last receipted entry (docs/behaviour.md, "Confirmation window": "when
            unconfirmed bytes pass a fraction of the window").
        budget: the process's memory budget (``max_memory_bytes``), charged and released with
            the entries: :attr:`Entry.size`, twice for a parsed :class:`Frame`, which is
            serialized again when written (its body and its bytes on the wire: the general
            path of a frame split across reads, every large one); None: none.
    """

    def __init__(
        self,
        max_bytes: int,
        *,
        receipt_prefix: str,
        receipt_fraction: float = 0.5,
        budget: MemoryBudget | None = None,
    ) -> None:
        if max_bytes <= 0:
            raise ValueError("max_bytes must be > 0")
        self.max_bytes = max_bytes
        self.receipt_prefix = receipt_prefix
        self._receipt_threshold = max(1, int(max_bytes * receipt_fraction))
        self._entries: deque[Entry] = deque()
        self._by_receipt: dict[str, Entry] = {}
        self._deferred = 0  # entries of _by_receipt whose receipt is deferred
        # Entries with an app receipt, in order, for first_unanswered() in O(1): answered,
        # confirmed or dropped ones leave from the left (_skip_settled). Made on first use (a
        # deque costs 600 bytes even empty; a session of fire-and-forget SENDs needs none).
        self._awaiting: deque[Entry] | None = None
        self._seq = 0
        self.bytes = 0
        self._unreceipted = 0
        self.confirmed_total = 0
        self.out_of_order = 0
        self.budget = budget
        #: What the entries are charged in ``budget`` (see ``budget`` above).
        self.charged = 0
        #: The app leg's read charge: a frame entering the window is charged here instead.
        self.handoff: ReadCharge | None = None

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Entry]:
        return iter(self._entries)

    def has_room(self, size: int) -> bool:
        """Whether a frame of ``size`` bytes fits now."""
        return not self._entries or self.bytes + size <= self.max_bytes

    @property
    def receipts_pending(self) -> int:
        """Receipts requested for entries in the window and not answered yet, but for the
        deferred ones (:attr:`Entry.deferred`). With none, nothing will make room: the entries
        were sent without a receipt of their own (the frame after each was already read), or
        their receipts wait for the app's COMMIT, so a frame that does not fit must go in after
        them anyway; being larger than the rest of the window it passes the receipt
        threshold, and its receipt confirms them and itself. (What a transaction holds past
        the window is bounded by ``max_transaction_size``.)"""
        return len(self._by_receipt) - self._deferred

    def _register(self, receipt: str, entry: Entry) -> None:
        self._by_receipt[receipt] = entry
        self._deferred += entry.deferred

    def _unregister(self, receipt: str) -> Entry | None:
        entry = self._by_receipt.pop(receipt, None)
        if entry is not None:
            self._deferred -= entry.deferred
        return entry

    def append(
        self,
        frame: Frame | RawFrame,
        *,
        app_receipt: str | None,
        want_receipt: bool | None,
        now: float,
        context: EntryContext | None = None,
        size: int | None = None,
        receipt_id: str | None = None,
        deferred: bool = False,
    ) -> Entry:
        """Add a frame; returns its entry (with the sidecar's receipt header set if one is
        requested: when ``want_receipt``, when the app asked for one, or when the bytes since
        the last receipted entry passed the threshold; never when ``want_receipt`` is None: a
        later entry's receipt confirms it). The caller checks :meth:`has_room`;
        ``size`` is :func:`frame_size` of ``frame`` if the caller has it already.
        ``receipt_id``: the id to request, when one is requested, if no pending entry uses it
        and it cannot be mistaken for the sidecar's own (``<session>-...``); else the
        sidecar's ``<receipt_prefix><seq>``. ``deferred``: see :attr:`Entry.deferred`."""
        self._seq += 1
        if size is None:
            size = frame_size(frame)
        receipt: str | None = None
        wanted = want_receipt or app_receipt is not None
        if want_receipt is None:
            self._unreceipted += size
        elif wanted or self._unreceipted + size >= self._receipt_threshold:
            own = self.receipt_prefix[:-1]  # "<session>-": the sidecar's own ids
            if (
                receipt_id is not None
                and not receipt_id.startswith(own)
                and receipt_id not in self._by_receipt
            ):
                receipt = receipt_id  # the caller's choice, while no pending entry has it
            else:
                receipt = f"{self.receipt_prefix}{self._seq}"
            frame = frame.with_header("receipt", receipt)
            self._unreceipted = 0
        else:
            self._unreceipted += size
        entry = Entry(
            self._seq, frame, size, app_receipt, receipt, now, context=context, deferred=deferred
        )
        self._entries.append(entry)
        if receipt is not None:
            self._register(receipt, entry)
        if app_receipt is not None:
            if self._awaiting is None:
                self._awaiting = deque()
            self._awaiting.append(entry)
        self.bytes += size
        if self.budget is not None:
            entry.charged = size if isinstance(frame, RawFrame) else 2 * size
            self.charged += entry.charged
            if self.handoff is not None:
                self.handoff.to_window()
            self.budget.charge(entry.charged)
        return entry

    def confirm(self, receipt: str) -> list[Entry] | None:
        """Apply a RECEIPT: the confirmed entries in order, or None for an unknown id.

        Confirms the receipted entry and every earlier entry that has no receipt pending of
        its own (see the module docstring on out-of-order receipts).
        """
        target = self._unregister(receipt)
        if target is None:
            return None
        confirmed: list[Entry] = []
        kept: list[Entry] = []
        while self._entries:
            entry = self._entries.popleft()
            if entry is target:
                confirmed.append(entry)
                break
            if entry.receipt is not None and entry.receipt in self._by_receipt:
                kept.append(entry)  # overtaken by a later receipt: wait for its own
                self.out_of_order += 1
            else:
                confirmed.append(entry)
        self._entries.extendleft(reversed(kept))
        released = charged = 0
        for entry in confirmed:
            released += entry.size
            charged += entry.charged
            entry.confirmed = True
        self.bytes -= released
        if self.budget is not None:
            self.charged -= charged
            self.budget.release(charged)
        self.confirmed_total += len(confirmed)
        self._skip_settled()
        return confirmed

    def ensure_receipt(self, entry: Entry) -> None:
        """Give an entry a receipt of its own if it has none (before it is sent again)."""
        if entry.receipt is not None:
            return
        receipt = f"{self.receipt_prefix}{entry.seq}"
        entry.receipt = receipt
        entry.outgoing = entry.outgoing.with_header("receipt", receipt)
        self._register(receipt, entry)

    def drop(self, entry: Entry) -> None:
        """Remove an entry without a receipt: never sent and given up (``call_timeout``), or
        made moot by a reconnect (an ACK for a delivery of the old link)."""
        self._entries.remove(entry)
        if entry.receipt is not None:
            self._unregister(entry.receipt)
        self.bytes -= entry.size
        if self.budget is not None:
            self.charged -= entry.charged
            self.budget.release(entry.charged)
        entry.dropped = True
        self._skip_settled()

    def unconfirmed(self) -> list[Entry]:
        """Every entry, in order (all of them are unconfirmed)."""
        return list(self._entries)

    def mark_all_unsent(self) -> None:
        """The leg they were written to is gone: every entry needs sending again."""
        for entry in self._entries:
            if entry.sent:
                entry.sent_before = True
            entry.sent = False

    def drop_all(self) -> list[Entry]:
        """Empty the window (the session ends); returns what was in it."""
        entries = list(self._entries)
        self._entries.clear()
        self._by_receipt.clear()
        self._deferred = 0
        self._awaiting = None
        if self.budget is not None:
            self.budget.release(self.charged)
            self.charged = 0
        self.bytes = 0
        for entry in entries:
            entry.dropped = True
        return entries

    def leave_budget(self) -> None:
        """The session is over: give its bytes back to the budget (the entries stay, for
        whatever still reads them), and charge it no more."""
        if self.budget is not None:
            self.budget.release(self.charged)
            self.charged = 0
            self.budget = None

    def first_unanswered(self) -> Entry | None:
        """The oldest entry in the window whose app receipt is still unanswered
        (``call_timeout`` watch). O(1) amortized."""
        self._skip_settled()
        awaiting = self._awaiting
        return awaiting[0] if awaiting else None

    def _skip_settled(self) -> None:
        """Forget the answered, confirmed or dropped entries at the head of ``_awaiting``,
        at once rather than at the next :meth:`first_unanswered`: an entry holds its frame, and
        a large body should leave memory when the window does (docs/behaviour.md, "Limits and
        bad input")."""
        awaiting = self._awaiting
        while awaiting:  # None or empty: nothing awaits an answer
            entry = awaiting[0]
            if not (entry.answered or entry.confirmed or entry.dropped):
                return
            awaiting.popleft()

    def statistics(self) -> WindowStatistics:
        """Frames, bytes, unsent frames and receipts pending now; counters since start."""
        return WindowStatistics(
            frames=len(self._entries),
            bytes=self.bytes,
            max_bytes=self.max_bytes,
            unsent=sum(1 for e in self._entries if not e.sent),
            receipts_pending=self.receipts_pending,
            confirmed_total=self.confirmed_total,
            out_of_order=self.out_of_order,
        )
