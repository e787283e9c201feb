"""Result rows, the printed table and ``latest.json``.

One row per workload and broker (issue 7): ``{"workload", "broker", "direct", "sidecar",
"ratio", "unit"}``, with ``ratio = sidecar / direct``; latency and outage rows add
``added_ms = sidecar - direct``. Extra keys carry what explains a figure: ``notes`` (the
broker differences that cost something, a client or sidecar that saturated a core),
``samples`` (every repetition), CPU used by the sidecar, the broker and the load generator,
and ``goal``/``goal_met`` where the issue sets a goal. A row whose workload failed has
``error`` and null figures. Rows that only exist for the sidecar (its RSS) have a null
``direct`` and ``ratio``.

The throughput and latency rows also carry ``relay`` (the same workload through a C byte
relay, socat, in the same run: issue 18), with ``relay_ratio = relay / direct``,
``sidecar_vs_relay = sidecar / relay`` and, for latency, ``relay_added_ms = relay - direct``.

The outbox rows (``bench.workloads.outbox_mode``) carry ``outbox`` (the same workload through
a sidecar with ``outbox = true``), with ``outbox_ratio = outbox / direct`` and
``outbox_vs_sidecar = outbox / sidecar``; :func:`print_outbox_table` prints them.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Goal", "Row", "median", "print_outbox_table", "print_table", "write_json"]


@dataclass(frozen=True)
class Goal:
    """A goal of issue 7 on one field of a row: ``field <= limit`` or ``field >= limit``."""

    field: str
    op: str  # "<=" or ">="
    limit: float
    text: str

    def met(self, row: Row) -> bool | None:
        """Whether ``row`` meets the goal; None when the field has no value."""
        value = getattr(row, self.field)
        if value is None:
            return None
        return bool(value <= self.limit if self.op == "<=" else value >= self.limit)


@dataclass
class Row:
    """One line of the table / one object of ``latest.json``."""

    workload: str
    broker: str
    unit: str
    direct: float | None = None
    sidecar: float | None = None
    added_ms: float | None = None
    relay: float | None = None
    relay_added_ms: float | None = None
    outbox: float | None = None
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    goal: Goal | None = None
    error: str | None = None

    @property
    def ratio(self) -> float | None:
        """``sidecar / direct``, None when either is missing or direct is 0."""
        if self.direct is None or self.sidecar is None or self.direct == 0:
            return None
        return self.sidecar / self.direct

    @property
    def relay_ratio(self) -> float | None:
        """``relay / direct``, None when either is missing or direct is 0."""
        if self.direct is None or self.relay is None or self.direct == 0:
            return None
        return self.relay / self.direct

    @property
    def sidecar_vs_relay(self) -> float | None:
        """``sidecar / relay``: the share of what a C byte relay keeps that the sidecar keeps;
        None when either is missing or the relay's is 0."""
        if self.relay is None or self.sidecar is None or self.relay == 0:
            return None
        return self.sidecar / self.relay

    @property
    def outbox_ratio(self) -> float | None:
        """``outbox / direct``, None when either is missing or direct is 0."""
        if self.direct is None or self.outbox is None or self.direct == 0:
            return None
        return self.outbox / self.direct

    @property
    def outbox_vs_sidecar(self) -> float | None:
        """``outbox / sidecar``: the outbox sidecar's figure over the plain sidecar's; None
        when either is missing or the sidecar's is 0."""
        if self.sidecar is None or self.outbox is None or self.sidecar == 0:
            return None
        return self.outbox / self.sidecar

    def to_json(self) -> dict[str, Any]:
        """The JSON object of this row (figures rounded for reading)."""
        out: dict[str, Any] = {
            "workload": self.workload,
            "broker": self.broker,
            "direct": _round(self.direct),
            "sidecar": _round(self.sidecar),
            "ratio": None if self.ratio is None else round(self.ratio, 3),
            "unit": self.unit,
        }
        if self.added_ms is not None or self.unit == "ms":
            out["added_ms"] = _round(self.added_ms)
        if self.relay is not None:
            out["relay"] = _round(self.relay)
            out["relay_ratio"] = _round3(self.relay_ratio)
            out["sidecar_vs_relay"] = _round3(self.sidecar_vs_relay)
            if self.relay_added_ms is not None:
                out["relay_added_ms"] = _round(self.relay_added_ms)
        if self.outbox is not None:
            out["outbox"] = _round(self.outbox)
            out["outbox_ratio"] = _round3(self.outbox_ratio)
            out["outbox_vs_sidecar"] = _round3(self.outbox_vs_sidecar)
        if self.goal is not None:
            out["goal"] = self.goal.text
            out["goal_met"] = self.goal.met(self)
        if self.error is not None:
            out["error"] = self.error
        if self.notes:
            out["notes"] = self.notes
        out.update(self.extra)
        return out


