"""Text that fits a width in terminal cells, and says so when it does not: a cut always ends (or, for
an id, starts) with "…", so nothing on screen is cut without a sign."""

from __future__ import annotations

from collections.abc import Sequence

from rich.cells import cell_len

ELLIPSIS = "…"


def clip(text: str, width: int) -> str:
    """text, or as much of its start as fits with "…" after it."""
    if cell_len(text) <= width:
        return text
    if width <= 0:
        return ""
    out = text[:width - 1]
    while cell_len(out) > width - 1:  # wide characters take two cells
        out = out[:-1]
    return out + ELLIPSIS


def clip_start(text: str, width: int) -> str:
    """text, or as much of its end as fits with "…" before it: for ids, whose ends tell them apart."""
    if cell_len(text) <= width:
        return text
    if width <= 0:
        return ""
    out = text[-(width - 1):] if width > 1 else ""
    while cell_len(out) > width - 1:
        out = out[1:]
    return ELLIPSIS + out


def pad(text: str, width: int, *, keep_end: bool = False) -> str:
    """text clipped to width and padded with spaces to it."""
    out = clip_start(text, width) if keep_end else clip(text, width)
    return out + " " * (width - cell_len(out))


def first_fit(options: Sequence[str], width: int) -> str:
    """The first of options (longest first) that fits; the last one clipped when none does."""
    for option in options:
        if cell_len(option) <= width:
            return option
    return clip(options[-1], width)
