"""The broker prober on a loaded machine (issue 36): a broker that answers is never called
down because the prober's own loop ran late or because the broker's answer was slow but
within its bounds; only a check that failed or got no answer within ``stale_after`` does.

No real I/O: trio's MockClock stands for the busy event loop (``jump`` moves the clock while
no task runs, as a loop busy with other work does), and the default probe
(:func:`proxy.admin.health.probe_broker`) talks to a STOMP broker scripted on memory streams.
"""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from config import Broker, Config
from proxy.admin.health import BrokerProber
from proxy.telemetry.vocabulary import ProbeOutcome

A = Broker("127.0.0.1", 61001)

#: broker_probe_interval 200 ms and connect_timeout 2000 ms, as the integration tests run:
#: stale_after is then 3.4 s (with the TLS diagnosis, 2 x 0.5 s).
FAST: dict[str, Any] = {"broker_probe_interval": 200, "connect_timeout": 2000}


async def test_a_prober_woken_late_by_a_busy_loop_keeps_an_answering_broker_up(
    mock_clock: trio.testing.MockClock,
) -> None:
    """The broker answered every check at once; the loop was then busy for 3 s (longer than
    stale_after) before the prober's sleep could end: the broker is still up, read before the
    prober runs again and after its next check."""
    checks: list[float] = []

    async def probe(broker: Broker) -> tuple[ProbeOutcome, str]:
        checks.append(trio.current_time())
        return ProbeOutcome.CONNECTED, "CONNECT answered"

    prober = BrokerProber(Config(brokers=(A,), **FAST), lambda: (), probe=probe)
    assert prober.stale_after == 3.4
    async with trio.open_nursery() as nursery:
        await nursery.start(prober.run)
        await prober.first_round_done.wait()
        (h,) = prober.statistics()
        assert h.state == "up"
        mock_clock.jump(3.0)  # the event loop was busy: no task ran, the prober woke late
        (h,) = prober.statistics()
        assert (h.state, h.detail) == ("up", "CONNECT answered")
        await trio.testing.wait_all_tasks_blocked()  # the late prober checks again
        assert len(checks) == 2
        (h,) = prober.statistics()
        assert (h.state, h.checks, h.failures) == ("up", 2, 0)
        nursery.cancel_scope.cancel()


class SlowBroker:
    """A STOMP broker on a memory stream that answers CONNECT and the probe's DISCONNECT
    receipt each ``delay`` seconds (trio time) late: slow, but within ``connect_timeout``."""

    def __init__(self, nursery: trio.Nursery, delay: float) -> None:
        self.nursery = nursery
        self.delay = delay
        self.connects = 0
        self.goodbyes = 0

    async def open_stream(self, broker: Broker) -> trio.abc.Stream:
        client, server = trio.testing.memory_stream_pair()
        self.nursery.start_soon(self._serve, server)
        return client

    async def _serve(self, stream: trio.abc.Stream) -> None:
        buffer = bytearray()

        async def frame() -> bytes:
            while b"\0" not in buffer:
                data = await stream.receive_some(4096)
                if not data:
                    raise trio.BrokenResourceError
                buffer.extend(data)
            end = buffer.index(b"\0")
            head = bytes(buffer[:end])
            del buffer[: end + 1]
            return head.lstrip(b"\r\n")

        try:
            assert (await frame()).startswith(b"CONNECT")
            self.connects += 1
            await trio.sleep(self.delay)
            await stream.send_all(b"CONNECTED\nversion:1.2\nserver:Slow/1.0\nheart-beat:0,0\n\n\0")
            assert (await frame()).startswith(b"DISCONNECT")
            await trio.sleep(self.delay)
            await stream.send_all(b"RECEIPT\nreceipt-id:mq-sidecar-probe\n\n\0")
            self.goodbyes += 1
        except trio.BrokenResourceError:
            pass
        finally:
            await stream.aclose()


async def test_a_slow_answer_that_arrives_keeps_the_broker_up(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    """A broker that answers CONNECT and the goodbye each 1.9 s late (within connect_timeout,
    2 s) is up at every moment after its first answer: a check lasts 3.8 s in all, longer than
    stale_after (3.4 s), but its answer is counted when CONNECTED arrives and the goodbye is
    bounded on its own."""
    broker = SlowBroker(nursery, delay=1.9)
    config = Config(brokers=(A,), **FAST)
    # the default probe (probe_broker), through the scripted broker's streams
    prober = BrokerProber(config, lambda: (), streams=broker.open_stream)
    states: list[tuple[float, str, str]] = []
    async with trio.open_nursery() as inner:
        await inner.start(prober.run)
        await prober.first_round_done.wait()
        start = trio.current_time()
        while trio.current_time() - start < 20.0:
            (h,) = prober.statistics()
            states.append((trio.current_time() - start, h.state, h.detail))
            await trio.sleep(0.1)
        inner.cancel_scope.cancel()
    assert broker.connects >= 5
    assert broker.goodbyes >= 5
    assert [s for s in states if s[1] != "up"] == []
    (h,) = prober.statistics()
    assert (h.failures, h.last_outcome) == (0, ProbeOutcome.CONNECTED)
    assert h.detail == "CONNECT answered: STOMP 1.2, Slow/1.0"
