"""The lockstep runner: one scenario against a broker directly and through a sidecar.

How a scenario runs (:class:`Lockstep`):

* Two *runs* on the same real broker: ``direct`` (the app's connections go to the broker) and
  ``sidecar`` (they go to an in-process sidecar whose broker list is just that broker). Each
  run has its own token (:func:`new_token`), the prefix of its destinations, client ids and
  durable subscription names, so the runs never meet on the broker.
* Each action (:mod:`tests.differential.scenario`) is written in both runs at the same time,
  then each run *settles*: it waits for what the action itself asked for (the CONNECTED of a
  CONNECT, the RECEIPT of the receipt it requested; an ERROR or the server closing the
  connection end that wait too) for at most :data:`RECEIPT_WAIT`, then for :data:`QUIET` of
  silence on all its connections (at most :data:`SETTLE_CAP`).
* Then what the app saw on every connection so far is compared, normalised
  (:mod:`tests.differential.normalize`). A mismatch is only reported if it persists through
  :data:`CONVERGE_TRIES` more quiet periods: a frame late by some milliseconds on one side is
  not a difference, a frame that never comes is.
* At the end every connection is closed, the sidecar's sessions are awaited, and a plain
  consumer drains, directly from the broker, every queue the scenario named (and its durable
  subscriptions, and its messages in ``ActiveMQ.DLQ``): what is left on the broker is
  compared too, and the durable subscriptions are removed.

The sidecar and all client I/O run in one trio loop in a background thread (:class:`Lab`),
so that synchronous callers (hypothesis' state machines, plain tests) drive it with
:meth:`Lab.call`; every wait is bounded.
"""

from __future__ import annotations

import contextlib
import secrets
import threading
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import trio

from config import Config, load_config
from proxy.app import Sidecar, serve
from tests.differential.normalize import NFrame, Normalizer, show
from tests.differential.scenario import (
    Action,
    Close,
    Frame,
    RunContext,
    awaited,
    render,
)
from tests.differential.wire import WireFrame, WireParser, encode

__all__ = [
    "CONVERGE_TRIES",
    "QUIET",
    "RECEIPT_WAIT",
    "SETTLE_CAP",
    "Difference",
    "Lab",
    "Lockstep",
    "Report",
    "new_token",
]

T = TypeVar("T")

#: Silence on all of a run's connections that ends a step's settling, seconds.
QUIET = 0.1
#: The longest wait for what an action asked for (CONNECTED, its RECEIPT), seconds.
RECEIPT_WAIT = 5.0
#: The longest wait for quiet after that, seconds.
SETTLE_CAP = 3.0
#: More quiet periods before a mismatch counts (the other side may be a hop behind).
CONVERGE_TRIES = 3
#: Quiet ending the final drain of a destination, seconds.
DRAIN_QUIET = 0.3
#: The longest a write may block (a peer that stopped reading), seconds.
WRITE_WAIT = 30.0
#: Bytes per read.
READ_SIZE = 1 << 20


def new_token() -> str:
    """A run's token: letters and digits only, so it never needs escaping."""
    return "dt" + secrets.token_hex(5)


