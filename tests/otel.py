"""What the tracing tests share (tests/proxy/test_tracing.py, tests/integration/test_tracing.py;
their fixtures ``span_exporter`` and ``tracing`` are in tests/conftest.py): the W3C Trace
Context spec's example ids."""

from __future__ import annotations

__all__ = ["PARENT_ID", "TRACEPARENT", "TRACE_ID"]

#: W3C Trace Context, "traceparent Header": the example's trace id and parent span id.
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