def _round(value: float | None) -> float | None:
    if value is None:
        return None
    if abs(value) >= 100:
        return round(value)
    if abs(value) >= 1:
        return round(value, 2)
    return round(value, 4)


def _round3(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def median(values: list[float]) -> float:
    """The median (``statistics.median``); raises ValueError on an empty list."""
    if not values:
        raise ValueError("median of no values")
    return float(statistics.median(values))


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3f}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def print_table(rows: list[Row]) -> str:
    """The table of ``rows`` as text (also returned): workload, broker, direct, relay,
    sidecar, ratio (sidecar / direct), relay ratio (relay / direct), sidecar / relay, unit,
    added ms (sidecar, and the relay's in brackets), goal (``ok``/``MISSED``, the goal's
    text)."""
    header = (
        f"{'workload':<36}{'broker':<9}{'direct':>10}{'relay':>10}{'sidecar':>10}"
        f"{'ratio':>7}{'relay':>7}{'s/relay':>8}  {'unit':<8}{'added ms (relay)':>18}  goal"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        goal = ""
        if r.goal is not None:
            met = r.goal.met(r)
            goal = f"{'?' if met is None else 'ok' if met else 'MISSED'} ({r.goal.text})"
        if r.error is not None:
            goal = f"ERROR: {r.error[:60]}"
        added = "" if r.added_ms is None else f"{r.added_ms:+.3f}"
        if r.relay_added_ms is not None:
            added += f" ({r.relay_added_ms:+.3f})"
        lines.append(
            f"{r.workload:<36}{r.broker:<9}{_fmt(r.direct):>10}{_fmt(r.relay):>10}"
            f"{_fmt(r.sidecar):>10}{_ratio(r.ratio):>7}{_ratio(r.relay_ratio):>7}"
            f"{_ratio(r.sidecar_vs_relay):>8}  {r.unit:<8}{added:>18}  {goal}"
        )
    text = "\n".join(lines)
    print(text, flush=True)
    return text


def _us(value: object) -> str:
    return f"{value:.1f}" if isinstance(value, int | float) else "-"


def print_outbox_table(rows: list[Row]) -> str:
    """The table of the rows with an ``outbox`` figure as text (also returned; empty when
    there is none): workload, broker, direct, sidecar, outbox, sidecar / direct, outbox /
    direct, outbox / sidecar, unit, CPU per message of the sidecar and of the outbox sidecar
    (us), the outbox's commits (fsyncs) per frame, disk bytes per frame (broker-down row)."""
    mine = [r for r in rows if r.outbox is not None]
    if not mine:
        return ""
    header = (
        f"{'workload':<38}{'broker':<9}{'direct':>9}{'sidecar':>9}{'outbox':>9}"
        f"{'s/d':>7}{'o/d':>7}{'o/s':>7}  {'unit':<6}{'CPU us s/o':>14}{'fsync/fr':>9}"
        f"{'B/fr':>7}"
    )
    lines = [header, "-" * len(header)]
    for r in mine:
        cpu = "/".join(_us(r.extra.get(f"{t}_cpu_us_per_msg")) for t in ("sidecar", "outbox"))
        commits = r.extra.get("commits_per_frame")
        disk = r.extra.get("disk_bytes_per_frame")
        lines.append(
            f"{r.workload:<38}{r.broker:<9}{_fmt(r.direct):>9}{_fmt(r.sidecar):>9}"
            f"{_fmt(r.outbox):>9}{_ratio(r.ratio):>7}{_ratio(r.outbox_ratio):>7}"
            f"{_ratio(r.outbox_vs_sidecar):>7}  {r.unit:<6}"
            f"{cpu:>14}"
            f"{'-' if commits is None else f'{commits:.3f}':>9}"
            f"{'-' if disk is None else str(disk):>7}"
        )
    text = "\n".join(lines)
    print(text, flush=True)
    return text


def write_json(path: Path, rows: list[Row]) -> None:
    """Write ``rows`` as a JSON list (one object per row) to ``path``, creating its folder."""
    write_document(path, [r.to_json() for r in rows])


def write_document(path: Path, document: object) -> None:
    """Write ``document`` as indented JSON to ``path``, creating its folder (values JSON does
    not know, such as a Path, as their ``str``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2, default=str) + "\n")