class Lab:
    """A trio loop in a background thread holding an in-process sidecar in front of one
    broker, and the client connections of the scenarios.

    Args:
        flavor: ``"activemq"`` or ``"rabbitmq"``.
        stomp_url: the broker's ``stomp://`` URL (its broker list for the sidecar).
        address: the broker's ``(host, port)`` for the direct run.
        overrides: sidecar configuration options.
    """

    def __init__(
        self,
        flavor: str,
        stomp_url: str,
        address: tuple[str, int],
        **overrides: object,
    ) -> None:
        self.flavor = flavor
        self.broker_address = address
        values: dict[str, object | None] = {
            "listen": "127.0.0.1:0",
            "admin_listen": "127.0.0.1:0",
            "brokers": stomp_url,
        }
        values.update(overrides)
        self.config: Config = load_config(path=None, env={}, overrides=values)
        self.sidecar: Sidecar | None = None
        self.sidecar_address: tuple[str, int] = ("127.0.0.1", 0)
        self.nursery: trio.Nursery | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="differential", daemon=True)

    def _main(self) -> None:
        try:
            trio.run(self._amain)
        except BaseException as exc:  # reported to the caller's thread
            self._error = exc
            self._ready.set()

    async def _amain(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        async with trio.open_nursery() as nursery:
            self.nursery = nursery
            sidecar: Sidecar = await nursery.start(serve, self.config)
            self.sidecar = sidecar
            assert sidecar.listen_address is not None
            self.sidecar_address = sidecar.listen_address
            self._ready.set()
            await self._stop.wait()
            sidecar.request_shutdown()
            with trio.move_on_after(self.config.durations.drain_timeout + 5):
                await sidecar.stopped.wait()
            nursery.cancel_scope.cancel()  # client readers still running

    def __enter__(self) -> Lab:
        self._thread.start()
        if not self._ready.wait(30) or self._error is not None:
            raise RuntimeError(f"sidecar did not start: {self._error!r}")
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._thread.is_alive() and self._stop is not None:
            trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        self._thread.join(30)
        assert not self._thread.is_alive(), "differential lab thread did not stop"
        if self._error is not None:
            raise self._error

    def call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run ``fn(*args)`` in the lab's loop and return its result."""
        return trio.from_thread.run(fn, *args, trio_token=self._token)

    def address(self, label: str) -> tuple[str, int]:
        return self.broker_address if label == "direct" else self.sidecar_address

    def sessions(self) -> int:
        """Sessions the sidecar has open (read inside the loop)."""
        return len(self.sidecar.sessions) if self.sidecar is not None else 0


@dataclass
class Conn:
    """One app connection of a run."""

    name: str
    stream: trio.SocketStream
    parser: WireParser = field(default_factory=WireParser)
    #: Frames received; None: the server closed the connection (EOF or reset).
    frames: list[WireFrame | None] = field(default_factory=list)
    closed_by_peer: bool = False
    closed_by_us: bool = False

    @property
    def open(self) -> bool:
        return not (self.closed_by_peer or self.closed_by_us)

    def messages(self) -> list[WireFrame]:
        return [f for f in self.frames if f is not None and f.command == "MESSAGE"]


class Run:
    """One side of the lockstep: the app's connections to one address."""

    def __init__(self, lab: Lab, label: str) -> None:
        self.lab = lab
        self.label = label
        self.token = new_token()
        self.conns: dict[str, Conn] = {}
        self._changed = trio.Event()

    def notify(self) -> None:
        event, self._changed = self._changed, trio.Event()
        event.set()

    async def changed(self) -> None:
        await self._changed.wait()

    def context(self) -> RunContext:
        return RunContext(self.token, {n: c.messages() for n, c in self.conns.items()})

    async def _reader(self, conn: Conn) -> None:
        try:
            while True:
                data = await conn.stream.receive_some(READ_SIZE)
                if not data:
                    break
                conn.parser.feed(data)
                while (frame := conn.parser.next()) is not None:
                    conn.frames.append(frame)
                self.notify()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        if not conn.closed_by_us:
            conn.closed_by_peer = True
            conn.frames.append(None)
            self.notify()

    async def open(self, name: str) -> Conn:
        stream = await trio.open_tcp_stream(*self.lab.address(self.label))
        conn = Conn(name, stream)
        self.conns[name] = conn
        assert self.lab.nursery is not None
        self.lab.nursery.start_soon(self._reader, conn)
        return conn

    async def close(self, name: str) -> None:
        conn = self.conns.get(name)
        if conn is None or conn.closed_by_us:
            return
        if not conn.closed_by_peer:
            conn.closed_by_us = True
        await trio.aclose_forcefully(conn.stream)
        conn.closed_by_us = True

    async def apply(self, action: Action) -> None:
        """Write ``action`` and settle."""
        if isinstance(action, Close):
            await self.close(action.conn)
            await self.settle(None, action.conn, 0)
            return
        conn = self.conns.get(action.conn) or await self.open(action.conn)
        start = len(conn.frames)
        if conn.open:
            data = render(action, self.context())
            # A write the server refused (it closed): its <closed> is what is compared.
            quiet_errors = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)
            with trio.move_on_after(WRITE_WAIT), contextlib.suppress(*quiet_errors):
                await conn.stream.send_all(data)
        await self.settle(awaited(action), action.conn, start)

    def _answered(self, wanted: str, conn: Conn, start: int) -> bool:
        for frame in conn.frames[start:]:
            if frame is None or frame.command == "ERROR":
                return True
            if wanted == "CONNECTED" and frame.command == "CONNECTED":
                return True
            if frame.command == "RECEIPT" and frame.get("receipt-id") == wanted:
                return True
        return False

    async def settle(self, wanted: str | None, name: str, start: int) -> None:
        """Wait for ``wanted`` on connection ``name`` (frames after ``start``), then quiet."""
        conn = self.conns.get(name)
        if wanted is not None and conn is not None:
            with trio.move_on_after(RECEIPT_WAIT):
                while not self._answered(wanted, conn, start):
                    await self.changed()
        await self.quiet(QUIET, SETTLE_CAP)

    async def quiet(self, quiet: float, cap: float) -> None:
        """Until nothing arrived on any connection for ``quiet`` s (at most ``cap`` s)."""
        with trio.move_on_after(cap):
            while True:
                with trio.move_on_after(quiet) as scope:
                    await self.changed()
                if scope.cancelled_caught:
                    return

    async def close_all(self) -> None:
        for name in list(self.conns):
            await self.close(name)

    def seen(self) -> dict[str, list[WireFrame | None]]:
        return {name: list(conn.frames) for name, conn in self.conns.items()}


