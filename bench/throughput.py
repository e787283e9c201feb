"""Throughput through mq-sidecar against the same broker directly, in the same run.

A first benchmark (issue 7 builds the full set): raw-socket STOMP load so the client is not
the bottleneck (stomp.py uses a whole core, BROKERS.md §5), the sidecar in its own process.
Workloads, each direct and through the sidecar, reported as msg/s and the ratio:

- ``send``: N non-persistent 1 KiB SENDs without receipts, the clock stops when the RECEIPT
  of a final SEND comes back;
- ``consume-auto``: N messages pre-filled, then consumed with ack auto.

Run: ``.venv/bin/python bench/throughput.py [--n 20000] [--broker activemq|rabbitmq]``.
Prints a table and writes ``bench/results/latest.json``. Never run as a timed test.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import protocol
from protocol import Command, Frame
from testbed import ActiveMQ, BrokerProcess, RabbitMQ, free_port, wait_stomp

BODY = b"x" * 1024
RESULTS = Path(__file__).parent / "results"


class RawStomp:
    """A minimal blocking STOMP 1.2 client over a socket, built on ``protocol``."""

    def __init__(self, port: int, vhost: str) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.parser = protocol.FrameParser(protocol.Limits(max_frame_bytes=1 << 24), version="1.2")
        self.send_frame(Frame.build(Command.CONNECT, {"accept-version": "1.2", "host": vhost}))
        connected = self.next_frame()
        assert connected.command is Command.CONNECTED, connected

    def send_frame(self, frame: Frame) -> None:
        self.sock.sendall(protocol.serialize(frame, "1.2"))

    def next_frame(self) -> Frame:
        while True:
            event = self.parser.next_event()
            if isinstance(event, Frame):
                return event
            if isinstance(event, protocol.ConnectionClosed):
                raise ConnectionError("closed")
            if isinstance(event, protocol.NeedData):
                self.parser.receive_data(self.sock.recv(1 << 20))

    def close(self) -> None:
        self.sock.close()


def send_burst(port: int, vhost: str, dest: str, n: int) -> float:
    """Seconds to send ``n`` SENDs and get the RECEIPT of one more."""
    c = RawStomp(port, vhost)
    one = protocol.serialize(Frame.build(Command.SEND, {"destination": dest}, BODY), "1.2")
    batch = one * 100
    start = time.perf_counter()
    for _ in range(n // 100):
        c.sock.sendall(batch)
    c.send_frame(Frame.build(Command.SEND, {"destination": dest, "receipt": "end"}, BODY))
    while True:
        f = c.next_frame()
        if f.command is Command.RECEIPT:
            break
    elapsed = time.perf_counter() - start
    c.close()
    return elapsed


def consume(port: int, vhost: str, dest: str, n: int) -> float:
    """Seconds to receive ``n`` messages (ack auto) from a pre-filled queue."""
    c = RawStomp(port, vhost)
    c.send_frame(Frame.build(Command.SUBSCRIBE, {"destination": dest, "id": "b", "ack": "auto"}))
    start = time.perf_counter()
    got = 0
    while got < n:
        if c.next_frame().command is Command.MESSAGE:
            got += 1
    elapsed = time.perf_counter() - start
    c.close()
    return elapsed


def start_sidecar(broker_url: str) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "proxy",
            "run",
            "--listen",
            f"127.0.0.1:{port}",
            "--admin-listen",
            "127.0.0.1:0",
            "--brokers",
            broker_url,
            "--log-level",
            "warning",
        ],
    )
    wait_stomp("127.0.0.1", port, timeout=30)
    return proc, port


def run(broker: BrokerProcess, flavor: str, n: int) -> list[dict[str, object]]:
    sidecar, sidecar_port = start_sidecar(broker.stomp_url)
    rows: list[dict[str, object]] = []
    try:
        for workload in ("send", "consume-auto"):
            rates = {}
            for target, port in (("direct", broker.stomp_port), ("sidecar", sidecar_port)):
                dest = f"/queue/bench-{workload}-{target}-{time.time_ns()}"
                if workload == "send":
                    elapsed = send_burst(port, broker.vhost, dest, n)
                else:
                    send_burst(broker.stomp_port, broker.vhost, dest, n)  # fill directly
                    elapsed = consume(port, broker.vhost, dest, n)
                rates[target] = n / elapsed
            rows.append(
                {
                    "workload": workload,
                    "broker": flavor,
                    "direct": round(rates["direct"]),
                    "sidecar": round(rates["sidecar"]),
                    "ratio": round(rates["sidecar"] / rates["direct"], 3),
                    "unit": "msg/s",
                }
            )
    finally:
        sidecar.terminate()
        sidecar.wait(30)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--broker", choices=["activemq", "rabbitmq", "both"], default="both")
    args = ap.parse_args()
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="mq-bench-") as tmp:
        if args.broker in ("activemq", "both"):
            with ActiveMQ("bench", Path(tmp), heap_mb=512, memory_mb=256) as amq:
                rows += run(amq, "activemq", args.n)
        if args.broker in ("rabbitmq", "both"):
            with RabbitMQ("bench", Path(tmp)) as rmq:
                rows += run(rmq, "rabbitmq", args.n)
    print(f"{'workload':<14}{'broker':<10}{'direct':>10}{'sidecar':>10}{'ratio':>8}")
    for r in rows:
        print(
            f"{r['workload']:<14}{r['broker']:<10}{r['direct']:>10}{r['sidecar']:>10}{r['ratio']:>8}"
        )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "latest.json").write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
