"""Each server's own name for the knob a verdict's "try" turns: the slot ceiling, the per-step token
budget and the KV pool, as that server's launch options spell them (its record's knobs)."""

from __future__ import annotations

from batchtop.core_engine.attach.servers import family
from batchtop.core_engine.attach.servers.family import GENERIC_KNOBS, Knobs


def knobs(flavour: str | None) -> Knobs:
    """A family whose record names no knobs (NIM passes its engine's options through) gets the generic words."""
    found = family(flavour)
    return found.knobs if found is not None and found.knobs is not None else GENERIC_KNOBS
