"""The outbox (store and forward, docs/outbox.md): frames stored on local disk before their
RECEIPT, forwarded later, and the consumer side's duplicate-suppression ids kept across a
restart.

- ``service``: the outbox at work in the daemon: opened at start, its group committer, what the
  sessions share of it (:class:`~proxy.outbox.service.OutboxService`).
- ``forwarder``: the outbox forwarder: frames no live session forwards (a previous process's,
  an ended session's) sent over a connection of the sidecar's own.
- ``frames``: the stored-frame format (STOMP 1.2 bytes) read back, and how many frames a
  forwarder reads at once.
- ``store``: SQLite in ``outbox_dir``; ``records``: what it holds; ``committer``: the group
  committer (one fsync per batch, from trio); ``lock``: one process per directory;
  ``recovery`` and ``wal``: recovering the store after a crash or power cut; ``btree``: reading
  a damaged database page by page; ``errors``.

The session's part (storing its app's SENDs, forwarding them, removing what was confirmed) is
:mod:`proxy.session.outbox`, its transactions :mod:`proxy.session.outbox_transactions`.
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
    Expire,
    Expired,
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
    "Expire",
    "Expired",
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
