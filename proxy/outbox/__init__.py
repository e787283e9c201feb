"""The durable outbox (issue 17): frames stored on local disk before their RECEIPT, forwarded
later, and the consumer side's duplicate-suppression ids kept across a restart.

Daemon side (it does I/O): SQLite in ``outbox_dir`` (:mod:`proxy.outbox.store`), recovered on
open (:mod:`proxy.outbox.recovery`, :mod:`proxy.outbox.wal`), locked to one process
(:mod:`proxy.outbox.lock`), written from trio through a group committer
(:mod:`proxy.outbox.committer`). docs/outbox.md describes the files, what a power cut can lose
and the measurements.
"""

from __future__ import annotations

from proxy.outbox.committer import CommitterStatistics, GroupCommitter, open_group_committer
from proxy.outbox.errors import (
    OutboxClosed,
    OutboxError,
    OutboxFull,
    OutboxFullTimeout,
    OutboxLocked,
    OutboxWriteError,
)
from proxy.outbox.lock import DirectoryLock
from proxy.outbox.records import (
    Append,
    DamagedFrame,
    OutboxDepth,
    OutboxFrame,
    RecordSeen,
    RecoveryReport,
    Remove,
    Removed,
    SessionBacklog,
    StoredFrame,
)
from proxy.outbox.store import OutboxStore
from proxy.outbox.wal import WalScan, scan_wal

__all__ = [
    "Append",
    "CommitterStatistics",
    "DamagedFrame",
    "DirectoryLock",
    "GroupCommitter",
    "OutboxClosed",
    "OutboxDepth",
    "OutboxError",
    "OutboxFrame",
    "OutboxFull",
    "OutboxFullTimeout",
    "OutboxLocked",
    "OutboxStore",
    "OutboxWriteError",
    "RecordSeen",
    "RecoveryReport",
    "Remove",
    "Removed",
    "SessionBacklog",
    "StoredFrame",
    "WalScan",
    "open_group_committer",
    "scan_wal",
]
