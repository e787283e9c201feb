"""Transactions across a broker loss, against real brokers (issue 36): a transaction that lost
a frame to ``call_timeout`` while the sidecar reconnected is never committed in part.

The chaos soak confirmed a COMMIT whose ActiveMQ stored two of its five SENDs: the first SENDs
reached the broker, the broker was lost, the next SENDs were dropped at ``call_timeout`` while
the session reconnected (the app got an ERROR for each), and the COMMIT, handed over later and
not due yet, was replayed after the transaction's first part on the new connection, which the
broker committed. Here the same interleaving on purpose, on ActiveMQ and RabbitMQ, in both
``transaction_failover`` modes: the broker's connection is reset by a fault proxy that then
refuses new ones until the dropped SENDs have their ERRORs; the COMMIT must get an ERROR naming
the transaction rolled back, and the queue, read straight from the broker, must hold nothing of
it. Before the fix the COMMIT got its RECEIPT and the queue held the first two messages.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from protocol import Command, Frame
from testbed import BrokerProcess, RabbitMQ
from tests.faultproxy import FaultProxy
from tests.integration.support import RawClient, SidecarThread, sidecar_config, unique

#: Fast reconnects; a short call_timeout, so the SENDs handed over during the outage are dropped.
FAST = {
    "retry_interval": "50",
    "max_retry_interval": "200",
    "connect_timeout": "2000",
    "call_timeout": "1000",
}
TX = "tx1"


@pytest.fixture(params=["activemq", "rabbitmq"])
def broker(request: pytest.FixtureRequest) -> BrokerProcess:
    """The real broker of this run (the session's ActiveMQ or RabbitMQ)."""
    found: BrokerProcess = request.getfixturevalue(request.param)
    return found


@pytest.fixture
def proxy(broker: BrokerProcess) -> Iterator[FaultProxy]:
    with FaultProxy((broker.host, broker.stomp_port)) as faults:
        yield faults


def url(proxy: FaultProxy, broker: BrokerProcess) -> str:
    suffix = "?host=/" if isinstance(broker, RabbitMQ) else ""
    return f"stomp://127.0.0.1:{proxy.port}{suffix}"


def answer(app: RawClient, receipt: str) -> Frame:
    """The RECEIPT or ERROR answering ``receipt`` (other frames skipped: events, none here)."""
    for _ in range(100):
        frame = app.frame()
        if frame.get("receipt-id") == receipt:
            return frame
    raise AssertionError(f"no answer to {receipt}")


def sent_in_order(broker: BrokerProcess, queue: str) -> list[bytes]:
    """The bodies on ``queue``, read straight from the broker: up to a marker sent there now
    (so the read ends on an event, not on a quiet period)."""
    reader = RawClient((broker.host, broker.stomp_port))
    reader.connect()
    reader.send_frame("SEND", {"destination": queue, "receipt": "marker"}, b"marker")
    assert answer(reader, "marker").command is Command.RECEIPT
    reader.send_frame("SUBSCRIBE", {"destination": queue, "id": "1", "ack": "auto"})
    bodies: list[bytes] = []
    for _ in range(100):
        frame = reader.frame()
        if frame.command is Command.MESSAGE:
            if frame.body == b"marker":
                reader.close()
                return bodies
            bodies.append(frame.body)
    raise AssertionError(f"no marker on {queue}")


@pytest.mark.parametrize("mode", ["replay", "rollback"])
def test_a_transaction_that_lost_a_send_at_call_timeout_is_not_committed(
    broker: BrokerProcess, proxy: FaultProxy, mode: str
) -> None:
    queue = unique("/queue/tx-timeout")
    barrier = unique("/queue/tx-barrier")
    config = sidecar_config(url(proxy, broker), transaction_failover=mode, **FAST)
    with SidecarThread(config) as sidecar:
        app = RawClient(sidecar.address)
        app.connect()
        app.send_frame("BEGIN", {"transaction": TX, "receipt": "begin"})
        assert answer(app, "begin").command is Command.RECEIPT
        for n in (0, 1):
            app.send_frame("SEND", {"destination": queue, "transaction": TX}, f"m{n}".encode())
        # Outside the transaction, after it on the same connection: once confirmed, the
        # broker has read SENDs 0 and 1 (RabbitMQ confirms them only at COMMIT).
        app.send_frame("SEND", {"destination": barrier, "receipt": "barrier"}, b"b")
        assert answer(app, "barrier").command is Command.RECEIPT

        proxy.refuse(True)
        proxy.reset()
        for n in (2, 3):
            app.send_frame(
                "SEND",
                {"destination": queue, "transaction": TX, "receipt": f"r{n}"},
                f"m{n}".encode(),
            )
        error = answer(app, "r2")
        assert error.command is Command.ERROR, error
        assert "within 1000 ms" in (error.get("message") or ""), error
        # SEND 3 was dropped at the same time, or taken out unsent with its transaction: an
        # ERROR, or its RECEIPT as in a transaction a failover rolled back (the COMMIT fails).
        answer(app, "r3")
        app.send_frame("COMMIT", {"transaction": TX, "receipt": "commit"})
        proxy.refuse(False)
        outcome = answer(app, "commit")

        assert outcome.command is Command.ERROR, f"COMMIT confirmed: {outcome}"
        assert f"transaction '{TX}' rolled back" in (outcome.get("message") or ""), outcome
        assert outcome.get("mq-sidecar-outcome") == "rolled_back"
        # The session goes on, on the broker it reconnected to.
        app.send_frame("SEND", {"destination": queue, "receipt": "after"}, b"after")
        assert answer(app, "after").command is Command.RECEIPT
        app.close()
    assert sent_in_order(broker, queue) == [b"after"]


def open_transaction_across_a_reset(app: RawClient, proxy: FaultProxy, queue: str) -> None:
    """BEGIN and SENDs 0 and 1 read by the broker, its connection reset, then SENDs 2 and 3
    and the COMMIT (receipt ``commit``) handed over while the sidecar reconnects."""
    app.send_frame("BEGIN", {"transaction": TX, "receipt": "begin"})
    assert answer(app, "begin").command is Command.RECEIPT
    for n in (0, 1):
        app.send_frame("SEND", {"destination": queue, "transaction": TX}, f"m{n}".encode())
    app.send_frame("SEND", {"destination": unique("/queue/tx-barrier"), "receipt": "barrier"})
    assert answer(app, "barrier").command is Command.RECEIPT
    proxy.reset()
    for n in (2, 3):
        app.send_frame("SEND", {"destination": queue, "transaction": TX}, f"m{n}".encode())
    app.send_frame("COMMIT", {"transaction": TX, "receipt": "commit"})


@pytest.mark.parametrize("mode", ["replay", "rollback"])
def test_a_transaction_open_across_a_reconnect_commits_whole_or_not_at_all(
    broker: BrokerProcess, proxy: FaultProxy, mode: str
) -> None:
    """A transaction whose first SENDs were on the lost connection: in ``replay`` mode it is
    re-run whole on the new one (BEGIN, every SEND in order) before its COMMIT, which commits
    all four messages once; in ``rollback`` mode its COMMIT gets an ERROR and nothing of it is
    committed. Never a RECEIPT for a COMMIT of part of it."""
    queue = unique("/queue/tx-whole")
    config = sidecar_config(url(proxy, broker), transaction_failover=mode, **FAST)
    with SidecarThread(config) as sidecar:
        app = RawClient(sidecar.address)
        app.connect()
        open_transaction_across_a_reset(app, proxy, queue)
        outcome = answer(app, "commit")
        app.close()
    if mode == "replay":
        assert outcome.command is Command.RECEIPT, outcome
        assert sent_in_order(broker, queue) == [b"m0", b"m1", b"m2", b"m3"]
    else:
        # Rolled back; or "in doubt" when the sidecar wrote the COMMIT to the reset connection
        # before it saw the reset (the broker never read it: the proxy had reset both sides).
        assert outcome.command is Command.ERROR, outcome
        message = outcome.get("message") or ""
        assert f"transaction '{TX}' rolled back" in message or "in doubt" in message, outcome
        assert sent_in_order(broker, queue) == []
