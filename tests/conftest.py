"""Real-broker fixtures for the whole suite (see harness/testbed/ and docs/brokers.md, "Running
them for tests").

* ``activemq`` (session): one ActiveMQ Classic broker, ready (~0.7 s to start).
* ``rabbitmq`` (session): one RabbitMQ node with rabbitmq_stomp, ready (~5 s to start).
* ``activemq_pair`` (function): a factory; ``primary, backup = activemq_pair()`` starts a
  shared-store pair (primary ready, backup blocked on the store lock, ~1.3 s) that is
  stopped after the test. Keyword arguments: those of ``testbed.start_activemq_pair``.

Brokers run on free 127.0.0.1 ports in ``tmp_path_factory`` directories. A missing broker
package FAILS the test (CI installs them): run ``scripts/setup.sh``. Tests that use these
fixtures get the ``activemq`` / ``rabbitmq`` marker automatically, so ``-m "not rabbitmq"``
deselects them (and those using tests/browser's ``chrome`` the ``browser`` marker).

Hypothesis runs without a per-example deadline (profile ``mq-sidecar``): a deadline is a timed
assertion, which tests here never make (speed is measured by bench/); under coverage and a
loaded machine an example may take longer than hypothesis' default 200 ms (and the
``too_slow`` health check, which times the first examples, is off for the same reason).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import HealthCheck, settings

from testbed import (
    ActiveMQ,
    RabbitMQ,
    TlsListener,
    activemq_installed,
    rabbitmq_installed,
    start_activemq_pair,
)

if TYPE_CHECKING:  # OpenTelemetry: imported by the tracing fixtures only when used
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from proxy.telemetry.tracing import Tracing

settings.register_profile("mq-sidecar", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("mq-sidecar")

#: Type of the ``activemq_pair`` fixture: keyword arguments of ``start_activemq_pair``.
ActiveMQPairFactory = Callable[..., tuple[ActiveMQ, ActiveMQ]]

_FIXTURE_MARKERS = {
    "activemq": "activemq",
    "activemq_pair": "activemq",
    "rabbitmq": "rabbitmq",
    "chrome": "browser",  # tests/browser/conftest.py
}


#: The folders whose files take longest (Spark clusters, drills, the image build, real-broker
#: failovers), run first: ``scripts/test.sh`` spreads whole files over two pytest-xdist workers
#: in collection order (``--dist loadfile``), so that the many short files come last and fill
#: the end of both workers' runs instead of one long file running alone at the end.
SLOW_FIRST = (
    "pipeline",
    "spark",
    "deploy",
    "chaos",
    "bench_smoke",
    "differential",
    "browser",
    "integration",
)


def _slowness_rank(item: pytest.Item) -> int:
    parts = item.path.relative_to(Path(__file__).parent).parts
    folder = parts[0] if len(parts) > 1 else ""
    return SLOW_FIRST.index(folder) if folder in SLOW_FIRST else len(SLOW_FIRST)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Put the slow folders first (:data:`SLOW_FIRST`; a stable sort keeps each file's order)
    and mark every test by the broker fixtures it uses (directly or through other fixtures)."""
    items.sort(key=_slowness_rank)
    for item in items:
        names = getattr(item, "fixturenames", ())
        for fixture, marker in _FIXTURE_MARKERS.items():
            if fixture in names and item.get_closest_marker(marker) is None:
                item.add_marker(getattr(pytest.mark, marker))


def _require_activemq() -> None:
    if not activemq_installed():
        pytest.fail(
            "ActiveMQ (Debian package activemq, /usr/share/activemq, java) is not installed: "
            "run scripts/setup.sh",
            pytrace=False,
        )


def _require_rabbitmq() -> None:
    if not rabbitmq_installed():
        pytest.fail(
            "RabbitMQ (Debian package rabbitmq-server with rabbitmq_stomp, epmd) is not "
            "installed: run scripts/setup.sh",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def activemq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ActiveMQ]:
    """One ActiveMQ Classic broker for the session (STOMP on a free 127.0.0.1 port)."""
    _require_activemq()
    broker = ActiveMQ("amq", tmp_path_factory.mktemp("activemq"))
    with broker:
        yield broker


@pytest.fixture(scope="session")
def rabbitmq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitMQ]:
    """One RabbitMQ node for the session; connect with ``vhost="/"`` (``broker.vhost``)."""
    _require_rabbitmq()
    broker = RabbitMQ("rmq", tmp_path_factory.mktemp("rabbitmq"))
    with broker:
        yield broker


@pytest.fixture
def activemq_pair(tmp_path: Path) -> Iterator[ActiveMQPairFactory]:
    """Factory of shared-store pairs ``(primary, backup)``; all are stopped after the test."""
    _require_activemq()
    pairs: list[tuple[ActiveMQ, ActiveMQ]] = []

    def make(
        *,
        lock_sleep_ms: int = 200,
        persist_redelivered: bool = False,
        heap_mb: int = 256,
        memory_mb: int = 64,
        timeout: float = 60.0,
        tls: TlsListener | None = None,
    ) -> tuple[ActiveMQ, ActiveMQ]:
        n = len(pairs)
        pair = start_activemq_pair(
            tmp_path / f"pair{n}",
            name=f"amq{n}",
            lock_sleep_ms=lock_sleep_ms,
            persist_redelivered=persist_redelivered,
            heap_mb=heap_mb,
            memory_mb=memory_mb,
            timeout=timeout,
            tls=tls,
        )
        pairs.append(pair)
        return pair

    yield make
    for primary, backup in reversed(pairs):
        backup.stop()
        primary.stop()


@pytest.fixture
def span_exporter() -> InMemorySpanExporter:
    """Where the ``tracing`` fixture's spans go, each as it ends (``get_finished_spans()``)."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    return InMemorySpanExporter()


@pytest.fixture
def tracing(span_exporter: InMemorySpanExporter) -> Iterator[Tracing]:
    """A sidecar's tracing (proxy.telemetry.tracing) exporting to ``span_exporter``."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from proxy.telemetry.tracing import Tracing

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(span_exporter))
    yield Tracing(provider)
    provider.shutdown()
