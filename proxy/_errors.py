"""Errors shared by the daemon's listeners (STOMP and admin); re-exported by ``proxy.app``."""

from __future__ import annotations

__all__ = ["ListenError"]


class ListenError(Exception):
    """A listen address cannot be bound (in use, no permission, no such address)."""
