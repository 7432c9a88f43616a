"""Where each roof's figure came from, in one source string the cache, the panels and the JSON share.

A DevicePeaks' source says how both roofs were measured ("measured:copy 256 MiB + ..."); a roof a
step raised adds a part after it, "; compute raised by step 812 at t=3.2 s" in the run that raised it,
"; memory raised by a step on 2026-12-07 23:40 UTC" once cached. Each roof reads its own parts back
(roof_source), so the compute roof a step raised is not said to be the copy's measurement.
"""

from __future__ import annotations

ROOFS = ("compute", "memory")
CACHED = " (cached)"
SEP = "; "


def with_raise(source: str, roof: str, words: str) -> str:
    """`source` with `roof`'s raise said as `words` ("by step 812 at t=3.2 s"), replacing an older one."""
    cached = source.endswith(CACHED)
    parts = source.removesuffix(CACHED).split(SEP)
    kept = [parts[0], *(p for p in parts[1:] if not p.startswith(f"{roof} raised "))]
    return SEP.join([*kept, f"{roof} raised {words}"]) + (CACHED if cached else "")


def roof_source(source: str, roof: str) -> str:
    """Where `roof` ("compute" or "memory") came from: the measurement, then its own raise if any
    ("measured:... (cached) / raised by a step on 2026-12-07 23:40 UTC")."""
    cached = source.endswith(CACHED)
    base, *raises = source.removesuffix(CACHED).split(SEP)
    own = [p.removeprefix(f"{roof} ") for p in raises if p.startswith(f"{roof} raised ")]
    return " / ".join([base + (CACHED if cached else ""), *own])
