"""Open transactions do not grow the sidecar (issue 16, "every buffer bounded"): 1 GiB driven
through a real sidecar process to RabbitMQ in transactions, with the sidecar's RSS sampled from
/proc as it goes. RabbitMQ confirms a transaction's SENDs only at its COMMIT, so the sidecar
holds them until then, up to ``max_transaction_size``: the frame past it gets an ERROR naming
the option, the transaction is aborted upstream, and the app goes on with a new one. RSS stays
flat over the whole gibibyte. (ActiveMQ confirms each SEND at once: in ``rollback`` mode the
sidecar holds nothing of a transaction there, tests/proxy/test_session_transaction_limit.py.)
"""

from __future__ import annotations

import select
from collections.abc import Iterator
from pathlib import Path

import pytest

from protocol import Command, Frame
from testbed import RabbitMQ
from testbed.sidecar import SidecarProcess
from tests.integration.support import RawClient

pytestmark = [pytest.mark.rabbitmq, pytest.mark.timeout(300)]

CHUNK = 64 * 1024
MIB = 1 << 20


def rss_bytes(pid: int) -> int:
    """Resident set size of ``pid``, bytes (/proc/PID/status VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


@pytest.fixture
def sidecar(tmp_path: Path, rabbitmq: RabbitMQ) -> Iterator[SidecarProcess]:
    process = SidecarProcess(
        "sidecar",
        tmp_path,
        brokers=rabbitmq.stomp_url,
        options={"max_transaction_size": 16 * MIB, "log_level": "warning"},
    )
    process.start()
    try:
        process.wait_ready(60)
        yield process
    finally:
        process.stop()


def test_1_gib_in_transactions_past_max_transaction_size_leaves_rss_flat(
    sidecar: SidecarProcess,
) -> None:
    pid = sidecar.pid
    assert pid is not None
    app = RawClient(sidecar.address)
    app.connect(login="guest", passcode="guest")
    body = b"m" * CHUNK
    samples: list[int] = []
    errors: list[str] = []
    sent = 0
    tx = 0
    app.send_frame("BEGIN", {"transaction": "t0"})
    while sent < 1 << 30:
        app.send_frame("SEND", {"destination": "/queue/tx-memory", "transaction": f"t{tx}"}, body)
        sent += CHUNK
        if sent % (4 * MIB):
            continue
        samples.append(rss_bytes(pid))
        arrived: list[Frame] = []
        while select.select([app.sock], [], [], 0.01 if arrived else 0)[0]:
            arrived.append(app.frame())  # the sidecar's ERRORs: for the frame past the limit,
        # then for the frames still sent in the aborted transaction
        assert all(f.command is Command.ERROR for f in arrived), arrived
        errors += [f.get("message") or "" for f in arrived]
        if any(e.startswith(f"transaction 't{tx}' aborted") for e in errors[-len(arrived) :]):
            tx += 1  # go on with a new transaction
            app.send_frame("BEGIN", {"transaction": f"t{tx}"})
    app.send_frame("ABORT", {"transaction": f"t{tx}", "receipt": "last"})
    while (answer := app.frame()).command is Command.ERROR:
        errors.append(answer.get("message") or "")
    app.close()
    baseline, peak = samples[8], max(samples)  # after the first transaction filled up
    print(
        f"\n[1 GiB in transactions, max_transaction_size 16 MiB] sent {sent / MIB:.0f} MiB in "
        f"{tx + 1} transactions, {len(errors)} aborted by the sidecar; sidecar RSS "
        f"{samples[0] / MIB:.1f} MiB at 4 MiB, {baseline / MIB:.1f} at 36 MiB, peak "
        f"{peak / MIB:.1f}, last {samples[-1] / MIB:.1f}\n  ERROR: {errors[0]}"
    )
    assert answer.command is Command.RECEIPT, answer
    assert tx >= 30  # 1 GiB / 16 MiB, give or take the frames in flight
    assert all("max_transaction_size (16777216 bytes" in e for e in errors), errors
    assert peak - baseline < 16 * MIB, "RSS grew with the traffic"
