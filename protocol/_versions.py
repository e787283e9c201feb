"""STOMP protocol versions and their negotiation (STOMP 1.2 "Protocol Negotiation")."""

from __future__ import annotations

from collections.abc import Iterable

# Everything in `__all__` gets re-exported as part of the public API of `protocol`.
__all__ = ["VERSIONS", "negotiate_version"]

#: The STOMP versions this package speaks, oldest first.
VERSIONS: tuple[str, ...] = ("1.0", "1.1", "1.2")


def check_version(version: str) -> str:
    """Return ``version`` if it is one of :data:`VERSIONS`, else raise ValueError."""
    if version not in VERSIONS:
        raise ValueError(f"unsupported STOMP version {version!r}; expected one of {VERSIONS}")
    return version


def parse_accept_version(value: str | None) -> frozenset[str]:
    """The versions listed in an ``accept-version`` header; absent means ``{"1.0"}``.

    STOMP 1.2 "Protocol Negotiation": "If the accept-version header is missing, it means that the
    client only supports version 1.0 of the protocol." Unknown entries are kept (and ignored by
    the callers that intersect with :data:`VERSIONS`).
    """
    if value is None:
        return frozenset({"1.0"})
    return frozenset(part.strip() for part in value.split(","))


def negotiate_version(
    accept_version: str | None, supported: Iterable[str] = VERSIONS
) -> str | None:
    """Pick the STOMP version a server answers a CONNECT with (STOMP 1.2 "Protocol Negotiation").

    Args:
        accept_version: the client's ``accept-version`` header (``"1.0,1.1,1.2"``), or None when
            absent. Entries are comma separated; surrounding spaces and unknown entries are ignored.
        supported: the versions we are willing to speak, each one of :data:`VERSIONS`.

    Returns:
        ``"1.0"`` when the header is absent (a 1.0 client) and 1.0 is supported; otherwise the
        highest version both sides support; None when there is none (the server should answer
        with an ERROR frame carrying a ``version`` header, per the spec).

    Raises:
        ValueError: ``supported`` names a version not in :data:`VERSIONS`.
    """
    ours = frozenset(check_version(v) for v in supported)
    offered = parse_accept_version(accept_version)
    common = [v for v in VERSIONS if v in ours and v in offered]
    return common[-1] if common else None
