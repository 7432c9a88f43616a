"""Numbers for narrow panels (SI prefixes: core_engine.perf.device_peaks.format_rate)."""

from __future__ import annotations


def short_seconds(seconds: float, width: int) -> str:
    """A duration in at most `width` cells (width >= 3): seconds, then minutes or hours once they do not fit."""
    for value, unit in ((seconds, "s"), (seconds / 60, "m"), (seconds / 3600, "h")):
        text = f"{value:.0f}{unit}"
        if len(text) <= width:
            return text
    return f"{seconds / 86400:.0f}d"
