"""Numbers for narrow panels: SI prefixes."""

from __future__ import annotations


def si(value: float, unit: str) -> str:
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def short_seconds(seconds: float, width: int) -> str:
    """A duration in at most `width` cells (width >= 3): seconds, then minutes or hours once they do not fit."""
    for value, unit in ((seconds, "s"), (seconds / 60, "m"), (seconds / 3600, "h")):
        text = f"{value:.0f}{unit}"
        if len(text) <= width:
            return text
    return f"{seconds / 86400:.0f}d"
