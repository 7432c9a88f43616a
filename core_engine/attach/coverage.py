"""What each server's metrics can fill on the attach panels, and what they cannot, in the words the
panels show where a number is missing (a "not exposed" that says why, and what to do instead): read
from each family's record (servers/)."""

from __future__ import annotations

from batchtop.core_engine.attach.servers import family
from batchtop.core_engine.attach.servers.family import WHATS


def gap(flavour: str | None, what: str, default: str = "not exposed") -> str:
    """Why `what` is missing for this flavour (or `default` when nothing specific is known)."""
    found = family(flavour)
    return found.gaps.get(what, default) if found is not None else default


def coverage(flavour: str) -> dict[str, str | None]:
    """Every `what`, with None where the flavour fills it: the JSON's `coverage` and the docs' table."""
    found = family(flavour)
    return {what: found.gaps.get(what) if found is not None else None for what in WHATS}
