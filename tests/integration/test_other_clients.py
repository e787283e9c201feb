"""Clients other than stomp.py through the sidecar (issue 14, item 3): the Ruby ``stomp`` gem
(Debian's ruby-stomp 1.4.10) and Node.js ``stompit`` (1.0.0, tests/clients/node).

Each flow is a small program under ``tests/clients/ruby`` or ``tests/clients/node`` that
takes the address and destination as arguments, does the flow and prints one JSON line: what
it received, in order, and its errors. Every test runs the program directly against the
broker and then through a sidecar in front of it, and asserts that the client saw the same
both ways once the ids the sidecar owns are set aside (:func:`normalize`); that is the
"transparency first" contract of docs/behaviour.md. The failover test kills the ActiveMQ
primary of a shared-store pair (SIGKILL) while the program publishes and consumes through a
sidecar: nothing lost, nothing shown twice.

The clients come from scripts/setup.sh (ruby-stomp from Debian, stompit with ``npm ci``): a
missing client fails the test. Every program has its own watchdog (``--timeout``) and every
subprocess a bounded wait; loopback only.
"""

from __future__ import annotations

import functools
import json
import queue
import re
import shutil
import subprocess
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from testbed import ActiveMQ
from tests.conftest import ActiveMQPairFactory
from tests.integration.support import Relay, SidecarThread, sidecar_config, unique

CLIENTS = Path(__file__).resolve().parents[1] / "clients"
#: Seconds a flow program may run (its own watchdog); the subprocess gets a little more.
FLOW_TIMEOUT = 20.0
#: Fast reconnect policy for the failover test, as in test_failover.py.
FAST = {"retry_interval": "50", "max_retry_interval": "500", "connect_timeout": "2000"}
#: Messages the failover flow publishes, and the share consumed when the primary is killed.
FAILOVER_COUNT = 300
KILL_AT = 0.3

Json = dict[str, Any]


# --- running the client programs -----------------------------------------------------------


@functools.cache
def _ruby() -> str:
    ruby = shutil.which("ruby")
    if ruby is not None:
        check = subprocess.run(
            [ruby, "-e", 'require "stomp"; print Stomp::Version::STRING'],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if check.returncode == 0:
            return ruby
    pytest.fail(
        "the Ruby stomp gem (Debian package ruby-stomp) is not installed: run scripts/setup.sh",
        pytrace=False,
    )


@functools.cache
def _node() -> str:
    node = shutil.which("node")
    if node is None or not (CLIENTS / "node/node_modules/stompit/package.json").is_file():
        pytest.fail(
            "node or stompit (tests/clients/node/node_modules) is missing: run scripts/setup.sh",
            pytrace=False,
        )
    return node


def command(
    client: str, flow: str, address: tuple[str, int], dest: str, **args: object
) -> list[str]:
    """The command line of ``flow`` for ``client`` ("ruby" or "node")."""
    if client == "ruby":
        argv = [_ruby(), str(CLIENTS / "ruby" / f"{flow}.rb")]
    else:
        argv = [_node(), str(CLIENTS / "node" / f"{flow}.js")]
    options: dict[str, object] = {"timeout": FLOW_TIMEOUT, **args}
    argv += ["--host", address[0], "--port", str(address[1]), "--dest", dest, "--vhost", "/"]
    for name, value in options.items():
        argv += [f"--{name.replace('_', '-')}", str(value)]
    return argv


def _result_line(stdout: str, stderr: str, argv: list[str]) -> Json:
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        raise AssertionError(f"{argv[1]} printed nothing; stderr:\n{stderr[-4000:]}")
    result: Json = json.loads(lines[-1])
    assert "progress" not in result, f"{argv[1]} ended without a result; stderr:\n{stderr[-4000:]}"
    return result


def run_flow(client: str, flow: str, address: tuple[str, int], dest: str, **args: object) -> Json:
    """Run one flow program to its end and return its JSON result."""
    argv = command(client, flow, address, dest, **args)
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=FLOW_TIMEOUT + 15, check=False
    )
    result = _result_line(done.stdout, done.stderr, argv)
    assert done.returncode in (0, 1), f"{argv[1]} exited {done.returncode}: {result}"
    return result


# --- comparing what the client saw ---------------------------------------------------------

#: Headers whose values the sidecar owns (docs/behaviour.md, "Transparency first"), or that
#: differ from run to run: compared by presence only. ``ack`` is also collapsed to one
#: occurrence (RabbitMQ repeats it on a message whose SEND copied an ``ack`` header in).
_ID_HEADERS = {"message-id": "<message-id>", "ack": "<ack>", "timestamp": "<timestamp>"}


def _message_ids(value: object, found: set[str]) -> None:
    if isinstance(value, dict):
        if "headers" in value and "body" in value:
            ids = value["headers"].get("message-id")
            found.update(ids if isinstance(ids, list) else [ids] if ids else [])
        for item in value.values():
            _message_ids(item, found)
    elif isinstance(value, list):
        for item in value:
            _message_ids(item, found)


