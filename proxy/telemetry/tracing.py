"""OpenTelemetry traces of the session's frames (issue 27 part 4; docs/operations.md, "Traces").

Off by default (``tracing = false``): then nothing imports this module, OpenTelemetry is never
imported, and the session's hooks cost one attribute test each (``core.tracer is not None``;
measured by ``python -m bench.tracing``, docs/results.md "Tracing"). With ``tracing = true``
the daemon makes one :class:`Tracing` at start (:meth:`Tracing.from_environment`: the exporter,
resource and sampler from OpenTelemetry's standard ``OTEL_*`` variables) and each session a
:class:`SessionTracer`, whose methods the session calls at these points:

=================  ==========================================================================
span / event       when
=================  ==========================================================================
``send <dest>``    a SEND entering the window (the app's, or one the outbox forwards; kind
                   PRODUCER, ``messaging.operation.type`` ``send``): from the moment the
                   session took it until the broker's RECEIPT covers it, or it is named in an
                   OUTCOME (lost, unknown, refused, rolled back: status ERROR)
``receive <dest>`` a MESSAGE from the broker (kind CONSUMER, ``receive``), ended once it is
                   queued for the app; a message the sidecar hid gets the event
                   ``duplicate hidden`` (or ``redelivery hidden``) and is not shown
``ack/nack``       an ACK or NACK of the app's entering the window (kind CLIENT, ``settle``),
                   until confirmed, the delivered message's span its parent when the sidecar
                   still knows it
``failover``       an event on every span still open when a session moved to another broker
                   (``from``/``to`` broker, ``outage_ms``, whether it reattached)
``replay``         an event on a span whose frame was sent again on the new leg
``call_timeout``   an event on a span whose app receipt was answered with an ERROR
=================  ==========================================================================

The parents come from the W3C ``traceparent`` / ``tracestate`` headers of the frames, read and
never written: the app's headers reach the broker unchanged (docs/behaviour.md, transparency),
so a consumer's span has the app's span as its parent, beside the sidecar's ``send`` span.
Attribute names are OpenTelemetry's messaging conventions (``messaging.system``: ``activemq``
or ``rabbitmq`` from the broker's ``server`` header); the sidecar's own are ``mq_sidecar.*``.

Exporting is the SDK's: a BatchSpanProcessor queues ended spans (bounded, ``OTEL_BSP_*``) and
exports from its own thread, so ``span.end()`` never blocks the trio loop.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace import (
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    Tracer,
    set_span_in_context,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

from protocol import Command, Frame, RawFrame
from proxy._errors import TracingUnavailable
from proxy._version import VERSION
from proxy.telemetry.vocabulary import FrameOutcome

if TYPE_CHECKING:
    from config import Broker
    from proxy.legs.broker import Upstream
    from proxy.legs.dialect import BrokerDialect
    from proxy.telemetry.events import FrameReport, SessionEvent
    from proxy.tracking.window import Entry


class TracedLeg(Protocol):
    """What a session's tracer reads of the session's hold on its broker leg (the session's
    ``LegState`` has it): the dialect of the broker (``messaging.system``), the leg when one is
    up, and the broker's index in the broker list (``server.address`` between legs)."""

    @property
    def dialect(self) -> BrokerDialect: ...

    @property
    def upstream(self) -> Upstream | None: ...

    @property
    def broker_index(self) -> int | None: ...


__all__ = ["SessionTracer", "TracedLeg", "Tracing", "TracingUnavailable"]

log = logging.getLogger("mq_sidecar.tracing")

#: The instrumentation scope's name (OpenTelemetry: the library that makes the spans).
SCOPE = "mq-sidecar"
#: Delivered messages whose trace an ACK may still find, per session, at most (oldest dropped).
SETTLE_PARENTS_MAX = 10_000
#: The outcomes that do not end a span: the frame may still be confirmed (an event instead).
_NOT_FINAL = {FrameOutcome.REPLAYED: "replay", FrameOutcome.TIMED_OUT: "call_timeout"}
_PROPAGATOR = TraceContextTextMapPropagator()


