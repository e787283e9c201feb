"""Telemetry: what the sidecar tells people and programs about what happened and what is.

- ``vocabulary``: the closed vocabularies of reasons and outcomes, the label values of the
  metrics (pure).
- ``metrics``: counters and histograms, things that happen (recorded when they happen).
- ``gauges``: things that are, read from the live objects when Prometheus scrapes.
- ``statistics``: the snapshots the admin plane and the gauges read.
- ``events``: session events (RECONNECTING, FAILOVER, DISCONNECT, OUTCOME, SPOOLING,
  SPOOL_DRAINED) and the bus that fans them out.
- ``logs``: logging set-up, JSON lines, one log line per event.
- ``tracing``: OpenTelemetry spans of a session's frames; imported only when ``tracing`` is
  on, since it imports OpenTelemetry (the ``otel`` extra).

This file imports nothing: the pure vocabulary may be imported by pure code.
"""
