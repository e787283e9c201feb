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

At the end the consumers' queues are read straight from the surviving broker: "lost" counts
the confirmed messages found on no queue. ``--no-kill`` kills nothing; ``--direct`` runs the
same load straight to the primary (no sidecar, no kill) for comparison in the same conditions.

Examples::

    .venv/bin/python -m bench.admission                   # 1,000 sessions, 100 SENDs each, defaults
    .venv/bin/python -m bench.admission --sessions 4980 --messages 20 --container-limit 1Gi
    .venv/bin/python -m bench.admission --sessions 4980 --messages 20 --direct
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import math
import platform
import tempfile
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from bench.procstat import cpu_seconds
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
    #: Seconds from each SEND to its RECEIPT.
    latencies: list[float] = field(default_factory=list)
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
    sent: dict[str, float] = {}
    for n in [*ids, None]:
        while waiting and (n is None or waiting >= outstanding):
            answer = await app.frame()
            if answer.command is not Command.RECEIPT:
                raise EOFError(f"{answer.command}: {answer.get('message')}")
            now = time.monotonic()
            first = first or now
            receipt = answer.get("receipt-id") or ""
            figures.confirmed.add(receipt)
            figures.latencies.append(now - sent.pop(receipt, now))
            waiting -= 1
        if n is not None:
            headers = {"destination": destination, "receipt": n, "persistent": "true", "n": n}
            sent[n] = time.monotonic()
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


async def drain_left(
    address: tuple[str, int], destination: str, consumers: int, quiet: float = 3.0
) -> collections.Counter[str]:
    """The messages (their ``n``) left on the consumers' queues, read straight from the
    broker at ``address`` (no sidecar) until ``quiet`` s without one on each queue."""
    left: collections.Counter[str] = collections.Counter()
    for c in range(consumers):
        app = App(await trio.open_tcp_stream(*address))
        try:
            await _connect(app)
            await app.send(
                Command.SUBSCRIBE,
                {"destination": f"{destination}.{c}", "id": "drain", "ack": "auto"},
            )
            for _ in range(1_000_000):  # at most this many per queue
                with trio.move_on_after(quiet):
                    message = await app.frame()
                    left[message.get("n") or ""] += 1
                    continue
                break
        finally:
            await trio.aclose_forcefully(app.stream)
    return left


def _connect_attempts(metrics: bytes) -> dict[str, float]:
    """``mq_sidecar_upstream_connect_attempts_total`` of a ``/metrics`` page, by its labels."""
    found: dict[str, float] = {}
    for line in metrics.decode().splitlines():
        if line.startswith("mq_sidecar_upstream_connect_attempts_total{"):
            labels, _, value = line.rpartition(" ")
            found[labels.removeprefix("mq_sidecar_upstream_connect_attempts_total")] = float(value)
    return found


def _direct(args: argparse.Namespace, primary: Any, backup: Any) -> None:
    """``--direct``: the load straight to ``primary`` (no kill), and what it confirmed."""
    address = (primary.host, primary.stomp_port)
    start = time.monotonic()
    figures = trio.run(
        lambda: run_load(
            address,
            "/queue/bench-admission",
            sessions=args.sessions,
            messages=args.messages,
            consumers=args.consumers,
            kill=lambda: None,
            connecting=args.connecting,
        )
    )
    elapsed = time.monotonic() - start
    cpu = cpu_seconds(primary.pid or 0)
    left = trio.run(drain_left, address, "/queue/bench-admission", args.consumers)
    missing = figures.lost - set(left)
    sessions = args.sessions + args.consumers
    print(f"# bench.admission --direct on {platform.node()}, {elapsed:.0f} s (no sidecar, no kill)")
    _latencies(figures)
    print(
        "| sessions | not connected | confirmed | lost | duplicated | probe receipt p50 / max s |"
    )
    print("|---|---|---|---|---|---|")
    print(
        f"| {sessions:,} | {len(figures.refused)} | {len(figures.confirmed):,} | {len(missing)} "
        f"| {figures.duplicated} | {_pct(figures.after_kill, 0.5):.2f} / "
        f"{_pct(figures.after_kill, 1.0):.2f} |"
    )
    _errors(figures, "sessions ended by an error")
    print(f"CPU seconds: broker {cpu:.1f}, load (this process) {time.process_time():.1f}")


def _errors(figures: Figures, title: str) -> None:
    """Print how many sessions ended with an error, and the five most frequent kinds."""
    kinds = collections.Counter(e.split(": ", 1)[-1][:70] for e in figures.errors)
    print(f"{title}: {len(figures.errors)}")
    for kind, n in kinds.most_common(5):
        print(f"  {n} x {kind}")