def normalize(result: Json, *, receipt_header: bool = False) -> Json:
    """``result`` with the ids set aside: the values of the headers in :data:`_ID_HEADERS`,
    every message id quoted in another header (the gem names its unreceive transaction after
    the message), and the ids of RECEIPTs nobody waited for. A MESSAGE's ``receipt`` header
    (RabbitMQ copies a SEND's into it) is dropped unless ``receipt_header``, then kept as
    ``<receipt>``: see :func:`test_rabbitmq_message_receipt_header`."""
    ids: set[str] = set()
    _message_ids(result, ids)
    pattern = re.compile("|".join(re.escape(i) for i in sorted(ids, key=len, reverse=True)))

    def text(value: str) -> str:
        return pattern.sub("<message-id>", value) if ids else value

    def header(value: object) -> object:
        return [text(str(v)) for v in value] if isinstance(value, list) else text(str(value))

    def walk(value: object) -> object:
        if isinstance(value, dict):
            if "headers" in value and "body" in value:
                headers: dict[str, object] = {}
                for name, v in value["headers"].items():
                    if name in _ID_HEADERS:
                        headers[name] = _ID_HEADERS[name]
                    elif name == "receipt":
                        if receipt_header:
                            headers[name] = "<receipt>"
                    else:
                        headers[name] = header(v)
                return {"body": value["body"], "headers": headers}
            return {
                k: ["<receipt>"] * len(v) if k == "stray_receipts" else walk(v)
                for k, v in value.items()
            }
        if isinstance(value, list):
            return [walk(v) for v in value]
        return value

    normalized = walk(result)
    assert isinstance(normalized, dict)
    return normalized


def bodies(messages: list[Json]) -> list[str]:
    return [str(m["body"]) for m in messages]


def direct_and_through(relay: Relay, client: str, flow: str, **args: object) -> tuple[Json, Json]:
    """Run ``flow`` against the broker, then through the sidecar, on one fresh queue (each
    flow leaves it empty); both results, checked for errors."""
    dest = unique("/queue/oc")
    direct = run_flow(client, flow, relay.broker_address, dest, **args)
    assert direct["errors"] == [], f"directly against {relay.flavor}: {direct['errors']}"
    through = run_flow(client, flow, relay.address, dest, **args)
    assert through["errors"] == [], f"through the sidecar: {through['errors']}"
    return direct, through


# --- send/receive, transactions, unreceive (both brokers) ------------------------------------

LEFT_BY_MODE = {
    "auto": ["end"],
    "client": ["m2", "m3", "end"],
    "client-individual": ["m1", "m3", "end"],
}


@pytest.mark.parametrize("ack", ["auto", "client", "client-individual"])
@pytest.mark.parametrize("client", ["ruby", "node"])
def test_ack_modes(relay: Relay, client: str, ack: str) -> None:
    """SEND four, receive them in ``ack`` mode, acknowledge some (client: one cumulative ACK;
    client-individual: two), DISCONNECT; a second session finds exactly the rest."""
    direct, through = direct_and_through(relay, client, "ack_modes", ack=ack)
    assert bodies(direct["received"]) == ["m0", "m1", "m2", "m3"]
    assert bodies(direct["left"]) == LEFT_BY_MODE[ack]
    assert normalize(through) == normalize(direct)


@pytest.mark.parametrize("client", ["ruby", "node"])
def test_transaction(relay: Relay, client: str) -> None:
    """BEGIN, SEND, ACK, COMMIT; BEGIN, SEND, ACK, ABORT: the committed SEND arrives and its
    ACK holds, the aborted SEND never arrives and its message is still on the queue."""
    direct, through = direct_and_through(relay, client, "transaction")
    assert bodies(direct["received"]) == ["m0", "m1"]
    assert bodies(direct["after"]) == ["t1", "end1"]
    assert bodies(direct["left"]) == ["m1", "end2"]
    assert normalize(through) == normalize(direct)


@pytest.mark.parametrize("ack", ["auto", "client"])
def test_ruby_unreceive_copy_arrives(relay: Relay, ack: str) -> None:
    """The gem's unreceive re-publishes a received message with its headers copied (in a
    transaction of its own): the copy arrives through the sidecar as it does directly (it
    used to be hidden as a duplicate), with ``retry_count`` 1 and the app's header."""
    direct, through = direct_and_through(relay, "ruby", "unreceive", ack=ack)
    assert direct["copy"]["body"] == "m0"
    assert direct["copy"]["headers"]["retry_count"] == "1"
    assert direct["copy"]["headers"]["x-app"] == "keep"
    assert bodies(direct["after"]) == ["end1"]
    assert bodies(direct["left"]) == ["end2"]
    assert normalize(through) == normalize(direct)


@pytest.mark.parametrize("client", ["ruby", "node"])
def test_rabbitmq_message_receipt_header(rmq_relay: Relay, client: str) -> None:
    """Which MESSAGEs carry a ``receipt`` header is the same both ways (values aside): RabbitMQ
    copies a SEND's ``receipt`` into the MESSAGE, and the consumer's sidecar removes the one a
    producer's sidecar requested (``<session>-r<n>``); before, every MESSAGE through the sidecar
    carried one."""
    direct, through = direct_and_through(rmq_relay, client, "ack_modes", ack="auto")
    assert normalize(through, receipt_header=True) == normalize(direct, receipt_header=True)


