"""The test bed itself, against the real brokers: readiness, round trips, stop, crash, hang.

Budget: well under 30 s of wall time (one RabbitMQ node for the session ~5 s, a second one
for the crash/restart test ~5 s + ~5 s, ActiveMQ brokers ~0.7 s each).
"""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import pytest
import stomp

from testbed import (
    ActiveMQ,
    BrokerError,
    BrokerProcess,
    RabbitMQ,
    free_port,
    wait_stomp,
)
from testbed.broker import process_alive
from testbed.probe import stomp_handshake
from testbed.sidecar import SidecarError, SidecarProcess, metric_total

pytestmark = pytest.mark.timeout(120)

#: Parametrization over the two session brokers, each with its marker.
BOTH_BROKERS = [
    pytest.param("activemq", marks=pytest.mark.activemq),
    pytest.param("rabbitmq", marks=pytest.mark.rabbitmq),
]

#: Seconds to wait for one frame from a broker in these tests.
FRAME_TIMEOUT = 10.0


class _Frames:
    """stomp.py listener (duck-typed: stomp.py looks up ``on_<frame>`` by name)."""

    def __init__(self) -> None:
        self.messages: queue.Queue[Any] = queue.Queue()
        self.receipts: queue.Queue[str] = queue.Queue()
        self.errors: queue.Queue[Any] = queue.Queue()

    def on_message(self, frame: Any) -> None:
        self.messages.put(frame)

    def on_receipt(self, frame: Any) -> None:
        self.receipts.put(frame.headers["receipt-id"])

    def on_error(self, frame: Any) -> None:
        self.errors.put(frame)

    def receipt(self) -> str:
        return self.receipts.get(timeout=FRAME_TIMEOUT)

    def message(self) -> Any:
        return self.messages.get(timeout=FRAME_TIMEOUT)


@contextmanager
def stomp_client(broker: BrokerProcess) -> Iterator[tuple[Any, _Frames]]:
    """A connected stomp.py 1.2 client for ``broker`` (CONNECT host header = broker.vhost)."""
    conn = stomp.Connection12(
        [(broker.host, broker.stomp_port)],
        vhost=broker.vhost,
        heartbeats=(0, 0),
        reconnect_attempts_max=1,
    )
    frames = _Frames()
    conn.set_listener("frames", frames)
    conn.connect(wait=True)
    try:
        yield conn, frames
    finally:
        if conn.is_connected():
            conn.disconnect()


def round_trip(broker: BrokerProcess) -> None:
    """SEND (with receipt) a persistent message to a fresh queue and receive it back."""
    dest = f"/queue/testbed-{uuid.uuid4().hex[:12]}"
    body = f"hello {broker.name}"
    with stomp_client(broker) as (conn, frames):
        conn.subscribe(dest, id="s1", ack="client-individual")
        conn.send(dest, body, headers={"persistent": "true", "receipt": "r-send"})
        assert frames.receipt() == "r-send"
        msg = frames.message()
        assert msg.body == body
        assert msg.headers["destination"] == dest
        conn.ack(msg.headers["ack"])
        assert frames.errors.empty()


def start_and_wait(broker: BrokerProcess) -> None:
    """``start()`` then ``wait_ready()`` (either may raise ``BrokerError``)."""
    broker.start()
    broker.wait_ready(timeout=30.0)


