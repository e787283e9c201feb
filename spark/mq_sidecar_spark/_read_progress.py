"""The queue reader's progress (``format("stomp")`` without ``stream=true``,
:class:`mq_sidecar_spark.reader.StompStreamReader`): what one settled range of the read log
cost (:class:`AckReport`) and when Spark committed its newest batch
(:func:`spark_committed_at`), for ``reportLatestOffset`` (docs/spark.md, "Progress of the
read"). PySpark's Python streaming sources have no source-metrics hook (its
``PythonMicroBatchStreamWithAdmissionControl`` does not implement ``ReportsSourceMetrics``), so
the figures travel in the reported latest offset, which Spark shows and never checkpoints.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["AckReport", "spark_committed_at"]


def spark_committed_at(checkpoint: Path) -> float | None:
    """When Spark committed its newest batch (s since the epoch): the modification time of the
    highest-numbered file in ``<checkpoint>/commits/`` (Spark's commit log, one file per batch
    id, written to a temporary name and renamed), or None when there is none (a
    ``checkpoint_location`` that is not the query's ``checkpointLocation``)."""
    try:
        names = [name for name in os.listdir(checkpoint / "commits") if name.isdigit()]
        if not names:
            return None
        return (checkpoint / "commits" / max(names, key=int)).stat().st_mtime
    except OSError:
        return None


@dataclass(frozen=True)
class AckReport:
    """One settled range of the read log, ``(after, to]``: ``acked`` ACKs written, ``ack_ms``
    the identities' fsync and the ACKs' writes took, ``delay_ms`` from Spark's commit of the
    newest batch (its commit log file) to the last ACK written (None when the commit log is
    not under ``checkpoint_location``)."""

    after: int
    to: int
    acked: int
    ack_ms: int
    delay_ms: int | None

    def progress(self) -> dict[str, int]:
        """The fields :meth:`StompStreamReader.reportLatestOffset` shows."""
        fields = {
            "acked_after": self.after,
            "acked_to": self.to,
            "acked": self.acked,
            "ack_ms": self.ack_ms,
        }
        if self.delay_ms is not None:
            fields["ack_delay_ms"] = self.delay_ms
        return fields

    def __str__(self) -> str:
        delay = "" if self.delay_ms is None else f", {self.delay_ms} ms after Spark's commit"
        return (
            f"committed ({self.after}, {self.to}], {self.acked} ACK(s) written in "
            f"{self.ack_ms} ms{delay}"
        )
