"""The goals table of issue 18: each figure through the C byte relay and through the sidecar,
the goal, and whether the sidecar meets it, read from the rows of one ``bench.run``.

Columns: figure / relay / sidecar / goal / met? — the format the issue's closing note pastes.
CPU figures are microseconds of CPU per message of the process in front of the broker (the
sidecar; socat with its forked children), from ``/proc``, on non-persistent 1 KiB messages;
throughput figures are the ratio to direct of the same run, the goal being the sidecar at
>= 0.8 of what the relay keeps; latency figures are the milliseconds added to a SEND+RECEIPT
round trip at p50 and p99; memory is the sidecar's RSS with 1,000 idle sessions (the relay
would be 1,000 socat processes: not measured). A figure whose workload did not run (``--only``,
``--quick``'s session counts) shows "-" and met "?".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from bench.report import Row

__all__ = ["GOALS", "GoalLine", "format_goals", "goal_lines"]


@dataclass(frozen=True)
class _Spec:
    figure: str
    kind: str  # "cpu", "vs_relay", "latency", "rss"
    # Rows to read, the first present wins. The synchronous round trip's CPU comes from the
    # latency workload (5,000 round trips in blocks interleaved with the other targets), or
    # from send-sync (2,000 back to back) when latency did not run.
    workloads: tuple[str, ...]
    op: str  # "<=" or ">="
    limit: float
    goal: str


#: Issue 18's goals, in the order of its table.
GOALS: tuple[_Spec, ...] = (
    _Spec("CPU per fire-and-forget SEND", "cpu", ("send-ff/non-persistent",), "<=", 20, "<= 20 us"),
    _Spec(
        "CPU per SEND, receipts pipelined",
        "cpu",
        ("send-pipelined/non-persistent",),
        "<=",
        30,
        "<= 30 us",
    ),
    _Spec(
        "CPU per auto-acked MESSAGE", "cpu", ("consume-auto/non-persistent",), "<=", 20, "<= 20 us"
    ),
    _Spec(
        "CPU per client-individual MESSAGE",
        "cpu",
        ("consume-client/non-persistent",),
        "<=",
        35,
        "<= 35 us",
    ),
    _Spec(
        "CPU per synchronous SEND+RECEIPT",
        "cpu",
        ("latency-send-receipt-p50", "send-sync/non-persistent"),
        "<=",
        120,
        "<= 120 us",
    ),
    _Spec(
        "throughput, receipts pipelined",
        "vs_relay",
        ("send-pipelined/non-persistent",),
        ">=",
        0.8,
        ">= 0.8 of relay",
    ),
    _Spec(
        "throughput, fire-and-forget",
        "vs_relay",
        ("send-ff/non-persistent",),
        ">=",
        0.8,
        ">= 0.8 of relay",
    ),
    _Spec("added latency p50", "latency", ("latency-send-receipt-p50",), "<=", 0.15, "<= +0.15 ms"),
    _Spec("added latency p99", "latency", ("latency-send-receipt-p99",), "<=", 0.8, "<= +0.8 ms"),
    _Spec("RSS, 1,000 idle sessions", "rss", ("scale-1000-sessions-rss",), "<=", 60, "<= 60 MiB"),
)


@dataclass(frozen=True)
class GoalLine:
    """One line of the goals table: ``relay`` and ``sidecar`` as printed (with units),
    ``value`` the sidecar's figure the goal is checked on (None: not measured), ``met``
    None when not measured."""

    broker: str
    figure: str
    relay: str
    sidecar: str
    goal: str
    value: float | None
    met: bool | None

    def to_json(self) -> dict[str, object]:
        """This line as a JSON object."""
        return {
            "broker": self.broker,
            "figure": self.figure,
            "relay": self.relay,
            "sidecar": self.sidecar,
            "goal": self.goal,
            "value": self.value,
            "met": self.met,
        }


def _cpu(row: Row, target: str) -> float | None:
    extra = row.extra
    value = extra.get(f"{target}_cpu_us_per_msg", extra.get(f"{target}_cpu_us_per_round_trip"))
    return None if value is None else float(value)


def _line(spec: _Spec, broker: str, row: Row | None) -> GoalLine:
    relay = sidecar = "-"
    value: float | None = None
    if row is not None and row.error is None:
        show: Callable[[float | None], str]
        if spec.kind == "cpu":
            value, relay_value = _cpu(row, "sidecar"), _cpu(row, "relay")

            def show(v: float | None) -> str:
                return "-" if v is None else f"{v:.1f} us"

            relay, sidecar = show(relay_value), show(value)
        elif spec.kind == "vs_relay":
            value = row.sidecar_vs_relay
            relay = "-" if row.relay_ratio is None else f"{row.relay_ratio:.2f}x direct"
            if row.ratio is not None and value is not None:
                sidecar = f"{row.ratio:.2f}x direct = {value:.3f} of relay"
        elif spec.kind == "latency":
            value = row.added_ms
            relay = "-" if row.relay_added_ms is None else f"{row.relay_added_ms:+.3f} ms"
            sidecar = "-" if value is None else f"{value:+.3f} ms"
        else:
            value = row.sidecar
            sidecar = "-" if value is None else f"{value:.0f} MiB"
        label = row.workload if len(spec.workloads) > 1 else ""
        if label and value is not None:
            sidecar += f" ({label})"
    met = None
    if value is not None:
        met = value <= spec.limit if spec.op == "<=" else value >= spec.limit
    return GoalLine(broker, spec.figure, relay, sidecar, spec.goal, value, met)


def goal_lines(rows: list[Row]) -> list[GoalLine]:
    """The goals table of ``rows``: one line per goal of :data:`GOALS` per broker that has
    rows, in the order of the brokers' first rows."""
    brokers = list(dict.fromkeys(r.broker for r in rows))
    lines = []
    for broker in brokers:
        by_name = {r.workload: r for r in rows if r.broker == broker}
        for spec in GOALS:
            row = next((by_name[w] for w in spec.workloads if w in by_name), None)
            lines.append(_line(spec, broker, row))
    return lines


def format_goals(lines: list[GoalLine]) -> str:
    """``lines`` as a Markdown table (figure | relay | sidecar | goal | met?), one section per
    broker headed by its name."""
    out: list[str] = []
    for broker in dict.fromkeys(line.broker for line in lines):
        out += [
            f"goals ({broker}):",
            "| figure | relay | sidecar | goal | met? |",
            "|---|---|---|---|---|",
        ]
        for line in (x for x in lines if x.broker == broker):
            met = "?" if line.met is None else "yes" if line.met else "no"
            out.append(f"| {line.figure} | {line.relay} | {line.sidecar} | {line.goal} | {met} |")
    return "\n".join(out)
