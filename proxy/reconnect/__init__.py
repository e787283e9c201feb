"""Reconnecting: when to try which broker again, and what the sessions share while they do.

- ``policy``: the reconnect policy, an immutable value with pure arithmetic: backoff delays,
  jitter, attempts, rounds, broker order (pure: :class:`~proxy.reconnect.policy.ReconnectPolicy`).
- ``walk``: the walk over the broker list by that policy, the only place that sleeps between
  attempts (:func:`~proxy.reconnect.walk.connect_by_policy`).
- ``board``: what the sessions of one sidecar share during an outage: reconnects in progress,
  the brokers' refusals (:class:`~proxy.reconnect.board.ReconnectBoard`).
- ``tally``: the board's pure counting (reconnects in progress, refusals' cool-downs).
- ``brokers``: the broker list in force, a stable index per broker, the diff of an update
  (pure: :class:`~proxy.reconnect.brokers.BrokerTable`).
- ``discovery``: what keeps the list in force live: the DNS names and the brokers file,
  looked up again every ``dns_refresh_interval`` and on SIGHUP
  (:class:`~proxy.reconnect.discovery.BrokerDiscovery`).
- ``resolve``: the DNS lookups (dnspython's async resolver, on trio).
- ``evacuations``: which brokers are evacuated, and whether an evacuation would strand the
  sessions (pure).

This file imports nothing: the pure modules here may be imported by pure code.
"""