# --- failover: kill -9 of the ActiveMQ primary (shared-store pair) ---------------------------


def _metric(sidecar: SidecarThread, name: str) -> float:
    """Sum of every sample of ``mq_sidecar_<name>_total`` on the sidecar's /metrics."""
    admin = sidecar.statistics().admin_listen
    assert admin is not None
    with urllib.request.urlopen(f"http://{admin[0]}:{admin[1]}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    pattern = rf"^mq_sidecar_{name}_total(?:\{{[^}}]*\}})? (\S+)$"
    return sum(float(v) for v in re.findall(pattern, text, re.MULTILINE))


@contextmanager
def _started(
    argv: list[str], stderr: Path
) -> Iterator[tuple[subprocess.Popen[str], queue.Queue[str | None]]]:
    """A running flow program (its stderr to the file ``stderr``) and the queue of its stdout
    lines (None at EOF); killed if still running at the end."""
    with stderr.open("w") as errors:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=errors, text=True)
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    reader = threading.Thread(target=pump, name="client-stdout", daemon=True)
    reader.start()
    try:
        yield proc, lines
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        reader.join(10)
        assert proc.stdout is not None
        proc.stdout.close()


def _run_with_kill(
    argv: list[str], primary: ActiveMQ, kill_at: int, stderr: Path
) -> tuple[Json, float, int]:
    """Run the failover program; SIGKILL ``primary`` once it has consumed ``kill_at``
    messages. Returns the result, seconds from the kill to the result, and how many
    messages the client had consumed when the kill was done."""
    killed_at = 0.0
    consumed_at_kill = -1
    deadline = time.monotonic() + FLOW_TIMEOUT + 30
    with _started(argv, stderr) as (_proc, lines):
        while True:
            try:
                line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"{argv[1]}: no result within the deadline") from None
            if line is None:
                raise AssertionError(f"{argv[1]} ended without a result: {stderr.read_text()}")
            if not line.strip():
                continue
            data: Json = json.loads(line)
            if "progress" not in data:
                return data, time.monotonic() - killed_at, consumed_at_kill
            received = int(data["progress"]["received"])
            if consumed_at_kill < 0 and received >= kill_at:
                primary.kill()
                killed_at = time.monotonic()
                consumed_at_kill = received


@pytest.mark.parametrize("client", ["ruby", "node"])
def test_failover_kill9_primary(
    activemq_pair: ActiveMQPairFactory, client: str, tmp_path: Path
) -> None:
    """The client publishes (a receipt per SEND) and consumes (client-individual) while the
    primary of a shared-store pair is killed with SIGKILL: through the sidecar it gets every
    receipt and every message exactly once, as directly against a broker that stays up."""
    primary, backup = activemq_pair(lock_sleep_ms=200)
    dest = unique("/queue/oc-failover")
    expected = [f"m{i}" for i in range(FAILOVER_COUNT)] + ["end"]

    direct = run_flow(
        client, "failover", (primary.host, primary.stomp_port), dest, count=FAILOVER_COUNT
    )
    assert direct["errors"] == []
    assert direct["received"] == expected
    assert direct["receipts"] == FAILOVER_COUNT

    config = sidecar_config(f"failover:({primary.stomp_url},{backup.stomp_url})", **FAST)
    with SidecarThread(config) as sidecar:
        argv = command(client, "failover", sidecar.address, dest, count=FAILOVER_COUNT, timeout=45)
        through, after_kill_s, consumed_at_kill = _run_with_kill(
            argv, primary, int(FAILOVER_COUNT * KILL_AT), tmp_path / "client.stderr"
        )
        failovers = _metric(sidecar, "failovers")
        hidden = _metric(sidecar, "duplicates_suppressed")
        replayed = _metric(sidecar, "replayed_frames")

    counts: Counter[str] = Counter(through.get("received", []))
    lost = [body for body in expected if counts[body] == 0]
    duplicates = {body: n for body, n in counts.items() if n > 1}
    print(
        f"\n[{through['client']} failover] consumed_at_kill={consumed_at_kill} "
        f"finished_after_kill_ms={after_kill_s * 1000:.0f} received={sum(counts.values())} "
        f"lost={len(lost)} duplicates={len(duplicates)} "
        f"in_order={through.get('received') == expected} "
        f"receipts={through.get('receipts')} failovers={failovers:.0f} hidden={hidden:.0f} "
        f"replayed={replayed:.0f}"
    )
    assert through["errors"] == []
    assert 0 <= consumed_at_kill < FAILOVER_COUNT, "the kill came after the flow"
    assert failovers >= 2, "both sessions (producer, consumer) failed over"
    assert (lost, duplicates) == ([], {})
    assert through["receipts"] == FAILOVER_COUNT
    assert through["received"] == direct["received"], "in the order sent, as directly"
