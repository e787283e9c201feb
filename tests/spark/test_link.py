"""The data source's STOMP connection (``mq_sidecar_spark._link.Link``, the writer's and the
streaming reader's) under a hung broker, driven as the writer drives it: every wait ends within
``timeout`` (issue 26: "never a hang"). No Spark here: the connection is driven directly,
against a real ActiveMQ (its own, since it is suspended) behind a real sidecar.

A broker stopped with SIGSTOP keeps its TCP connections open and answers nothing, so the
sidecar forwards the SEND and no receipt ever comes back: the task's wait must end by itself.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from mq_sidecar_spark._link import Link
from mq_sidecar_spark.errors import StompTimeout
from testbed import ActiveMQ
from testbed.sidecar import SidecarProcess
from tests.spark.conftest import SIDECAR_OPTIONS
from tests.spark.support import unique


@pytest.mark.activemq
def test_no_receipt_from_a_hung_broker_ends_within_timeout(tmp_path: Path) -> None:
    """Connected while the broker answers; then it hangs: one SEND asking a receipt, and the
    wait for it raises StompTimeout after ``timeout`` (2 s), not later; closing the failed
    connection does not wait either."""
    broker = ActiveMQ("hung", tmp_path / "amq")
    with broker:
        sidecar = SidecarProcess(
            "hung-sidecar", tmp_path, brokers=broker.stomp_url, options=SIDECAR_OPTIONS
        )
        with sidecar:
            link = Link("127.0.0.1", sidecar.port, None, None, timeout=2.0)
            link.open()
            link.send(unique(), b"{}", {"mq-sidecar-id": "a"}, "r1")
            link.wait_below(1, "after the first SEND")  # the broker answers
            assert link.receipts == 1
            broker.suspend()
            try:
                link.send(unique(), b"{}", {"mq-sidecar-id": "b"}, "r2")
                started = time.monotonic()
                with pytest.raises(StompTimeout, match=r"within 2 s after 1 SENDs \(1 outstanding"):
                    link.wait_below(1, "after 1 SENDs")
                waited = time.monotonic() - started
                started = time.monotonic()
                link.close(graceful=False)
                closing = time.monotonic() - started
            finally:
                broker.resume()
    assert 1.9 < waited < 5.0
    assert closing < 2.0


def send_many(link: Link, body: bytes, count: int) -> None:
    for n in range(count):
        link.send("/queue/stuck", body, {"mq-sidecar-id": f"s{n}"}, None)


@pytest.mark.activemq
def test_a_send_the_sidecar_does_not_read_ends_within_timeout(tmp_path: Path) -> None:
    """The broker hangs and the sidecar's confirmation window (64 KiB here) fills: the sidecar
    stops reading its app (backpressure, docs/behaviour.md, "Confirmation window"), the TCP
    buffers fill, and a SEND blocks in the socket write. The watchdog ends it after
    ``timeout`` (2 s) with StompTimeout."""
    broker = ActiveMQ("stuck", tmp_path / "amq")
    body = b"x" * (1 << 20)
    with broker:
        sidecar = SidecarProcess(
            "stuck-sidecar",
            tmp_path,
            brokers=broker.stomp_url,
            options={**SIDECAR_OPTIONS, "confirmation_window_size": 65536},
        )
        with sidecar:
            link = Link("127.0.0.1", sidecar.port, None, None, timeout=2.0)
            link.open()
            broker.suspend()
            started = time.monotonic()
            try:
                with pytest.raises(StompTimeout, match="blocked for more than 2 s"):
                    send_many(link, body, 64)  # 64 MiB at most: far more than buffers hold
                elapsed = time.monotonic() - started
                link.close(graceful=False)
            finally:
                broker.resume()
    assert elapsed < 30.0