def parent_of(frame: Frame | RawFrame) -> Context:
    """The context a frame's W3C ``traceparent`` (and ``tracestate``) header names; an empty
    context (a root span) when it has none or it does not parse (W3C Trace Context: an
    invalid traceparent is ignored)."""
    traceparent = frame.get("traceparent")
    if traceparent is None:
        return Context()
    carrier = {"traceparent": traceparent}
    tracestate = frame.get("tracestate")
    if tracestate is not None:
        carrier["tracestate"] = tracestate
    return _PROPAGATOR.extract(carrier, context=Context())


def _name(operation: str, destination: str | None) -> str:
    """A span's name by OpenTelemetry's messaging conventions: ``{operation} {destination}``,
    the operation alone when the frame names no destination."""
    return operation if not destination else f"{operation} {destination}"


class Tracing:
    """The sidecar's tracing: one tracer from its own :class:`TracerProvider` (never the
    process-global one, so a test can give each sidecar its own exporter).

    Args:
        provider: where spans go; :meth:`shutdown` shuts it down (flushing what is queued).
    """

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.tracer: Tracer = provider.get_tracer(SCOPE, VERSION)

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> Tracing | None:
        """Tracing configured by OpenTelemetry's standard variables, as an SRE sets them for
        any OpenTelemetry SDK: ``OTEL_TRACES_EXPORTER`` (``otlp``, the default; ``console``;
        ``none``; comma-separated for several), ``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT`` /
        ``_HEADERS`` / ``_TIMEOUT`` / ``_PROTOCOL`` (``http/protobuf``, the default; ``grpc``
        when ``opentelemetry-exporter-otlp-proto-grpc`` is installed), ``OTEL_SERVICE_NAME``
        and ``OTEL_RESOURCE_ATTRIBUTES`` (``service.name`` defaults to ``mq-sidecar``),
        ``OTEL_TRACES_SAMPLER[_ARG]``, ``OTEL_BSP_*``. ``OTEL_SDK_DISABLED=true``: None
        (tracing stays off, logged).

        Raises:
            TracingUnavailable: an exporter named that this install cannot make.
        """
        env = os.environ if environ is None else environ
        if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
            log.warning("tracing = true, but OTEL_SDK_DISABLED=true: no traces")
            return None
        resource = Resource.create()
        if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
            resource = resource.merge(Resource({"service.name": "mq-sidecar"}))
        resource = resource.merge(Resource({"service.version": VERSION}))
        provider = TracerProvider(resource=resource)
        names = [n.strip().lower() for n in env.get("OTEL_TRACES_EXPORTER", "otlp").split(",")]
        for name in names:
            if name in ("", "none"):
                continue
            provider.add_span_processor(_processor(name, env))
        log.info("tracing on: exporters %s", ", ".join(names))
        return cls(provider)

    def session(self, session_id: str, leg: TracedLeg, brokers: Sequence[Broker]) -> SessionTracer:
        """The tracer of one session: its id, its broker leg (which broker, which dialect)
        and the broker list (the board's: ``leg.broker_index`` indexes it)."""
        return SessionTracer(self.tracer, session_id, leg, brokers)

    def shutdown(self) -> None:
        """Export what is queued (within the exporters' timeouts) and stop; blocking, for a
        worker thread (:func:`trio.to_thread.run_sync`)."""
        self.provider.shutdown()


