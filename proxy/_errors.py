"""Errors that stop the daemon at start: its listeners (STOMP and admin), its open-file limit,
its outbox and its tracing; re-exported by ``proxy.app``."""

from __future__ import annotations

__all__ = ["FileLimitTooLow", "ListenError", "OutboxUnusable", "TracingUnavailable"]


class FileLimitTooLow(Exception):
    """The open-file limit (``RLIMIT_NOFILE``'s hard limit) cannot hold what ``max_sessions``
    needs (two sockets per session and the daemon's own files); the message names both
    numbers and the option. One line, for ``mq-sidecar run``'s exit 1."""


class ListenError(Exception):
    """A listen address cannot be bound (in use, no permission, no such address)."""


class OutboxUnusable(Exception):
    """``outbox_dir`` cannot be used: another sidecar holds it (its PID named), or it cannot
    be created, read or written. One line, for ``mq-sidecar run``'s exit 1."""


class TracingUnavailable(Exception):
    """``tracing = true`` but the tracing cannot start: the ``otel`` extra is not installed,
    or ``OTEL_TRACES_EXPORTER`` / the OTLP protocol names an exporter this install cannot make
    (:mod:`proxy.telemetry.tracing`). One line, for ``mq-sidecar run``'s exit 1."""
