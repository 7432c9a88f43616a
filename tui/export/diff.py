"""What changed between two screens, as spans of cells: both formats write only those, so a frame where
one counter moved costs a few bytes, not a screenful. No Textual here."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator

from batchtop.tui.export.screen import Cell, Grid, Row

MERGE_GAP = 4  # unchanged cells between two changes that are rewritten anyway: one span costs less than two


def changed_spans(before: Row | None, after: Row, gap: int = MERGE_GAP) -> list[tuple[int, int]]:
    """[start, end) column spans of `after` that differ from `before` (all of it when there is no before)."""
    if before is None or len(before) != len(after):
        return [(0, len(after))]
    if before == after:
        return []
    spans: list[tuple[int, int]] = []
    for x, (old, new) in enumerate(zip(before, after)):
        if old != new:
            if spans and x - spans[-1][1] <= gap:
                spans[-1] = (spans[-1][0], x + 1)
            else:
                spans.append((x, x + 1))
    return [_whole_wide(after, start, end) for start, end in spans]


def _whole_wide(row: Row, start: int, end: int) -> tuple[int, int]:
    """Never cut a wide character in half: a span starts on its left half and ends after its right."""
    while start > 0 and row[start][0] == "":
        start -= 1
    while end < len(row) and row[end][0] == "":
        end += 1
    return start, end


def grid_changes(before: Grid | None, after: Grid) -> Iterator[tuple[int, int, int]]:
    """(row, start, end) of every changed span, top to bottom."""
    for y, row in enumerate(after):
        old = before[y] if before is not None and y < len(before) else None
        for start, end in changed_spans(old, row):
            yield y, start, end


def runs(cells: Row, key: Callable[[Cell], Hashable]) -> Iterator[tuple[int, int, Hashable]]:
    """[start, end) stretches of cells sharing key(cell), relative to the start of `cells`."""
    start = 0
    for x in range(1, len(cells) + 1):
        if x == len(cells) or key(cells[x]) != key(cells[start]):
            yield start, x, key(cells[start])
            start = x
