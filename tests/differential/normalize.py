"""What the differential harness does NOT compare, declared in this one place.

The rule (issue 14, docs/behaviour.md "Transparency first"): an app pointed at the sidecar
must see what it sees from the broker. The sidecar owns only its ack ids, its receipt ids,
its duplicate-detection ids, its own limits and the session state it needs for failover;
every frame, command, header, body and ERROR text the app gets must be equal in the two runs
after the normalisation below, and nothing else is normalised. A new exception goes here,
with its reason, or it is a difference.

Declared (``frame`` normalisation, :func:`normalize_frame`):

* **Run token** (:data:`RUN_TOKEN`): each run uses its own destination prefix (and client
  ids, durable subscription names, subscription ids built from it) so that the direct run and
  the sidecar run on one broker never meet. Every occurrence of the run's token in a header
  value or a body becomes ``<run>``.
* **``ack`` of MESSAGE** (:data:`PRESENCE_ONLY`): the sidecar's own ack ids
  (docs/behaviour.md "The relay"). Presence is compared, the value is not; not even its
  identity pattern (a broker may reuse an ack id for a redelivery, the sidecar numbers every
  delivery). The ``id`` an app puts in its ACK/NACK is looked up per run (the scenario says
  "the k-th MESSAGE connection c got"; each run sends its own value), see
  :mod:`tests.differential.scenario`.
* **``message-id`` of MESSAGE** (:data:`PER_RUN_TABLE`): broker-generated. Each distinct
  value becomes ``<message-id#n>`` in order of first appearance (connections in name order,
  frames in order), so the identity pattern is compared (ActiveMQ keeps a message's id
  across redelivery, RabbitMQ does not: through the sidecar it must be the same), not the
  value. The same table rewrites those values wherever else they appear (``message-id``
  copied into a re-published SEND, ERROR texts).
* **Timestamps** (:data:`TIME_HEADERS`): ``timestamp``, ``expires`` (non-zero),
  ``JMSXGroupSeq``-like broker clocks are not scenario input: a non-zero value becomes
  ``<time>``; ``0`` is compared.
* **Duplicate-detection ids** (:data:`DROPPED`): ``mq-sidecar-id`` and ``_AMQ_DUPL_ID`` are
  removed from every frame in both runs (the sidecar adds them to SENDs; whether an app sees
  them is not compared). Their effect is: a message the sidecar hides as a duplicate is a
  missing MESSAGE, and that is compared.
* **``receipt`` of MESSAGE**: RabbitMQ copies a SEND's ``receipt`` header into the MESSAGE.
  A SEND through the sidecar carries the app's own receipt id there (compared), or, when the
  app asked for none, the sidecar's ``<session>-r<n>`` (docs/brokers.md "Receipts"), which a
  consumer's sidecar removes and which is dropped here too (a plain consumer of the broker,
  the drain, sees it). (``receipt-id`` of RECEIPT and ERROR is compared: the app's own.)
* **CONNECTED** (:data:`CONNECTED_PRESENCE_ONLY`): ``session`` is a per-connection id (the
  broker's connection id, or the sidecar's session id): presence compared, value not.
  ``heart-beat``, ``version`` and ``server`` ARE compared: an app may branch on any of them
  (the sidecar itself tells brokers apart by ``server``), and an app gets the heart-beats the
  broker would give it (issue 25; docs/behaviour.md "The relay").
* **Header order** (:func:`normalize_frame`): STOMP gives meaning only to the order of
  repeated headers (the first wins), so headers are sorted by name, stably: the order of
  repeats of one name is compared.
* **Heart-beat EOLs** between frames are not frames: they are counted, not compared.
* **ActiveMQ connection ids inside ERROR texts** (:data:`AMQ_ID`): ``ID:host-port-...``
  strings are broker-generated per connection; they become ``<amq-id>`` (unless the
  message-id table knows them).
* **Large bodies** are compared in full; only their display is shortened
  (``<N bytes sha256:...>``).
* **Order** across connections is not compared (STOMP has none). On one connection, the
  frames that are not MESSAGE are compared in order, and so are the MESSAGEs of each
  subscription from each destination; how these streams interleave is not compared: a
  broker dispatches deliveries on its own schedule, independent of the receipts it writes
  on the same connection, and a wildcard subscription's queues in any order (both orders
  happen between two direct runs). Whether and after which frame the server closed a
  connection is compared (``<closed>``).
* **What is left on the broker** (the final drain, :mod:`tests.differential.runner`): per
  destination the drained messages are compared as a sorted list, because the order in which
  a broker puts back the messages of a closed connection is not determined.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from proxy.tracking import SIDECAR_RECEIPT
from tests.differential.wire import WireFrame

__all__ = [
    "AMQ_ID",
    "CLOSED",
    "CONNECTED_PRESENCE_ONLY",
    "DROPPED",
    "PER_RUN_TABLE",
    "PRESENCE_ONLY",
    "RUN_TOKEN",
    "TIME_HEADERS",
    "NFrame",
    "Normalizer",
    "show",
]

#: Replacement of a run's token.
RUN_TOKEN = "<run>"
#: Headers removed from every frame: the sidecar's duplicate-detection ids.
DROPPED = frozenset({"mq-sidecar-id", "_AMQ_DUPL_ID"})
#: Headers of MESSAGE whose value is the sidecar's (ack ids): presence only.
PRESENCE_ONLY = frozenset({"ack"})
#: Headers of CONNECTED compared by presence only (see the module docstring).
CONNECTED_PRESENCE_ONLY = frozenset({"session"})
#: Headers whose distinct values are numbered per run (broker-generated message ids).
PER_RUN_TABLE = frozenset({"message-id"})
#: Broker clocks: a non-zero value becomes ``<time>``.
TIME_HEADERS = frozenset({"timestamp", "expires"})
#: ActiveMQ connection / message ids (``ID:host-40191-1718000000000-1:2:3:1:1``), escaped
#: (``\c``) or not.
AMQ_ID = re.compile(r"ID(?::|\\c)[A-Za-z0-9._-]+-\d+-\d+-\d+(?:(?::|\\c)\d+)*")
#: The marker of a connection the server closed.
CLOSED = "<closed>"
#: Bodies longer than this are shown by length and hash.
_SHOW_BODY = 160


@dataclass(frozen=True, order=True)
class NFrame:
    """A normalised frame: what is compared. ``body`` is the normalised body bytes."""

    command: str
    headers: tuple[tuple[str, str], ...]
    body: bytes

    def __str__(self) -> str:
        return show(self)


def show(frame: NFrame) -> str:
    """One line for a report."""
    if frame.command == CLOSED:
        return CLOSED
    headers = " ".join(f"{k}:{v}" for k, v in frame.headers)
    if len(frame.body) > _SHOW_BODY:
        digest = hashlib.sha256(frame.body).hexdigest()[:12]
        body = f"<{len(frame.body)} bytes sha256:{digest}>"
    else:
        body = repr(frame.body)
    return f"{frame.command} [{headers}] {body}"


class Normalizer:
    """The normalisation of one run: its token and its table of message ids.

    Build one per comparison (:meth:`frames` assigns table entries in the order it sees
    values, so call it on the connections in name order).
    """

    def __init__(self, token: str) -> None:
        self.token = token
        self._ids: dict[str, str] = {}

    def _id(self, value: str) -> str:
        if value not in self._ids:
            self._ids[value] = f"<message-id#{len(self._ids) + 1}>"
        return self._ids[value]

    def _text(self, text: str) -> str:
        text = text.replace(self.token, RUN_TOKEN)
        for raw, mapped in self._ids.items():
            if raw and raw in text:
                text = text.replace(raw, mapped)
        return AMQ_ID.sub("<amq-id>", text)

    def token_free(self, text: str) -> str:
        """``text`` with the run's token replaced."""
        return text.replace(self.token, RUN_TOKEN)

    def frame(self, frame: WireFrame) -> NFrame:
        """:func:`normalize_frame` with this run's table."""
        command = frame.command
        # First pass: learn the message ids (the table maps them in texts too).
        if command == "MESSAGE":
            for name, value in frame.headers:
                if name in PER_RUN_TABLE:
                    self._id(value)
        headers: list[tuple[str, str]] = []
        for name, value in frame.headers:
            if name in DROPPED:
                continue
            if command == "MESSAGE" and name == "receipt" and SIDECAR_RECEIPT.fullmatch(value):
                continue  # the sidecar's own receipt request, copied by RabbitMQ
            if name in PER_RUN_TABLE and command == "MESSAGE":
                out = self._id(value)
            elif command == "MESSAGE" and name in PRESENCE_ONLY:
                out = "<sidecar-owned>"
            elif command == "CONNECTED" and name in CONNECTED_PRESENCE_ONLY:
                out = "<per-connection>"
            elif name in TIME_HEADERS and value.strip() not in ("", "0"):
                out = "<time>"
            else:
                out = self._text(value)
            headers.append((self._text(name), out))
        headers.sort(key=lambda kv: kv[0])  # stable: repeats keep their order
        body = frame.body
        if self.token.encode() in body or command == "ERROR":
            try:
                body = self._text(body.decode()).encode()
            except UnicodeDecodeError:
                body = body.replace(self.token.encode(), RUN_TOKEN.encode())
        return NFrame(command, tuple(headers), body)

    def frames(self, frames: Iterable[WireFrame | None]) -> list[NFrame]:
        """Normalised frames; None (the server closed the connection) becomes CLOSED."""
        return [NFrame(CLOSED, (), b"") if frame is None else self.frame(frame) for frame in frames]

    def connections(
        self, received: Mapping[str, Iterable[WireFrame | None]]
    ) -> dict[str, list[NFrame]]:
        """Every connection's frames, normalised, connections in name order."""
        return {name: self.frames(received[name]) for name in sorted(received)}

    def drained(self, drained: Mapping[str, Iterable[WireFrame]]) -> dict[str, list[NFrame]]:
        """What a plain consumer drained per destination (name normalised), sorted."""
        out: dict[str, list[NFrame]] = {}
        for dest in sorted(drained):
            frames = []
            for frame in self.frames(drained[dest]):
                headers = tuple(
                    (k, "<message-id>" if k in PER_RUN_TABLE else v) for k, v in frame.headers
                )
                frames.append(NFrame(frame.command, headers, frame.body))
            out[self._text(dest)] = sorted(frames)
        return out
