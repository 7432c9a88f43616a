"""A sentence over a few lines of a narrow panel: wrapped at spaces, and where it still does not fit,
its last line ends in "…" (fit.clip), so its start, where the key words go, always shows."""

from __future__ import annotations

import textwrap

from batchtop.tui.widgets.common.text_fit import ELLIPSIS, clip


def wrap_lines(text: str, width: int, max_lines: int) -> list[str]:
    """text in at most max_lines lines of at most width cells; [] for empty text or no room."""
    if not text or width <= 0 or max_lines <= 0:
        return []
    lines = textwrap.wrap(text, width, break_on_hyphens=False)
    if len(lines) <= max_lines:
        return lines
    kept = lines[:max_lines]
    last = kept[-1] + " " + lines[max_lines]  # longer than width: clip() ends it with "…"
    kept[-1] = clip(last, width) if len(last) > width else last[:width - 1] + ELLIPSIS
    return kept
