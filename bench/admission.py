"""Admission at scale (issue 34): ``.venv/bin/python -m bench.admission``.

One sidecar process in front of an ActiveMQ shared-store pair (primary, backup). Producer
sessions connect one after another (at most ``--connecting`` CONNECTs unanswered at once)
while the earlier ones send: each pipelines persistent SENDs with receipts (at most
``--outstanding`` unconfirmed), half right after its CONNECTED and half once every producer
is connected; consumer sessions receive with ``client-individual`` ACKs. Once half the
producers are connected the primary is killed with SIGKILL; every producer connected before
the kill then sends one SEND more (its probe) and the time from the kill to its RECEIPT is
the time until that session has its first receipt after the kill.

The brokers get a 1 GiB heap and a 512 MB memory limit (the test bed's default is 64 MB):
with 64 MB, two 5,000-session runs of four had nearly every producer's last SENDs
unconfirmed past ``call_timeout`` once all sent at once, which looked like ActiveMQ's
producer flow control; with 512 MB one run of one had it for some (not verified further).

Prints sessions refused, messages confirmed, lost and received twice, the sidecar's RSS
(idle with no session, peak) and RSS per session, the memory budget's figures (/status
``memory``: held, reserved, free, peak) and the time until every session connected before
the kill has its first receipt after it (p50, max). A benchmark, never a timed test;
``tests/integration/test_admission.py`` runs the same load (:func:`run_load`) small, with the
default configuration.

Examples::

    .venv/bin/python -m bench.admission                   # 1,000 sessions, 100 SENDs each, defaults
    .venv/bin/python -m bench.admission --sessions 4980 --messages 20 --container-limit 1Gi
"""

from __future__ import annotations

import argparse
import collections
import math
import platform
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from protocol import Command, Frame
from testbed import start_activemq_pair
from testbed.sidecar import SidecarProcess
from tests.integration.test_takeover import App

#: What the helm chart leaves the process out of the container's memory limit
#: (helm/mq-sidecar/templates/_helpers.tpl, mq-sidecar.memoryBudget).
CHART_PROCESS_BYTES = 128 << 20
#: Seconds any one wait of the load may take (a CONNECT held through the takeover, a RECEIPT).
WAIT = 120.0


@dataclass
class Figures:
    """What one run of :func:`run_load` saw."""

    sessions: int
    connected: int = 0
    refused: list[str] = field(default_factory=list)
    #: Receipt ids the producers were answered (every SEND asks for one).
    confirmed: set[str] = field(default_factory=set)
    #: Message ids the consumers received, with how many times.
    received: collections.Counter[str] = field(default_factory=collections.Counter)
    #: Seconds from the kill to each pre-kill session's first RECEIPT after it.
    after_kill: list[float] = field(default_factory=list)
    connected_before_kill: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def lost(self) -> set[str]:
        """Confirmed messages no consumer received."""
        return self.confirmed - set(self.received)

    @property
    def duplicated(self) -> int:
        """Deliveries beyond the first of each message."""
        return sum(n - 1 for n in self.received.values() if n > 1)


async def _connect(app: App) -> Frame:
    await app.send(Command.CONNECT, {"accept-version": "1.2", "host": "/"})
    return await app.frame()


async def _sends(
    app: App, destination: str, ids: list[str], outstanding: int, figures: Figures
) -> float:
    """Send one persistent SEND per id (body and receipt: the id), at most ``outstanding``
    unconfirmed; returns when every receipt came, the time of the first one (monotonic)."""
    waiting = 0
    first = 0.0
    for n in [*ids, None]:
        while waiting and (n is None or waiting >= outstanding):
            answer = await app.frame()
            if answer.command is not Command.RECEIPT:
                raise EOFError(f"{answer.command}: {answer.get('message')}")
            first = first or time.monotonic()
            figures.confirmed.add(answer.get("receipt-id") or "")
            waiting -= 1
        if n is not None:
            headers = {"destination": destination, "receipt": n, "persistent": "true", "n": n}
            await app.send(Command.SEND, headers, n.encode())
            waiting += 1
    return first


