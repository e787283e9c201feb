"""The stream read's task against a plain reader of the same range, in one run:
``python -m bench.spark_stream`` (from the repository, ``PYTHONPATH=.:harness:spark``, pyarrow
importable). Issue 33 part 4, the first ratio.

One RabbitMQ node and one mq-sidecar process in front of it; a stream of ``--rows`` messages of
``--size`` bytes. Then, in ``--rounds`` rounds, each variant in turn (the order rotates from round
to round, so that a slow spell of the shared machine does not fall on one variant only), each
reading offsets ``[0, rows)`` once:

* ``stomp.py direct``: a plain stomp.py consumer straight to the node's STOMP port, a SUBSCRIBE
  at ``offset=0`` with ``ack:client`` and ``prefetch-count`` 1,000, a cumulative ACK every 500
  messages, until the last offset: the reference;
* ``task direct``: the data source's task (:func:`mq_sidecar_spark.stream.read_range`, the
  records turned into Arrow batches as Spark gets them) straight to the node;
* ``task via sidecar``: the same through the sidecar, as an executor reads.

Rates are messages per second from the connect to the last record. Prints each measurement and
the ratios ``task via sidecar / stomp.py direct`` (goal >= 0.9) and ``task direct / stomp.py
direct`` (the task's own cost, sidecar aside). A benchmark, never a timed test. About a minute
with the defaults on 2 cores.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import stomp

from mq_sidecar_spark._stream_options import parse_stream_options
from mq_sidecar_spark.stream import read_range
from testbed import RabbitMQ
from testbed.sidecar import SidecarProcess
from tests.spark.support import new_stream, publish

#: The sidecar's options: quiet, fast reconnects (as the Spark tests').
SIDECAR_OPTIONS: dict[str, object] = {"log_level": "warning", "retry_interval": 50}


def stomp_py_read(host: str, port: int, destination: str, rows: int, timeout: float) -> float:
    """Seconds a plain stomp.py consumer takes to read offsets ``[0, rows)`` (module doc)."""
    done = threading.Event()
    state = {"n": 0}

    class Listener(stomp.ConnectionListener):  # type: ignore[misc]
        def on_message(self, frame: Any) -> None:
            state["n"] += 1
            offset = int(frame.headers["x-stream-offset"])
            if state["n"] % 500 == 0:
                conn.ack(frame.headers["ack"])
            if offset >= rows - 1:
                done.set()

    started = time.perf_counter()
    conn = stomp.Connection12([(host, port)], heartbeats=(0, 0), auto_decode=False, vhost="/")
    conn.set_listener("l", Listener())
    conn.connect(wait=True)
    conn.subscribe(
        destination,
        id="bench",
        ack="client",
        headers={"x-stream-offset": "offset=0", "prefetch-count": "1000"},
    )
    finished = done.wait(timeout)
    elapsed = time.perf_counter() - started
    conn.disconnect()
    if not finished:
        raise RuntimeError(f"stomp.py read {state['n']} of {rows} in {timeout} s")
    return elapsed


def task_read(port: int, destination: str, rows: int) -> float:
    """Seconds the data source's task takes to read offsets ``[0, rows)`` through ``port``."""
    options = parse_stream_options(
        {"stream": "true", "destination": destination, "port": str(port), "vhost": "/"},
        batch=True,
    )
    started = time.perf_counter()
    count = sum(batch.num_rows for batch in read_range(options, 0, rows))
    elapsed = time.perf_counter() - started
    if count != rows:
        raise RuntimeError(f"the task read {count} of {rows}")
    return elapsed


def fill(broker: RabbitMQ, port: int, rows: int, size: int) -> str:
    """A new stream of ``rows`` messages of ``size`` bytes on ``broker``, published through the
    sidecar at ``port``; its destination."""
    destination = new_stream(broker)
    publish(("127.0.0.1", port), destination, range(rows), prefix="x" * (size - 6))
    return destination


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark (module doc) and print its figures and ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=100, help="bytes per message body")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-stream-") as tmp:
        work = Path(tmp)
        with RabbitMQ("bench-rmq", work / "rmq") as broker:
            sidecar = SidecarProcess(
                "bench-sidecar", work, brokers=broker.stomp_url, options=SIDECAR_OPTIONS
            )
            with sidecar:
                destination = fill(broker, sidecar.port, args.rows, args.size)
                variants: dict[str, Callable[[], float]] = {
                    "stomp.py direct": lambda: stomp_py_read(
                        broker.host, broker.stomp_port, destination, args.rows, 300
                    ),
                    "task direct": lambda: task_read(broker.stomp_port, destination, args.rows),
                    "task via sidecar": lambda: task_read(sidecar.port, destination, args.rows),
                }
                rates: dict[str, list[float]] = {name: [] for name in variants}
                names = list(variants)
                for round_ in range(args.rounds):
                    order = names[round_ % len(names) :] + names[: round_ % len(names)]
                    for name in order:
                        seconds = variants[name]()
                        rates[name].append(args.rows / seconds)
                        print(f"round {round_ + 1} {name:17} {args.rows / seconds:9,.0f} msg/s")
    median = {name: statistics.median(values) for name, values in rates.items()}
    print(f"\n{args.rows:,} messages of {args.size} bytes, {args.rounds} rounds, medians:")
    for name, value in median.items():
        print(f"  {name:17} {value:9,.0f} msg/s")
    base = median["stomp.py direct"]
    print(f"  task via sidecar / stomp.py direct  {median['task via sidecar'] / base:.2f}x")
    print(f"  task direct / stomp.py direct       {median['task direct'] / base:.2f}x")


if __name__ == "__main__":
    main()
