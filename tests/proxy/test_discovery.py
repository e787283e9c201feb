"""The live broker list: the table's diffing with stable indexes (pure), the list's updates from
DNS and the brokers file with bad input (a lookup that fails or times out, an answer without an
address, a file that does not parse, an update that would leave no broker: the last good list
stays, one log line, /status), the evacuation of a broker that leaves, and SIGHUP's plan.

DNS here is a function the test answers for (trio's autojump clock, no sleeps); the real
dnspython lookups against a real DNS server are tests/integration/test_live_broker_list.py.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import re
import types
from pathlib import Path

import pytest
import trio
import trio.testing

from config import Broker, Config, ConfigError, parse_broker_url
from proxy.admin.health import BrokerProber
from proxy.admin.server import AdminServer
from proxy.app import Sidecar
from proxy.reconnect import brokers as brokers_module
from proxy.reconnect.brokers import (
    BrokerTable,
    EmptyBrokerList,
    first_in_force,
    in_force_count,
    walk_order,
)
from proxy.reconnect.discovery import RELOAD, BrokerDiscovery, NoBrokers
from proxy.reconnect.policy import ReconnectPolicy
from proxy.reconnect.resolve import LookupFailed
from proxy.reload import plan_reload, reload_sidecar
from proxy.session.core import session_policy
from proxy.telemetry.vocabulary import ProbeOutcome

A, B, C, D = (Broker(f"10.0.0.{n}", 61613) for n in range(1, 5))
NAME = parse_broker_url("stomp://mq.test:61613?dns=all")[0][0]
SRV = parse_broker_url("stomp://_stomp._tcp.mq.test")[0][0]


# -- the table (pure) ------------------------------------------------------------------------


def test_a_table_keeps_every_brokers_index_across_updates() -> None:
    table = BrokerTable([A, B])
    change = table.update([B, C])
    assert (change.joined, change.left) == ((C,), (A,))
    assert [table[i] for i in range(len(table))] == [A, B, C]  # A keeps its slot
    assert table.in_force() == (B, C)
    assert table.indexes() == (1, 2)
    assert (table.serves(0), table.serves(1), table.serves(2)) == (False, True, True)
    change = table.update([A, C])  # A comes back to its slot
    assert (change.joined, change.left) == ((A,), (B,))
    assert table.index_of(A.label) == 0
    assert table.in_force() == (A, C)
    assert not table.update([A, C, A])  # listed twice: once; nothing changed
    assert (first_in_force(table), in_force_count(table)) == (0, 2)


def test_a_table_refuses_an_update_that_would_leave_no_broker() -> None:
    table = BrokerTable([A])
    with pytest.raises(EmptyBrokerList):
        table.update([])
    assert table.in_force() == (A,)


def test_a_broker_whose_settings_changed_keeps_its_slot_and_is_no_change() -> None:
    table = BrokerTable([A])
    other = dataclasses.replace(A, virtual_host="/")
    assert not table.update([other])
    assert table[0] is other


def test_the_table_gives_away_the_slot_out_of_force_longest_past_its_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(brokers_module, "MAX_SLOTS", 3)
    table = BrokerTable([A, B, C])
    table.update([C])  # A left first, then B
    table.update([C, D])
    assert len(table) == 3
    assert table.index_of(D.label) == 0  # A's slot
    assert table.index_of(A.label) is None
    assert table.in_force() == (C, D)


def test_the_walk_tries_the_brokers_in_force_in_list_order() -> None:
    table = BrokerTable([A, B, C])
    table.update([C, A])  # B out; C first now
    policy = ReconnectPolicy()
    rng = random.Random(1)
    assert walk_order(table, policy, None, rng) == [2, 0]
    assert walk_order(table, policy, 0, rng) == [0, 2]  # reattach first
    assert walk_order(table, policy, 1, rng) == [2, 0]  # B left: the list from its start
    assert walk_order([A, B], policy, 1, rng) == [1, 0]  # a plain list: as before


# -- the list: DNS and the file ---------------------------------------------------------------


class Answers:
    """What the test's DNS answers, per name: brokers, or an exception to raise, or None to
    never answer (a timeout)."""

    def __init__(self, **answers: object) -> None:
        self.answers: dict[str, object] = {k.replace("_", "."): v for k, v in answers.items()}
        self.asked = 0

    async def __call__(self, template: Broker) -> tuple[Broker, ...]:
        self.asked += 1
        answer = self.answers[template.host]
        if answer is None:
            await trio.sleep_forever()
        if isinstance(answer, Exception):
            raise answer
        assert isinstance(answer, tuple)
        return answer


class Calls:
    def __init__(self) -> None:
        self.joined: list[tuple[str, str]] = []
        self.left: list[tuple[str, str]] = []


def make_list(config: Config, answers: Answers) -> tuple[BrokerDiscovery, Calls]:
    calls = Calls()
    table = BrokerTable([b for b in config.brokers if not b.dns])
    return (
        BrokerDiscovery(
            config,
            table,
            on_join=lambda b, source: calls.joined.append((b.label, source)),
            on_leave=lambda b, reason: calls.left.append((b.label, reason)),
            resolve=answers,
        ),
        calls,
    )


def at(*hosts: str) -> tuple[Broker, ...]:
    return tuple(dataclasses.replace(NAME, host=h, dns=None, virtual_host="mq.test") for h in hosts)


async def test_a_dns_name_follows_its_addresses_and_a_broker_that_leaves_is_evacuated(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "mq_sidecar.brokers")
    answers = Answers(mq_test=at("127.0.0.2", "127.0.0.3"))
    brokers, calls = make_list(Config(brokers=(A, NAME)), answers)
    await brokers.start()
    assert brokers.table.labels() == (A.label, "127.0.0.2:61613", "127.0.0.3:61613")
    assert brokers.table[1].virtual_host == "mq.test"  # the same CONNECT as by name
    assert calls.joined == calls.left == []  # at start nothing runs on the list yet
    answers.answers["mq.test"] = at("127.0.0.3", "127.0.0.4")
    await brokers.refresh()
    assert brokers.table.labels() == (A.label, "127.0.0.3:61613", "127.0.0.4:61613")
    assert calls.joined == [("127.0.0.4:61613", "DNS name mq.test")]
    assert calls.left == [
        ("127.0.0.2:61613", "left the broker list (DNS name mq.test no longer resolves to it)")
    ]
    assert caplog.messages == [
        "broker list updated: 127.0.0.4:61613 joined (DNS name mq.test); 127.0.0.2:61613 "
        "left; in force: 10.0.0.1:61613, 127.0.0.3:61613, 127.0.0.4:61613"
    ]
    assert brokers.statistics().updates == 1


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (LookupFailed("DNS name mq.test: the answer has no A record"), "has no A record"),
        (LookupFailed("DNS name mq.test does not exist (NXDOMAIN)"), "NXDOMAIN"),
        (None, "DNS name mq.test: no answer within 5 s"),
    ],
    ids=["no-address", "nxdomain", "timeout"],
)
async def test_a_lookup_that_fails_keeps_the_last_good_answer_with_one_log_line(
    autojump_clock: trio.testing.MockClock,
    caplog: pytest.LogCaptureFixture,
    answer: object,
    reason: str,
) -> None:
    caplog.set_level(logging.INFO, "mq_sidecar.brokers")
    answers = Answers(mq_test=at("127.0.0.2"))
    brokers, calls = make_list(Config(brokers=(NAME,)), answers)
    await brokers.start()
    answers.answers["mq.test"] = answer
    started = trio.current_time()
    for _ in range(3):  # three refreshes, one line
        await brokers.refresh()
    if answer is None:  # each lookup given up at its timeout and a grace second
        assert trio.current_time() - started == pytest.approx(3 * 6.0)
    assert brokers.table.labels() == ("127.0.0.2:61613",)
    assert calls.left == []
    (line,) = caplog.messages
    assert line.startswith("broker list: DNS name mq.test")
    assert line.count("mq.test") == 1
    assert reason in line
    assert line.endswith("; keeping its last good answer")
    (failed,) = brokers.statistics().failed
    assert (failed.source, reason in failed.reason) == ("DNS name mq.test", True)
    answers.answers["mq.test"] = at("127.0.0.2")
    await brokers.refresh()
    assert brokers.statistics().failed == ()
    assert caplog.messages[-1] == "broker list: DNS name mq.test answers again"


async def test_srv_records_give_hosts_and_ports(autojump_clock: trio.testing.MockClock) -> None:
    one = dataclasses.replace(SRV, host="b1.mq.test", port=61001, dns=None)
    two = dataclasses.replace(SRV, host="b2.mq.test", port=61002, dns=None)
    answers = Answers()
    answers.answers["_stomp._tcp.mq.test"] = (one, two)
    brokers, calls = make_list(Config(brokers=(SRV,)), answers)
    await brokers.start()
    answers.answers["_stomp._tcp.mq.test"] = (two,)
    await brokers.refresh()
    assert brokers.table.labels() == ("b2.mq.test:61002",)
    assert calls.left == [
        (
            "b1.mq.test:61001",
            "left the broker list (SRV name _stomp._tcp.mq.test no longer resolves to it)",
        )
    ]


async def test_at_start_a_name_that_does_not_resolve_stands_for_itself_or_there_is_no_broker(
    autojump_clock: trio.testing.MockClock,
) -> None:
    answers = Answers(mq_test=LookupFailed("DNS name mq.test does not exist (NXDOMAIN)"))
    brokers, _ = make_list(Config(brokers=(NAME,)), answers)
    await brokers.start()
    assert brokers.table.in_force() == (dataclasses.replace(NAME, dns=None),)
    answers.answers["_stomp._tcp.mq.test"] = LookupFailed("SRV name: NXDOMAIN")
    srv_only, _ = make_list(Config(brokers=(SRV,)), answers)
    with pytest.raises(NoBrokers, match=re.escape("_stomp._tcp.mq.test: SRV name: NXDOMAIN")):
        await srv_only.start()


async def test_a_brokers_file_is_followed_and_a_bad_one_keeps_the_last_good_list(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "mq_sidecar.brokers")
    path = tmp_path / "brokers.txt"
    path.write_text("# the brokers\nstomp://10.0.0.2:61613\n")
    brokers, calls = make_list(Config(brokers=(A,), brokers_file=str(path)), Answers())
    await brokers.start()
    assert brokers.table.in_force() == (A, B)
    path.write_text("stomp://10.0.0.3:61613\nstomp://10.0.0.4:0\n")
    await brokers.refresh()
    assert brokers.table.in_force() == (A, B)  # line 2 does not parse: nothing changes
    (failed,) = brokers.statistics().failed
    assert failed.source == f"brokers_file {path}"
    assert failed.reason == "line 2: 'stomp://10.0.0.4:0': broker port must be 1..65535, got 0"
    assert caplog.messages == [
        f"broker list: brokers_file {path}: {failed.reason}; the list in force stays"
    ]
    await brokers.refresh()  # unchanged since: not read again, not logged again
    assert len(caplog.messages) == 1
    path.write_text("stomp://10.0.0.3:61613\n")
    await brokers.refresh()
    assert brokers.table.in_force() == (A, C)
    assert calls.left == [
        (B.label, f"left the broker list (brokers_file {path} no longer names it)")
    ]
    assert calls.joined == [(C.label, f"brokers_file {path}")]


async def test_an_update_that_would_leave_no_broker_is_refused(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    path = tmp_path / "brokers.txt"
    path.write_text("stomp://10.0.0.2:61613\n")
    brokers, calls = make_list(Config(brokers_file=str(path)), Answers())
    await brokers.start()
    path.write_text("# nobody\n")
    await brokers.refresh()
    assert brokers.table.in_force() == (B,)
    assert calls.left == []
    (failed,) = brokers.statistics().failed
    assert (failed.source, failed.reason) == ("the broker list", "the update names no broker")


async def test_the_refresh_task_looks_every_jittered_interval(
    autojump_clock: trio.testing.MockClock,
) -> None:
    answers = Answers(mq_test=at("127.0.0.2"))
    brokers, _ = make_list(Config(brokers=(NAME,), dns_refresh_interval=1000), answers)
    await brokers.start()
    async with trio.open_nursery() as nursery:
        await nursery.start(brokers.run)
        await trio.sleep(10.5)
        nursery.cancel_scope.cancel()
    # 1 at start, then one per 0.8..1.2 s: between 8 and 13 in 10.5 s
    assert 1 + 8 <= answers.asked <= 1 + 13


# -- the sidecar: a broker that leaves is evacuated; SIGHUP's plan ---------------------------


async def test_a_broker_that_leaves_the_list_is_evacuated_and_restored_when_it_returns(
    autojump_clock: trio.testing.MockClock,
) -> None:
    answers = Answers(mq_test=at("127.0.0.2", "127.0.0.3"))
    sidecar = Sidecar(Config(brokers=(NAME,)), resolve=answers)
    await sidecar.rotation.start()
    assert sidecar.metrics.brokers == ("127.0.0.2:61613", "127.0.0.3:61613")
    answers.answers["mq.test"] = at("127.0.0.3")
    await sidecar.rotation.discovery.refresh()
    (evacuation,) = sidecar.rotation.evacuations()
    assert evacuation.broker == "127.0.0.2:61613"
    assert evacuation.reason == "left the broker list (DNS name mq.test no longer resolves to it)"
    assert [b.label for b in sidecar.rotation.brokers()] == ["127.0.0.3:61613"]
    answers.answers["mq.test"] = at("127.0.0.2", "127.0.0.3")
    await sidecar.rotation.discovery.refresh()
    assert sidecar.rotation.evacuations() == ()


def test_sighup_applies_the_live_options_and_names_the_others() -> None:
    old = Config(brokers=(A,))
    new = dataclasses.replace(
        old, brokers=(A, B), retry_interval=250, log_level="debug", listen=("127.0.0.1", 1)
    )
    plan = plan_reload(old, new)
    assert plan.applied == ("brokers", "retry_interval", "log_level")
    assert plan.restart == ("listen",)
    assert plan.config.listen == old.listen
    assert (plan.config.brokers, plan.config.retry_interval) == ((A, B), 250)


async def test_the_prober_follows_the_list(autojump_clock: trio.testing.MockClock) -> None:
    """A broker that joins is checked from then on, at once; one that leaves is no longer
    checked nor reported."""
    checked: list[str] = []

    async def probe(broker: Broker) -> tuple[ProbeOutcome, str]:
        checked.append(broker.label)
        return ProbeOutcome.CONNECTED, "ok"

    prober = BrokerProber(Config(brokers=(A, B), broker_probe_interval=1000), tuple, probe=probe)
    async with trio.open_nursery() as nursery:
        await nursery.start(prober.run)
        await trio.sleep(0.5)
        prober.follow([B, C])
        await trio.sleep(0.1)
        assert [h.broker for h in prober.statistics()] == [B.label, C.label]
        assert [h.state for h in prober.statistics()] == ["up", "up"]  # C checked at once
        checked.clear()
        await trio.sleep(2.0)
        nursery.cancel_scope.cancel()
    assert sorted(set(checked)) == [B.label, C.label]  # A no longer


async def test_sighup_applies_what_it_can_to_running_sessions_in_one_line(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "mq_sidecar")
    path = tmp_path / "brokers.txt"
    path.write_text(f"stomp://{B.label}\n")
    config = Config(brokers=(A,), brokers_file=str(path))
    sidecar = Sidecar(config, resolve=Answers())
    await sidecar.rotation.start()

    class Running:  # what a reload and an evacuation touch of a live session
        core = types.SimpleNamespace(policy=session_policy(config))

        def statistics(self) -> types.SimpleNamespace:
            return types.SimpleNamespace(broker=B.label)

    running = Running()
    sidecar.sessions.add(running)  # type: ignore[arg-type]
    path.write_text(f"stomp://{C.label}\n")
    new = dataclasses.replace(
        config, retry_interval=250, max_sessions=5, log_level="warning", listen=("127.0.0.1", 5)
    )
    root = logging.getLogger("mq_sidecar")
    level = root.level
    try:
        line = await reload_sidecar(sidecar, lambda: new)
        assert root.level == logging.WARNING
    finally:
        root.setLevel(level)
    assert line == (
        "reload (SIGHUP): applied retry_interval, max_sessions, log_level; needs a restart: "
        f"listen; broker list in force: {A.label}, {C.label}"
    )
    assert running.core.policy.retry_interval == 0.25
    assert (sidecar.config.max_sessions, sidecar.config.listen) == (5, config.listen)
    assert [e.broker for e in sidecar.rotation.evacuations()] == [B.label]

    def refuse() -> Config:
        raise ConfigError(["retry_interval: must be > 0, got -1 (from /etc/x.toml)"])

    line = await reload_sidecar(sidecar, refuse)
    assert line == (
        "reload (SIGHUP) refused: retry_interval: must be > 0, got -1 (from /etc/x.toml); the "
        "configuration in force stays"
    )
    assert [f.source for f in sidecar.rotation.discovery.statistics().failed] == [RELOAD]
    assert sidecar.config.retry_interval == 250
    await reload_sidecar(sidecar, lambda: sidecar.config)
    assert sidecar.rotation.discovery.statistics().failed == ()


async def test_sighup_gives_the_admin_plane_a_new_token_file(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    old, new = tmp_path / "old-token", tmp_path / "new-token"
    config = Config(brokers=(A,), admin_token_file=str(old))
    sidecar = Sidecar(config)
    await sidecar.rotation.start()
    sidecar.admin = AdminServer(sidecar)
    assert sidecar.admin.token is not None
    assert sidecar.admin.token.path == str(old)
    line = await reload_sidecar(
        sidecar, lambda: dataclasses.replace(config, admin_token_file=str(new))
    )
    assert line.startswith("reload (SIGHUP): applied admin_token_file; needs a restart: nothing")
    assert sidecar.admin.token is sidecar.admin.actions.token
    assert sidecar.admin.token is not None
    assert sidecar.admin.token.path == str(new)