#: Streams of one connection: ``frames`` (everything but MESSAGE, in order) and one
#: ``subscription <id> from <destination>`` per subscription and destination (its MESSAGEs
#: in order).
Streams = dict[str, list[NFrame]]


def streams_of(
    normalizer: Normalizer,
    seen: dict[str, list[WireFrame | None]],
    waive: Callable[[NFrame], NFrame] | None = None,
) -> Streams:
    """Each connection's frames split in streams (see :data:`Streams`), normalised.

    The interleaving of MESSAGEs with the other frames, across subscriptions, and across the
    destinations one (wildcard) subscription matches, on one connection is not compared:
    the broker dispatches deliveries on its own schedule, independent of the receipts it
    writes on the same connection (both orders happen in direct runs). Declared in
    :mod:`tests.differential.normalize` ("Order").
    """
    out: Streams = {}
    for name in sorted(seen):
        frames = seen[name]
        by_sub: dict[str, list[WireFrame | None]] = {}
        control: list[WireFrame | None] = []
        for frame in frames:
            if frame is not None and frame.command == "MESSAGE":
                sub = frame.get("subscription") or ""
                dest = frame.get("destination") or ""
                key = normalizer.token_free(f"{sub} from {dest}")
                by_sub.setdefault(key, []).append(frame)
            else:
                control.append(frame)
        for sub in sorted(by_sub):
            out[f"{name} subscription {sub}"] = normalizer.frames(by_sub[sub])
        out[f"{name} frames"] = normalizer.frames(control)
    if waive is not None:
        out = {key: [waive(f) for f in frames] for key, frames in out.items()}
    return out


@dataclass
class Difference:
    """What the app saw differently on one stream (a connection's frames, one subscription's
    MESSAGEs, or what a destination held at the end)."""

    step: int
    action: str
    stream: str
    direct: list[NFrame]
    sidecar: list[NFrame]

    def first(self) -> tuple[NFrame | None, NFrame | None]:
        """The first pair of frames that differ (None: that side has no frame there)."""
        for i in range(max(len(self.direct), len(self.sidecar))):
            d = self.direct[i] if i < len(self.direct) else None
            s = self.sidecar[i] if i < len(self.sidecar) else None
            if d != s:
                return d, s
        return None, None

    def __str__(self) -> str:
        d, s = self.first()
        lines = [
            f"step {self.step} ({self.action}), {self.stream}:",
            f"  direct : {show(d) if d else '(nothing)'}",
            f"  sidecar: {show(s) if s else '(nothing)'}",
            "  direct stream : " + " | ".join(map(show, self.direct[-8:])),
            "  sidecar stream: " + " | ".join(map(show, self.sidecar[-8:])),
        ]
        return "\n".join(lines)


