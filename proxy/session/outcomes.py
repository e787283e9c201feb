"""What became of app frames that did not end plainly confirmed: one :class:`FrameReport` per
frame, naming it by the app's receipt id and its ``mq-sidecar-id`` with one
:class:`~proxy.telemetry.vocabulary.FrameOutcome` (docs/behaviour.md, "Frame outcomes").

After JEUS' Send/AcknowledgeException, which carry the id of the message that failed, and the
Qpid draft's TransactionAborted (certainly not done) vs TransactionUnknown (may be done): the
outcome says whether the frame may have taken effect on a broker.

No I/O: these functions only read window entries and a replay plan; the control channel
(:meth:`proxy.session.control.ControlChannel.report`) counts, publishes and (through the event
log) logs the reports.
"""

from __future__ import annotations

from collections.abc import Iterable

from config import FailoverMode
from protocol import Command
from proxy.telemetry.events import FrameReport, report_of_frame
from proxy.telemetry.vocabulary import FrameOutcome, OutcomeCause
from proxy.tracking import STREAM_CREDIT, Transaction
from proxy.tracking.replay import ReplayPlan
from proxy.tracking.window import Entry

__all__ = ["after_restore", "report_of", "unsettled", "unsettled_outcome"]


def report_of(entry: Entry, outcome: FrameOutcome, cause: OutcomeCause) -> FrameReport:
    """The report of one window entry: its command, the app's receipt id, the SEND's
    ``mq-sidecar-id``, its sequence number and transaction."""
    return report_of_frame(entry.frame, entry.app_receipt, outcome, cause, seq=entry.seq)


def unsettled_outcome(entry: Entry) -> FrameOutcome:
    """The outcome of an entry still unconfirmed when the session gives it up: ``unknown``
    when it was written to a broker (the current leg, or one lost before confirming it: it
    may have taken effect there), ``lost`` when it never was."""
    return FrameOutcome.UNKNOWN if entry.sent or entry.sent_before else FrameOutcome.LOST


def unsettled(entries: Iterable[Entry], cause: OutcomeCause) -> list[FrameReport]:
    """Reports of the unconfirmed ``entries`` a session gives up (the drain deadline, an
    exhausted reconnect, the app's DISCONNECT): their final outcome, also for one the app
    already had an ERROR for (``timed_out`` may become ``unknown``)."""
    return [report_of(e, unsettled_outcome(e), cause) for e in entries if not e.confirmed]


def after_restore(plan: ReplayPlan, mode: FailoverMode) -> list[FrameReport]:
    """Reports of what a restore did to the window (:func:`proxy.tracking.replay.plan_replay`):

    - a frame replayed that an earlier leg may have had (``sent_before``): ``replayed``;
    - an ACK of a delivery of the old leg, not replayed: in ``transparent`` mode the sidecar
      settles the redelivery when it recognises it (``replayed``); in ``strict`` mode the
      message is shown again (``lost``). A NACK's message comes back either way, as asked. A
      stream's ACK (:data:`~proxy.tracking.STREAM_CREDIT`) is not reported: it was credit,
      and its message never comes again (docs/behaviour.md, "Streams");
    - a frame of a transaction rolled back (``transaction_failover = rollback``):
      ``rolled_back``; a COMMIT in flight there: ``unknown`` (in doubt), or ``rolled_back``
      when no broker ever had it.
    """
    cause = OutcomeCause.FAILOVER
    reports = [report_of(e, FrameOutcome.REPLAYED, cause) for e in plan.replay if e.sent_before]
    for entry in plan.answer:
        command = entry.frame.command
        owner = entry.context if isinstance(entry.context, Transaction) else None
        if owner is not None and owner.rolled_back:
            reports.append(report_of(entry, FrameOutcome.ROLLED_BACK, cause))
        elif command is Command.ACK and not _aborted(owner) and entry.context is not STREAM_CREDIT:
            outcome = FrameOutcome.LOST if mode is FailoverMode.STRICT else FrameOutcome.REPLAYED
            reports.append(report_of(entry, outcome, cause))
    reports += (report_of(e, FrameOutcome.UNKNOWN, cause) for e in plan.in_doubt)
    reports += (report_of(e, FrameOutcome.ROLLED_BACK, cause) for e in plan.refused)
    return sorted(reports, key=lambda r: r.seq)


def _aborted(tx: Transaction | None) -> bool:
    """Whether ``tx`` was ended by the app's ABORT (its frames were to have no effect)."""
    return tx is not None and tx.end is not None and tx.end.frame.command is Command.ABORT
