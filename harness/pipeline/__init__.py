"""PySpark side of mq-sidecar: publish DataFrames through the sidecar and reconcile (issue 6)."""

from __future__ import annotations