@dataclass
class Report:
    """The differences a scenario showed (empty: transparent)."""

    differences: list[Difference] = field(default_factory=list)

    def __str__(self) -> str:
        if not self.differences:
            return "no difference"
        return "\n".join(map(str, self.differences))


@dataclass(frozen=True)
class Durable:
    """A durable subscription a scenario made, to drain and remove at the end (templates with
    ``{run}``): ActiveMQ (``name`` and ``client_id``) or RabbitMQ (``sub_id``)."""

    destination: str
    name: str | None = None
    client_id: str | None = None
    sub_id: str | None = None


class Lockstep:
    """One scenario's two runs (see the module docstring). Use from the lab's loop, or from
    another thread through :meth:`step_sync`, :meth:`finish_sync`."""

    def __init__(
        self,
        lab: Lab,
        *,
        drain_dlq: bool = True,
        waive: Callable[[NFrame], NFrame] | None = None,
    ) -> None:
        self.lab = lab
        self.direct = Run(lab, "direct")
        self.sidecar = Run(lab, "sidecar")
        self.report = Report()
        self.steps = 0
        self.drain_dlq = drain_dlq and lab.flavor == "activemq"
        #: Applied to every normalised frame of both runs before comparing: the stateful
        #: test's waivers of known differences (tests/differential/known.py); None here.
        self.waive = waive
        self._baseline: dict[str, tuple[int, int]] = {}
        self._queues: set[str] = set()
        self._durables: set[Durable] = set()
        self._client_ids: dict[str, str] = {}

    @property
    def runs(self) -> tuple[Run, Run]:
        return self.direct, self.sidecar

    @property
    def diverged(self) -> bool:
        return bool(self.report.differences)

    # -- bookkeeping of what to drain ---------------------------------------------------

    def _note(self, action: Action) -> None:
        if not isinstance(action, Frame):
            return
        dest = action.header("destination")
        if action.command in ("CONNECT", "STOMP"):
            cid = action.header("client-id")
            if isinstance(cid, str):
                self._client_ids[action.conn] = cid
        if not isinstance(dest, str) or "{run}" not in dest:
            return
        if action.header("x-queue-type") == "stream":
            # A RabbitMQ stream is not drained: nothing leaves it, and a SUBSCRIBE to its
            # /queue/ name without its declaration headers is refused.
            return
        if dest.startswith("/queue/") and not any(c in dest for c in "*>#"):
            self._queues.add(dest)
        if action.command != "SUBSCRIBE":
            return
        name = action.header("activemq.subscriptionName")
        sub_id = action.header("id")
        if isinstance(name, str) and self.lab.flavor == "activemq":
            cid = self._client_ids.get(action.conn)
            if cid is not None:
                self._durables.add(Durable(dest, name=name, client_id=cid))
        elif (
            action.header("durable") == "true"
            and self.lab.flavor == "rabbitmq"
            and isinstance(sub_id, str)
        ):
            self._durables.add(Durable(dest, sub_id=sub_id))

    # -- steps ------------------------------------------------------------------------------

    def _compare(self) -> list[tuple[str, list[NFrame], list[NFrame]]]:
        """Mismatching streams, each compared from where its last reported difference
        ended (a difference is reported once; the streams are compared again after it)."""
        direct = streams_of(Normalizer(self.direct.token), self.direct.seen(), self.waive)
        sidecar = streams_of(Normalizer(self.sidecar.token), self.sidecar.seen(), self.waive)
        out = []
        for key in sorted(set(direct) | set(sidecar)):
            bd, bs = self._baseline.get(key, (0, 0))
            d, s = direct.get(key, [])[bd:], sidecar.get(key, [])[bs:]
            if d != s:
                out.append((key, d, s))
        return out

    async def step(self, action: Action) -> list[Difference]:
        """Run ``action`` on both sides, settle, compare; the new differences."""
        self.steps += 1
        self._note(action)
        async with trio.open_nursery() as nursery:
            for run in self.runs:
                nursery.start_soon(run.apply, action)
        mismatches = self._compare()
        for _ in range(CONVERGE_TRIES):
            if not mismatches:
                break
            async with trio.open_nursery() as nursery:
                for run in self.runs:
                    nursery.start_soon(run.quiet, 0.2, 1.0)
            mismatches = self._compare()
        new = [Difference(self.steps, repr(action), key, d, s) for key, d, s in mismatches]
        for diff in new:
            bd, bs = self._baseline.get(diff.stream, (0, 0))
            self._baseline[diff.stream] = (bd + len(diff.direct), bs + len(diff.sidecar))
        self.report.differences += new
        return new

    async def finish(self, *, compare: bool = True) -> list[Difference]:
        """Close every connection, wait for the sidecar's sessions to end, drain what is left
        (and remove durable subscriptions); compare it unless ``compare`` is False."""
        for run in self.runs:
            await run.close_all()
        with trio.move_on_after(10):
            while self.lab.sessions():  # noqa: ASYNC110 (the sidecar has no event for it)
                await trio.sleep(0.02)
        drained: list[dict[str, list[NFrame]]] = []
        for run in self.runs:
            got = await self._drain(run)
            drained.append(Normalizer(run.token).drained(got))
        new: list[Difference] = []
        if compare:
            direct, sidecar = drained
            for dest in sorted(set(direct) | set(sidecar)):
                d, s = direct.get(dest, []), sidecar.get(dest, [])
                if self.waive is not None:
                    d, s = [self.waive(f) for f in d], [self.waive(f) for f in s]
                if d != s:
                    new.append(Difference(self.steps + 1, "drain", f"left on {dest}", d, s))
        self.report.differences += new
        return new

    def step_sync(self, action: Action) -> list[Difference]:
        return self.lab.call(self.step, action)

    def finish_sync(self, *, compare: bool = True) -> list[Difference]:
        async def finish() -> list[Difference]:
            return await self.finish(compare=compare)

        return self.lab.call(finish)

    # -- the final drain --------------------------------------------------------------------

    def _vhost(self) -> list[tuple[str, str]]:
        return [("host", "/")] if self.lab.flavor == "rabbitmq" else []

    async def _drain(self, run: Run) -> dict[str, list[WireFrame]]:
        """Consume, directly from the broker, what the scenario left on ``run``'s queues,
        durable subscriptions and (ActiveMQ) its messages in ``ActiveMQ.DLQ``."""
        out: dict[str, list[WireFrame]] = {}
        ctx = RunContext(run.token)
        queues = sorted(ctx.text(q) for q in self._queues)
        subs: list[tuple[str, list[tuple[str, str]]]] = []
        for i, queue in enumerate(queues):
            subs.append((queue, [("id", f"drain-{i}"), ("destination", queue)]))
        if self.drain_dlq:
            dlq = [
                ("id", "drain-dlq"),
                ("destination", "/queue/ActiveMQ.DLQ"),
                ("selector", f"dtrun = '{run.token}'"),
            ]
            subs.append(("/queue/ActiveMQ.DLQ", dlq))
        if subs:
            per_sub = await self._consume(None, subs, [])
            for (dest, _), got in zip(subs, per_sub, strict=True):
                out[dest] = got
        for durable in sorted(self._durables, key=repr):
            dest = ctx.text(durable.destination)
            if durable.name is not None and durable.client_id is not None:
                name = ctx.text(durable.name)
                sub = [
                    ("id", "drain-d"),
                    ("destination", dest),
                    ("activemq.subscriptionName", name),
                ]
                after = [
                    [("id", "drain-d")],
                    [("id", "drain-d"), ("activemq.subscriptionName", name)],
                ]
                cid = ctx.text(durable.client_id)
                out[f"durable {name} on {dest}"] = (await self._consume(cid, [(dest, sub)], after))[
                    0
                ]
            elif durable.sub_id is not None:
                sid = ctx.text(durable.sub_id)
                flags = [("durable", "true"), ("auto-delete", "false")]
                sub = [("id", sid), ("destination", dest), *flags]
                unsub = [[("id", sid), *flags]]
                out[f"durable {sid} on {dest}"] = (await self._consume(None, [(dest, sub)], unsub))[
                    0
                ]
        return out

    async def _consume(
        self,
        client_id: str | None,
        subs: Sequence[tuple[str, list[tuple[str, str]]]],
        unsubscribes: Sequence[list[tuple[str, str]]],
    ) -> list[list[WireFrame]]:
        """One plain 1.2 consumer on the broker: SUBSCRIBE (auto ack) to each of ``subs``,
        collect until :data:`DRAIN_QUIET` of silence, send each of ``unsubscribes``; the
        MESSAGEs of each subscription. Every wait bounded; ``AssertionError`` if the broker
        does not answer."""
        stream = await trio.open_tcp_stream(*self.lab.broker_address)
        parser = WireParser()
        frames: list[WireFrame] = []

        async def until(pred: Callable[[], bool], seconds: float) -> bool:
            with trio.move_on_after(seconds):
                while not pred():
                    data = await stream.receive_some(READ_SIZE)
                    if not data:
                        raise AssertionError(f"drain: broker closed the connection: {frames}")
                    parser.feed(data)
                    while (frame := parser.next()) is not None:
                        frames.append(frame)
                return True
            return False

        def receipt(rid: str) -> Callable[[], bool]:
            return lambda: any(f.get("receipt-id") == rid for f in frames)

        try:
            connect = [("accept-version", "1.2"), *self._vhost()]
            if client_id is not None:
                connect.append(("client-id", client_id))
            await stream.send_all(encode("CONNECT", connect))
            ok = await until(lambda: any(f.command == "CONNECTED" for f in frames), 10)
            assert ok, f"drain: no CONNECTED: {frames}"
            for n, (_, headers) in enumerate(subs):
                await stream.send_all(encode("SUBSCRIBE", [*headers, ("receipt", f"s{n}")]))
            for n in range(len(subs)):
                assert await until(receipt(f"s{n}"), 10), f"drain: no receipt: {frames}"
            count = -1
            for _ in range(100):  # bounded: 100 quiet periods at most
                if count == len(frames):
                    break
                count = len(frames)

                def grew(before: int = count) -> bool:
                    return len(frames) > before

                await until(grew, DRAIN_QUIET)
            for n, headers in enumerate(unsubscribes):
                await stream.send_all(encode("UNSUBSCRIBE", [*headers, ("receipt", f"u{n}")]))
                assert await until(receipt(f"u{n}"), 10), f"drain: no receipt: {frames}"
            errors = [f for f in frames if f.command == "ERROR"]
            assert not errors, f"drain: {errors}"
            await stream.send_all(encode("DISCONNECT", [("receipt", "bye")]))
            await until(receipt("bye"), 5)
        finally:
            await trio.aclose_forcefully(stream)
        ids = [dict(h)["id"] for _, h in subs]
        return [
            [f for f in frames if f.command == "MESSAGE" and f.get("subscription") == sid]
            for sid in ids
        ]


def run_scenario(
    lab: Lab,
    actions: Sequence[Action],
    *,
    waive: Callable[[NFrame], NFrame] | None = None,
) -> Report:
    """Run ``actions`` in lockstep and drain; the report of every difference (``waive``: see
    :class:`Lockstep`)."""
    lock = Lockstep(lab, waive=waive)
    for action in actions:
        lock.step_sync(action)
    lock.finish_sync()
    return lock.report


def iter_actions(*groups: Action | Sequence[Action]) -> Iterator[Action]:
    """Flatten actions and lists of actions (scenario helpers return either)."""
    for group in groups:
        if isinstance(group, Sequence):
            yield from group
        else:
            yield group
