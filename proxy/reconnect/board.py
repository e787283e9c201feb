"""What the sessions of one sidecar share about their brokers: the reconnects in progress (a
first connection waits for their outcome instead of racing them), the brokers' refusals of a
CONNECT (docs/behaviour.md, "Broker list and reconnect policy") and the brokers evacuated
(docs/operations.md, "Actions").

The counting is pure (:mod:`proxy.reconnect.tally`, :mod:`proxy.reconnect.evacuations`); this
adds the waiting (trio Events) and the clock.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence

import trio

from config import Broker
from protocol import Frame
from proxy.legs.broker import Upstream, UpstreamRefused, UpstreamUnavailable
from proxy.reconnect.brokers import BrokerTable
from proxy.reconnect.evacuations import Evacuation, Evacuations
from proxy.reconnect.policy import ReconnectPolicy
from proxy.reconnect.tally import ReconnectTally, Refusals

__all__ = ["ReconnectBoard", "RefusalKey"]

#: Refusals are kept per (broker index, CONNECT identity: :meth:`ReconnectBoard.identity`).
RefusalKey = tuple[int, bytes]


class ReconnectBoard:
    """Where the sessions of one sidecar report their reconnects, and where a new session's
    first connection waits for their outcome instead of racing them (docs/behaviour.md,
    "Broker list and reconnect policy").

    The counts are a :class:`~proxy.reconnect.tally.ReconnectTally` (pure); this adds one trio
    Event, set and replaced on a change while someone waits. Nothing is queued: a waiter
    reads the tally when it wakes, so memory does not grow with sessions or outcomes. The
    brokers' refusals are a :class:`~proxy.reconnect.tally.Refusals` (at most 256 entries) keyed
    by broker index and :meth:`identity`. The sidecar owns one
    (``proxy.app.Sidecar.reconnects``); a Session built alone gets its own.

    ``brokers`` is the broker list the sessions walk (:class:`~proxy.reconnect.brokers.
    BrokerTable`, built from ``brokers``; the sidecar's
    :class:`~proxy.reconnect.discovery.BrokerDiscovery` changes it at run time).

    Connection attempts take a slot of their broker's (:meth:`connect_slot`): at most
    ``max_connecting`` are in flight to one broker at once, the others wait in the order they
    came (a trio Semaphore per broker, dropped when no attempt holds or waits for it).

    The evacuated brokers are an :class:`~proxy.reconnect.evacuations.Evacuations` (one entry
    per broker) read with :meth:`evacuated`, changed with :meth:`evacuate` and :meth:`readmit`;
    each session's link waits with :meth:`wait_evacuated` for its broker to be evacuated
    (proxy.session.link).
    """

    def __init__(self, brokers: Sequence[Broker] = (), *, max_connecting: int = 64) -> None:
        if max_connecting < 1:
            raise ValueError(f"max_connecting must be > 0, not {max_connecting}")
        #: The broker list in force, by stable index (the sidecar's BrokerDiscovery changes it).
        self.brokers = BrokerTable(brokers)
        self.max_connecting = max_connecting
        self._slots: dict[str, trio.Semaphore] = {}
        self.tally = ReconnectTally()
        self.refusals: Refusals[RefusalKey, UpstreamRefused] = Refusals()
        self.evacuations = Evacuations()
        self._changed = trio.Event()
        self._waiters = 0
        self._identity_key = secrets.token_bytes(32)
        self._evacuations_changed = trio.Event()

    def identity(self, connect: Frame) -> bytes:
        """What makes two sessions' CONNECTs to a broker the same for its refusals: a keyed
        digest (HMAC-SHA256 with a key of this board's, never shown) of every header but
        ``heart-beat``: login and passcode, host (RabbitMQ's vhost), client-id... Only a
        session that would send the very same CONNECT skips a broker that refused one; the
        credentials are not kept, nor a digest that could be checked against a guess."""
        mac = hmac.new(self._identity_key, digestmod=hashlib.sha256)
        for name, value in sorted(connect.headers):
            if name == "heart-beat":
                continue
            for part in (name, value):
                data = part.encode("utf-8", "surrogateescape")
                mac.update(len(data).to_bytes(4, "big"))
                mac.update(data)
        return mac.digest()

    async def attempt_alone(
        self,
        key: RefusalKey,
        connect: Callable[[], Awaitable[Upstream]],
        policy: ReconnectPolicy,
    ) -> Upstream:
        """One attempt outside a reconnect round (the ``priority_backup`` failback watch)
        under the same refusal rules: skipped, by raising the standing refusal, while the
        broker's cool-down for ``key`` runs; a lasting refusal starts or extends it, an
        accepted CONNECT ends it.

        Raises:
            UpstreamUnavailable: the attempt failed, or the standing refusal.
        """
        standing = self.refusals.claim(key, trio.current_time())
        if standing is not None:
            raise standing
        try:
            upstream = await connect()
        except UpstreamUnavailable as exc:
            if isinstance(exc, UpstreamRefused) and lasting_refusal(exc):
                self.refusals.refused(key, exc, trio.current_time(), policy)
            else:
                self.refusals.settled(key)
            raise
        except BaseException:
            self.refusals.settled(key)
            raise
        self.refusals.accepted(key)
        return upstream

    @contextlib.asynccontextmanager
    async def connect_slot(self, broker: str) -> AsyncIterator[None]:
        """Hold one of the ``max_connecting`` slots of the broker labelled ``broker`` for the
        block (one connection attempt: TCP connect through CONNECTED); waits, first come first
        served, while they are all held. Cancellation propagates (a waiter leaves the queue).
        """
        slots = self._slots.get(broker)
        if slots is None:
            slots = self._slots[broker] = trio.Semaphore(self.max_connecting)
        try:
            async with slots:
                yield
        finally:
            if (
                slots.value == self.max_connecting
                and not slots.statistics().tasks_waiting
                and self._slots.get(broker) is slots
            ):
                del self._slots[broker]  # idle: the map holds only brokers being connected to

    def connecting(self, broker: str) -> tuple[int, int]:
        """``(in flight, waiting)``: the connection attempts to ``broker`` holding a slot and
        those waiting for one."""
        slots = self._slots.get(broker)
        if slots is None:
            return (0, 0)
        return (self.max_connecting - slots.value, slots.statistics().tasks_waiting)

    @property
    def reconnecting(self) -> int:
        """Sessions whose reconnect is in progress."""
        return self.tally.reconnecting

    def _wake(self) -> None:
        if self._waiters:
            self._changed.set()
            self._changed = trio.Event()

    def up(self, broker: int) -> None:
        """A session reached broker index ``broker`` (any connection): wake the waiters.

        Raises:
            ValueError: ``broker`` is negative.
        """
        self.tally.up(broker)
        self._wake()

    @contextlib.contextmanager
    def reconnect(self) -> Iterator[None]:
        """Count a reconnect in progress for as long as the block runs, however it ends
        (success, ReconnectExhausted, cancellation); report success with :meth:`up`."""
        self.tally.reconnect_began()
        try:
            yield
        finally:
            self.tally.reconnect_ended()
            self._wake()

    async def wait_up(self, seconds: float, *, until_idle: bool) -> int | None:
        """Wait up to ``seconds`` for a session to reach a broker; returns its index.

        Returns None when ``seconds`` pass first or, with ``until_idle``, as soon as no
        reconnect is in progress any more (they all ended without reaching one: nobody is
        left to wait for). Cancellation propagates.
        """
        start = self.tally.generation
        self._waiters += 1
        try:
            with trio.move_on_after(max(0.0, seconds)):
                while True:  # each pass follows a change; bounded in time by ``seconds``
                    seen = self.tally.since(start)
                    if seen.broker is not None:
                        return seen.broker
                    if until_idle and seen.idle:
                        return None
                    await self._changed.wait()
        finally:
            self._waiters -= 1
        return None

    # -- evacuations ----------------------------------------------------------------------

    def evacuate(self, broker: str, reason: str, *, for_seconds: float | None = None) -> Evacuation:
        """Put the broker labelled ``broker`` out of the rotation, for ``for_seconds`` (None:
        until :meth:`readmit`), and wake the sessions on it: each moves to another broker at
        its next quiet point (proxy.session.link). ``reason`` goes into their FAILOVER events.
        The caller checks the label and whether the sessions have somewhere to go
        (:func:`proxy.reconnect.evacuations.stranded`).

        Raises:
            ValueError: ``for_seconds`` out of range (:meth:`Evacuations.evacuate`).
        """
        entry = self.evacuations.evacuate(
            broker, reason, trio.current_time(), for_seconds=for_seconds
        )
        self._evacuations_changed.set()
        self._evacuations_changed = trio.Event()
        return entry

    def readmit(self, broker: str) -> Evacuation | None:
        """Put ``broker`` back into the rotation; returns the evacuation it ends (None: it
        was not evacuated). Sessions that moved away stay where they are (with
        ``priority_backup`` those on a backup go back to the first broker, as after an
        outage)."""
        entry = self.evacuations.readmit(broker, trio.current_time())
        self._evacuations_changed.set()
        self._evacuations_changed = trio.Event()
        return entry

    def evacuated(self, broker: str) -> Evacuation | None:
        """The evacuation of the broker labelled ``broker`` now, or None."""
        return self.evacuations.get(broker, trio.current_time())

    async def wait_evacuated(self, broker: str) -> Evacuation:
        """Wait until ``broker`` is evacuated (at once if it is); returns the evacuation."""
        while (entry := self.evacuated(broker)) is None:  # each pass follows a change
            await self._evacuations_changed.wait()
        return entry


#: First words of the body of ActiveMQ's ERROR to a CONNECT whose ``client-id`` it still holds
#: for another connection (``Broker: B - Client: X already connected from tcp://...``): javax
#: in 5.x, jakarta in 6.x.
_CLIENT_ID_IN_USE = ("javax.jms.InvalidClientIDException", "jakarta.jms.InvalidClientIDException")


def lasting_refusal(exc: UpstreamUnavailable) -> bool:
    """Whether ``exc`` is a refusal that waiting does not change (credentials, vhost...).

    Not ActiveMQ's refusal of a ``client-id`` still held by another connection: ActiveMQ
    drops a closed connection asynchronously, so a CONNECT right after the sidecar closed its
    old leg to that broker (a reattach) meets it about one time in three (measured with 5.17:
    6 of 20 immediate reconnects); it goes away within milliseconds, like a broker restarting.
    Such a refusal fails the attempt like an unreachable broker: no cool-down, and not a
    refusal of the round."""
    if not isinstance(exc, UpstreamRefused):
        return False
    return not exc.error.body.lstrip().startswith(tuple(p.encode() for p in _CLIENT_ID_IN_USE))