async def run_load(
    address: tuple[str, int],
    destination: str,
    *,
    sessions: int,
    messages: int,
    consumers: int,
    kill: Callable[[], None],
    outstanding: int = 10,
    connecting: int = 50,
) -> Figures:
    """Run the load against the sidecar at ``address`` (see the module docstring): ``sessions``
    producers of ``messages`` SENDs each (and a probe for those connected before the kill),
    ``consumers`` consumers, each on a queue of its own (``destination.<c>``; producer ``i``
    sends to consumer ``i % consumers``'s: every copy of a message reaches the one
    subscription, whose duplicate detection hides it); ``kill`` (blocking, run in a thread)
    once half the producers are connected. Every wait is bounded (:data:`WAIT`); returns
    what was seen."""
    figures = Figures(sessions)
    killed = trio.Event()
    all_connected = trio.Event()
    producers_done = trio.Event()
    half_connected = trio.Event()
    caught_up = trio.Event()
    kill_at = [0.0]
    answered = [0]
    counted: set[int] = set()
    finished = [0]
    slots = trio.Semaphore(connecting)

    def one_answered(i: int) -> None:
        if i in counted:
            return
        counted.add(i)
        answered[0] += 1
        if answered[0] == sessions:
            all_connected.set()
            half_connected.set()  # fewer than half connected: kill all the same

    def check_caught_up() -> None:
        if producers_done.is_set() and len(figures.received) >= len(figures.confirmed):
            caught_up.set()

    async def produce(i: int, app: App) -> None:
        ids = [f"{i}-{k}" for k in range(messages)]
        async with slots:
            answer = await _connect(app)
        one_answered(i)
        if answer.command is not Command.CONNECTED:
            figures.refused.append(f"{answer.get('message')}: {answer.body.decode()}")
            return
        figures.connected += 1
        if figures.connected >= sessions // 2:
            half_connected.set()
        before_kill = not killed.is_set()
        queue = f"{destination}.{i % consumers}"
        await _sends(app, queue, ids[: messages // 2], outstanding, figures)
        if before_kill:
            await killed.wait()
            got = await _sends(app, queue, [f"{i}-probe"], 1, figures)
            figures.after_kill.append(got - kill_at[0])
        await all_connected.wait()
        await _sends(app, queue, ids[messages // 2 :], outstanding, figures)

    async def producer(i: int) -> None:
        app: App | None = None
        try:
            with trio.fail_after(3 * WAIT):
                app = App(await trio.open_tcp_stream(*address))
                await produce(i, app)
        except (EOFError, OSError, trio.BrokenResourceError, trio.TooSlowError) as exc:
            figures.errors.append(f"producer {i}: {exc!r}")
            one_answered(i)  # never connected: the others do not wait for it
        finally:
            if app is not None:
                await trio.aclose_forcefully(app.stream)
            finished[0] += 1
            if finished[0] == sessions:
                producers_done.set()
                check_caught_up()

    async def consumer(c: int, subscribed: trio.Event) -> None:
        app = App(await trio.open_tcp_stream(*address))
        try:
            await _connect(app)
            await app.send(
                Command.SUBSCRIBE,
                {"destination": f"{destination}.{c}", "id": f"c{c}", "ack": "client-individual"},
            )
            subscribed.set()
            while True:
                message = await app.frame()
                if message.command is not Command.MESSAGE:
                    figures.errors.append(
                        f"consumer {c}: {message.command} {message.get('message')}"
                    )
                    return
                figures.received[message.get("n") or ""] += 1
                check_caught_up()
                await app.send(Command.ACK, {"id": message.get("ack") or ""})
        except (EOFError, OSError, trio.BrokenResourceError) as exc:
            figures.errors.append(f"consumer {c}: {exc!r}")
        finally:
            await trio.aclose_forcefully(app.stream)

    async def kill_midway() -> None:
        await half_connected.wait()
        figures.connected_before_kill = figures.connected
        kill_at[0] = time.monotonic()
        killed.set()
        await trio.to_thread.run_sync(kill)

    async with trio.open_nursery() as nursery:
        for c in range(consumers):
            subscribed = trio.Event()
            nursery.start_soon(consumer, c, subscribed)
            with trio.fail_after(WAIT):
                await subscribed.wait()
        async with trio.open_nursery() as producing:
            producing.start_soon(kill_midway)
            for i in range(sessions):
                await slots.acquire()  # one after another: a slot frees at each answer
                slots.release()
                producing.start_soon(producer, i)
        with trio.move_on_after(WAIT):
            await caught_up.wait()
            await trio.sleep(1.0)  # late redeliveries would show as duplicates
        nursery.cancel_scope.cancel()
    return figures


def _bytes(text: str) -> int:
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}
    for suffix, factor in units.items():
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * factor)
    return int(text)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)] if ordered else 0.0


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark once and print its figures."""
    parser = argparse.ArgumentParser(prog="python -m bench.admission", description=__doc__)
    parser.add_argument(
        "--sessions",
        type=int,
        default=980,
        help="producer sessions (with the consumers, all connected at once: 980 + 20 is the "
        "default max_sessions)",
    )
    parser.add_argument("--messages", type=int, default=100, help="SENDs per producer")
    parser.add_argument("--consumers", type=int, default=20)
    parser.add_argument(
        "--connecting", type=int, default=50, help="CONNECTs unanswered at once, at most"
    )
    parser.add_argument(
        "--container-limit",
        help="derive max_memory_bytes as the chart does from this memory limit (e.g. 1Gi) and "
        "set max_sessions to the producers and consumers; default: the program's defaults",
    )
    args = parser.parse_args(argv)
    options: dict[str, Any] = {"log_level": "warning"}
    if args.container_limit:
        options["max_memory_bytes"] = _bytes(args.container_limit) - CHART_PROCESS_BYTES
        options["max_sessions"] = args.sessions + args.consumers
    with tempfile.TemporaryDirectory(prefix="bench-admission-") as tmp:
        primary, backup = start_activemq_pair(
            Path(tmp) / "pair", name="adm", heap_mb=1024, memory_mb=512
        )
        sidecar = SidecarProcess(
            "admission",
            Path(tmp),
            brokers=f"failover:({primary.stomp_url},{backup.stomp_url})",
            options=options,
        )
        try:
            with sidecar:
                sidecar.wait_ready()
                idle = sidecar.rss_kib() * 1024
                start = time.monotonic()
                figures = trio.run(
                    lambda: run_load(
                        sidecar.address,
                        "/queue/bench-admission",
                        sessions=args.sessions,
                        messages=args.messages,
                        consumers=args.consumers,
                        kill=primary.kill,
                        connecting=args.connecting,
                    )
                )
                elapsed = time.monotonic() - start
                peak = sidecar.peak_rss_kib() * 1024
                memory = sidecar.status()["memory"]
        finally:
            backup.stop()
            primary.stop()
    _report(
        args,
        options=options,
        figures=figures,
        idle=idle,
        peak=peak,
        memory=memory,
        elapsed=elapsed,
    )


def _report(
    args: argparse.Namespace,
    *,
    options: dict[str, Any],
    figures: Figures,
    idle: int,
    peak: int,
    memory: dict[str, Any],
    elapsed: float,
) -> None:
    mib = 1 << 20
    sessions = args.sessions + args.consumers
    print(f"# bench.admission on {platform.node()} ({platform.machine()}), {elapsed:.0f} s")
    print(f"options: {options}")
    budget = [r for r in figures.refused if r.startswith(("out of memory", "too many sessions"))]
    print(
        "| sessions | refused by the sidecar | not connected by the broker | confirmed | lost "
        "| duplicated | idle RSS MiB | peak RSS MiB | RSS per session KiB | budget peak MiB "
        "| first receipt after kill p50 / max s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    print(
        f"| {sessions:,} | {len(budget)} | {len(figures.refused) - len(budget)} "
        f"| {len(figures.confirmed):,} | {len(figures.lost)} | {figures.duplicated} "
        f"| {idle / mib:.0f} | {peak / mib:.0f} | {(peak - idle) / sessions / 1024:.0f} "
        f"| {memory['peak'] / mib:.1f} "
        f"| {_pct(figures.after_kill, 0.5):.2f} / {_pct(figures.after_kill, 1.0):.2f} |"
    )
    kinds = collections.Counter(e.split(": ", 1)[-1][:70] for e in figures.errors)
    print(f"sessions ended by an ERROR after CONNECTED: {len(figures.errors)}")
    for kind, n in kinds.most_common(5):
        print(f"  {n} x {kind}")
    print(f"memory at the end: {memory}")
    if figures.refused:
        print(f"first refusal: {figures.refused[0]}")


if __name__ == "__main__":
    main()
