"""Bounded stress run of ``test_failover.py::test_rabbitmq_kill_and_restart_reattaches`` (issue
25, part 7: the consumer sometimes stopped near 4,150 of 5,000 after the kill and restart).

Run by hand, never by the suite (pytest collects ``test_*.py`` only)::

    PYTHONPATH=.:harness .venv/bin/python -m tests.integration.stall_repro --runs 20

Each run is the test's scenario: one RabbitMQ node, a sidecar in a thread (``SidecarThread``,
``upstream_heartbeat = 1000,1000`` and the test's fast retry policy), a stomp.py consumer
(``client-individual``, one ACK per MESSAGE) and a producer of ``--n`` persistent SENDs with
receipts on a new durable queue; at 40 % received the node is killed with SIGKILL and
restarted on its port. A run *stalls* when the consumer has not every body and has received
nothing new for ``--stall`` seconds (bounded: ``--timeout`` per run). The node is started once
and reused by every run (each run kills and restarts it anyway).

For every run it prints one line (received, distinct, receipts, the app's ERROR frames, the
FAILOVER event, seconds); for a stall it also prints what explains it: the consumer's ERRORs,
the sidecar's sessions (state, broker, counters), the queue at the broker (``rabbitmqctl
list_queues`` ready / unacknowledged / consumers, ``list_consumers``), the sidecar's log records
since the kill and the broker's log lines with ``error``/``cancel``/``crash``. The sidecar's
log (``mq_sidecar`` at DEBUG) of each run is kept in ``--workdir``. Exit status 1 if any run
stalled or lost or duplicated a body.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import re
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from testbed import RabbitMQ
from tests.integration.support import Client, SidecarThread, sidecar_config, unique
from tests.integration.test_failover import (
    FAST,
    Consumer,
    Producer,
    exactly_once,
    subscribe_events,
)

_RECOVERED = re.compile(r"Recovering (\d+) queues of type rabbit_classic_queue")


def _broker_lines(broker: RabbitMQ, offset: int) -> list[str]:
    """The broker's log lines from byte ``offset`` that look like errors or cancellations."""
    try:
        with broker.log_path.open("rb") as f:
            f.seek(offset)
            text = f.read().decode("utf-8", errors="replace")
    except OSError as exc:
        return [f"<no log: {exc}>"]
    keys = ("error", "cancel", "crash", "function_clause", "nack", "closing")
    return [line for line in text.splitlines() if any(k in line.lower() for k in keys)]


def _queues_recovered(broker: RabbitMQ, offset: int) -> list[int]:
    """The counts in the broker's "Recovering N queues of type rabbit_classic_queue" lines
    from byte ``offset`` on (one per start: how many durable classic queues it found)."""
    try:
        with broker.log_path.open("rb") as f:
            f.seek(offset)
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return []
    return [int(m) for m in _RECOVERED.findall(text)]


