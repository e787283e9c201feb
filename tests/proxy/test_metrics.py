"""proxy.telemetry.metrics: one method per thing to record, gauges read at scrape time, bounded
labels,
an exposition promtool accepts, and docs/operations.md documenting every metric."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import trio
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from config import Broker, Config
from protocol import Command
from proxy.admin.server import AdminServer
from proxy.app import Sidecar
from proxy.telemetry.metrics import Metrics
from proxy.telemetry.statistics import SessionStatistics, SidecarStatistics
from proxy.telemetry.vocabulary import (
    ClientErrorReason,
    ConnectOutcome,
    FailoverReason,
    OutageOutcome,
    ProbeOutcome,
    RelayDirection,
    TransactionOutcome,
)
from tests.proxy.test_admin_health import session_stats

A, B = "127.0.0.1:61001", "127.0.0.1:61002"
#: The page that documents every metric (its "Metrics" section).
OPERATIONS_DOC = Path(__file__).parents[2] / "docs" / "operations.md"

#: Every label name a metric of ours may have (bounded vocabularies only).
ALLOWED_LABELS = {
    "broker",
    "outcome",
    "from_broker",
    "to_broker",
    "reason",
    "direction",
    "command",
    "state",
    "endpoint",
    "code",
    "version",
    "result",
    "action",
    "le",
}


class FakeSidecar(Sidecar):
    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.fake_sessions: list[SessionStatistics] = []

    def statistics(self) -> SidecarStatistics:
        return SidecarStatistics(None, 7, tuple(self.fake_sessions))


def config() -> Config:
    return Config(brokers=(Broker("127.0.0.1", 61001), Broker("127.0.0.1", 61002)))


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_each_metrics_object_has_its_own_registry() -> None:
    one, two = Metrics(brokers=[A]), Metrics(brokers=[A])
    one.window_full()
    assert value(one.registry, "mq_sidecar_window_full_total") == 1.0
    assert value(two.registry, "mq_sidecar_window_full_total") == 0.0
    assert not [f for f in REGISTRY.collect() if f.name.startswith("mq_sidecar")]


def test_configured_brokers_show_zeros_before_any_event() -> None:
    m = Metrics(brokers=[A, B])
    for broker in (A, B):
        for outcome in ConnectOutcome:
            assert (
                value(
                    m.registry,
                    "mq_sidecar_upstream_connect_attempts_total",
                    broker=broker,
                    outcome=outcome,
                )
                == 0.0
            )


RECORDINGS: list[tuple[str, Callable[[Metrics], None], str, dict[str, str], float]] = [
    (
        "connect_attempt",
        lambda m: m.connect_attempt(A, ConnectOutcome.REFUSED),
        "mq_sidecar_upstream_connect_attempts_total",
        {"broker": A, "outcome": "refused"},
        1.0,
    ),
    (
        "connect_attempt, unlisted broker",
        lambda m: m.connect_attempt("other:1", ConnectOutcome.TIMEOUT),
        "mq_sidecar_upstream_connect_attempts_total",
        {"broker": "other:1", "outcome": "timeout"},
        1.0,
    ),
    (
        "failover",
        lambda m: m.failover(A, B, FailoverReason.HEARTBEAT_TIMEOUT),
        "mq_sidecar_failovers_total",
        {"from_broker": A, "to_broker": B, "reason": "heartbeat_timeout"},
        1.0,
    ),
    (
        "reattach",
        lambda m: m.reattach(A, FailoverReason.CONNECTION_LOST),
        "mq_sidecar_reattaches_total",
        {"broker": A, "reason": "connection_lost"},
        1.0,
    ),
    (
        "outage",
        lambda m: m.outage(0.7, OutageOutcome.FAILED_OVER),
        "mq_sidecar_outage_seconds_bucket",
        {"outcome": "failed_over", "le": "1.0"},
        1.0,
    ),
    (
        "outage sum",
        lambda m: m.outage(0.7, OutageOutcome.DISCONNECTED),
        "mq_sidecar_outage_seconds_sum",
        {"outcome": "disconnected"},
        0.7,
    ),
    ("window_full", lambda m: m.window_full(), "mq_sidecar_window_full_total", {}, 1.0),
    (
        "receipt_roundtrip",
        lambda m: m.receipt_roundtrip(0.003),
        "mq_sidecar_receipt_roundtrip_seconds_bucket",
        {"le": "0.005"},
        1.0,
    ),
    ("frames_replayed", lambda m: m.frames_replayed(3), "mq_sidecar_replayed_frames_total", {}, 3),
    (
        "duplicates_suppressed",
        lambda m: m.duplicates_suppressed(),
        "mq_sidecar_duplicates_suppressed_total",
        {},
        1.0,
    ),
    (
        "transaction",
        lambda m: m.transaction(TransactionOutcome.IN_DOUBT),
        "mq_sidecar_transactions_total",
        {"outcome": "in_doubt"},
        1.0,
    ),
    ("frames_lost", lambda m: m.frames_lost(2), "mq_sidecar_lost_frames_total", {}, 2.0),
    (
        "client_protocol_error",
        lambda m: m.client_protocol_error(ClientErrorReason.HANDSHAKE_TIMEOUT),
        "mq_sidecar_client_protocol_errors_total",
        {"reason": "handshake_timeout"},
        1.0,
    ),
    ("sse_dropped", lambda m: m.sse_dropped(), "mq_sidecar_sse_clients_dropped_total", {}, 1.0),
    (
        "http_request",
        lambda m: m.http_request("metrics", 200),
        "mq_sidecar_admin_http_requests_total",
        {"endpoint": "metrics", "code": "200"},
        1.0,
    ),
]


@pytest.mark.parametrize(
    ("record", "name", "labels", "expected"),
    [r[1:] for r in RECORDINGS],
    ids=[r[0] for r in RECORDINGS],
)
def test_each_method_records_one_sample(
    record: Callable[[Metrics], None], name: str, labels: dict[str, str], expected: float
) -> None:
    m = Metrics(brokers=[A, B])
    record(m)
    assert value(m.registry, name, **labels) == pytest.approx(expected)


def test_every_reason_and_outcome_is_prebound() -> None:
    m = Metrics(brokers=[A])
    for reason in ClientErrorReason:
        assert value(m.registry, "mq_sidecar_client_protocol_errors_total", reason=reason) == 0
    for outcome in TransactionOutcome:
        assert value(m.registry, "mq_sidecar_transactions_total", outcome=outcome) == 0
    for why in FailoverReason:
        assert value(m.registry, "mq_sidecar_reattaches_total", broker=A, reason=why) == 0


def test_relayed_frames_are_plain_counters_exported_at_scrape() -> None:
    sidecar = FakeSidecar(config())
    AdminServer(sidecar)
    m = sidecar.metrics
    for _ in range(3):
        m.frame_to_broker(Command.SEND, 100)
    m.frame_to_app(Command.MESSAGE, 40)
    m.frame_to_app(Command.RECEIPT, 0)
    assert m.relayed[RelayDirection.APP_TO_BROKER, Command.SEND] == [3, 300]

    async def scrape() -> str:
        return generate_latest(sidecar.registry).decode()

    text = trio.run(scrape)
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    to_broker = (("command", "SEND"), ("direction", "app_to_broker"))
    assert samples["mq_sidecar_relayed_frames_total", to_broker] == 3
    assert samples["mq_sidecar_relayed_bytes_total", to_broker] == 300
    to_app = (("command", "MESSAGE"), ("direction", "broker_to_app"))
    assert samples["mq_sidecar_relayed_bytes_total", to_app] == 40
    # commands never seen are left out rather than exported as zeros
    assert (
        "mq_sidecar_relayed_frames_total",
        (("command", "NACK"), ("direction", "app_to_broker")),
    ) not in samples


async def test_gauges_come_from_statistics_at_scrape_time() -> None:
    sidecar = FakeSidecar(config())
    AdminServer(sidecar)
    sidecar.fake_sessions = [
        session_stats("s-1", "running", A, window_frames=3, window_bytes=500),
        session_stats("s-2", "running", A, window_frames=1, window_bytes=100),
        session_stats("s-3", "reconnecting", A, window_frames=2, window_bytes=900),
        session_stats("s-4", "handshake", None),
    ]
    r = sidecar.registry
    assert value(r, "mq_sidecar_sessions", state="running") == 2
    assert value(r, "mq_sidecar_sessions", state="reconnecting") == 1
    assert value(r, "mq_sidecar_sessions", state="closing") == 0
    assert value(r, "mq_sidecar_sessions_accepted_total") == 7
    assert value(r, "mq_sidecar_upstream_connected", broker=A) == 2
    assert value(r, "mq_sidecar_upstream_connected", broker=B) == 0
    assert value(r, "mq_sidecar_window_frames") == 6
    assert value(r, "mq_sidecar_window_bytes") == 1500
    assert value(r, "mq_sidecar_window_max_bytes") == 900
    assert value(r, "mq_sidecar_window_limit_bytes") == 1048576
    assert value(r, "mq_sidecar_reconnects_in_progress") == 1
    assert value(r, "mq_sidecar_broker_up", broker=A) == 0  # not probed yet
    assert value(r, "mq_sidecar_ready") == 0
    sidecar.fake_sessions = []  # read again at the next scrape: nothing kept in parallel
    assert value(r, "mq_sidecar_sessions", state="running") == 0


async def full_exposition() -> tuple[Sidecar, str]:
    """A sidecar whose every metric has at least one sample."""
    sidecar = FakeSidecar(config())
    AdminServer(sidecar)
    sidecar.fake_sessions = [session_stats("s-1", "running", A, window_bytes=10)]
    for _, record, *_ in RECORDINGS:
        record(sidecar.metrics)
    sidecar.metrics.frame_to_broker(Command.SEND, 5)
    sidecar.metrics.probe(A, ProbeOutcome.CONNECTED)
    return sidecar, generate_latest(sidecar.registry).decode()


async def test_labels_are_bounded() -> None:
    _, text = await full_exposition()
    for family in text_string_to_metric_families(text):
        if not family.name.startswith("mq_sidecar"):
            continue
        for sample in family.samples:
            assert set(sample.labels) <= ALLOWED_LABELS, (sample.name, sample.labels)
    assert "s-1" not in text  # session ids never become labels


@pytest.fixture(scope="module")
def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail(
            "promtool (Debian package prometheus) is not installed: run scripts/setup.sh",
            pytrace=False,
        )
    return path


async def test_promtool_accepts_the_exposition(promtool: str) -> None:
    _, text = await full_exposition()
    result = await trio.run_process(
        [promtool, "check", "metrics"],
        stdin=text.encode(),
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    output = (result.stdout + result.stderr).decode()
    assert result.returncode == 0, output
    assert output == ""  # no lint findings at all


def exposed_names(sidecar: Sidecar) -> set[str]:
    """Names as they appear in the exposition (with _total, _info, ...), ours only."""
    names = set()
    for family in sidecar.registry.collect():
        if not family.name.startswith("mq_sidecar"):
            continue
        suffix = {"counter": "_total", "info": "_info"}.get(family.type, "")
        names.add(family.name + suffix)
    return names


async def test_docs_document_every_metric() -> None:
    sidecar, _ = await full_exposition()
    metric = re.compile(r"`(mq_sidecar_[a-z_]+)[`{]")
    documented = set(metric.findall(OPERATIONS_DOC.read_text()))
    exposed = exposed_names(sidecar)
    assert exposed - documented == set(), "metrics missing from docs/operations.md"
    for page in [OPERATIONS_DOC.parents[1] / "README.md", *OPERATIONS_DOC.parent.glob("*.md")]:
        # mq_sidecar_spark is the PySpark data source's import name (docs/spark.md), no metric.
        named = set(metric.findall(page.read_text())) - {"mq_sidecar_spark"}
        assert named - exposed == set(), f"{page.name} names metrics that do not exist"