def _processor(name: str, env: Mapping[str, str]) -> SpanProcessor:
    """The span processor of one ``OTEL_TRACES_EXPORTER`` entry."""
    exporter: SpanExporter
    if name == "console":
        exporter = ConsoleSpanExporter()
    elif name == "otlp":
        protocol = env.get(
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "")
        )
        protocol = protocol.strip().lower() or "http/protobuf"
        try:
            if protocol == "http/protobuf":
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415
                    OTLPSpanExporter as HttpExporter,
                )

                exporter = HttpExporter()
            elif protocol == "grpc":
                from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # type: ignore[import-not-found, unused-ignore]  # noqa: PLC0415
                    OTLPSpanExporter as GrpcExporter,
                )

                exporter = GrpcExporter()
            else:
                raise TracingUnavailable(f"OTLP protocol {protocol!r} is not supported")
        except ImportError as exc:
            raise TracingUnavailable(
                f"tracing = true: the OTLP exporter for {protocol} is not installed ({exc}); "
                "install mq-sidecar[otel]"
            ) from None
    else:
        raise TracingUnavailable(f"OTEL_TRACES_EXPORTER {name!r} is not supported")
    return BatchSpanProcessor(exporter)


class SessionTracer:
    """The spans of one session (module docstring), by window entry: a span lives from the
    app's frame until its entry is confirmed or named in an OUTCOME; :meth:`close` ends those
    the session ends with. At most one span per entry in the window, so as bounded as it is."""

    __slots__ = ("_brokers", "_id", "_leg", "_open", "_settle_parents", "_tracer")

    def __init__(
        self, tracer: Tracer, session_id: str, leg: TracedLeg, brokers: Sequence[Broker]
    ) -> None:
        self._tracer = tracer
        self._id = session_id
        self._leg = leg
        self._brokers = brokers
        #: Spans of window entries not settled yet, by the entry's ``seq``.
        self._open: dict[int, Span] = {}
        #: (span context, destination) of messages delivered to the app, by their ack id.
        self._settle_parents: dict[str, tuple[SpanContext, str]] = {}

    def _attributes(self, operation: str, name: str, destination: str | None) -> dict[str, str]:
        attributes = {
            "messaging.system": self._leg.dialect.messaging_system,
            "messaging.operation.type": operation,
            "messaging.operation.name": name,
            "mq_sidecar.session": self._id,
        }
        if destination is not None:
            attributes["messaging.destination.name"] = destination
        return attributes

    def _broker(self, span: Span) -> None:
        """``server.address`` / ``server.port`` of the broker the session is on now."""
        leg = self._leg
        index = leg.broker_index
        if leg.upstream is not None:
            broker = leg.upstream.broker
        elif index is not None:
            broker = self._brokers[index]
        else:
            return
        span.set_attribute("server.address", broker.host)
        span.set_attribute("server.port", broker.port)

    def submitted(self, entry: Entry, started: int) -> None:
        """A frame of the app entered the window as ``entry`` (``started``: when the session
        took it, :func:`time.time_ns`, before any wait for room): a SEND or an ACK/NACK gets
        its span; other commands none."""
        command = entry.command
        if command is Command.SEND:
            self._send(entry, started)
        elif command is Command.ACK or command is Command.NACK:
            self._settle(entry, started)

    def _send(self, entry: Entry, started: int) -> None:
        frame = entry.outgoing
        destination = frame.get("destination")
        span = self._tracer.start_span(
            _name("send", destination),
            context=parent_of(frame),
            kind=SpanKind.PRODUCER,
            attributes=self._attributes("send", "send", destination),
            start_time=started,
        )
        dup_id = frame.get("mq-sidecar-id")
        if dup_id is not None:
            span.set_attribute("mq_sidecar.id", dup_id)
        body = frame.body_length if isinstance(frame, RawFrame) else len(frame.body)
        span.set_attribute("messaging.message.body.size", body)
        self._broker(span)
        self._open[entry.seq] = span

    def _settle(self, entry: Entry, started: int) -> None:
        """An ACK or NACK going upstream; its parent is the delivered message's span when the
        sidecar still has it (by the broker's ack id: ``id`` in STOMP 1.2, ``message-id``
        before; a redelivery after a failover has a new one, and then it is a root span)."""
        frame = entry.outgoing
        name = "ack" if frame.command is Command.ACK else "nack"
        ack_id = frame.get("id") or frame.get("message-id") or ""
        known = self._settle_parents.pop(ack_id, None)
        context = Context()
        destination = None
        if known is not None:
            context = set_span_in_context(NonRecordingSpan(known[0]))
            destination = known[1]
        span = self._tracer.start_span(
            _name(name, destination),
            context=context,
            kind=SpanKind.CLIENT,
            attributes=self._attributes("settle", name, destination),
            start_time=started,
        )
        self._broker(span)
        self._open[entry.seq] = span

    def confirmed(self, entries: Iterable[Entry]) -> None:
        """A RECEIPT covered ``entries``: their spans end (status unset: OK)."""
        opened = self._open
        for entry in entries:
            span = opened.pop(entry.seq, None)
            if span is not None:
                self._broker(span)
                span.end()

    def outcomes(self, reports: Iterable[FrameReport]) -> None:
        """What became of frames not plainly confirmed (an OUTCOME): ``replayed`` and
        ``timed_out`` are events on the span, which stays open; any other ends it with status
        ERROR (``error.type``: the outcome)."""
        opened = self._open
        for report in reports:
            event = _NOT_FINAL.get(report.outcome)
            if event is not None:
                span = opened.get(report.seq)
                if span is not None:
                    span.add_event(event, {"mq_sidecar.cause": str(report.cause)})
                continue
            span = opened.pop(report.seq, None)
            if span is None:
                continue
            span.set_attribute("error.type", str(report.outcome))
            span.set_attribute("mq_sidecar.cause", str(report.cause))
            span.set_status(Status(StatusCode.ERROR, f"{report.outcome}: {report.cause}"))
            span.end()

    def failover(self, event: SessionEvent) -> None:
        """The session moved to a new leg (the FAILOVER ``event``): a ``failover`` event on
        every span still open, so a trace shows where the outage added time."""
        attributes: dict[str, AttributeValue] = {
            "mq_sidecar.from": event.from_broker or "",
            "mq_sidecar.to": event.to_broker or "",
            "mq_sidecar.outage_ms": event.outage_ms or 0,
            "mq_sidecar.reattached": bool(event.reattached),
            "mq_sidecar.reason": event.reason,
        }
        for span in self._open.values():
            span.add_event("failover", attributes)

    def message(self, frame: Frame, to_app: Frame | None, hidden: str | None) -> None:
        """A MESSAGE from the broker: shown to the app as ``to_app``, or hidden (``hidden``:
        why, ``duplicate`` or ``redelivery``). The span ends at once."""
        destination = frame.get("destination")
        span = self._tracer.start_span(
            _name("receive", destination),
            context=parent_of(frame),
            kind=SpanKind.CONSUMER,
            attributes=self._attributes("receive", "receive", destination),
        )
        message_id = frame.get("message-id")
        if message_id is not None:
            span.set_attribute("messaging.message.id", message_id)
        span.set_attribute("messaging.message.body.size", len(frame.body))
        self._broker(span)
        if hidden is not None:
            span.add_event(f"{hidden} hidden", {"mq_sidecar.hidden": hidden})
        elif to_app is not None:
            # the broker's ack id, which the sidecar's ACK of it names (_settle)
            ack_id = frame.get("ack") or frame.get("message-id")
            if ack_id is not None:
                parents = self._settle_parents
                if len(parents) >= SETTLE_PARENTS_MAX:
                    del parents[next(iter(parents))]
                parents[ack_id] = (span.get_span_context(), destination or "")
        span.end()

    def close(self) -> None:
        """The session ended: spans still open end with status ERROR (``session_ended``)."""
        opened, self._open = self._open, {}
        for span in opened.values():
            span.set_status(Status(StatusCode.ERROR, "the session ended before a confirmation"))
            span.end()
        self._settle_parents.clear()
