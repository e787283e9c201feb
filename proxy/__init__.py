"""The mq-sidecar daemon (docs/architecture.md)."""

from __future__ import annotations

# First: whether its compiled modules may load (docs/architecture.md, "The compiled core").
import protocol._native  # noqa: F401
