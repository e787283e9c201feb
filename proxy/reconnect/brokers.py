"""The broker list in force, with a stable index per broker (pure; docs/configuration.md, "A live
broker list").

The broker list changes at run time (a DNS name that resolves to other addresses, the brokers
file, a SIGHUP), while sessions, the reconnect board and the walk name brokers by index. So a
:class:`BrokerTable` never moves a broker: every broker that was ever in the list keeps its slot,
a broker that leaves is only marked out of force (and evacuated by the caller:
:mod:`proxy.reconnect.evacuations`), one that comes back gets its slot again. Brokers are the
same broker when their labels (``host:port``) are; a broker whose other settings changed (a
virtual host in the file) takes its slot's place.

Memory: one slot per broker label ever in force, at most :data:`MAX_SLOTS`; past that the slot
of the broker out of force longest is given to the newcomer (a Kubernetes Service whose pods
keep changing addresses).

Nothing here reads a clock or does I/O; the owner that resolves and reads files is
:class:`proxy.reconnect.discovery.BrokerDiscovery`.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import overload

from config import Broker
from proxy.reconnect.policy import ReconnectPolicy

__all__ = [
    "MAX_SLOTS",
    "BrokerChange",
    "BrokerTable",
    "EmptyBrokerList",
    "first_in_force",
    "in_force",
    "in_force_count",
    "walk_order",
]

#: Most slots a table keeps (brokers in force and those that left, kept for their indexes).
MAX_SLOTS = 1024


class EmptyBrokerList(ValueError):
    """An update that would leave no broker in force: refused, the list in force stays."""


@dataclass(frozen=True, slots=True)
class BrokerChange:
    """What one :meth:`BrokerTable.update` changed: brokers that joined (new, or back after
    leaving) and brokers that left, each in list order."""

    joined: tuple[Broker, ...] = ()
    left: tuple[Broker, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.joined or self.left)


class BrokerTable(Sequence[Broker]):
    """Every broker in the list, by a stable index: ``table[i]`` is the broker of slot ``i``
    (in force or not), ``len(table)`` the number of slots; :meth:`in_force` the list in force,
    in its order.

    Args:
        brokers: the list at start (labels distinct, as the configuration's are).
    """

    __slots__ = ("_index", "_left", "_order", "_slots")

    def __init__(self, brokers: Sequence[Broker] = ()) -> None:
        self._slots: list[Broker] = []
        self._index: dict[str, int] = {}
        self._order: tuple[int, ...] = ()  # slots in force, in list order
        self._left: list[int] = []  # slots out of force, longest out first
        self.update(brokers, allow_empty=True)

    @overload
    def __getitem__(self, index: int) -> Broker: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Broker]: ...
    def __getitem__(self, index: int | slice) -> Broker | Sequence[Broker]:
        return self._slots[index]

    def __len__(self) -> int:
        return len(self._slots)

    def serves(self, index: int) -> bool:
        """Whether slot ``index`` is in force."""
        return 0 <= index < len(self._slots) and index not in self._left

    def indexes(self) -> tuple[int, ...]:
        """The slots in force, in list order."""
        return self._order

    def in_force(self) -> tuple[Broker, ...]:
        """The brokers in force, in list order."""
        return tuple(self._slots[i] for i in self._order)

    def labels(self) -> tuple[str, ...]:
        """The labels of the brokers in force, in list order."""
        return tuple(self._slots[i].label for i in self._order)

    def index_of(self, label: str) -> int | None:
        """The slot of the broker labelled ``label``, in force or not; None: never seen (or
        its slot given away)."""
        return self._index.get(label)

    def first(self) -> int:
        """The slot of the first broker in force (``priority_backup``'s first broker).

        Raises:
            EmptyBrokerList: none is in force (only a table built empty).
        """
        if not self._order:
            raise EmptyBrokerList("no broker in force")
        return self._order[0]

    def update(self, brokers: Sequence[Broker], *, allow_empty: bool = False) -> BrokerChange:
        """Make ``brokers`` the list in force (their order is the list's); returns what joined
        and what left. A broker listed twice counts once, at its first place.

        Raises:
            EmptyBrokerList: ``brokers`` is empty (unless ``allow_empty``): the list in force
                stays, never emptied by accident.
        """
        if not brokers and not allow_empty:
            raise EmptyBrokerList("the update names no broker")
        before = set(self._order)
        order: list[int] = []
        joined: list[Broker] = []
        for broker in brokers:
            index = self._index.get(broker.label)
            if index is None:
                index = self._new_slot(broker)
            elif index in order:
                continue
            self._slots[index] = broker
            if index in self._left:
                self._left.remove(index)
            if index not in before:
                joined.append(broker)
            order.append(index)
        kept = set(order)
        left = [self._slots[i] for i in self._order if i not in kept]
        for i in self._order:
            if i not in kept:
                self._left.append(i)
        self._order = tuple(order)
        return BrokerChange(tuple(joined), tuple(left))

    def _new_slot(self, broker: Broker) -> int:
        if len(self._slots) < MAX_SLOTS or not self._left:
            self._slots.append(broker)
            index = len(self._slots) - 1
        else:  # give away the slot of the broker out of force longest
            index = self._left.pop(0)
            del self._index[self._slots[index].label]
            self._slots[index] = broker
        self._index[broker.label] = index
        return index


def walk_order(
    brokers: Sequence[Broker], policy: ReconnectPolicy, current: int | None, rng: random.Random
) -> list[int]:
    """The indexes of ``brokers`` to try in one round (:meth:`ReconnectPolicy.order`): of a
    :class:`BrokerTable`, its brokers in force only, in list order (``current`` first when it
    is in force); of a plain sequence, all of them."""
    if not isinstance(brokers, BrokerTable):
        return policy.order(len(brokers), current, rng)
    indexes = brokers.indexes()
    if not indexes:
        return []
    position = indexes.index(current) if current is not None and current in indexes else None
    return [indexes[k] for k in policy.order(len(indexes), position, rng)]


def first_in_force(brokers: Sequence[Broker]) -> int:
    """The index of the first broker in force of ``brokers`` (0 for a plain sequence)."""
    return brokers.first() if isinstance(brokers, BrokerTable) else 0


def in_force_count(brokers: Sequence[Broker]) -> int:
    """How many brokers of ``brokers`` are in force (all of a plain sequence)."""
    return len(brokers.indexes()) if isinstance(brokers, BrokerTable) else len(brokers)


def in_force(brokers: Sequence[Broker]) -> Sequence[Broker]:
    """The brokers in force of ``brokers``, in list order (all of a plain sequence)."""
    return brokers.in_force() if isinstance(brokers, BrokerTable) else brokers
