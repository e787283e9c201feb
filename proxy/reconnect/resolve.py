"""DNS lookups of the broker list's names: every address of a name (``dns=all``, a Kubernetes
headless Service) or its SRV records (``dns=srv``), through dnspython's async resolver, which
runs on trio (it picks trio's backend by sniffio). Never on the data path: only the
:class:`~proxy.reconnect.discovery.BrokerDiscovery`'s refresh task calls it.

A lookup gives the brokers a name stands for, as addresses (an SRV record's target is looked
up too), sorted (an SRV set by priority, then weight, heaviest first; addresses in address
order: a DNS server that rotates its answers does not change the list), or raises
:class:`LookupFailed` with one line: the name does not exist, an answer without an address, a
timeout, a server failure. The caller keeps the last good answer.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Awaitable, Callable, Sequence

import dns.asyncresolver
import dns.exception
import dns.nameserver
import dns.rdata
import dns.rdtypes.IN.SRV
import dns.resolver

from config import Broker, parse_dns_server

__all__ = ["LookupFailed", "Resolve", "expand", "make_resolver"]

#: A lookup of one DNS-named broker (``Broker.dns`` set): the brokers it stands for now.
Resolve = Callable[[Broker], Awaitable[tuple[Broker, ...]]]


class LookupFailed(Exception):
    """A lookup gave no broker; the message is the reason, one line (the name, what failed)."""


def make_resolver(servers: Sequence[str] | None, timeout: float) -> Resolve:
    """A :data:`Resolve` through dnspython asking ``servers`` (``ip[:port]``, option
    ``dns_servers``) or, for None, the system's resolver (``/etc/resolv.conf``, its search
    domains included: a Kubernetes short name). Each lookup (both address families, or the SRV
    query) gives up after ``timeout`` seconds.

    The system's configuration is read at the first lookup, not before: a sidecar without
    DNS names never reads it, and one whose ``/etc/resolv.conf`` is missing or unreadable
    gets that as the lookup's failure (and keeps its last good list), not a crash.

    Raises:
        ValueError: a server that is not ``ip[:port]`` (the configuration checked it).
    """
    nameservers = (
        None
        if servers is None
        else [
            dns.nameserver.Do53Nameserver(host, port)
            for host, port in (parse_dns_server(s) for s in servers)
        ]
    )
    made: list[dns.asyncresolver.Resolver] = []

    def resolver() -> dns.asyncresolver.Resolver:
        if not made:
            try:
                one = dns.asyncresolver.Resolver(configure=nameservers is None)
            except dns.exception.DNSException as exc:
                raise LookupFailed(f"the system's DNS configuration is unusable: {exc}") from None
            if nameservers is not None:
                one.nameservers = list(nameservers)
            one.lifetime = one.timeout = timeout
            made.append(one)
        return made[0]

    async def resolve(template: Broker) -> tuple[Broker, ...]:
        return await expand(resolver(), template, search=nameservers is None)

    return resolve


async def expand(
    resolver: dns.asyncresolver.Resolver, template: Broker, *, search: bool | None = None
) -> tuple[Broker, ...]:
    """The brokers ``template`` stands for now (:attr:`config.Broker.dns`).

    ``dns=all``: one broker per A and AAAA address of ``template.host``, on its port; each
    keeps the name for the CONNECT ``host`` header (unless a virtual host is set) and, with
    TLS, for SNI and the certificate check (unless ``sniHost`` is set): the same CONNECT and
    TLS as a connection by name. ``dns=srv``: the SRV records (RFC 2782), in priority order,
    heavier weight first; each record's target looked up the same way (through the same
    servers: a name only ``dns_servers`` know resolves), one broker per address on the
    record's port, the target's name kept as above.

    Raises:
        LookupFailed: no such name, an answer with no address (or an SRV set of only ``.``:
            "service not available"), a timeout, a server failure.
    """
    name = template.host
    if template.dns != "srv":
        return tuple(_at(template, name, template.port, await _addresses(resolver, name, search)))
    answer = await _query(resolver, name, "SRV", search)
    found = [r for r in answer if isinstance(r, dns.rdtypes.IN.SRV.SRV)]
    records = sorted(found, key=lambda r: (r.priority, -r.weight, str(r.target), r.port))
    brokers: list[Broker] = []
    failures: list[str] = []
    for record in records:
        target = str(record.target).rstrip(".")
        if not target:
            continue
        try:
            addresses = await _addresses(resolver, target, search)
        except LookupFailed as exc:
            failures.append(str(exc))
            continue
        brokers.extend(_at(template, target, record.port, addresses))
    if not brokers:
        why = f" ({failures[0]})" if failures else ""
        raise LookupFailed(f"SRV name {name}: no record names a host with an address{why}")
    return _distinct(brokers)


async def _addresses(
    resolver: dns.asyncresolver.Resolver, name: str, search: bool | None
) -> list[str]:
    """The A and AAAA addresses of ``name``, in address order.

    Raises:
        LookupFailed: neither gave one (the first failure's words).
    """
    addresses: list[str] = []
    failures: list[str] = []
    for kind in ("A", "AAAA"):
        try:
            addresses.extend(r.to_text() for r in await _query(resolver, name, kind, search))
        except LookupFailed as exc:
            failures.append(str(exc))
    if not addresses:
        raise LookupFailed(failures[0] if failures else f"DNS name {name}: no address")
    return sorted(addresses, key=ipaddress.ip_address)


def _at(template: Broker, name: str, port: int, addresses: list[str]) -> list[Broker]:
    """One broker per address, on ``port``, sending the CONNECT ``host`` header (unless the
    template sets a virtual host) and, with TLS, the SNI name (unless it sets ``sniHost``) of
    ``name``: the same CONNECT and TLS as a connection by name."""
    vhost = template.virtual_host if template.virtual_host is not None else name
    sni = template.server_name if template.server_name is not None or not template.tls else name
    return [
        dataclasses.replace(
            template, host=a, port=port, dns=None, virtual_host=vhost, server_name=sni
        )
        for a in addresses
    ]


async def _query(
    resolver: dns.asyncresolver.Resolver, name: str, kind: str, search: bool | None
) -> list[dns.rdata.Rdata]:
    """The records of type ``kind`` of ``name`` (an empty answer raises).

    Raises:
        LookupFailed: with the reason in words.
    """
    what = "SRV name" if kind == "SRV" else "DNS name"
    try:
        answer = await resolver.resolve(name, kind, search=search)
    except dns.resolver.NXDOMAIN:
        raise LookupFailed(f"{what} {name} does not exist (NXDOMAIN)") from None
    except dns.resolver.NoAnswer:
        raise LookupFailed(f"{what} {name}: the answer has no {kind} record") from None
    except dns.resolver.LifetimeTimeout:
        raise LookupFailed(f"{what} {name}: no answer within {resolver.lifetime:g} s") from None
    except dns.resolver.NoNameservers:
        raise LookupFailed(
            f"{what} {name}: every DNS server failed (SERVFAIL or refused)"
        ) from None
    except dns.exception.DNSException as exc:
        raise LookupFailed(f"{what} {name}: {exc}") from None
    return list(answer)


def _distinct(brokers: list[Broker]) -> tuple[Broker, ...]:
    seen: set[str] = set()
    out = []
    for b in brokers:
        if b.label not in seen:
            seen.add(b.label)
            out.append(b)
    return tuple(out)
