"""Where http_request may connect: public addresses only, judged at connect time.

An allowlisted *name* says nothing about where it points: ``internal.example.com`` may
resolve to 127.0.0.1, and a DNS answer may change between a check and the connect
(rebinding). So the address is judged where aiohttp uses it, twice:

- ``PublicResolver`` drops every non-public address from a DNS answer (and refuses
  the name when none is left), so aiohttp only ever tries public ones;
- ``guarded_socket`` (the connector's ``socket_factory``) judges the exact address each
  socket is about to connect to. aiohttp does not ask the resolver for literal IP
  hosts, so this is what catches ``http://127.0.0.1/`` and ``http://[::ffff:7f00:1]/``.

This module imports aiohttp at the top; ``web.py`` imports it only inside ``run``.
"""

from __future__ import annotations

import errno
import ipaddress
import socket

from aiohappyeyeballs import AddrInfoType
from aiohttp import DefaultResolver
from aiohttp.abc import AbstractResolver, ResolveResult

from ...errors import EchoBotError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


class AddressRefused(EchoBotError, OSError):
    """A connection to a non-public address, refused before any packet is sent."""

    def __init__(self, target: str, reason: str) -> None:
        super().__init__(
            errno.EACCES,
            f"{target} is {reason}; http_request only connects to public addresses "
            "(set [tools.http] allow_private = true to allow this)",
        )
        self.target = target


def refusal_reason(address: str) -> str | None:
    """None for a public unicast address, else why it may not be connected to."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return "not an IP address"
    return _reason(ip)


def _reason(ip: IPAddress) -> str | None:
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = _embedded_ipv4(ip)
        if embedded is not None:
            # The packet really goes to the IPv4 address inside (mapped, NAT64) or
            # may be routed by it (6to4): judge that one.
            inner = _reason(embedded)
            if inner is not None:
                return f"{inner} (inside {ip.compressed})"
            if ip.ipv4_mapped is not None or ip in _NAT64:
                return None
    checks = (
        ("a loopback address", ip.is_loopback),
        ("the unspecified address", ip.is_unspecified),
        ("a link-local address", ip.is_link_local),
        ("a multicast address", ip.is_multicast),
        ("a private address", ip.is_private),
        ("a reserved address", ip.is_reserved),
        ("a site-local address", isinstance(ip, ipaddress.IPv6Address) and ip.is_site_local),
        ("not a globally routable address", not ip.is_global),
    )
    return next((label for label, hit in checks if hit), None)


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return ip.sixtofour


class PublicResolver(AbstractResolver):
    """aiohttp's default resolver, keeping only the public addresses of an answer."""

    def __init__(self) -> None:
        self._inner = DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        answer = await self._inner.resolve(host, port, family)
        public = [entry for entry in answer if refusal_reason(entry["host"]) is None]
        if public:
            return public
        if not answer:
            raise OSError(errno.EHOSTUNREACH, f"{host} has no address")
        first = answer[0]["host"]
        raise AddressRefused(f"{host} ({first})", str(refusal_reason(first)))

    async def close(self) -> None:
        await self._inner.close()


def guarded_socket(addr_info: AddrInfoType) -> socket.socket:
    """The connector's socket factory: refuses to make a socket for a non-public peer."""
    family, type_, proto, _, sockaddr = addr_info
    address = str(sockaddr[0])
    reason = refusal_reason(address)
    if reason is not None:
        raise AddressRefused(address, reason)
    return socket.socket(family=family, type=type_, proto=proto)
