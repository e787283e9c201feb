"""The hypothesis state machine of differential scenarios: real client behaviour, each rule
run on both sides in lockstep (:class:`~tests.differential.runner.Lockstep`).

The vocabulary: CONNECT/STOMP variants (1.0 without ``accept-version``, 1.0, 1.1, 1.2, a
list; heart-beats; ``host``; login or not; a ``client-id``; a body of ``\\n``), SUBSCRIBE
variants (ack modes, ActiveMQ wildcards, selectors, prefetch, browser, durable; without
``id`` or ``destination``; an id in use), SEND variants (receipt or not, in a transaction,
empty, binary with ``content-length``, large, CRLF line ends, repeated and escaped headers),
the re-publish of a received MESSAGE with all its headers, ACK/NACK variants (each
version's headers; without ``id``, with a wrong ``subscription``, an unknown id),
BEGIN/COMMIT/ABORT, UNSUBSCRIBE, DISCONNECT with or without receipt, closing the socket, and
malformed input. Connections: ``p``, ``c`` and ``d``.

The model (which connections are open and connected, in which version, their
subscriptions and transactions, the MESSAGEs they got) follows what the *direct* run saw;
the two runs are the same until a difference, which ends the comparison of the example.

Scenarios avoid what a broker itself does not determine: two consumers competing for one
queue (a wildcard overlaps its queues), and a client that promises heart-beats.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from tests.differential import known
from tests.differential.runner import Difference, Lab, Lockstep, Report
from tests.differential.scenario import (
    Action,
    Blob,
    Close,
    Frame,
    MsgRef,
    Raw,
    Republish,
    Value,
    connect,
)

__all__ = ["DifferentialMachine", "NewDifference"]

CONNS = ("p", "c", "d")
#: Concrete queues, and what each subscribable destination covers.
QUEUES = ("/queue/{run}.a.x", "/queue/{run}.a.y", "/queue/{run}.b")
TOPIC = "/topic/{run}.t"
WILDCARDS = {
    "/queue/{run}.a.*": {"/queue/{run}.a.x", "/queue/{run}.a.y"},
    "/queue/{run}.a.>": {"/queue/{run}.a.x", "/queue/{run}.a.y"},
}
#: CONNECT ``accept-version`` (None: a STOMP 1.0 client without one), repeats as weights:
#: the variants every sidecar run answers differently today end an example at once.
VERSIONS = ["1.2"] * 5 + ["1.1"] * 2 + ["1.0,1.1,1.2", "1.1,1.2", None, "1.0", "9.9"]
#: A large body: some MiB, well under every limit.
LARGE = 3 << 20


class NewDifference(AssertionError):
    """A difference no known class explains."""


@dataclass
class ConnModel:
    name: str
    opened: bool = False
    connected: bool = False
    closed: bool = False
    version: str = "1.2"
    client_id: str | None = None
    subs: dict[str, str] = field(default_factory=dict)  # id -> destination
    txs: set[str] = field(default_factory=set)
    messages: int = 0

    @property
    def usable(self) -> bool:
        return self.connected and not self.closed


class DifferentialMachine(RuleBasedStateMachine):
    """Subclass per broker with ``lab`` set (see :func:`machine_for`)."""

    lab: Lab

    def __init__(self) -> None:
        super().__init__()
        self.lock = Lockstep(self.lab)
        self.conns = {name: ConnModel(name) for name in CONNS}
        self.actions: list[Action] = []
        self.known: list[str] = []
        self.counter = 0
        self.amq = self.lab.flavor == "activemq"

    # -- running -------------------------------------------------------------------------

    def _rid(self) -> str:
        self.counter += 1
        return f"r{self.counter}"

    def _do(self, action: Action) -> None:
        if self.known:
            return  # the runs diverged at a known difference: nothing more is compared
        self.actions.append(action)
        new = self.lock.step_sync(action)
        self._judge(new)
        self._observe()

    def _judge(self, new: list[Difference]) -> None:
        unknown = []
        for diff in new:
            cls = known.classify(diff)
            if cls is None:
                unknown.append(diff)
            else:
                self.known.append(cls.name)
        if unknown and os.environ.get("MQ_SIDECAR_DIFFERENTIAL_SURVEY"):
            print(f"\nNEW DIFFERENCE\n{Report(unknown)}")
            for action in self.actions:
                print(f"    {action!r},")
            self.known.append("new")
        elif unknown:
            report = Report(unknown)
            steps = ",\n    ".join(repr(a) for a in self.actions)
            raise NewDifference(f"{report}\nscenario:\n    {steps},")

    def _observe(self) -> None:
        for name, model in self.conns.items():
            conn = self.lock.direct.conns.get(name)
            if conn is None:
                continue
            model.opened = True
            model.messages = len(conn.messages())
            if not conn.open:
                model.closed = True
            for frame in conn.frames:
                if frame is not None and frame.command == "CONNECTED":
                    model.connected = True
                    model.version = frame.get("version") or "1.0"

    def teardown(self) -> None:
        if os.environ.get("MQ_SIDECAR_DIFFERENTIAL_VERBOSE"):
            print(f"\n{len(self.actions)} steps, known: {self.known}")
            for action in self.actions:
                print(f"    {action!r}")
            for diff in self.lock.report.differences:
                print(diff)
        try:
            new = self.lock.finish_sync(compare=not self.known)
        finally:
            self.known.append("finished")
        if new:
            self.known = []  # judge the drain like any step
            self._judge(new)

    # -- helpers -----------------------------------------------------------------------------

    def _usable(self) -> list[str]:
        return [n for n, m in self.conns.items() if m.usable]

    def _queue_busy(self, covered: set[str]) -> bool:
        for model in self.conns.values():
            if model.closed:
                continue
            for dest in model.subs.values():
                mine = WILDCARDS.get(dest, {dest})
                if mine & covered:
                    return True
        return False

    # -- rules -------------------------------------------------------------------------------

    @precondition(lambda self: any(not m.opened for m in self.conns.values()))
    @rule(
        data=st.data(),
        version=st.sampled_from(VERSIONS),
        heart_beat=st.sampled_from([None, "0,0", "0,1000"]),
        login=st.booleans(),
        host=st.sampled_from(["/", "/", "/", None, "localhost"]),
        client_id=st.booleans(),
        body_newline=st.integers(0, 19),  # 19: a body of "\n" (the simplest, 0, is none)
        stomp_command=st.booleans(),
    )
    def connect(
        self,
        *,
        data: st.DataObject,
        version: str | None,
        heart_beat: str | None,
        login: bool,
        host: str | None,
        client_id: bool,
        body_newline: int,
        stomp_command: bool,
    ) -> None:
        name = data.draw(st.sampled_from([n for n, m in self.conns.items() if not m.opened]))
        model = self.conns[name]
        cid = f"{{run}}-{name}" if client_id else None
        model.client_id = cid
        command = "STOMP" if stomp_command and version not in (None, "1.0") else "CONNECT"
        self._do(
            connect(
                name,
                version,
                host=host,
                heart_beat=heart_beat,
                login=("guest", "guest") if login else None,
                client_id=cid,
                body=b"\n" if body_newline == 19 else b"",
                command=command,
            )
        )

    @precondition(lambda self: any(m.usable for m in self.conns.values()))
    @rule(
        data=st.data(),
        ack=st.sampled_from([None, "auto", "client", "client-individual"]),
        receipt=st.booleans(),
        extra=st.sampled_from(
            ["plain"] * 4 + ["selector", "prefetch", "browser", "durable", "no-id", "no-dest"]
        ),
        sub_id=st.sampled_from(["s1", "s2"]),
    )
    def subscribe(
        self, data: st.DataObject, ack: str | None, receipt: bool, extra: str, sub_id: str
    ) -> None:
        name = data.draw(st.sampled_from(self._usable()))
        model = self.conns[name]
        dests = [*QUEUES, TOPIC] + (list(WILDCARDS) if self.amq else [])
        if not self.amq:
            dests.remove("/queue/{run}.a.y")
        dest = data.draw(st.sampled_from(dests))
        if extra == "durable":
            dest = TOPIC
            if self.amq and model.client_id is None:
                extra = "plain"
        if extra == "browser" and (not self.amq or not dest.startswith("/queue/")):
            extra = "plain"
        if extra in ("selector", "prefetch") and not self.amq and extra == "selector":
            extra = "plain"
        if dest.startswith("/queue/") and extra != "browser":
            covered = WILDCARDS.get(dest, {dest})
            if self._queue_busy(covered):
                dest = TOPIC  # no competing consumers: the broker does not determine them
        if extra == "no-id" and model.version != "1.0":
            extra = "plain"
        sid = f"{{run}}-{sub_id}" if extra == "durable" else sub_id
        headers: list[tuple[str, Value]] = []
        if extra != "no-id":
            headers.append(("id", sid))
        if extra != "no-dest":
            headers.append(("destination", dest))
        if ack is not None:
            headers.append(("ack", ack))
        if extra == "selector":
            headers.append(("selector", "color = 'red'"))
        elif extra == "prefetch":
            headers.append(("activemq.prefetchSize" if self.amq else "prefetch-count", "1"))
        elif extra == "browser":
            headers.append(("browser", "true"))
        elif extra == "durable":
            if self.amq:
                headers.append(("activemq.subscriptionName", f"{{run}}-{name}-{sub_id}"))
            else:
                headers += [("durable", "true"), ("auto-delete", "false")]
        if receipt:
            headers.append(("receipt", self._rid()))
        if extra not in ("no-dest", "browser", "no-id") and sid not in model.subs:
            model.subs[sid] = dest
        self._do(Frame(name, "SUBSCRIBE", tuple(headers)))

    @precondition(lambda self: any(m.usable for m in self.conns.values()))
    @rule(
        data=st.data(),
        body=st.sampled_from(["text"] * 6 + ["empty", "binary", "large", "crlf", "no-dest"]),
        receipt=st.booleans(),
        headers=st.sampled_from(["none", "repeated", "escaped", "red", "blue", "persistent"]),
        in_tx=st.booleans(),
    )
    def send(
        self, data: st.DataObject, body: str, receipt: bool, headers: str, in_tx: bool
    ) -> None:
        name = data.draw(st.sampled_from(self._usable()))
        model = self.conns[name]
        dests = [*QUEUES, TOPIC]
        if not self.amq:
            dests.remove("/queue/{run}.a.y")
        dest = data.draw(st.sampled_from(dests))
        self.counter += 1
        hs: list[tuple[str, Value]] = []
        if body != "no-dest":
            hs.append(("destination", dest))
        hs.append(("dtrun", "{run}"))
        if headers == "repeated":
            hs += [("x-rep", "first"), ("x-rep", "second")]
        elif headers == "escaped" and model.version != "1.0":
            hs.append(("x-esc", "a\\cb\\\\c\\nd"))
        elif headers in ("red", "blue"):
            hs.append(("color", headers))
        elif headers == "persistent":
            hs.append(("persistent", "true"))
        if in_tx and model.txs:
            hs.append(("transaction", sorted(model.txs)[0]))
        if receipt:
            hs.append(("receipt", self._rid()))
        payload: bytes | Blob = f"m{self.counter}".encode()
        content_length = False
        eol = b"\n"
        if body == "empty":
            payload = b""
        elif body == "binary":
            payload, content_length = Blob(300, binary=True, seed=self.counter), True
        elif body == "large":
            payload = Blob(LARGE, seed=self.counter)
        elif body == "crlf":
            eol = b"\r\n"
        self._do(Frame(name, "SEND", tuple(hs), payload, content_length, eol))

    @precondition(lambda self: any(m.messages for m in self.conns.values()))
    @rule(data=st.data(), receipt=st.booleans(), drop_message_id=st.booleans())
    def republish(self, data: st.DataObject, receipt: bool, drop_message_id: bool) -> None:
        usable = self._usable()
        sources = [n for n, m in self.conns.items() if m.messages]
        if not usable:
            return
        name = data.draw(st.sampled_from(usable))
        source = data.draw(st.sampled_from(sources))
        index = data.draw(st.integers(0, self.conns[source].messages - 1))
        extra = (("receipt", self._rid()),) if receipt else ()
        drop = ("message-id",) if drop_message_id else ()
        self._do(Republish(name, source, index, extra, drop))

    @precondition(lambda self: any(m.usable and m.messages for m in self.conns.values()))
    @rule(
        data=st.data(),
        command=st.sampled_from(["ACK", "ACK", "NACK"]),
        variant=st.sampled_from(["right"] * 5 + ["no-id", "wrong-sub", "unknown"]),
        receipt=st.booleans(),
        in_tx=st.booleans(),
    )
    def ack(
        self, data: st.DataObject, command: str, variant: str, receipt: bool, in_tx: bool
    ) -> None:
        names = [n for n in self._usable() if self.conns[n].messages]
        name = data.draw(st.sampled_from(names))
        model = self.conns[name]
        index = data.draw(st.integers(0, model.messages - 1))
        hs: list[tuple[str, Value]] = []
        if model.version == "1.2":
            if variant != "no-id":
                hs.append(("id", "nonsense" if variant == "unknown" else MsgRef(name, index)))
        else:
            if variant != "no-id":
                mid: Value = (
                    "nonsense" if variant == "unknown" else MsgRef(name, index, "message-id")
                )
                hs.append(("message-id", mid))
            if model.version == "1.1":
                sub: Value = (
                    "nope" if variant == "wrong-sub" else MsgRef(name, index, "subscription")
                )
                hs.append(("subscription", sub))
        if in_tx and model.txs:
            hs.append(("transaction", sorted(model.txs)[0]))
        if receipt:
            hs.append(("receipt", self._rid()))
        self._do(Frame(name, command, tuple(hs)))

    @precondition(lambda self: any(m.usable for m in self.conns.values()))
    @rule(
        data=st.data(),
        command=st.sampled_from(["BEGIN", "COMMIT", "ABORT"]),
        receipt=st.booleans(),
    )
    def transaction(self, data: st.DataObject, command: str, receipt: bool) -> None:
        name = data.draw(st.sampled_from(self._usable()))
        model = self.conns[name]
        hs: list[tuple[str, Value]] = [("transaction", "t1")]
        if receipt:
            hs.append(("receipt", self._rid()))
        if command == "BEGIN":
            model.txs.add("t1")
        else:
            model.txs.discard("t1")
        self._do(Frame(name, command, tuple(hs)))

    @precondition(lambda self: any(m.usable and m.subs for m in self.conns.values()))
    @rule(data=st.data(), receipt=st.booleans())
    def unsubscribe(self, data: st.DataObject, receipt: bool) -> None:
        names = [n for n in self._usable() if self.conns[n].subs]
        name = data.draw(st.sampled_from(names))
        model = self.conns[name]
        sub_id = data.draw(st.sampled_from(sorted(model.subs)))
        del model.subs[sub_id]
        hs: list[tuple[str, Value]] = [("id", sub_id)]
        if receipt:
            hs.append(("receipt", self._rid()))
        self._do(Frame(name, "UNSUBSCRIBE", tuple(hs)))

    @precondition(lambda self: any(m.usable for m in self.conns.values()))
    @rule(data=st.data(), how=st.sampled_from(["receipt", "plain", "close"]))
    def disconnect(self, data: st.DataObject, how: str) -> None:
        name = data.draw(st.sampled_from(self._usable()))
        model = self.conns[name]
        model.closed = True
        if how == "close":
            self._do(Close(name))
        elif how == "receipt":
            self._do(Frame(name, "DISCONNECT", (("receipt", self._rid()),)))
        else:
            self._do(Frame(name, "DISCONNECT"))

    @precondition(lambda self: any(m.usable for m in self.conns.values()))
    @rule(
        data=st.data(),
        kind=st.sampled_from(["unknown-command", "no-colon", "heartbeats", "lowercase"]),
    )
    def malformed(self, data: st.DataObject, kind: str) -> None:
        name = data.draw(st.sampled_from(self._usable()))
        raw = {
            "unknown-command": b"FROB\nreceipt:bad\n\n\0",
            "no-colon": b"SEND\ndestination\nreceipt:bad\n\nx\0",
            "heartbeats": b"\n\r\n\n",
            "lowercase": b"send\ndestination:/queue/{run}.b\nreceipt:bad\n\nx\0",
        }[kind]
        self._do(Raw(name, raw))

    @rule()
    def idle(self) -> None:
        """Always possible (hypothesis needs a rule once every connection is closed)."""


def machine_for(lab: Lab) -> type[DifferentialMachine]:
    """The state machine class for ``lab``'s broker."""
    return type(f"Differential_{lab.flavor}", (DifferentialMachine,), {"lab": lab})
