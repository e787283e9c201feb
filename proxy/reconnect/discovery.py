"""Broker discovery: what the configuration, DNS and the brokers file name now, kept in
force on the reconnect board's :class:`~proxy.reconnect.brokers.BrokerTable` (the broker list
in force; this module keeps it live;
(docs/configuration.md, "A live broker list"; docs/operations.md, "The broker list at run
time").

Sources, in list order: the ``brokers`` of the configuration, then those of ``brokers_file``.
A broker with ``dns`` set stands for what its name resolves to (every address, or its SRV
records: :mod:`proxy.reconnect.resolve`). Every ``dns_refresh_interval`` (jittered by ±20 %)
the refresh task looks every such name up again and looks at the file (re-read when its
modification time, size or inode changed); SIGHUP re-reads it too (:meth:`BrokerDiscovery.reload`).

An update is applied as a diff (:meth:`BrokerTable.update`): a broker that joins is in the next
walks, the prober's rounds, ``/status`` and the metrics (``on_join``); one that leaves is
evacuated by the caller (``on_leave``: its sessions move at their next quiet point with a
FAILOVER whose reason says why, :meth:`proxy.rotation.BrokerRotation.evacuate`). Bad input
never empties the list: a lookup that fails (no such name, an answer without an address, a
timeout) keeps that name's last good answer; a file that does not parse keeps the file's last
good brokers; an update that would leave no broker at all is refused. Each is one log line when
it begins (and one when it ends), and stands in :meth:`BrokerDiscovery.statistics`
(``/status``) until it ends.

Lookups run in this object's task, never on a session's data path.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import trio

from config import Broker, Config, read_brokers_file
from proxy.reconnect.brokers import BrokerTable, EmptyBrokerList
from proxy.reconnect.resolve import LookupFailed, Resolve, make_resolver

__all__ = ["BrokerDiscovery", "BrokerListStatistics", "FailedUpdate", "NoBrokers"]

log = logging.getLogger("mq_sidecar.brokers")

#: The longest a lookup may take, seconds (at most ``dns_refresh_interval``).
LOOKUP_TIMEOUT = 5.0
#: Seconds past the lookup's own timeout after which the list gives up on it all the same.
LOOKUP_GRACE = 1.0
#: The refresh interval is drawn from this range of ``dns_refresh_interval`` (jitter).
JITTER = (0.8, 1.2)
#: The source of a SIGHUP whose configuration did not load.
RELOAD = "the configuration reloaded on SIGHUP"
#: Why a broker of the configuration itself leaves (a SIGHUP with another ``brokers``).
CONFIGURATION = "the configuration"


class NoBrokers(Exception):
    """At start, no source gave a broker; the message names each source's reason."""


@dataclass(frozen=True, slots=True)
class FailedUpdate:
    """An update not applied, standing until that source gives a good one.

    Attributes:
        source: ``"DNS name x"``, ``"SRV name _s._tcp.x"``, ``"brokers_file /path"``,
            ``"the broker list"`` (an update that would leave no broker) or :data:`RELOAD`.
        reason: one line (a file's problems name their lines).
        since: when it began, wall-clock seconds (``time.time()``).
    """

    source: str
    reason: str
    since: float


@dataclass(frozen=True, slots=True)
class BrokerListStatistics:
    """The list in force and what stands against it, for ``/status``.

    Attributes:
        brokers: the labels in force, in list order.
        failed: every update not applied (one per source), oldest first.
        updates: changes applied since start.
        last_change: when the last one was, wall-clock seconds; None: none yet.
    """

    brokers: tuple[str, ...]
    failed: tuple[FailedUpdate, ...]
    updates: int
    last_change: float | None


def _source(template: Broker) -> str:
    return f"{'SRV' if template.dns == 'srv' else 'DNS'} name {template.host}"


