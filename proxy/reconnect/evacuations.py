"""Which brokers are evacuated: out of the rotation, their sessions moving to other brokers at
their next quiet point (pure; docs/operations.md, "Actions").

An evacuation is the operator's (``POST /actions/evacuate``) or, later, the broker list's (a
broker that left DNS or the brokers file): one operation for both. While a broker is
evacuated, no connection goes to it (the reconnect walk skips it, :mod:`proxy.reconnect.walk`;
the ``priority_backup`` watch does not fail back to it) and every session on it moves to
another broker the way a failback does (:mod:`proxy.session.link`): at a quiet point, the app
held briefly, a FAILOVER event with reason ``evacuated`` whose words say why. It lasts until
it is readmitted or, when given a time, until that time has passed.

This module keeps the table and judges whether an evacuation would strand the sessions
(:func:`stranded`); it has no clock (times are the caller's, in seconds) and no trio. The
waiting (a trio Event per change) is :class:`proxy.reconnect.board.ReconnectBoard`'s.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "MAX_EVACUATION_SECONDS",
    "Evacuation",
    "EvacuationRefused",
    "Evacuations",
    "UnknownBroker",
    "stranded",
]

#: The longest ``for_seconds`` an evacuation takes: 30 days (longer is "until readmitted").
MAX_EVACUATION_SECONDS = 30 * 86400.0


class UnknownBroker(ValueError):
    """A broker label that is not in the broker list; the message names the list's labels."""


class EvacuationRefused(Exception):
    """An evacuation that would leave the broker's sessions nowhere to go; the message is the
    reason, one line (no credentials: broker labels and the prober's words only)."""


@dataclass(frozen=True, slots=True)
class Evacuation:
    """One broker out of the rotation.

    Attributes:
        broker: its label (``host:port``, as the configuration gives it).
        reason: why, in words for the FAILOVER events and logs ("requested by 10.0.0.7 on
            the admin plane", "left the broker list").
        since: when it began, in the caller's seconds.
        until: when it ends by itself, in the caller's seconds; None: until readmitted.
    """

    broker: str
    reason: str
    since: float
    until: float | None = None

    def active(self, now: float) -> bool:
        """Whether it still holds at ``now``."""
        return self.until is None or now < self.until


class Evacuations:
    """The evacuated brokers, by label. One entry per broker: evacuating it again replaces its
    entry (a new reason or end). An entry whose ``until`` has passed is gone: every read at a
    later ``now`` drops it. Memory: one entry per configured broker at most (labels are
    checked against the broker list by the caller)."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: dict[str, Evacuation] = {}

    def evacuate(
        self, broker: str, reason: str, now: float, *, for_seconds: float | None = None
    ) -> Evacuation:
        """Put ``broker`` out of the rotation from ``now``, for ``for_seconds`` (None: until
        :meth:`readmit`); returns the entry.

        Raises:
            ValueError: ``for_seconds`` is not a finite number in (0, MAX_EVACUATION_SECONDS].
        """
        until = None
        if for_seconds is not None:
            if not (math.isfinite(for_seconds) and 0 < for_seconds <= MAX_EVACUATION_SECONDS):
                raise ValueError(
                    f"for_seconds must be above 0 and at most {MAX_EVACUATION_SECONDS:g}, "
                    f"got {for_seconds!r}"
                )
            until = now + for_seconds
        entry = Evacuation(broker, reason, now, until)
        self._entries[broker] = entry
        return entry

    def readmit(self, broker: str, now: float) -> Evacuation | None:
        """Put ``broker`` back into the rotation; returns the evacuation that held at ``now``,
        or None when none did."""
        entry = self._entries.pop(broker, None)
        return entry if entry is not None and entry.active(now) else None

    def get(self, broker: str, now: float) -> Evacuation | None:
        """The evacuation of ``broker`` at ``now``, or None."""
        entry = self._entries.get(broker)
        if entry is None:
            return None
        if not entry.active(now):
            del self._entries[broker]
            return None
        return entry

    def active(self, now: float) -> tuple[Evacuation, ...]:
        """Every evacuation that holds at ``now``, oldest first."""
        for broker in [b for b, e in self._entries.items() if not e.active(now)]:
            del self._entries[broker]
        return tuple(sorted(self._entries.values(), key=lambda e: e.since))


def stranded(
    broker: str,
    brokers: Sequence[str],
    evacuated: Sequence[str],
    states: Mapping[str, tuple[str, str]] | None,
) -> str | None:
    """Why evacuating ``broker`` would leave its sessions nowhere to go, or None when another
    broker can take them.

    Another broker can take them when it is in the list, not evacuated and, given the
    prober's ``states`` (label to ``(state, detail)``, :class:`proxy.admin.health.BrokerHealth`),
    ``up``: it answered a STOMP CONNECT recently, or a session leg to it is live. Without
    ``states`` only the list and the evacuations are judged.

    Args:
        broker: the label of the broker to evacuate (in ``brokers``).
        brokers: the labels of the broker list.
        evacuated: the labels evacuated now (``broker`` among them or not).
        states: the prober's view, or None.
    """
    others = [b for b in brokers if b != broker]
    if not others:
        return f"{broker} is the only broker in the list: its sessions would have nowhere to go"
    left = [b for b in others if b not in evacuated]
    if not left:
        return (
            f"every other broker is evacuated ({', '.join(others)}): readmit one first, or "
            "its sessions would have nowhere to go"
        )
    if states is None:
        return None
    if any(states.get(b, ("unknown", ""))[0] == "up" for b in left):
        return None
    why = "; ".join(f"{b}: {_words(states.get(b))}" for b in left)
    return f"no other broker can take the sessions: {why}"


def _words(state: tuple[str, str] | None) -> str:
    if state is None or state[0] == "unknown":
        return "not checked yet"
    return f"{state[0]} ({state[1]})" if state[1] else state[0]
