"""What a failover does to a session beyond its subscriptions, pure: temporary destinations and
their broker-side names, queue browsers, topic subscriptions that miss messages.

**Temporary destinations.** An app names one as ``/temp-queue/<name>`` (or ``/temp-topic/``);
the broker makes a real destination for it *per connection* and rewrites the name in the
``reply-to`` of a request, so a responder sees the broker-side name: ActiveMQ's
``/remote-temp-queue/ID:<connection id>:<n>`` (StompProtocolConverter.createTempDestination:
the connection's n-th temporary destination, numbered 1, 2... in the order the connection first
names them in a SEND's ``destination`` then ``reply-to``, or a SUBSCRIBE/UNSUBSCRIBE's
``destination``), RabbitMQ's ``/reply-queue/amq.gen-<random>`` (made by the first SEND naming
it in ``reply-to``; a reply shows it as ``destination:/queue/amq.gen-...`` with
``subscription:/temp-queue/<name>``). Measured on ActiveMQ 5.17 and RabbitMQ 3.10
(docs/brokers.md, "Temporary destinations"). A new leg is a new connection, so every name the
old leg made changes: :class:`TempNames` follows them, so that the FAILOVER event can say old →
new. ActiveMQ's names are known as soon as the leg names the destination (the connection id is
the CONNECTED ``session`` header, unless the app's CONNECT set ``client-id``, which ActiveMQ
puts there instead); RabbitMQ's random ones are learned from a reply, or from the sidecar's own
probe after a reconnect (:meth:`TempNames.probe`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from protocol import Command, Frame, RawFrame
from proxy.tracking.records import Subscription

__all__ = [
    "PROBE_HEADER",
    "TEMP_MAX",
    "TEMP_PREFIXES",
    "LinkEnd",
    "TempDestination",
    "TempNames",
    "TempRename",
    "misses_messages",
    "probe_end",
]

#: Prefixes of temporary destinations (ActiveMQ "Temporary Destinations": both; RabbitMQ STOMP
#: "Temp Queue Destinations": ``/temp-queue/``).
TEMP_PREFIXES = ("/temp-queue/", "/temp-topic/")
#: Temporary destinations a session remembers, the most recently named: an app that names a new
#: one per request must not grow the session without bound. Past it on one leg, the names of the
#: ones made later on that leg are not predicted (reported unknown).
TEMP_MAX = 1024
#: Header of the sidecar's probe SENDs (RabbitMQ): the temporary destination the probe is about
#: (its ``reply-to`` comes back rewritten to the broker-side name).
PROBE_HEADER = "mq-sidecar-temp"
#: ActiveMQ's STOMP prefixes of the broker-side names of its temporary destinations.
_ACTIVEMQ_REMOTE = {"/temp-queue/": "/remote-temp-queue/", "/temp-topic/": "/remote-temp-topic/"}


@dataclass(eq=False, slots=True)
class TempDestination:
    """A temporary destination the app named, and what the broker calls it.

    ``generation``: the leg (:attr:`SessionState.generation`) on which the broker made it, 0 for
    none yet; ``broker_name``: its broker-side name there, the one responders see in
    ``reply-to`` (None: not known).
    """

    name: str
    generation: int = 0
    broker_name: str | None = None


@dataclass(frozen=True, slots=True)
class TempRename:
    """What a failover did to one temporary destination: its broker-side name on the old leg and
    on the new one (None: not known, or not made again yet)."""

    destination: str
    old: str | None
    new: str | None


@dataclass(frozen=True, slots=True)
class LinkEnd:
    """What ending an upstream leg did to the session (:meth:`SessionState.new_link`).

    ``interrupted``: browsers whose browse the lost leg cut short (they are not made again);
    ``temps``: the temporary destinations the old leg had made, each with its broker-side name
    there (None: not known).
    """

    interrupted: tuple[Subscription, ...] = ()
    temps: tuple[tuple[str, str | None], ...] = ()


class TempNames:
    """The temporary destinations of one session and their names on the current leg.

    Fed every frame the current leg sends, in order (:meth:`note`), and the MESSAGEs it gets
    for no subscription of the app (:meth:`seen`).
    """

    def __init__(self) -> None:
        self._temps: OrderedDict[str, TempDestination] = OrderedDict()
        self.generation = 0
        self._style = ""  # "activemq" | "rabbitmq" | "" (names not known)
        self._connection_id: str | None = None
        self._made = 0  # temporary destinations the current leg made (ActiveMQ's numbering)
        self._exact = True  # no name made on this leg was forgotten (TEMP_MAX)
        self._probe: str | None = None  # the probe subscription id on this leg, if any
        self._probed: list[str] = []  # the names it asks for
        #: False once a probe failed: not tried again in this session.
        self.probing = True

    def new_link(
        self, generation: int, *, style: str, connection_id: str | None
    ) -> tuple[tuple[str, str | None], ...]:
        """A new leg (``style``: how its broker names temporary destinations, ``"activemq"``,
        ``"rabbitmq"`` or ``""``: :attr:`proxy.legs.dialect.BrokerDialect.temp_names`;
        ``connection_id``: ActiveMQ's id of the connection, None when not known). Returns the
        temporary destinations the old leg had made, with their broker-side names there."""
        old = self.generation
        made = tuple((t.name, t.broker_name) for t in self._temps.values() if t.generation == old)
        self.generation = generation
        self._style = style
        self._connection_id = connection_id
        self._made = 0
        self._exact = True
        self._probe = None
        self._probed = []
        return made if old else ()

    def name_of(self, name: str) -> str | None:
        """The broker-side name of temporary destination ``name`` on the current leg."""
        t = self._temps.get(name)
        if t is None or t.generation != self.generation:
            return None
        return t.broker_name

    def note(self, frame: Frame | RawFrame) -> None:
        """A frame the current leg sends (every one, in order): the temporary destinations it
        makes the broker create (module docstring)."""
        command = frame.command
        if command is Command.SEND:
            if isinstance(frame, RawFrame) and frame.data.find(b":/temp-", 0, frame.head_end) < 0:
                return  # no header value names a temporary destination (the fast lane)
            destination = frame.get("destination")
            reply_to = frame.get("reply-to")
            if destination is not None and self._style == "activemq":
                self._made_by(destination)
            if reply_to is not None:
                self._made_by(reply_to)
        elif command is Command.SUBSCRIBE or command is Command.UNSUBSCRIBE:
            destination = frame.get("destination")
            if destination is not None and self._style != "rabbitmq":
                self._made_by(destination)

    def _made_by(self, destination: str) -> None:
        if not destination.startswith(TEMP_PREFIXES):
            return
        t = self._temps.get(destination)
        if t is None:
            t = self._temps[destination] = TempDestination(destination)
            while len(self._temps) > TEMP_MAX:
                _, old = self._temps.popitem(last=False)
                if old.generation == self.generation:
                    self._exact = False  # if named again, the broker would not number it anew
        else:
            self._temps.move_to_end(destination)
        if t.generation == self.generation:
            return
        t.generation = self.generation
        t.broker_name = None
        if self._style != "activemq":
            return
        self._made += 1
        if self._connection_id is not None and self._exact:
            prefix = "/temp-queue/" if destination.startswith("/temp-queue/") else "/temp-topic/"
            t.broker_name = f"{_ACTIVEMQ_REMOTE[prefix]}{self._connection_id}:{self._made}"

    def seen(self, subscription: str, message: Frame) -> bool:
        """A MESSAGE for no subscription of the app: True when it is the sidecar's own probe
        (hide it); a RabbitMQ reply to a temporary queue (``subscription:/temp-queue/x``,
        ``destination:/queue/amq.gen-...``) teaches its broker-side name."""
        if subscription == self._probe:
            name = message.get(PROBE_HEADER)
            reply_to = message.get("reply-to")
            t = self._temps.get(name or "")
            if t is not None and reply_to is not None and reply_to.startswith("/reply-queue/"):
                t.generation = self.generation
                t.broker_name = reply_to
            return True
        if self._style == "rabbitmq" and subscription.startswith("/temp-queue/"):
            t = self._temps.get(subscription)
            destination = message.get("destination") or ""
            if (
                t is not None
                and t.generation == self.generation
                and destination.startswith("/queue/amq.gen-")
            ):
                t.broker_name = "/reply-queue/" + destination.removeprefix("/queue/")
        return False

    def probe(self, probe_id: str, names: Iterable[str]) -> list[Frame]:
        """RabbitMQ: the frames that make ``names`` again on the current leg and show their new
        names, since RabbitMQ's are random: a SUBSCRIBE of the sidecar's own (``probe_id``,
        a private queue bound to ``amq.direct``), and per name a SEND to it whose ``reply-to``
        names the temporary queue (RabbitMQ makes it and rewrites the header to its name;
        :meth:`seen` reads it). ``[]`` when there is nothing to probe. The caller sends them in
        order, each through :meth:`note`, and later :func:`probe_end`."""
        wanted = [n for n in names if n.startswith("/temp-queue/") and n in self._temps]
        if self._style != "rabbitmq" or not wanted or not self.probing:
            return []
        self._probe = probe_id
        self._probed = wanted
        exchange = f"/exchange/amq.direct/{probe_id}"
        frames = [
            Frame(
                Command.SUBSCRIBE,
                (("id", probe_id), ("destination", exchange), ("ack", "auto")),
            )
        ]
        frames.extend(
            Frame(
                Command.SEND,
                (("destination", exchange), ("reply-to", n), (PROBE_HEADER, n)),
            )
            for n in wanted
        )
        return frames

    def probed(self) -> bool:
        """Whether every name the probe asked for is known on the current leg (it is done)."""
        return all(self.name_of(n) is not None for n in self._probed)


def probe_end(probe_id: str) -> Frame:
    """The UNSUBSCRIBE that ends a probe (:meth:`TempNames.probe`); its private queue goes."""
    return Frame(Command.UNSUBSCRIBE, (("id", probe_id),))


#: Headers that make a topic subscription durable: ActiveMQ Classic's and Artemis' subscription
#: names, RabbitMQ's ``durable``/``persistent`` (with ``true``).
_DURABLE_NAMES = ("activemq.subscriptionName", "durable-subscription-name")
#: Destinations whose subscriptions get only what is published while they exist: topics (both
#: brokers), temporary topics, RabbitMQ exchanges (each subscription a private queue).
_TOPIC_PREFIXES = ("/topic/", "/temp-topic/", "/exchange/")


def misses_messages(sub: Subscription) -> bool:
    """Whether ``sub`` is a non-durable topic subscription: while no broker has it (an outage,
    a move), what is published to its destination never reaches it."""
    if sub.local or not sub.destination.startswith(_TOPIC_PREFIXES):
        return False
    frame = sub.frame
    if any(frame.get(name) is not None for name in _DURABLE_NAMES):
        return False
    return frame.get("durable") != "true" and frame.get("persistent") != "true"
