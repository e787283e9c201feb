"""Tracing (issue 27 part 4; docs/operations.md, "Traces"): a session's spans on scripted
brokers, read from the OpenTelemetry SDK's InMemorySpanExporter; the OTLP/HTTP export to a
receiver on loopback; tracing off imports no OpenTelemetry.

The app's W3C headers are the ones of the spec's example (W3C Trace Context, "traceparent
Header"): trace id ``4bf92f3577b34da6a3ce929d0e0e4736``, parent span id ``00f067aa0ba902b7``.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import trio
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from config import Config
from protocol import Command
from proxy._errors import TracingUnavailable
from proxy.app import start_tracing
from proxy.legs.dialect import messaging_system
from proxy.telemetry.tracing import Tracing, parent_of
from testbed.otlp import OtlpReceiver
from tests.otel import PARENT_ID, TRACE_ID, TRACEPARENT
from tests.proxy.scripted_broker import (
    RABBITMQ,
    Network,
    Running,
    ScriptedBroker,
    make_config,
    start_session,
)

QUEUE = "/queue/orders"
TRACESTATE = "congo=t61rcWkgMzE"


def spans(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


async def traced_app(
    nursery: trio.Nursery,
    network: Network,
    tracing: Tracing,
    *brokers: ScriptedBroker,
    **config: object,
) -> Running:
    running = await start_session(
        nursery, network, make_config(*brokers, **config), tracing=tracing
    )
    assert (await running.app.connect()).command is Command.CONNECTED
    await running.app.subscribe_events()
    return running


async def test_a_send_span_continues_the_apps_trace_until_the_receipt(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    network: Network,
    tracing: Tracing,
    span_exporter: InMemorySpanExporter,
) -> None:
    """A SEND carrying the app's traceparent/tracestate: a PRODUCER span in the app's trace,
    the app's span its parent, with the messaging attributes; ended only once the broker's
    RECEIPT confirms the SEND. The headers reach the broker unchanged."""
    broker = network.add("broker", 61001)
    broker.receipts = "hold"
    running = await traced_app(nursery, network, tracing, broker)
    app = running.app
    await app.send(
        Command.SEND,
        {
            "destination": QUEUE,
            "receipt": "r1",
            "traceparent": TRACEPARENT,
            "tracestate": TRACESTATE,
        },
        b"order",
    )
    (sent,) = await broker.wait_for(Command.SEND)
    assert sent.get("traceparent") == TRACEPARENT
    assert sent.get("tracestate") == TRACESTATE
    await broker.signal.wait_until(lambda: len(broker.link.held) == 1)
    assert not spans(span_exporter, f"send {QUEUE}")  # open until the receipt
    await broker.link.release()
    await app.wait_receipt("r1")
    (span,) = spans(span_exporter, f"send {QUEUE}")
    assert span.kind is SpanKind.PRODUCER
    assert format(span.context.trace_id, "032x") == TRACE_ID
    assert span.parent is not None
    assert format(span.parent.span_id, "016x") == PARENT_ID
    assert span.parent.is_remote
    assert span.status.status_code is StatusCode.UNSET
    attributes = dict(span.attributes or {})
    assert attributes["messaging.system"] == "activemq"
    assert attributes["messaging.destination.name"] == QUEUE
    assert attributes["messaging.operation.type"] == "send"
    assert attributes["messaging.message.body.size"] == 5
    assert attributes["mq_sidecar.id"] == sent.get("mq-sidecar-id")
    assert attributes["server.address"] == "broker.test"
    assert attributes["server.port"] == 61001


async def test_a_send_confirmed_after_a_failover_carries_failover_and_replay_events(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    network: Network,
    tracing: Tracing,
    span_exporter: InMemorySpanExporter,
) -> None:
    """The primary never confirms the SEND and goes down; the backup confirms its replay: the
    SEND's span ends OK with a ``failover`` event (from, to, outage) and a ``replay`` event,
    so the trace shows where the failover added time."""
    primary = network.add("primary", 61001)
    backup = network.add("backup", 61002)
    primary.receipts = "hold"
    running = await traced_app(nursery, network, tracing, primary, backup)
    app = running.app
    await app.send(
        Command.SEND, {"destination": QUEUE, "receipt": "r1", "traceparent": TRACEPARENT}, b"x"
    )
    await primary.signal.wait_until(lambda: len(primary.link.held) == 1)
    primary.reachable = False
    await primary.link.drop("reset")
    await app.wait_receipt("r1")
    (replayed,) = await backup.wait_for(Command.SEND)
    assert replayed.get("traceparent") == TRACEPARENT
    (span,) = spans(span_exporter, f"send {QUEUE}")
    assert span.status.status_code is StatusCode.UNSET
    assert format(span.context.trace_id, "032x") == TRACE_ID
    names = [e.name for e in span.events]
    assert names == ["failover", "replay"]
    failover = dict(span.events[0].attributes or {})
    assert failover["mq_sidecar.from"] == primary.label
    assert failover["mq_sidecar.to"] == backup.label
    assert failover["mq_sidecar.reattached"] is False
    assert isinstance(failover["mq_sidecar.outage_ms"], int)
    assert failover["mq_sidecar.outage_ms"] >= 0
    assert dict(span.attributes or {})["server.address"] == "broker.test"
    assert dict(span.attributes or {})["server.port"] == 61002  # confirmed by the backup


async def test_a_send_lost_when_reconnect_is_exhausted_ends_with_an_error(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    network: Network,
    tracing: Tracing,
    span_exporter: InMemorySpanExporter,
) -> None:
    """A SEND the only broker never confirmed, the broker gone for good: its span ends with
    status ERROR and ``error.type`` ``unknown`` (it may have taken effect there)."""
    broker = network.add("broker", 61001)
    broker.receipts = "hold"
    running = await traced_app(nursery, network, tracing, broker, reconnect_attempts=0)
    app = running.app
    await app.send(Command.SEND, {"destination": QUEUE, "receipt": "r1"}, b"x")
    await broker.signal.wait_until(lambda: len(broker.link.held) == 1)
    broker.reachable = False
    await broker.link.drop("close")
    await running.done.wait()
    (span,) = spans(span_exporter, f"send {QUEUE}")
    assert span.status.status_code is StatusCode.ERROR
    assert dict(span.attributes or {})["error.type"] == "unknown"
    assert span.parent is None  # the app sent no traceparent: a root span


async def test_message_spans_a_hidden_duplicate_and_an_ack_in_the_messages_trace(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    network: Network,
    tracing: Tracing,
    span_exporter: InMemorySpanExporter,
) -> None:
    """A MESSAGE with a traceparent: a CONSUMER ``receive`` span in that trace; the same
    message again (same ``mq-sidecar-id``: a producer's replay) is hidden from the app, and its
    span carries the ``duplicate hidden`` event; the app's ACK is a ``settle`` span whose parent
    is the delivered message's span, ended once the broker confirms it (RabbitMQ here)."""
    broker = network.add("broker", 61001, server=RABBITMQ)
    running = await traced_app(nursery, network, tracing, broker)
    app = running.app
    await app.send(
        Command.SUBSCRIBE,
        {"destination": QUEUE, "id": "s1", "ack": "client-individual", "receipt": "sub"},
    )
    await app.wait_receipt("sub")
    headers = [("mq-sidecar-id", "p-1"), ("traceparent", TRACEPARENT)]
    await broker.link.deliver(QUEUE, b"m", message_id="ID:1", headers=headers)
    await broker.link.deliver(QUEUE, b"m", message_id="ID:2", headers=headers)
    await broker.signal.wait_until(lambda: len(broker.link.received(Command.ACK)) == 1)
    assert len(app.messages(QUEUE)) == 1
    shown, hidden = spans(span_exporter, f"receive {QUEUE}")
    for span in (shown, hidden):
        assert span.kind is SpanKind.CONSUMER
        assert format(span.context.trace_id, "032x") == TRACE_ID
        assert span.parent is not None
        assert format(span.parent.span_id, "016x") == PARENT_ID
        assert dict(span.attributes or {})["messaging.system"] == "rabbitmq"
        assert dict(span.attributes or {})["messaging.operation.type"] == "receive"
    assert [e.name for e in shown.events] == []
    assert [e.name for e in hidden.events] == ["duplicate hidden"]
    assert dict(hidden.attributes or {})["messaging.message.id"] == "ID:2"

    ack = app.messages(QUEUE)[0].get("ack")
    assert ack is not None
    await app.send(Command.ACK, {"id": ack, "receipt": "a1"})
    await app.wait_receipt("a1")
    (settle,) = spans(span_exporter, f"ack {QUEUE}")
    assert settle.kind is SpanKind.CLIENT
    assert dict(settle.attributes or {})["messaging.operation.type"] == "settle"
    assert settle.parent is not None
    assert settle.parent.span_id == shown.context.span_id


async def test_spans_still_open_end_with_the_session(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    network: Network,
    tracing: Tracing,
    span_exporter: InMemorySpanExporter,
) -> None:
    """The app leaves without DISCONNECT while its SEND is unconfirmed: the span is not left
    open (ERROR, named with the OUTCOME of the session's end)."""
    broker = network.add("broker", 61001)
    broker.receipts = "hold"
    running = await traced_app(nursery, network, tracing, broker)
    await running.app.send(Command.SEND, {"destination": QUEUE}, b"x")
    await broker.signal.wait_until(lambda: len(broker.link.held) == 1)
    await running.app.stream.aclose()
    await running.done.wait()
    (span,) = spans(span_exporter, f"send {QUEUE}")
    assert span.status.status_code is StatusCode.ERROR


def test_messaging_system_follows_the_brokers_server_header() -> None:
    assert messaging_system("ActiveMQ/5.17.6") == "activemq"
    assert messaging_system("ActiveMQ-Artemis/2.31.2") == "activemq"
    assert messaging_system("RabbitMQ/3.10.8") == "rabbitmq"
    assert messaging_system("Apollo/1.7") == "apollo"
    assert messaging_system("") == "stomp"


def test_an_invalid_traceparent_starts_a_root_span() -> None:
    from opentelemetry.trace import get_current_span

    from protocol import Frame

    frame = Frame(Command.SEND, (("destination", QUEUE), ("traceparent", "00-zz-yy-01")))
    assert not get_current_span(parent_of(frame)).get_span_context().is_valid
    good = Frame(Command.SEND, (("traceparent", TRACEPARENT), ("tracestate", TRACESTATE)))
    context = get_current_span(parent_of(good)).get_span_context()
    assert format(context.trace_id, "032x") == TRACE_ID
    assert context.trace_state.get("congo") == "t61rcWkgMzE"


def test_the_standard_variables_switch_and_choose_the_exporter() -> None:
    """OTEL_SDK_DISABLED=true leaves tracing off; OTEL_TRACES_EXPORTER names the exporter
    (an unknown one stops the start with one line); tracing = false makes nothing."""
    assert Tracing.from_environment({"OTEL_SDK_DISABLED": "true"}) is None
    with pytest.raises(TracingUnavailable, match="'zipkin' is not supported"):
        Tracing.from_environment({"OTEL_TRACES_EXPORTER": "zipkin"})
    with pytest.raises(TracingUnavailable, match="'thrift' is not supported"):
        Tracing.from_environment({"OTEL_EXPORTER_OTLP_PROTOCOL": "thrift"})
    quiet = Tracing.from_environment({"OTEL_TRACES_EXPORTER": "none"})
    assert quiet is not None
    assert quiet.provider.resource.attributes["service.name"] == "mq-sidecar"
    quiet.shutdown()
    assert start_tracing(Config()) is None


def test_tracing_off_imports_no_opentelemetry() -> None:
    """With tracing off the daemon (its CLI, app, sessions) never imports OpenTelemetry."""
    code = (
        "import sys, proxy.__main__, proxy.app, proxy.session;"
        "from config import Config; from proxy.app import start_tracing;"
        "assert start_tracing(Config()) is None;"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"


async def test_spans_are_exported_over_otlp_http(
    nursery: trio.Nursery, network: Network, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The OTLP exporter configured by the standard variables alone sends the SEND's span,
    with the app's trace id and the service name, to an OTLP/HTTP receiver on loopback."""
    with OtlpReceiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{receiver.port}")
        monkeypatch.setenv("OTEL_SERVICE_NAME", "orders-sidecar")
        tracing = Tracing.from_environment()
        assert tracing is not None
        broker = network.add("broker", 61001)
        running = await traced_app(nursery, network, tracing, broker)
        await running.app.send(
            Command.SEND, {"destination": QUEUE, "receipt": "r1", "traceparent": TRACEPARENT}
        )
        with trio.fail_after(10):
            await running.app.wait_receipt("r1")
        await trio.to_thread.run_sync(tracing.shutdown)  # exports what is queued
    assert receiver.paths == []
    requests = [ExportTraceServiceRequest.FromString(body) for body in receiver.bodies]
    exported = [
        (resource, span)
        for request in requests
        for resource in request.resource_spans
        for scope in resource.scope_spans
        for span in scope.spans
    ]
    (resource, span), *_ = [(r, s) for r, s in exported if s.name == f"send {QUEUE}"]
    assert span.trace_id.hex() == TRACE_ID
    assert span.parent_span_id.hex() == PARENT_ID
    names = {a.key: a.value.string_value for a in resource.resource.attributes}
    assert names["service.name"] == "orders-sidecar"


def test_run_exits_1_with_one_line_when_tracing_cannot_start() -> None:
    """``mq-sidecar run`` with tracing on and an exporter it cannot make: exit 1 and one line
    naming it, before listening (docs/operations.md, "Traces")."""
    env = {
        **os.environ,
        "MQ_SIDECAR_TRACING": "true",
        "MQ_SIDECAR_BROKERS": "stomp://127.0.0.1:1",
        "MQ_SIDECAR_LISTEN": "127.0.0.1:0",
        "MQ_SIDECAR_ADMIN_LISTEN": "127.0.0.1:0",
        "OTEL_TRACES_EXPORTER": "zipkin",
    }
    out = subprocess.run(
        [sys.executable, "-m", "proxy", "run"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1] == (
        "mq-sidecar: OTEL_TRACES_EXPORTER 'zipkin' is not supported"
    )
