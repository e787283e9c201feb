"""The report's records: what a publish and drain delivered (:class:`Delivery`), each fault
the drill made (:class:`FaultRecord`) and the FAILOVER events it caused
(:class:`FailoverIncident`). Times are seconds since the publish started, durations
milliseconds where the name says ``_ms``."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["FAULT_KINDS", "Delivery", "FailoverIncident", "FaultRecord"]

#: The drill's fault kinds: ``broker`` (kill -9 of the serving broker, ``--faults N``),
#: ``all-down`` (kill -9 of every broker for a while, ``--faults all-down``) and ``sidecar``
#: (kill -9 of the producer's sidecar, restarted at once, ``--kill-sidecar``); on the RabbitMQ
#: cluster (``--broker rabbitmq-cluster``) ``node`` (kill -9 of the node the sessions are on,
#: restarted) and ``rolling-restart`` (every node stopped and started in turn); each with how
#: the PNG labels its kill line and its shaded outage.
FAULT_KINDS: dict[str, tuple[str, str]] = {
    "broker": ("kill -9 primary", "outage"),
    "all-down": ("kill -9 of every broker", "every broker down"),
    "sidecar": ("kill -9 of the producer's sidecar", "sidecar restarting"),
    "node": ("kill -9 of the connected node", "sessions' longest outage"),
    "rolling-restart": ("rolling restart begins", "rolling restart (one node down at a time)"),
}


@dataclass(frozen=True)
class FaultRecord:
    """One fault the drill made (``kind``: a key of :data:`FAULT_KINDS`).

    ``broker``: what was killed (a broker's name; for ``all-down`` both names joined by
    ``+``; for ``sidecar`` the sidecar's name); ``pid``: the (first) process killed, ``pids``
    every one; ``at``: seconds since the publish started; ``fraction``: share of the rows
    published then; ``takeover_ms``: from the kill until the other broker answered STOMP
    CONNECT (``broker`` faults of the drill's own pair, else None); ``restarted``: the killed
    broker was started again as the new backup (``all-down``: both brokers were started
    again; ``sidecar``: the sidecar was started again on its port and ``outbox_dir``);
    ``restored_at``: t when the service was back (``all-down``: the first broker restarted
    answers STOMP CONNECT; ``sidecar``: the restarted sidecar is ready), None when not
    measured or it never came back (``node``: the killed node rejoined; ``rolling-restart``:
    the last node rejoined); ``new_pid``: the restarted sidecar's PID; ``detail``: a few
    words (``node``: whether it led the queue; ``rolling-restart``: each node's downtime).
    """

    index: int
    broker: str
    pid: int | None
    at: float
    fraction: float
    takeover_ms: int | None = None
    restarted: bool = False
    kind: str = "broker"
    pids: tuple[int, ...] = ()
    restored_at: float | None = None
    new_pid: int | None = None
    detail: str = ""

    @property
    def downtime(self) -> float | None:
        """Seconds from the kill until the service was back (None: not measured)."""
        return None if self.restored_at is None else self.restored_at - self.at

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form: the fields and ``downtime_s``."""
        values = asdict(self)
        values["pids"] = list(self.pids)
        downtime = self.downtime
        values["downtime_s"] = None if downtime is None else round(downtime, 3)
        return values

    def describe(self) -> str:
        """One line for the text report."""
        downtime = "" if self.downtime is None else f", back after {self.downtime:.1f} s"
        when = f"at t={self.at:.1f} s, {self.fraction:.0%} published"
        if self.kind == "all-down":
            pids = ", ".join(str(p) for p in self.pids)
            restarted = ", both restarted (the serving one first)" if self.restarted else ""
            return f"every broker down: kill -9 {self.broker} (pids {pids}) {when}{downtime}" + (
                restarted
            )
        if self.kind == "sidecar":
            again = f", restarted as pid {self.new_pid}" if self.new_pid is not None else ""
            return f"kill -9 {self.broker} (pid {self.pid}) {when}{again}{downtime}"
        if self.kind == "node":
            again = ", restarted and rejoined" if self.restarted else ""
            return (
                f"kill -9 #{self.index + 1} node {self.broker} (pid {self.pid}, "
                f"{self.detail}) {when}{again}{downtime}"
            )
        if self.kind == "rolling-restart":
            ended = f", ended after {self.downtime:.1f} s" if self.downtime is not None else ""
            return (
                f"rolling restart of {self.broker.replace('+', ', ')} from t={self.at:.1f} s, "
                f"{self.fraction:.0%} published{ended}"
                + (f" ({self.detail})" if self.detail else "")
            )
        takeover = "" if self.takeover_ms is None else f", broker takeover {self.takeover_ms} ms"
        return f"kill -9 #{self.index + 1} {self.broker} (pid {self.pid}) {when}{takeover}" + (
            ", restarted as backup" if self.restarted else ""
        )


@dataclass(frozen=True)
class FailoverIncident:
    """The FAILOVER events of the sessions that moved after one fault (or unplanned ones).

    ``fault``: index of the fault, None for FAILOVERs no kill explains (e.g. a heart-beat
    timeout under load). ``sessions``: ``sidecar:session_id`` of each session that moved.
    """

    fault: int | None
    from_broker: str
    to_broker: str
    sessions: tuple[str, ...]
    outage_ms_min: int
    outage_ms_max: int
    replayed_frames: int
    reattached: int


@dataclass
class Delivery:
    """What one publish and drain delivered, reconciled with the source.

    ``rows``: rows in the source; ``sent``: rows the writer published and got confirmed;
    ``received``: messages the app received (duplicates included), ``unique`` of them
    distinct source rows; ``lost``: rows never received; ``duplicates``: extra copies the app
    received; ``mismatched``: rows whose content differs; ``unexpected``: messages not from
    the source; ``residual``: messages a fresh session still found on the queue.
    """

    rows: int
    sent: int
    received: int
    unique: int
    lost: int
    duplicates: int
    mismatched: int
    unexpected: int
    residual: int

    @property
    def exactly_once(self) -> bool:
        """Every row sent, and received exactly once with its content; nothing else."""
        return (
            self.sent == self.rows
            and self.lost == 0
            and self.duplicates == 0
            and self.mismatched == 0
            and self.unexpected == 0
        )
