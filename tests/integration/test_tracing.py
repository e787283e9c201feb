"""Tracing through a real ActiveMQ (issue 27 part 4; docs/operations.md, "Traces"): a sidecar
in a thread with the OpenTelemetry SDK's InMemorySpanExporter, stomp.py apps.

A SEND carrying the app's W3C traceparent: the sidecar's span continues the app's trace, and
the header reaches the consumer unchanged; after a kill -9 of the primary of a shared-store pair,
a SEND confirmed by the backup carries the ``failover`` event.
"""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from proxy.telemetry.tracing import Tracing
from testbed import ActiveMQ
from tests.conftest import ActiveMQPairFactory
from tests.integration.support import SidecarThread, client, sidecar_config, unique, wait_until
from tests.otel import PARENT_ID, TRACE_ID, TRACEPARENT

FAST = {"retry_interval": "50", "max_retry_interval": "500", "connect_timeout": "2000"}


def spans(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


@pytest.mark.activemq
def test_the_apps_trace_continues_through_the_sidecar_to_the_consumer(
    activemq: ActiveMQ, tracing: Tracing, span_exporter: InMemorySpanExporter
) -> None:
    """The SEND span has the app's trace id and parent span id and ends with the RECEIPT; the
    consumer (through the sidecar too) gets the traceparent unchanged, and its MESSAGE is a
    ``receive`` span in the same trace."""
    dest = unique()
    config = sidecar_config(activemq.stomp_url)
    with (
        SidecarThread(config, tracing=tracing) as sidecar,
        client(sidecar.address) as consumer,
        client(sidecar.address) as producer,
    ):
        consumer.conn.subscribe(dest, id="s1", ack="auto", headers={"receipt": "sub"})
        consumer.receipt("sub")
        producer.conn.send(dest, "order", headers={"receipt": "r1", "traceparent": TRACEPARENT})
        producer.receipt("r1")
        (message,) = consumer.messages(1)
        assert message.headers["traceparent"] == TRACEPARENT
        wait_until(lambda: bool(spans(span_exporter, f"receive {dest}")))
    (span,) = spans(span_exporter, f"send {dest}")
    assert span.kind is SpanKind.PRODUCER
    assert format(span.context.trace_id, "032x") == TRACE_ID
    assert span.parent is not None
    assert format(span.parent.span_id, "016x") == PARENT_ID
    assert span.status.status_code is StatusCode.UNSET
    attributes = dict(span.attributes or {})
    assert attributes["messaging.system"] == "activemq"
    assert attributes["messaging.destination.name"] == dest
    assert attributes["server.port"] == activemq.stomp_port
    (receive,) = spans(span_exporter, f"receive {dest}")
    assert receive.context.trace_id == span.context.trace_id
    assert receive.parent is not None
    assert format(receive.parent.span_id, "016x") == PARENT_ID


@pytest.mark.activemq
def test_a_send_confirmed_after_a_kill9_failover_shows_the_failover(
    activemq_pair: ActiveMQPairFactory, tracing: Tracing, span_exporter: InMemorySpanExporter
) -> None:
    """kill -9 of the primary, then a SEND with a traceparent: it waits through the takeover
    and the backup confirms it; its span carries the ``failover`` event (from the primary to
    the backup, the outage in milliseconds) and ends OK."""
    primary, backup = activemq_pair(lock_sleep_ms=200)
    dest = unique()
    config = sidecar_config(f"failover:({primary.stomp_url},{backup.stomp_url})", **FAST)
    with SidecarThread(config, tracing=tracing) as sidecar, client(sidecar.address) as app:
        app.conn.send(dest, "before", headers={"receipt": "r0"})
        app.receipt("r0")
        primary.kill()
        app.conn.send(dest, "after", headers={"receipt": "r1", "traceparent": TRACEPARENT})
        app.receipt("r1", timeout=60)
    (span,) = [s for s in spans(span_exporter, f"send {dest}") if s.parent is not None]
    assert format(span.context.trace_id, "032x") == TRACE_ID
    assert span.status.status_code is StatusCode.UNSET
    (failover,) = [e for e in span.events if e.name == "failover"]
    attributes = dict(failover.attributes or {})
    assert attributes["mq_sidecar.from"] == f"127.0.0.1:{primary.stomp_port}"
    assert attributes["mq_sidecar.to"] == f"127.0.0.1:{backup.stomp_port}"
    outage = attributes["mq_sidecar.outage_ms"]
    assert isinstance(outage, int)
    assert outage > 0
    assert dict(span.attributes or {})["server.port"] == backup.stomp_port
