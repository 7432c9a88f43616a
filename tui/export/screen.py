"""The screen as a grid of cells, read the way Textual's own screenshot reads it (a full render of
the compositor), so both export formats draw exactly what a terminal would show."""

from __future__ import annotations

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style
from textual.app import App

Cell = tuple[str, Style]  # one character cell; the right half of a wide character holds ""
Row = tuple[Cell, ...]
Grid = tuple[Row, ...]

PLAIN = Style()


def row_cells(segments: list[Segment], width: int) -> Row:
    """One screen line as exactly `width` cells (padded with blanks, cropped where it runs over)."""
    cells: list[Cell] = []
    for text, style, control in segments:
        if control:
            continue
        style = style or PLAIN
        for char in text:
            cells.append((char, style))
            if cell_len(char) == 2:
                cells.append(("", style))
    blank = (" ", cells[-1][1] if cells else PLAIN)
    return tuple(cells[:width]) + (blank,) * (width - len(cells))


def screen_grid(app: App) -> Grid:
    """What is on the app's screen now, toasts and all."""
    width, height = app.size
    # rendered as App.export_screenshot renders it
    update = app.screen._compositor.render_update(full=True, screen_stack=app._background_screens)
    rows = [row_cells([seg for strip in line for seg in strip], width) for line in update.strips[:height]]
    return tuple(rows)
