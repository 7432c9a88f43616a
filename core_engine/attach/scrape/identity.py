"""Which server a URL names, whatever its spelling: `http://localhost:8000`, `http://127.0.0.1:08000/`,
`http://127.0.0.1:8000/metrics?x=1` and `http://[::ffff:127.0.0.1]:8000` are one server, and given
together they would count its numbers twice in the aggregate.

A server is its address and port: the host resolved to its addresses (an IPv4-mapped IPv6 address
unwrapped to the IPv4 one), the port as a number (the scheme's default when none is given), the path
and query dropped. Two URLs name one server when they share the port and any address. Names are looked
up only for URLs that share a port with another, so a list of distinct ports costs no DNS lookup, and
each lookup waits RESOLVE_S at most (on a daemon thread: a stuck resolver costs the start no more); a
name that does not resolve in time stands for itself."""

from __future__ import annotations

import ipaddress
import socket
import threading
from urllib.parse import urlsplit

from batchtop.core_engine.errors import ConfigError

DEFAULT_PORTS = {"http": 80, "https": 443}
RESOLVE_S = 2.0


def _address(text: str) -> str | None:
    """The canonical text of an IP address (IPv4-mapped IPv6 unwrapped), or None for a name."""
    try:
        address = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return str(address)


def _addresses(host: str, port: int) -> frozenset[str]:
    """The addresses a host stands for; a name that does not resolve stands for itself."""
    literal = _address(host)
    if literal is not None:
        return frozenset({literal})
    found: list[str] = []

    def lookup() -> None:
        try:
            found.extend(str(info[4][0]) for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except (OSError, UnicodeError):
            pass

    worker = threading.Thread(target=lookup, name="batchtop-attach-resolve", daemon=True)
    worker.start()
    worker.join(RESOLVE_S)
    addresses = {a for a in map(_address, list(found) if not worker.is_alive() else []) if a is not None}
    return frozenset(addresses) or frozenset({host.lower().rstrip(".")})


def port_of(url: str) -> int:
    parts = urlsplit(url)
    return parts.port if parts.port is not None else DEFAULT_PORTS.get(parts.scheme, 80)


def refuse_duplicates(given: list[str], resolved: list[str]) -> None:
    """ConfigError naming both spellings when two URLs name one server (resolved: their /metrics URLs)."""
    ports = [port_of(u) for u in resolved]
    shared = {p for p in ports if ports.count(p) > 1}
    seen: list[tuple[int, frozenset[str], str]] = []
    for spelling, url, port in zip(given, resolved, ports):
        if port not in shared:
            continue
        addresses = _addresses(urlsplit(url).hostname or "", port)
        for other_port, other_addresses, other in seen:
            if other_port == port and addresses & other_addresses:
                where = min(addresses & other_addresses)
                shown = f"[{where}]" if ":" in where else where
                raise ConfigError("URL", f"{other} and {spelling} are one server ({shown}:{port}): its numbers "
                                         "would count twice in the aggregate; give each server once")
        seen.append((port, addresses, spelling))
