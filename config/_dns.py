"""The DNS side of the broker list: the ``dns`` option of a broker URL and the ``dns_servers``
option (pure: no lookups here; they are the daemon's, proxy/reconnect/resolve.py).

A broker URL whose ``dns`` is ``all`` or ``srv`` stands for the brokers its name resolves to
(:attr:`config.Broker.dns`; docs/configuration.md, "A live broker list").
"""

from __future__ import annotations

import ipaddress
import re

__all__ = ["DNS_KINDS", "dns_kind", "parse_dns_server"]

#: Port of a DNS server when ``dns_servers`` names none (RFC 1035).
DNS_PORT = 53


#: Values of the broker URL option ``dns`` (:attr:`config.Broker.dns`).
DNS_KINDS = ("all", "srv")


def dns_kind(
    given: str | None, host: str, port_given: bool, problems: list[str], shown: str
) -> str | None:
    """The ``dns`` of a broker URL: ``given`` (``all`` or ``srv``), else ``srv`` for a host
    that starts with ``_`` (an SRV name, RFC 2782: ``_service._proto.name``), else None.
    Returns ``""`` after appending a problem: an unknown value, an SRV name with a port (the
    port comes from its records), ``all`` of an IP literal (it resolves to itself)."""
    kind = given if given is not None else ("srv" if host.startswith("_") else None)
    if kind is None:
        return None
    if kind not in DNS_KINDS:
        problems.append(f"{shown!r}: option 'dns' must be 'all' or 'srv', got {given!r}")
        return ""
    if kind == "srv" and port_given:
        problems.append(f"{shown!r}: an SRV name takes no port (its records give the ports)")
        return ""
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", host) or re.fullmatch(r"[0-9.]+", host):
        problems.append(f"{shown!r}: option 'dns={kind}' needs a DNS name, got {host!r}")
        return ""
    return kind


def parse_dns_server(text: str) -> tuple[str, int]:
    """One entry of ``dns_servers``: ``host[:port]`` with an IP literal host (an IPv6 one in
    brackets when a port follows: ``[::1]:5353``); port 53 when absent.

    Raises:
        ValueError: not an IP literal, or a port out of 1..65535.
    """
    s = text.strip()
    host, port_text = s, ""
    if s.startswith("["):
        host, _, rest = s[1:].partition("]")
        port_text = rest.removeprefix(":") if rest.startswith(":") else rest
    elif s.count(":") == 1:
        host, _, port_text = s.partition(":")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"{s!r} is not an IP address (with an optional :port)") from None
    if not port_text:
        return host, DNS_PORT
    if not (port_text.isascii() and port_text.isdigit() and 1 <= int(port_text) <= 65535):
        raise ValueError(f"{s!r}: the port must be 1..65535")
    return host, int(port_text)
