"""Errors that stop the daemon at start: its listeners (STOMP and admin) and its outbox;
re-exported by ``proxy.app``."""

from __future__ import annotations

__all__ = ["ListenError", "OutboxUnusable"]


class ListenError(Exception):
    """A listen address cannot be bound (in use, no permission, no such address)."""


class OutboxUnusable(Exception):
    """``outbox_dir`` cannot be used: another sidecar holds it (its PID named), or it cannot
    be created, read or written. One line, for ``mq-sidecar run``'s exit 1."""