def port_is_bindable(port: int) -> bool:
    """True if a listener could bind 127.0.0.1:port now (SO_REUSEADDR, as brokers do)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def test_free_port_is_bindable() -> None:
    assert port_is_bindable(free_port())


def test_wait_stomp_times_out_naming_the_address() -> None:
    port = free_port()
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=f"127.0.0.1:{port}"):
        wait_stomp("127.0.0.1", port, timeout=0.3)
    assert time.monotonic() - started < 2.0


@pytest.mark.parametrize("fixture", BOTH_BROKERS)
def test_broker_answers_connected(fixture: str, request: pytest.FixtureRequest) -> None:
    broker: BrokerProcess = request.getfixturevalue(fixture)
    assert broker.running()
    assert wait_stomp(broker.host, broker.stomp_port, timeout=5.0, vhost=broker.vhost) < 5.0
    reply = stomp_handshake(broker.host, broker.stomp_port, timeout=5.0, vhost=broker.vhost)
    assert reply.connected
    assert reply.headers["version"] == "1.2"
    assert broker.stomp_url.startswith(f"stomp://127.0.0.1:{broker.stomp_port}")


@pytest.mark.parametrize("fixture", BOTH_BROKERS)
def test_stomp_py_round_trip(fixture: str, request: pytest.FixtureRequest) -> None:
    round_trip(request.getfixturevalue(fixture))


def test_rabbitmq_specifics(rabbitmq: RabbitMQ) -> None:
    assert rabbitmq.stomp_url == f"stomp://127.0.0.1:{rabbitmq.stomp_port}?host=/"
    # The CONNECT host header is the vhost: anything but "/" is refused (gotcha 8.7).
    bad = stomp_handshake(rabbitmq.host, rabbitmq.stomp_port, timeout=5.0, vhost="127.0.0.1")
    assert not bad.connected
    assert "access denied" in bad.describe().lower()
    dest = f"ctl-{uuid.uuid4().hex[:8]}"
    with stomp_client(rabbitmq) as (conn, frames):
        conn.send(f"/queue/{dest}", "x", headers={"persistent": "true", "receipt": "r1"})
        assert frames.receipt() == "r1"
    listing = rabbitmq.rabbitmqctl("list_queues", "-q", "name", "messages")
    assert any(line.split() == [dest, "1"] for line in listing.splitlines()), listing
    # beam.smp is the process to signal, not the sh wrapper.
    pid = rabbitmq.pid
    assert pid is not None
    assert Path(f"/proc/{pid}/comm").read_text().strip() == "beam.smp"


@pytest.mark.parametrize("fixture", BOTH_BROKERS)
def test_suspend_resume(fixture: str, request: pytest.FixtureRequest) -> None:
    broker: BrokerProcess = request.getfixturevalue(fixture)
    broker.suspend()
    try:
        # A hung broker: the kernel still completes the TCP handshake, nothing answers.
        with pytest.raises(TimeoutError):
            wait_stomp(broker.host, broker.stomp_port, timeout=0.5, vhost=broker.vhost)
        assert broker.running()
    finally:
        broker.resume()
    assert wait_stomp(broker.host, broker.stomp_port, timeout=5.0, vhost=broker.vhost) < 1.0


@pytest.mark.activemq
def test_activemq_stop_frees_port_and_is_idempotent(tmp_path: Path) -> None:
    broker = ActiveMQ("solo", tmp_path)
    with broker:
        pid = broker.pid
        assert pid is not None
        assert Path(f"/proc/{pid}/comm").read_text().strip() == "java"
        assert not port_is_bindable(broker.stomp_port)
        round_trip(broker)
    assert not broker.running()
    assert broker.pid is None
    assert not process_alive(pid)
    assert port_is_bindable(broker.stomp_port)
    broker.stop()  # idempotent
    # Restart on the same port and store: the stopped broker released both.
    with broker:
        round_trip(broker)
    assert port_is_bindable(broker.stomp_port)


@pytest.mark.activemq
def test_activemq_start_failure_raises_with_log_tail(tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))  # bound, not listening: connects are refused
        port = squatter.getsockname()[1]
        broker = ActiveMQ("clash", tmp_path, stomp_port=port)
        with pytest.raises(BrokerError, match="Address already in use"):
            start_and_wait(broker)
        assert not broker.running()
    broker.stop()


def test_activemq_pair_failover(
    activemq_pair: Callable[..., tuple[ActiveMQ, ActiveMQ]],
) -> None:
    primary, backup = activemq_pair()
    assert backup.is_backup_waiting()
    assert not primary.is_backup_waiting()
    # A waiting backup has no listener at all.
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((backup.host, backup.stomp_port), timeout=2.0).close()
    dest = f"/queue/failover-{uuid.uuid4().hex[:8]}"
    with stomp_client(primary) as (conn, frames):
        conn.send(dest, "survives", headers={"persistent": "true", "receipt": "r-p"})
        assert frames.receipt() == "r-p"
    primary.kill()
    assert not primary.running()
    takeover = wait_stomp(backup.host, backup.stomp_port, timeout=10.0, vhost=backup.vhost)
    assert takeover < 5.0
    assert not backup.is_backup_waiting()
    with stomp_client(backup) as (conn, frames):
        conn.subscribe(dest, id="s", ack="auto")
        assert frames.message().body == "survives"


@pytest.mark.long
@pytest.mark.rabbitmq
def test_rabbitmq_crash_and_restart(tmp_path: Path) -> None:
    node = RabbitMQ("crash", tmp_path)
    with node:
        dest = f"/queue/durable-{uuid.uuid4().hex[:8]}"
        with stomp_client(node) as (conn, frames):
            conn.send(dest, "kept", headers={"persistent": "true", "receipt": "r"})
            assert frames.receipt() == "r"
        beam = node.pid
        assert beam is not None
        node.kill()
        assert not node.running()
        assert not process_alive(beam)
        assert port_is_bindable(node.stomp_port)
        # Same ports, same mnesia: the persistent message survived kill -9 (docs/brokers.md).
        node.start()
        node.wait_ready()
        with stomp_client(node) as (conn, frames):
            conn.subscribe(dest, id="s", ack="auto")
            assert frames.message().body == "kept"
    assert not node.running()
    assert port_is_bindable(node.stomp_port)
    assert port_is_bindable(node.epmd_port)


_ORPHAN_SCRIPT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from testbed import ActiveMQ
    broker = ActiveMQ("orphan", Path(sys.argv[1]))
    broker.start()
    broker.wait_ready()
    print(broker.pid, flush=True)
    if sys.argv[2] == "exit":
        sys.exit(0)  # no stop(): the finalizer stops it at interpreter exit
    time.sleep(600)
    """
)