class BrokerDiscovery:
    """The owner of the live broker list (see the module docstring).

    Args:
        config: the configuration (``brokers``, ``brokers_file``, ``dns_refresh_interval``,
            ``dns_servers``).
        table: the list the sessions walk (the reconnect board's), changed in place.
        on_join: called with each broker that joins, and its source in words.
        on_leave: called with each broker that leaves and why, in words (``"left the broker
            list (DNS name x no longer resolves to it)"``).
        resolve: the lookup (tests); default: dnspython (:func:`make_resolver`).
        rng: the refresh interval's jitter.
    """

    def __init__(
        self,
        config: Config,
        table: BrokerTable,
        *,
        on_join: Callable[[Broker, str], None],
        on_leave: Callable[[Broker, str], None],
        resolve: Resolve | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.table = table
        self._on_join = on_join
        self._on_leave = on_leave
        self._given_resolve = resolve
        self._rng = rng if rng is not None else random.Random()
        self._lock = trio.Lock()
        self._expansions: dict[tuple[str, str | None], tuple[Broker, ...]] = {}
        self._file: tuple[Broker, ...] = ()
        self._file_stamp: tuple[int, int, int] | None = None
        self._failed: dict[str, FailedUpdate] = {}
        self._origin: dict[str, str] = {}  # label in force -> its source in words
        self.updates = 0
        self._last_change: float | None = None
        self._config = config
        self._interval_changed = trio.Event()
        self._timeout = LOOKUP_TIMEOUT
        self._resolve = self._make_resolve(config)

    def _make_resolve(self, config: Config) -> Resolve:
        self._timeout = min(LOOKUP_TIMEOUT, config.durations.dns_refresh_interval)
        if self._given_resolve is not None:
            return self._given_resolve
        return make_resolver(config.dns_servers, self._timeout)

    @property
    def dynamic(self) -> bool:
        """Whether anything can change the list at run time (a DNS name or a brokers file)."""
        config = self._config
        return config.brokers_file is not None or any(b.dns for b in config.brokers)

    # -- the work ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Read the file and look every name up once, and put the result in force (no
        callbacks: nothing runs on the list yet). A ``dns=all`` name that does not resolve
        yet stands for itself (resolved at each connect, as a broker without ``dns``).

        Raises:
            NoBrokers: no source gave a broker (each source's reason in the message).
        """
        async with self._lock:
            self._read_file(force=True)
            await self._lookup_all()
            brokers = self._compose(fallback=True)
            if not brokers:
                why = "; ".join(f"{f.source}: {f.reason}" for f in self._failed.values())
                raise NoBrokers(f"no broker to connect to: {why or 'the list is empty'}")
            self.table.update(brokers)
            self._origin = {b.label: src for b, src in self._compose_with_sources(fallback=True)}

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Refresh every ``dns_refresh_interval`` (jittered) until cancelled; nothing is looked
        at while nothing can change the list (no DNS name, no file: :attr:`dynamic`)."""
        task_status.started()
        while True:
            low, high = JITTER
            interval = self._config.durations.dns_refresh_interval
            with trio.move_on_after(interval * self._rng.uniform(low, high)):
                await self._interval_changed.wait()  # a reload with another interval
            self._interval_changed = trio.Event()
            if self.dynamic:
                await self.refresh()

    async def refresh(self) -> None:
        """Look every name up and look at the file (re-read when it changed); apply."""
        async with self._lock:
            self._read_file(force=False)
            await self._lookup_all()
            self._apply()

    async def reload(self, config: Config | None = None) -> None:
        """SIGHUP: take ``config``'s broker options (when given), re-read the file whether
        or not it changed, look every name up, apply."""
        async with self._lock:
            if config is not None:
                if config.dns_refresh_interval != self._config.dns_refresh_interval:
                    self._interval_changed.set()
                if config.dns_servers != self._config.dns_servers:
                    self._resolve = self._make_resolve(config)
                self._config = config
                if config.brokers_file is None:
                    self._file, self._file_stamp = (), None
                    self._failed = {
                        s: f for s, f in self._failed.items() if not s.startswith("brokers_file")
                    }
            self._failed.pop(RELOAD, None)
            self._read_file(force=True)
            await self._lookup_all()
            self._apply()

    def _read_file(self, *, force: bool) -> None:
        path = self._config.brokers_file
        if path is None:
            return
        source = f"brokers_file {path}"
        try:
            st = os.stat(path)
            stamp: tuple[int, int, int] | None = (st.st_mtime_ns, st.st_size, st.st_ino)
        except OSError:
            stamp = None
        if not force and stamp is not None and stamp == self._file_stamp:
            return
        brokers, problems = read_brokers_file(path)
        if problems:
            self._fail(source, "; ".join(problems), "the list in force stays")
            self._file_stamp = stamp  # looked at: not again until it changes
            return
        self._file, self._file_stamp = brokers, stamp
        self._succeed(source)

    async def _lookup_all(self) -> None:
        templates = [b for b in (*self._config.brokers, *self._file) if b.dns]
        wanted = {(t.host, t.dns) for t in templates}
        for key in [k for k in self._expansions if k not in wanted]:
            del self._expansions[key]
        for template in templates:
            key, source = (template.host, template.dns), _source(template)
            try:
                with trio.fail_after(self._timeout + LOOKUP_GRACE):
                    found = await self._resolve(template)
            except (LookupFailed, trio.TooSlowError) as exc:
                reason = str(exc) or f"{source}: no answer within {self._timeout:g} s"
                self._fail(source, reason, "keeping its last good answer")
                continue
            # The same name may carry other settings in another entry: keep the template's.
            self._expansions[key] = found
            self._succeed(source)

    def _expanded(self, template: Broker, fallback: bool) -> tuple[Broker, ...]:
        found = self._expansions.get((template.host, template.dns))
        if found is None and fallback and template.dns == "all":
            return (dataclasses.replace(template, dns=None),)
        return found or ()

    def _compose_with_sources(self, *, fallback: bool = False) -> list[tuple[Broker, str]]:
        out: list[tuple[Broker, str]] = []
        file_source = f"brokers_file {self._config.brokers_file}"
        for group, where in ((self._config.brokers, CONFIGURATION), (self._file, file_source)):
            for entry in group:
                if entry.dns:
                    out.extend((b, _source(entry)) for b in self._expanded(entry, fallback))
                else:
                    out.append((entry, where))
        return out

    def _compose(self, *, fallback: bool = False) -> list[Broker]:
        return [b for b, _ in self._compose_with_sources(fallback=fallback)]

    def _apply(self) -> None:
        pairs = self._compose_with_sources()
        try:
            change = self.table.update([b for b, _ in pairs])
        except EmptyBrokerList:
            self._fail("the broker list", "the update names no broker", "the list in force stays")
            return
        self._succeed("the broker list")
        origin_before, self._origin = self._origin, {}
        for broker, source in pairs:
            self._origin.setdefault(broker.label, source)
        if not change:
            return
        self.updates += 1
        self._last_change = time.time()
        log.warning(
            "broker list updated: %s%s; in force: %s",
            ", ".join(f"{b.label} joined ({self._origin[b.label]})" for b in change.joined),
            ("; " if change.joined and change.left else "")
            + ", ".join(f"{b.label} left" for b in change.left),
            ", ".join(self.table.labels()),
        )
        for broker in change.joined:
            self._on_join(broker, self._origin[broker.label])
        for broker in change.left:
            self._on_leave(broker, self._leaving(origin_before.get(broker.label, CONFIGURATION)))

    def _leaving(self, source: str) -> str:
        if source.startswith(("DNS name", "SRV name")):
            return f"left the broker list ({source} no longer resolves to it)"
        return f"left the broker list ({source} no longer names it)"

    def reload_refused(self, reason: str) -> None:
        """A SIGHUP's configuration did not load (:mod:`proxy.reload`): it stands among the
        updates not applied until a reload succeeds (the reload logs its own line)."""
        self._failed[RELOAD] = FailedUpdate(RELOAD, reason, time.time())

    def _fail(self, source: str, reason: str, consequence: str) -> None:
        standing = self._failed.get(source)
        if standing is not None and standing.reason == reason:
            return  # logged when it began
        self._failed[source] = FailedUpdate(source, reason, time.time())
        shown = reason if reason.startswith(source) else f"{source}: {reason}"
        log.warning("broker list: %s; %s", shown, consequence)

    def _succeed(self, source: str) -> None:
        if self._failed.pop(source, None) is not None:
            if source.startswith("brokers_file"):
                log.info("broker list: %s parses again", source)
            elif source.startswith(("DNS name", "SRV name")):
                log.info("broker list: %s answers again", source)
            else:
                log.info("broker list: %s: updates apply again", source)

    def statistics(self) -> BrokerListStatistics:
        """The list in force and the updates not applied (``/status``)."""
        return BrokerListStatistics(
            brokers=self.table.labels(),
            failed=tuple(sorted(self._failed.values(), key=lambda f: f.since)),
            updates=self.updates,
            last_change=self._last_change,
        )

    def sources(self) -> Sequence[tuple[str, str]]:
        """Each broker in force with its source in words, in list order."""
        return [(label, self._origin.get(label, CONFIGURATION)) for label in self.table.labels()]
