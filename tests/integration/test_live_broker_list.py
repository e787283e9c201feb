"""The live broker list against real brokers and a real DNS server (docs/configuration.md, "A
live broker list"; docs/operations.md, "The broker list at run time", "Reload on SIGHUP").

Two independent brokers of one kind, A and B (ActiveMQ; for DNS, RabbitMQ too), behind a
broker list that changes mid-transfer: a producer (persistent SENDs, each with a receipt) and a
consumer (ACKing each MESSAGE) through the sidecar; the list goes from A to B (every session
moves to B, FAILOVER with the reason of the list) and back to A (the consumer gets what A still
holds), and in the end the app has every body exactly once and nothing is left on either
broker.

- By DNS: the SRV name ``_stomp._tcp.mq.test`` served by dnsmasq on loopback (records rewritten
  and dnsmasq restarted; while it is down the lookups fail and the list in force stays).
- By the brokers file and SIGHUP, to a sidecar process: a file that does not parse keeps the
  list in force, its line named; the file with B and a SIGHUP move the sessions; the file with
  A again is followed without a signal (its modification time, looked at every
  ``dns_refresh_interval``, which the SIGHUP shortened).

The diffing and bad input in detail are tests/proxy/test_discovery.py.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from config import parse_broker_url
from proxy.reconnect.resolve import LookupFailed, make_resolver
from testbed import ActiveMQ
from testbed.sidecar import SidecarProcess
from tests.integration.dnsmasq import dnsmasq_server
from tests.integration.support import (
    WAIT,
    Client,
    SidecarThread,
    sidecar_config,
    unique,
    wait_until,
)
from tests.integration.test_evacuation import (  # noqa: F401 (two_brokers: a fixture)
    Broker,
    drain_directly,
    moved,
    settle,
    two_brokers,
)
from tests.integration.test_failover import (
    FAST,
    Consumer,
    Producer,
    exactly_once,
    subscribe_events,
)

#: Messages of each transfer: the list changes at a quarter of them.
N = 1500
CREDENTIALS = ("ops", "ops-secret")
CLIENT = {"client_login": "ops", "client_passcode": "ops-secret"}
SRV_NAME = "_stomp._tcp.mq.test"


class Transfer:
    """The app: a control client watching every session's events, a consumer and a producer
    of ``N`` messages on one queue, through the sidecar at ``address``."""

    def __init__(self, address: tuple[str, int]) -> None:
        self.dest = unique("/queue/live-list")
        self.control = Client(address)
        self.control.connect(*CREDENTIALS)
        subscribe_events(self.control, every_session=True)
        self.consumer = Consumer(address, self.dest, credentials=CREDENTIALS)
        self.producer = Producer(address, self.dest, N, CREDENTIALS, persistent="true")
        self.producer.start()

    def there_and_back(
        self, a: str, b: str, to_b: Callable[[], None], to_a: Callable[[], None]
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int, list[Any]]:
        """At a quarter of the transfer ``to_b()`` (the list becomes B): every session
        moves to B; the producer ends there and the consumer takes what B has; then
        ``to_a()``: back to A for what A still holds. Returns the FAILOVER events each way,
        the receipts and the producer's errors."""
        wait_until(lambda: self.consumer.count() >= N // 4, 60)
        to_b()
        away = moved(self.control, 3, b)
        receipts, errors = self.producer.outcome(60)
        settle(self.consumer)
        to_a()
        back = moved(self.control, 3, a)
        wait_until(lambda: len(set(self.consumer.bodies)) >= N, 60)
        time.sleep(0.5)  # anything shown twice would come now
        return away, back, receipts, errors

    def close(self) -> None:
        self.consumer.close()
        self.producer.client.close()
        self.control.close()

    def check(self, first: Broker, second: Broker) -> str:
        """Exactly once, nothing left on either broker; returns the summary."""
        left = [drain_directly(first, self.dest), drain_directly(second, self.dest)]
        missing, duplicated = exactly_once(self.consumer.bodies, N)
        unseen = [b for bodies in left for b in bodies if b not in self.consumer.bodies]
        assert (missing, duplicated) == (0, 0)
        assert unseen == []
        assert self.consumer.errors == []
        return (
            f"sent={N} consumed={len(self.consumer.bodies)} missing={missing} "
            f"duplicates={duplicated} left_on_brokers={[len(x) for x in left]} "
            f"unseen_left={len(unseen)}"
        )


def in_force(status: dict[str, Any]) -> list[str]:
    return [b["broker"] for b in status["broker_list"]["in_force"]]


def test_a_dns_srv_change_moves_every_session_and_loses_nothing(
    two_brokers: tuple[Broker, Broker],  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """SRV ``_stomp._tcp.mq.test`` -> A; dnsmasq stopped (lookups fail: the list stays A,
    /status names the failed update); restarted with SRV -> B: B joins, A leaves and is
    evacuated; then SRV -> A again: back, nothing lost or twice. ActiveMQ, then RabbitMQ."""
    caplog.set_level(logging.INFO, "mq_sidecar")
    first, second = two_brokers
    with dnsmasq_server(tmp_path, {"a.mq.test": "127.0.0.1", "b.mq.test": "127.0.0.1"}) as dns:
        # the records' targets are looked up through dnsmasq too: the labels are addresses
        a, b = f"127.0.0.1:{first.stomp_port}", f"127.0.0.1:{second.stomp_port}"
        dns.set_records(srv={SRV_NAME: [("a.mq.test", first.stomp_port)]})
        config = sidecar_config(
            f"stomp://{SRV_NAME}?host={first.vhost}",  # RabbitMQ's vhost, as by name
            dns_servers=dns.server,
            dns_refresh_interval="250",
            broker_probe_interval="200",
            login="guest",  # RabbitMQ's default user; ActiveMQ takes anyone
            passcode="guest",
            **CLIENT,
            **FAST,
        )
        with SidecarThread(config) as sidecar:
            assert in_force(sidecar.status()) == [a]
            app = Transfer(sidecar.address)

            def to_b() -> None:
                dns.stop()  # the lookups fail: the last good answer stays
                wait_until(lambda: sidecar.status()["broker_list"]["failed_updates"], 10)
                status = sidecar.status()
                assert in_force(status) == [a]
                (failed,) = status["broker_list"]["failed_updates"]
                assert failed["source"] == f"SRV name {SRV_NAME}"
                assert Counter(s.broker for s in sidecar.statistics().sessions) == {a: 3}
                dns.set_records(srv={SRV_NAME: [("b.mq.test", second.stomp_port)]})

            def to_a() -> None:
                dns.set_records(srv={SRV_NAME: [("a.mq.test", first.stomp_port)]})

            started = time.monotonic()
            away, back, receipts, errors = app.there_and_back(a, b, to_b, to_a)
            took = time.monotonic() - started
            status = sidecar.status()
            app.close()
        summary = app.check(first, second)
    assert receipts == N
    assert errors == []
    reason = "left the broker list (SRV name _stomp._tcp.mq.test no longer resolves to it)"
    assert {e["reason"] for e in away} == {f"broker {a} evacuated: {reason}"}
    assert {e["reason"] for e in back} == {f"broker {b} evacuated: {reason}"}
    assert in_force(status) == [a]
    assert status["broker_list"]["failed_updates"] == []
    lines = [
        m
        for m in caplog.messages
        if m.startswith(("broker list", f"broker {a} evacuated", f"broker {b} evacuated"))
    ]
    kind = type(first).__name__
    print(f"\n[live broker list, DNS, {kind}] {summary} took_s={took:.1f}\n" + "\n".join(lines))
    assert f"broker list updated: {b} joined (SRV name {SRV_NAME}); {a} left; in force: {b}" in (
        lines
    )
    assert any(line.startswith(f"broker {a} evacuated ({reason}): ") for line in lines)


class FileSidecar(SidecarProcess):
    """A sidecar process whose brokers come from its ``brokers_file`` alone."""

    def _prepare(self) -> None:
        super()._prepare()
        text = self.config_path.read_text()
        self.config_path.write_text(
            "\n".join(line for line in text.splitlines() if not line.startswith("brokers =")) + "\n"
        )

    def reconfigure(self, **options: object) -> None:
        """Change options of its configuration file (read at the next SIGHUP)."""
        self.options.update(options)
        self._prepare()

    def sighup(self) -> None:
        assert self.pid is not None
        os.kill(self.pid, signal.SIGHUP)

    def log_lines(self) -> list[str]:
        lines: list[str] = self.log_path.read_text().splitlines()
        return lines


@pytest.mark.activemq
def test_the_brokers_file_and_sighup_move_every_session_and_lose_nothing(
    activemq: ActiveMQ, tmp_path: Path
) -> None:
    """The brokers file names A. A line that does not parse and a SIGHUP: the list stays, the
    broker list's line and the reload's name the file's line, /status the failed update. The
    file with B, the reconnect policy and the refresh interval changed, another
    ``drain_timeout``, SIGHUP: B joins, A leaves, the sessions move; the log line says what was
    applied and that drain_timeout needs a restart. The file with A again, no signal: followed
    within the (new) refresh interval, back to A."""
    with ActiveMQ("file-b", tmp_path) as second:
        a, b = f"127.0.0.1:{activemq.stomp_port}", f"127.0.0.1:{second.stomp_port}"
        path = tmp_path / "brokers.txt"
        path.write_text(f"# the test's brokers\n{activemq.stomp_url}\n")
        sidecar = FileSidecar(
            "file-sidecar",
            tmp_path,
            brokers=activemq.stomp_url,
            options={
                "brokers_file": str(path),
                "dns_refresh_interval": 60_000,
                "broker_probe_interval": 200,
                "log_level": "info",
                **CLIENT,
                **{k: int(v) for k, v in FAST.items()},
            },
            readiness="readyz",
        )
        with sidecar:
            assert in_force(sidecar.status()) == [a]
            app = Transfer(sidecar.address)

            def to_b() -> None:
                path.write_text(f"{activemq.stomp_url}\nstomp://127.0.0.1:0\n")
                sidecar.sighup()
                wait_until(lambda: sidecar.status()["broker_list"]["failed_updates"], WAIT)
                status = sidecar.status()
                (failed,) = status["broker_list"]["failed_updates"]
                assert failed["reason"].startswith("line 2: 'stomp://127.0.0.1:0'")
                assert in_force(status) == [a]
                path.write_text(f"{second.stomp_url}\n")
                sidecar.reconfigure(retry_interval=60, dns_refresh_interval=300, drain_timeout=9000)
                sidecar.sighup()

            def to_a() -> None:
                path.write_text(f"# back\n{activemq.stomp_url}\n")  # no signal this time

            away, back, receipts, errors = app.there_and_back(a, b, to_b, to_a)
            status = sidecar.status()
            app.close()
        summary = app.check(activemq, second)
        log = sidecar.log_lines()
    assert receipts == N
    assert errors == []
    leaving = f"left the broker list (brokers_file {path} no longer names it)"
    assert {e["reason"] for e in away} == {f"broker {a} evacuated: {leaving}"}
    assert {e["reason"] for e in back} == {f"broker {b} evacuated: {leaving}"}
    assert in_force(status) == [a]
    assert status["broker_list"]["failed_updates"] == []
    lines = [line for line in log if "mq_sidecar.brokers" in line or "reload (SIGHUP)" in line]
    lines += [line for line in log if " evacuated (" in line]
    print(f"\n[live broker list, file + SIGHUP] {summary}\n" + "\n".join(lines))
    bad = "line 2: 'stomp://127.0.0.1:0': broker port must be 1..65535, got 0"
    bad_reload, good_reload = [line for line in lines if "reload (SIGHUP): " in line]
    assert bad_reload.endswith(
        "reload (SIGHUP): applied nothing (no live option changed); needs a restart: nothing; "
        f"broker list in force: {a}; not applied: brokers_file {path}: {bad}"
    )
    assert good_reload.endswith(
        "reload (SIGHUP): applied dns_refresh_interval, retry_interval; needs a restart: "
        f"drain_timeout; broker list in force: {b}"
    )
    assert next(line.partition("mq_sidecar.brokers: ")[2] for line in lines if bad in line) == (
        f"broker list: brokers_file {path}: {bad}; the list in force stays"
    )


async def test_every_address_of_a_name_from_a_real_dns_server(tmp_path: Path) -> None:
    """``dns=all`` through dnspython on trio to dnsmasq: every A address of the name, in address
    order, each sending the name as its CONNECT host; the hosts file rewritten and dnsmasq
    SIGHUPed: the new addresses; a name it does not serve and a server that is gone fail with
    a reason (the list keeps its last good answer: tests/proxy/test_discovery.py)."""
    template = parse_broker_url("stomp://mq.test:61613?dns=all")[0][0]
    with dnsmasq_server(tmp_path, {}) as dns, trio.fail_after(20):
        dns.addresses = {"mq.test": ["127.0.0.3", "127.0.0.2"]}
        dns.start()
        resolve = make_resolver([dns.server], 1.0)
        found = await resolve(template)
        assert [(b.label, b.virtual_host, b.dns) for b in found] == [
            ("127.0.0.2:61613", "mq.test", None),
            ("127.0.0.3:61613", "mq.test", None),
        ]
        dns.set_addresses({"mq.test": ["127.0.0.4", "127.0.0.3"]})
        labels: list[str] = []
        for _ in range(100):  # dnsmasq reads the file when it handles the signal: <= 2 s
            labels = [b.label for b in await resolve(template)]
            if "127.0.0.4:61613" in labels:
                break
            await trio.sleep(0.02)
        assert labels == ["127.0.0.3:61613", "127.0.0.4:61613"]
        other = parse_broker_url("stomp://elsewhere.test:61613?dns=all")[0][0]
        with pytest.raises(LookupFailed, match=r"elsewhere\.test"):
            await resolve(other)
        dns.stop()
        with pytest.raises(LookupFailed, match=r"mq\.test"):
            await resolve(template)
