"""The ZMQ endpoints `attach --kv-events` takes: checked before any socket, and vLLM's port pairing.

vLLM binds its publisher on a port and its replay ROUTER on another (5557 and 5558 by default), and a
data-parallel rank N publishes on both ports + N; a subscriber connects, so a wildcard host is refused.
"""

from __future__ import annotations

import re

_TCP = re.compile(r"tcp://(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.\-]+):(?P<port>[0-9]{1,5})")
FORM = "tcp://HOST:PORT or ipc://PATH"


def _tcp(text: str) -> tuple[str, int] | None:
    m = _TCP.fullmatch(text)
    if m is None:
        return None
    port = int(m["port"])
    return (m["host"], port) if 0 < port < 65536 else None


def parse_endpoint(text: str) -> str:
    """The endpoint to connect to, or ValueError saying what a KV-event endpoint looks like."""
    endpoint = text.strip()
    if endpoint.startswith("ipc://"):
        if len(endpoint) == len("ipc://") or any(c.isspace() for c in endpoint):
            raise ValueError(f"{text!r}: an ipc endpoint needs a path ({FORM})")
        return endpoint
    if endpoint.startswith("tcp://*") or endpoint.startswith("tcp://0.0.0.0:"):
        raise ValueError(f"{text!r}: that is the server's bind address; name its host ({FORM})")
    if _tcp(endpoint) is None:
        raise ValueError(f"{text!r} is not a KV-event endpoint ({FORM}, port 1-65535)")
    return endpoint


def offset_port(endpoint: str, offset: int) -> str:
    """The same host with the port moved by `offset` (data-parallel rank N: offset N)."""
    parsed = _tcp(endpoint)
    if parsed is None:
        raise ValueError(f"{endpoint!r} has no tcp port to offset")
    host, port = parsed
    if not 0 < port + offset < 65536:
        raise ValueError(f"{endpoint!r}: port {port} + {offset} is out of range")
    return f"tcp://{host}:{port + offset}"


def default_replay_endpoint(endpoint: str) -> str:
    """vLLM's replay ROUTER beside a publisher: the same host, the next port (5557 -> 5558)."""
    return offset_port(endpoint, 1)