def one_run(
    broker: RabbitMQ, run: int, *, n: int, stall: float, timeout: float, workdir: Path
) -> dict[str, Any]:
    """One run of the scenario; returns its record (``stalled``, counts, explanations)."""
    log_path = workdir / f"sidecar-run{run:03d}.log"
    handler = logging.FileHandler(log_path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger("mq_sidecar")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    record: dict[str, Any] = {"run": run}
    started = time.monotonic()
    try:
        config = sidecar_config(broker.stomp_url, upstream_heartbeat="1000,1000", **FAST)
        with SidecarThread(config) as sidecar:
            control = Client(sidecar.address)
            control.connect()
            subscribe_events(control)
            dest = unique()
            deadline = time.monotonic() + timeout
            consumer, producer, broker_offset, _, restart_s = _transfer_and_kill(
                broker, sidecar.address, dest, n, timeout
            )
            record["restart_s"] = round(restart_s, 1)
            last_count, last_change = -1, time.monotonic()
            while time.monotonic() < deadline:
                distinct = len(set(consumer.bodies))
                if distinct >= n:
                    break
                if consumer.count() != last_count:
                    last_count, last_change = consumer.count(), time.monotonic()
                elif time.monotonic() - last_change > stall and not producer.is_alive():
                    break
                time.sleep(0.1)
            distinct = len(set(consumer.bodies))
            record["received"] = consumer.count()
            record["distinct"] = distinct
            record["stalled"] = distinct < n
            record["consumer_errors"] = [
                {"message": e.headers.get("message"), "body": str(e.body)[:300]}
                for e in consumer.errors
            ]
            record["producer_alive"] = producer.is_alive()
            events = []
            while not control.message_queue.empty():
                m = control.message_queue.get()
                body = json.loads(m.body)
                events.append(
                    {
                        k: body.get(k)
                        for k in ("event", "session_id", "reason", "outage_ms", "reattached")
                    }
                )
            record["events"] = events
            if record["stalled"]:
                record["sessions"] = sidecar.status().get("sessions")
                for args in (
                    (
                        "list_queues",
                        "name",
                        "messages_ready",
                        "messages_unacknowledged",
                        "consumers",
                    ),
                    ("list_consumers",),
                    ("list_connections", "name", "state", "recv_cnt", "send_cnt"),
                    ("list_channels", "name", "messages_unacknowledged", "prefetch_count"),
                ):
                    try:
                        record[args[0]] = broker.rabbitmqctl(*args, timeout=30).strip()
                    except Exception as exc:
                        record[args[0]] = repr(exc)
                record["broker_log"] = _broker_lines(broker, broker_offset)[-40:]
            record["queues_recovered"] = _queues_recovered(broker, broker_offset)
            try:
                receipts, errors = producer.outcome(30)
            except AssertionError as exc:  # the producer is still blocked
                receipts, errors = -1, []
                record["producer_blocked"] = str(exc)
            record["receipts"] = receipts
            record["producer_errors"] = [e.headers.get("message") for e in errors]
            with contextlib.suppress(Exception):
                consumer.close()
            with contextlib.suppress(Exception):
                producer.client.close()
            with contextlib.suppress(Exception):
                control.close()
        missing, duplicated = exactly_once(consumer.bodies, n)
        record["missing"], record["duplicated"] = missing, duplicated
    finally:
        logger.removeHandler(handler)
        handler.close()
        record["seconds"] = round(time.monotonic() - started, 1)
        record["sidecar_log"] = str(log_path)
    return record


def _transfer_and_kill(
    broker: RabbitMQ,
    address: tuple[str, int],
    dest: str,
    n: int,
    timeout: float,
    *,
    declared_for: float = 0.0,
) -> tuple[Consumer, Producer, int, int, float]:
    """The test's transfer: a consumer and a producer of ``n`` persistent SENDs with receipts
    through ``address``; once the consumer has 40 % (or after ``timeout`` seconds) the node
    is killed with SIGKILL and restarted. Returns the two apps, the broker log's size at the
    kill (bytes), what the consumer had received then, and the seconds from the kill until the
    node answered STOMP again. ``declared_for``: seconds between the consumer's SUBSCRIBE (which
    declares the queue) and the producer's start."""
    consumer = Consumer(address, dest)
    time.sleep(declared_for)
    producer = Producer(address, dest, n, persistent="true")
    producer.start()
    deadline = time.monotonic() + timeout
    while consumer.count() < n * 0.4 and time.monotonic() < deadline:
        time.sleep(0.02)
    offset = broker.log_path.stat().st_size
    received_at_kill = consumer.count()
    killed_at = time.monotonic()
    broker.kill()
    broker.start()
    broker.wait_ready(90)
    return consumer, producer, offset, received_at_kill, time.monotonic() - killed_at


def _queue_listed(broker: RabbitMQ, destination: str) -> tuple[bool, int]:
    """Whether ``rabbitmqctl list_queues`` lists the queue of ``/queue/NAME``, and its
    message count (0 when not listed)."""
    name = destination.removeprefix("/queue/")
    rows = broker.rabbitmqctl("list_queues", "-q", "--no-table-headers", "name", "messages")
    found = [line.split() for line in rows.splitlines() if line.split()[:1] == [name]]
    return (True, int(found[0][1])) if found else (False, 0)


def direct_run(broker: RabbitMQ, run: int, n: int, declared_for: float = 0.0) -> dict[str, Any]:
    """The scenario without a sidecar: a stomp.py consumer and producer straight to the node,
    kill -9 at 40 % received, restart; nothing re-declares the queue afterwards, so whether
    it is listed again (and with how many messages) is the broker's own recovery."""
    dest = unique()
    address = ("127.0.0.1", broker.stomp_port)
    consumer, _producer, offset, received_at_kill, _ = _transfer_and_kill(
        broker, address, dest, n, 120.0, declared_for=declared_for
    )
    back, messages = _queue_listed(broker, dest)
    record = {
        "run": run,
        "received_at_kill": received_at_kill,
        "received": consumer.count(),
        "queue_back": back,
        "messages_back": messages,
        "queues_recovered": _queues_recovered(broker, offset),
    }
    print(f"direct run: {record}", flush=True)
    return record


def declare_probe(broker: RabbitMQ, delays: list[float], repeats: int) -> list[dict[str, Any]]:
    """The broker alone (no sidecar): declare a durable queue by SUBSCRIBE (then UNSUBSCRIBE),
    SEND 200 persistent messages each with a receipt, wait for every receipt, wait ``delay``
    seconds, kill -9 the node, restart it, and see whether the queue and its messages came
    back (``rabbitmqctl list_queues name messages``). One record per try:
    ``{"delay_s", "queue_back", "messages"}``."""
    out = []
    for delay in delays:
        for _ in range(repeats):
            queue = unique("/queue/probe")
            app = Client(("127.0.0.1", broker.stomp_port))
            app.connect()
            app.conn.subscribe(queue, id="p", headers={"receipt": "s"})
            app.receipt("s")
            app.conn.unsubscribe(id="p", headers={"receipt": "u"})
            app.receipt("u")
            for i in range(200):
                app.conn.send(queue, f"m{i}", headers={"persistent": "true", "receipt": f"r{i}"})
            for _ in range(200):
                app.expect("RECEIPT", 30)
            time.sleep(delay)
            broker.kill()
            with contextlib.suppress(Exception):
                app.close()
            broker.start()
            broker.wait_ready(90)
            back, messages = _queue_listed(broker, queue)
            record = {"delay_s": delay, "queue_back": back, "messages": messages}
            print(f"declare probe: {record}", flush=True)
            out.append(record)
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the scenario ``--runs`` times; print a line per run and a summary; 1 on a stall."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--stall", type=float, default=30.0, help="seconds without progress")
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds per run at most")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument(
        "--fresh-node", action="store_true", help="a new node for every run (as the test)"
    )
    parser.add_argument(
        "--declare-probe",
        type=float,
        nargs="*",
        default=None,
        metavar="DELAY",
        help="instead: kill -9 DELAY seconds after a durable queue got 200 confirmed "
        "persistent messages; does the queue come back? (--runs tries per delay)",
    )
    parser.add_argument(
        "--settle",
        type=float,
        default=0.0,
        help="with --direct: seconds to wait after the node answers STOMP before the run",
    )
    parser.add_argument(
        "--declared-for",
        type=float,
        default=0.0,
        help="with --direct: seconds between declaring the queue and the producer's start",
    )
    parser.add_argument(
        "--direct",
        action="store_true",
        help="instead: the scenario with stomp.py straight to the node (no sidecar), a new "
        "node per run; is the queue back after the restart?",
    )
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="stall-repro-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"workdir {workdir}", flush=True)
    if args.direct:
        direct = []
        for run in range(1, args.runs + 1):
            with RabbitMQ(f"rmq-direct{run}", workdir) as direct_broker:
                time.sleep(args.settle)
                direct.append(direct_run(direct_broker, run, args.n, args.declared_for))
        gone = [r for r in direct if not r["queue_back"]]
        print(f"summary: runs={len(direct)} queue not recovered={len(gone)}")
        return 1 if gone else 0
    if args.declare_probe is not None:
        with RabbitMQ("rmq-probe", workdir) as probe_broker:
            tries = declare_probe(probe_broker, args.declare_probe or [0.2, 1.0, 3.0], args.runs)
        gone = [t for t in tries if not t["queue_back"] or t["messages"] != 200]
        print(f"summary: tries={len(tries)} queue or messages gone={len(gone)}")
        return 1 if gone else 0
    records: list[dict[str, Any]] = []
    broker: RabbitMQ | None = None
    try:
        for run in range(1, args.runs + 1):
            if broker is None or args.fresh_node:
                if broker is not None:
                    broker.stop()
                broker = RabbitMQ(f"rmq-stall{run}" if args.fresh_node else "rmq-stall", workdir)
                broker.start()
                broker.wait_ready(90)
            record = one_run(
                broker, run, n=args.n, stall=args.stall, timeout=args.timeout, workdir=workdir
            )
            records.append(record)
            flag = "STALL" if record["stalled"] else "ok"
            print(
                f"run {run:3d} {flag}: received={record.get('received')} "
                f"distinct={record.get('distinct')} receipts={record.get('receipts')} "
                f"missing={record.get('missing')} duplicated={record.get('duplicated')} "
                f"consumer_errors={record.get('consumer_errors')} "
                f"queues_recovered_at_restart={record.get('queues_recovered')} "
                f"restart_s={record.get('restart_s')} seconds={record['seconds']}",
                flush=True,
            )
            if record["stalled"]:
                print(json.dumps(record, indent=2, default=str), flush=True)
            (workdir / "records.json").write_text(json.dumps(records, indent=2, default=str))
    finally:
        if broker is not None:
            broker.stop()
    stalls = sum(1 for r in records if r["stalled"])
    bad = sum(1 for r in records if r.get("missing") or r.get("duplicated"))
    print(f"summary: runs={len(records)} stalls={stalls} lost_or_duplicated={bad}")
    return 1 if stalls or bad else 0


if __name__ == "__main__":
    threading.current_thread().name = "stall-repro"
    sys.exit(main())
