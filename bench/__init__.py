"""Benchmarks of mq-sidecar against the same brokers directly (issue 7); run on demand only.

``python -m bench.run`` starts its own brokers (``testbed``), runs every workload once
directly and once through a sidecar process with the same load generator, prints a table and
writes ``bench/results/latest.json``. Never imported by the test suite except the smoke test
in ``tests/bench_smoke`` (tiny counts, no timing assertions).

Modules: ``loadgen`` (the raw-socket STOMP load generator), ``procstat`` (CPU and RSS from
``/proc``), ``sidecar`` (the sidecar as a separate process), ``report`` (rows, table, JSON),
``workloads/`` (throughput, latency, failover, scale) and ``run`` (the command line).
"""

from __future__ import annotations
