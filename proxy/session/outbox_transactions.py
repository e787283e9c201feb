"""Transactions in outbox mode (docs/outbox.md, "Transactions"): a transaction is held by the
sidecar, nothing of it sent upstream, for as long as every frame of it is a SEND the outbox
takes; its COMMIT stores all of its SENDs in one append (all or none) and is answered once
they are durable; its ABORT forgets them. The first frame of it that is anything else (an ACK,
a SEND to another destination) *promotes* it: its BEGIN and the SENDs held so far go the usual
way (the window, the broker's transaction), receipts not asked again, and the transaction goes
on there.

Stored SENDs are forwarded as plain SENDs (their ``transaction`` header removed): the broker
gets them one by one, in order, durable on the sidecar's disk from the COMMIT on, but not as
one broker transaction.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from protocol import Command, Frame
from proxy.outbox import OutboxClosed, OutboxError
from proxy.session.core import SessionCore, log
from proxy.session.ending import Ending, error_frame
from proxy.session.outbox import SessionOutbox
from proxy.session.to_app import AppOutput
from proxy.telemetry.vocabulary import FrameOutcome
from proxy.tracking import TRANSACTION_OVERHEAD, FrameRejected
from proxy.tracking.window import frame_size

__all__ = ["ABORTED_REMEMBERED", "OutboxTransaction", "OutboxTransactions"]

#: Held transactions forgotten for ``max_transaction_size`` that a session remembers.
ABORTED_REMEMBERED = 64

#: A command handler of the app side: (frame, idle) -> True when the session is over.
Handler = Callable[[Frame, bool], Awaitable[bool]]


@dataclass
class OutboxTransaction:
    """One transaction held by the sidecar: its BEGIN and SENDs as the app sent them (receipts
    removed: answered already), and the bytes they count against ``max_transaction_size``."""

    begin: Frame
    sends: list[Frame] = field(default_factory=list)
    size: int = 0


class OutboxTransactions:
    """The held transactions of one session (see the module docstring).

    Args:
        core: the session's shared state.
        out: writes to the app (RECEIPTs, ERRORs).
        outbox: the session's outbox part (what it takes, where COMMIT stores).
        upstream_send: the app side's SEND as it goes upstream (``mq-sidecar-id`` set).
        handlers: the app side's handlers by command, through which a promoted transaction
            and the frame that promoted it go.
    """

    def __init__(
        self,
        core: SessionCore,
        out: AppOutput,
        outbox: SessionOutbox,
        upstream_send: Callable[[Frame], tuple[Frame, str | None]],
        handlers: dict[Command, Handler],
    ) -> None:
        self.core = core
        self.out = out
        self.outbox = outbox
        self.upstream_send = upstream_send
        self.handlers = handlers
        self.open: dict[str, OutboxTransaction] = {}
        #: Bytes the held transactions count against ``max_transaction_size``: their SENDs
        #: and ``TRANSACTION_OVERHEAD`` each (as the session's own open transactions).
        self.used = 0
        #: Transactions forgotten for ``max_transaction_size``, newest last (at most
        #: :data:`ABORTED_REMEMBERED`): their later frames are refused, their ABORT answered.
        self.aborted: OrderedDict[str, str] = OrderedDict()

    def takes(self, frame: Frame) -> bool:
        """Whether ``frame`` is this part's: a BEGIN of a transaction id the session does
        not know, or any frame naming a held transaction."""
        tx = frame.get("transaction")
        if tx is None:
            return False
        if tx in self.open or tx in self.aborted:
            return True
        state = self.core.state
        return frame.command is Command.BEGIN and state is not None and tx not in state.transactions

    async def handle(self, frame: Frame, idle: bool) -> bool:
        """Handle a frame :meth:`takes`; True when the session is over.

        Raises:
            FrameRejected: a SEND that would take the held transactions past
                ``max_transaction_size`` (the transaction is forgotten: as aborted).
        """
        tx = frame.get("transaction") or ""
        receipt = frame.get("receipt")
        command = frame.command
        limit = self.core.config.max_transaction_size
        if tx in self.aborted:
            if command is Command.ABORT:
                del self.aborted[tx]
                await self.out.answer_locally(receipt)
                return False
            raise FrameRejected(f"{command} in transaction '{tx}': {self.aborted[tx]}")
        if command is Command.BEGIN and tx not in self.open:
            if self.used + TRANSACTION_OVERHEAD > limit:
                raise FrameRejected(
                    f"BEGIN of transaction {tx!r} refused: the session's open transactions "
                    f"hold {self.used} bytes, max_transaction_size is {limit}"
                )
            self.open[tx] = OutboxTransaction(frame.without("receipt"), size=TRANSACTION_OVERHEAD)
            self.used += TRANSACTION_OVERHEAD
            await self.out.answer_locally(receipt)
            return False
        held = self.open[tx]
        if command is Command.SEND and self.outbox.takes(frame):
            size = frame_size(frame)
            if self.used + size > limit:
                why = (
                    f"transaction '{tx}' aborted: its SENDs would take the session's open "
                    f"transactions past max_transaction_size ({limit} bytes; {self.used} held)"
                )
                self._forget(tx)
                self.aborted[tx] = why
                if len(self.aborted) > ABORTED_REMEMBERED:
                    self.aborted.popitem(last=False)
                raise FrameRejected(why)
            held.sends.append(frame.without("receipt"))
            held.size += size
            self.used += size
            await self.out.answer_locally(receipt)
            return False
        self._forget(tx)
        if command is Command.ABORT:
            await self.out.answer_locally(receipt)
            return False
        if command is Command.COMMIT:
            await self._commit(frame, held)
            return False
        # Anything else promotes it: the broker's transaction from here on.
        log.debug("session %s: transaction %r goes to the broker (%s)", self.core.id, tx, command)
        await self.handlers[Command.BEGIN](held.begin, False)
        for send in held.sends:
            await self.handlers[Command.SEND](send, False)
        return await self.handlers[command](frame, idle)

    def _forget(self, tx: str) -> None:
        held = self.open.pop(tx)
        self.used -= held.size

    async def _commit(self, commit: Frame, held: OutboxTransaction) -> None:
        """Store the transaction's SENDs in one append; answer the COMMIT once durable, or
        with an ERROR (outcome ``rolled_back``: nothing of it was stored)."""
        core = self.core
        frames = [self.upstream_send(send)[0].without("transaction") for send in held.sends]
        receipt = commit.get("receipt")
        try:
            await self.outbox.store(frames)
        except OutboxClosed as exc:
            core.end(Ending(f"outbox closed: {exc}", app_error=error_frame(str(exc))))
            return
        except OutboxError as exc:
            tx = commit.get("transaction")
            log.warning("session %s: transaction %r not stored: %s", core.id, tx, exc)
            await self.out.send(
                error_frame(
                    f"transaction '{tx}' rolled back: {exc}",
                    receipt_id=receipt,
                    outcome=FrameOutcome.ROLLED_BACK,
                )
            )
            return
        await self.out.answer_locally(receipt)