def _latencies(figures: Figures) -> None:
    """Print the SEND-to-RECEIPT times: p50, p99, max and how many took over 30 s."""
    waits = figures.latencies
    over = sum(1 for w in waits if w > 30.0)
    print(
        f"SEND to RECEIPT: p50 {_pct(waits, 0.5):.2f} s, p99 {_pct(waits, 0.99):.2f} s, max "
        f"{_pct(waits, 1.0):.2f} s; {over:,} of {len(waits):,} over 30 s"
    )


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
    parser.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a sidecar option (TOML value, e.g. upstream_heartbeat=[0,0]); repeatable",
    )
    parser.add_argument(
        "--no-kill",
        action="store_true",
        help="kill no broker (the sidecar's own cost at this scale, against --direct)",
    )
    parser.add_argument(
        "--direct",
        action="store_true",
        help="the same load straight to the primary (no sidecar, no kill): how fast the broker "
        "alone confirms it on this machine, for comparison",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        help="keep the brokers' and the sidecar's files and logs here (default: a temporary "
        "directory, removed at the end)",
    )
    args = parser.parse_args(argv)
    options: dict[str, Any] = {"log_level": "warning"}
    for given in args.option:
        name, _, value = given.partition("=")
        options[name] = tomllib.loads(f"v = {value}")["v"]
    if args.container_limit:
        options["max_memory_bytes"] = _bytes(args.container_limit) - CHART_PROCESS_BYTES
        options["max_sessions"] = args.sessions + args.consumers
    with contextlib.ExitStack() as stack:
        if args.workdir is not None:
            args.workdir.mkdir(parents=True, exist_ok=True)
            tmp = str(args.workdir)
        else:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-admission-"))
        primary, backup = start_activemq_pair(
            Path(tmp) / "pair", name="adm", heap_mb=1024, memory_mb=512
        )
        if args.direct:
            try:
                _direct(args, primary, backup)
            finally:
                backup.stop()
                primary.stop()
            return
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
                        kill=(lambda: None) if args.no_kill else primary.kill,
                        connecting=args.connecting,
                    )
                )
                elapsed = time.monotonic() - start
                peak = sidecar.peak_rss_kib() * 1024
                asked = time.monotonic()
                memory = sidecar.status(timeout=WAIT)["memory"]
                status_wait = time.monotonic() - asked
                cpu = {
                    "sidecar": cpu_seconds(sidecar.pid or 0),
                    "backup broker": cpu_seconds(backup.pid or 0),
                    "load (this process)": time.process_time(),
                }
                attempts = _connect_attempts(sidecar.get("/metrics", timeout=WAIT)[1])
            survivor = primary if args.no_kill else backup
            left = trio.run(
                drain_left,
                (survivor.host, survivor.stomp_port),
                "/queue/bench-admission",
                args.consumers,
            )
        finally:
            backup.stop()
            primary.stop()
    _report(
        args,
        options=options,
        status_wait=status_wait,
        left=left,
        cpu=cpu,
        attempts=attempts,
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
    status_wait: float,
    left: collections.Counter[str],
    cpu: dict[str, float],
    attempts: dict[str, float],
) -> None:
    mib = 1 << 20
    sessions = args.sessions + args.consumers
    print(f"# bench.admission on {platform.node()} ({platform.machine()}), {elapsed:.0f} s")
    print(f"options: {options}")
    missing = figures.lost - set(left)
    print(
        f"confirmed and not received by the consumers: {len(figures.lost)}; of them left on "
        f"the queues (read straight from the broker at the end): {len(figures.lost & set(left))}"
        f"; on no queue (lost): {len(missing)} {sorted(missing)[:20]}"
    )
    total = sum(left.values())
    print(f"on the queues at the end: {total} ({total - len(left)} copies)")
    budget = [r for r in figures.refused if r.startswith(("out of memory", "too many sessions"))]
    print(
        "| sessions | refused by the sidecar | not connected by the broker | confirmed | lost "
        "| duplicated | idle RSS MiB | peak RSS MiB | RSS per session KiB | budget peak MiB "
        "| first receipt after kill p50 / max s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    print(
        f"| {sessions:,} | {len(budget)} | {len(figures.refused) - len(budget)} "
        f"| {len(figures.confirmed):,} | {len(missing)} | {figures.duplicated} "
        f"| {idle / mib:.0f} | {peak / mib:.0f} | {(peak - idle) / sessions / 1024:.0f} "
        f"| {memory['peak'] / mib:.1f} "
        f"| {_pct(figures.after_kill, 0.5):.2f} / {_pct(figures.after_kill, 1.0):.2f} |"
    )
    _latencies(figures)
    _errors(figures, "sessions ended by an ERROR after CONNECTED")
    print(f"memory at the end: {memory}")
    print(f"/status answered {status_wait:.1f} s after it was asked, once the load had ended")
    print("CPU seconds: " + ", ".join(f"{name} {value:.1f}" for name, value in cpu.items()))
    print("broker connection attempts (mq_sidecar_upstream_connect_attempts_total by outcome): ")
    for label, value in sorted(attempts.items()):
        print(f"  {label} {value:,.0f}")
    if figures.refused:
        print(f"first refusal: {figures.refused[0]}")


if __name__ == "__main__":
    main()