@pytest.mark.activemq
@pytest.mark.parametrize("how", ["exit", "sigkill"])
def test_no_broker_outlives_its_owner(how: str, tmp_path: Path) -> None:
    with subprocess.Popen(
        [sys.executable, "-c", _ORPHAN_SCRIPT, str(tmp_path), how],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parent.parent,
    ) as owner:
        try:
            assert owner.stdout is not None
            jvm = int(owner.stdout.readline())
            assert process_alive(jvm)
            if how == "sigkill":
                os.kill(owner.pid, signal.SIGKILL)
            owner.wait(timeout=30)
            deadline = time.monotonic() + 10.0
            while process_alive(jvm) and time.monotonic() < deadline:
                time.sleep(0.02)
            assert not process_alive(jvm)
        finally:
            if owner.poll() is None:
                owner.kill()


# --- the sidecar as a child process (testbed.sidecar) -------------------------------------


@pytest.mark.activemq
@pytest.mark.parametrize("readiness", ["stomp", "readyz"])
def test_sidecar_process_round(
    readiness: Literal["stomp", "readyz"],
    activemq: ActiveMQ,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Config file from options (the caller's MQ_SIDECAR_* ignored), readiness, the admin
    plane, /proc readers, the log, and an orderly stop with the exit status."""
    monkeypatch.setenv("MQ_SIDECAR_LISTEN", "nowhere")  # would be a configuration error
    sidecar = SidecarProcess(
        "sc",
        tmp_path,
        brokers=activemq.stomp_url,
        options={"log_level": "info", "retry_interval": 50},
        readiness=readiness,
    )
    with sidecar:
        assert sidecar.config_path == tmp_path / "sc" / "mq-sidecar.toml"
        assert "retry_interval = 50" in sidecar.config_path.read_text()
        assert sidecar.get("/healthz") == (200, b"ok\n")
        assert sidecar.broker_ports == {activemq.stomp_port}
        assert "sessions_open" in sidecar.status()
        assert "mq_sidecar_upstream_connected" in sidecar.metrics()
        assert sidecar.cpu_seconds() > 0
        assert sidecar.peak_rss_kib() >= sidecar.rss_kib() > 0
        assert sidecar.fd_count() > 3
        with stomp_client(sidecar) as (conn, frames):
            counts = sidecar.sockets()
            assert counts.app == 1
            assert counts.upstream >= 1
            dest = f"/queue/testbed-sidecar-{uuid.uuid4().hex[:8]}"
            conn.subscribe(dest, id="s", ack="auto")
            conn.send(dest, "through", headers={"receipt": "r"})
            assert frames.receipt() == "r"
            assert frames.message().body == "through"
            connected = metric_total(sidecar.metrics(), "mq_sidecar_upstream_connected")
            assert connected >= 1
        running_code = sidecar.returncode
    assert running_code is None
    assert not sidecar.running()
    assert sidecar.returncode == 0
    assert "shutdown complete" in sidecar.log_text()
    assert sidecar.error_log_lines() == []
    with pytest.raises(SidecarError, match="not running"):
        sidecar.rss_kib()


@pytest.mark.activemq
def test_sidecar_process_killed_restarts_on_the_same_ports(
    activemq: ActiveMQ, tmp_path: Path
) -> None:
    """kill -9 and start again (the drill's --kill-sidecar): same STOMP and admin ports, same
    configuration file (so the same outbox_dir), a new process, the log appended to. The
    restart runs in a thread that ends at once, as the drill's does: the sidecar must not get
    the parent-death signal when that thread ends (Linux sends it per thread)."""
    outbox = tmp_path / "outbox"
    sidecar = SidecarProcess(
        "sc",
        tmp_path,
        brokers=activemq.stomp_url,
        options={"outbox": True, "outbox_dir": str(outbox)},
        readiness="readyz",
        parent_death=signal.SIGTERM,
    )
    with sidecar:
        first, ports = sidecar.pid, (sidecar.port, sidecar.admin_port)
        assert first is not None
        sidecar.kill()
        assert not process_alive(first)
        assert sidecar.returncode == -signal.SIGKILL
        restart = threading.Thread(target=start_and_wait, args=(sidecar,))
        restart.start()
        restart.join(60.0)
        assert not restart.is_alive()
        assert sidecar.pid not in (None, first)
        assert (sidecar.port, sidecar.admin_port) == ports
        assert f'outbox_dir = "{outbox}"' in sidecar.config_path.read_text()
        assert sidecar.status()["outbox"]["frames"] == 0, "the same outbox_dir, unlocked"
        with stomp_client(sidecar) as (conn, frames):
            dest = f"/queue/testbed-restart-{uuid.uuid4().hex[:8]}"
            conn.send(dest, "after the restart", headers={"receipt": "r"})
            assert frames.receipt() == "r"
        assert "received SIGTERM" not in sidecar.log_text(), "signalled when the thread ended"
    assert sidecar.returncode == 0
    assert (tmp_path / "sc.log").read_text().count("starting server") == 2


def test_sidecar_process_that_cannot_start_says_why(tmp_path: Path) -> None:
    sidecar = SidecarProcess("bad", tmp_path, brokers="not a url", readiness="readyz")
    with pytest.raises(SidecarError, match=r"exited (at once )?with code 2") as info:
        start_and_wait(sidecar)
    assert "brokers" in str(info.value)  # the log's tail names the problem
    assert sidecar.returncode == 2


_SIDECAR_ORPHAN_SCRIPT = textwrap.dedent(
    """
    import signal, sys, time
    from pathlib import Path
    from testbed.sidecar import SidecarProcess
    sidecar = SidecarProcess(
        "orphan", Path(sys.argv[1]), brokers=sys.argv[2],
        parent_death=signal.Signals[sys.argv[3]],
    )
    sidecar.start()
    sidecar.wait_ready()
    print(sidecar.pid, flush=True)
    time.sleep(600)
    """
)


@pytest.mark.activemq
@pytest.mark.parametrize("parent_death", ["SIGKILL", "SIGTERM"])
def test_no_sidecar_outlives_its_owner(
    parent_death: str, activemq: ActiveMQ, tmp_path: Path
) -> None:
    """SIGKILL of the harness: the sidecar is killed (SIGKILL) or drains and exits (SIGTERM)."""
    with subprocess.Popen(
        [sys.executable, "-c", _SIDECAR_ORPHAN_SCRIPT, str(tmp_path), activemq.stomp_url,
         parent_death],
        stdout=subprocess.PIPE,
        text=True,
    ) as owner:  # fmt: skip
        try:
            assert owner.stdout is not None
            pid = int(owner.stdout.readline())
            assert process_alive(pid)
            os.kill(owner.pid, signal.SIGKILL)
            owner.wait(timeout=30)
            deadline = time.monotonic() + 20.0
            while process_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.02)
            assert not process_alive(pid)
        finally:
            if owner.poll() is None:
                owner.kill()
    log = (tmp_path / "orphan.log").read_text()
    assert ("shutdown complete" in log) == (parent_death == "SIGTERM"), log[-2000:]
