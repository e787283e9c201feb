"""The rotation: the brokers the sessions may use now, and what changes it.

Three things change the rotation, and this object is where they meet:

- **discovery** (:class:`~proxy.reconnect.discovery.BrokerDiscovery`): the live broker list,
  DNS names and the brokers file, refreshed and reloaded on SIGHUP; a broker that joins is
  probed and gets its metrics, one that leaves is evacuated (its sessions have to go,
  whatever the others' state) and readmitted if it comes back;
- **the operator** (``POST /actions/evacuate`` and ``/actions/readmit``,
  :mod:`proxy.admin.actions`): a broker evacuated is out of the rotation until readmitted or
  for ``for_seconds``, every session on it moving to another broker at its next quiet point
  with a FAILOVER event; an evacuation that would leave the sessions nowhere to go is refused
  (:func:`~proxy.reconnect.evacuations.stranded`, on the prober's word);
- **the reconnect board** (:class:`~proxy.reconnect.board.ReconnectBoard`), which holds the
  list in force and the evacuations and wakes the sessions they concern.

No task of its own: discovery's refresh runs in the daemon's nursery (:func:`proxy.app.serve`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

import trio

from config import Broker, Config
from proxy.admin.health import BrokerProber
from proxy.reconnect.board import ReconnectBoard
from proxy.reconnect.discovery import BrokerDiscovery
from proxy.reconnect.evacuations import Evacuation, EvacuationRefused, UnknownBroker, stranded
from proxy.reconnect.resolve import Resolve
from proxy.telemetry.metrics import Metrics

__all__ = ["BrokerRotation"]

log = logging.getLogger("mq_sidecar.app")


class BrokerRotation:
    """The brokers in rotation (module docstring).

    Args:
        config: validated configuration (its ``brokers``, ``brokers_file``, DNS options).
        board: the reconnect board the sessions share; the list in force is its ``brokers``.
        metrics: where a broker that joins gets its children.
        brokers_of_sessions: the broker label each live session is on now (None: none), for
            the log line of an evacuation.
        prober: the admin plane's broker prober once it runs, else None (an evacuation is then
            checked without its states).
        resolve: the DNS lookup of the list's names (tests); default: dnspython's.

    Attributes:
        discovery: the live broker list (:mod:`proxy.reconnect.discovery`).
    """

    def __init__(
        self,
        config: Config,
        board: ReconnectBoard,
        metrics: Metrics,
        *,
        brokers_of_sessions: Callable[[], Iterable[str | None]],
        prober: Callable[[], BrokerProber | None],
        resolve: Resolve | None = None,
    ) -> None:
        self.board = board
        self.metrics = metrics
        self._brokers_of_sessions = brokers_of_sessions
        self._prober = prober
        self.discovery = BrokerDiscovery(
            config, board.brokers, on_join=self._joined, on_leave=self._left, resolve=resolve
        )
        #: Brokers evacuated because they left the list (readmitted when they come back).
        self._left_list: set[str] = set()

    async def start(self) -> None:
        """The broker list at start: the brokers file read, the DNS names looked up
        (:meth:`BrokerDiscovery.start <proxy.reconnect.discovery.BrokerDiscovery.start>`);
        their metrics' children made.

        Raises:
            NoBrokers: none found.
        """
        await self.discovery.start()
        for broker in self.brokers():
            self.metrics.add_broker(broker.label)

    def brokers(self) -> tuple[Broker, ...]:
        """The broker list in force, in its order."""
        return self.board.brokers.in_force()

    def connecting(self, broker: str) -> tuple[int, int]:
        """``(in flight, waiting)``: the sessions' connection attempts to the broker labelled
        ``broker`` holding one of its ``max_connecting`` slots, and those waiting for one."""
        return self.board.connecting(broker)

    def evacuations(self) -> tuple[Evacuation, ...]:
        """The brokers evacuated now, oldest first."""
        return self.board.evacuations.active(trio.current_time())

    def evacuate(
        self, broker: str, reason: str, *, for_seconds: float | None = None, check: bool = True
    ) -> Evacuation:
        """Evacuate the broker labelled ``broker`` (``host:port``): out of the rotation until
        :meth:`readmit` or for ``for_seconds`` (seconds), every session on it moving to another
        broker at its next quiet point with a FAILOVER event (reason ``evacuated``, its words
        ending with ``reason``); :meth:`ReconnectBoard.evacuate
        <proxy.reconnect.board.ReconnectBoard.evacuate>`. Evacuating it again replaces the
        reason and the end. Logged.

        ``check``: refuse when no other broker can take the sessions
        (:func:`~proxy.reconnect.evacuations.stranded`: another broker in the list, not
        evacuated, ``up`` for the admin plane's prober). A broker that left the list is
        evacuated without it: its sessions have to go.

        Raises:
            UnknownBroker: ``broker`` is not in the broker list.
            EvacuationRefused: ``check`` and no other broker can take the sessions.
            ValueError: ``for_seconds`` out of range.
        """
        labels = self._labels(broker)
        if check:
            evacuated = [e.broker for e in self.evacuations()]
            prober = self._prober()
            states = None
            if prober is not None:
                states = {h.broker: (h.state, h.detail) for h in prober.statistics()}
            why = stranded(broker, labels, evacuated, states)
            if why is not None:
                raise EvacuationRefused(why)
        entry = self.board.evacuate(broker, reason, for_seconds=for_seconds)
        on_it = sum(1 for b in self._brokers_of_sessions() if b == broker)
        log.warning(
            "broker %s evacuated (%s)%s: %d session(s) on it move at their next quiet point",
            broker,
            reason,
            "" if for_seconds is None else f" for {for_seconds:g} s",
            on_it,
        )
        return entry

    def readmit(self, broker: str) -> Evacuation | None:
        """Put the evacuated broker labelled ``broker`` back into the rotation; returns the
        evacuation it ends (None: it was not evacuated). Logged.

        Raises:
            UnknownBroker: ``broker`` is not in the broker list.
        """
        self._labels(broker)
        entry = self.board.readmit(broker)
        if entry is not None:
            log.warning(
                "broker %s readmitted to the rotation (evacuated: %s)", broker, entry.reason
            )
        return entry

    def _labels(self, broker: str) -> list[str]:
        """The labels of the broker list in force; ``broker`` is in it, or was (a broker that
        left the list is evacuated by its label).

        Raises:
            UnknownBroker: it is not and never was.
        """
        table = self.board.brokers
        labels = list(table.labels())
        if table.index_of(broker) is None:
            raise UnknownBroker(f"{broker} is not in the broker list ({', '.join(labels)})")
        return labels

    def _joined(self, broker: Broker, source: str) -> None:
        """A broker joined the list: into the rotation (readmitted if it had left it), the
        prober's rounds and the metrics."""
        label = broker.label
        if label in self._left_list:
            self._left_list.discard(label)
            entry = self.board.readmit(label)
            if entry is not None:
                log.warning("broker %s back in the broker list (%s)", label, source)
        self.metrics.add_broker(label)
        self._follow()

    def _left(self, broker: Broker, reason: str) -> None:
        """A broker left the list: evacuated (its sessions have to go, whatever the others'
        state), no longer probed."""
        self._left_list.add(broker.label)
        self.evacuate(broker.label, reason, check=False)
        self._follow()

    def _follow(self) -> None:
        prober = self._prober()
        if prober is not None:
            prober.follow(self.brokers())
