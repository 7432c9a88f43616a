"""The server families attach reads, one record each (servers/<family>.py, a ServerFamily), listed in
SERVERS in the order detection names them. Adding a server is its record file and its line here.

Everything that asks about a family (detection, parsing, coverage, knobs, the recording's checks)
goes through these functions, which read SERVERS when called."""

from __future__ import annotations

from batchtop.core_engine.attach.servers import batchtop, llamacpp, lmdeploy, nim, sglang, tgi, trtllm, vllm
from batchtop.core_engine.attach.servers.family import ServerFamily

SERVERS: tuple[ServerFamily, ...] = (vllm.FAMILY, sglang.FAMILY, batchtop.FAMILY, tgi.FAMILY, llamacpp.FAMILY,
                                     lmdeploy.FAMILY, nim.FAMILY, trtllm.FAMILY)
MIXED = "mixed"  # the aggregate's flavour when its replicas are different servers


def families() -> tuple[ServerFamily, ...]:
    return SERVERS


def family(name: str | None) -> ServerFamily | None:
    """The record of a flavour; None for no server yet, "mixed", or one no record names."""
    return next((f for f in SERVERS if f.name == name), None)


def flavour_names() -> tuple[str, ...]:
    return tuple(f.name for f in SERVERS)


def label(flavour: str | None) -> str:
    """The flavour as the screen names it."""
    if flavour == MIXED:
        return "mixed servers"
    found = family(flavour)
    return found.label if found is not None else flavour or "no server yet"
