"""asciicast v2 (what asciinema's player, `asciinema play` and asciinema.org read): a JSON header line,
then one [seconds, "o", terminal output] event per frame that changed, holding only the changed cells."""

from __future__ import annotations

import json
from datetime import datetime

from rich.color import ColorSystem

from batchtop.tui.export.diff import grid_changes, runs
from batchtop.tui.export.screen import Grid

START = "\x1b[0m\x1b[?25l\x1b[H\x1b[2J"  # reset, hide the cursor, home, clear: a clean terminal under frame 0
RESET = "\x1b[0m"


def unix_time(iso: str | None) -> int | None:
    """The header's timestamp from the recording's start_time, so the same trace exports the same bytes."""
    try:
        return int(datetime.fromisoformat(iso).timestamp()) if iso else None
    except (TypeError, ValueError):
        return None


def draw(before: Grid | None, after: Grid) -> str:
    """The escapes that turn screen `before` into `after`: each changed span, placed and styled."""
    out: list[str] = []
    for y, start, end in grid_changes(before, after):
        cells = after[y][start:end]
        out.append(f"\x1b[{y + 1};{start + 1}H")
        for a, b, style in runs(cells, lambda cell: cell[1]):
            out.append(style.render("".join(char for char, _ in cells[a:b]), color_system=ColorSystem.TRUECOLOR))
    return "".join(out)


class CastWriter:
    """Collects a frame at a time and holds only the events: a long recording needs no screen history."""

    def __init__(self, width: int, height: int, title: str, timestamp: int | None = None) -> None:
        header: dict = {"version": 2, "width": width, "height": height}
        if timestamp is not None:
            header["timestamp"] = timestamp
        header["title"] = title
        header["env"] = {"TERM": "xterm-256color"}
        self.height = height
        self.lines = [json.dumps(header, ensure_ascii=False)]
        self.num_frames = 0
        self._shown: Grid | None = None
        self._last_t = 0.0

    def add(self, t: float, grid: Grid) -> None:
        """The screen at t seconds of the recording; nothing is written when it did not change."""
        data = draw(self._shown, grid)
        if self._shown is None:
            data = START + data
        if data:
            self._event(t, data)
            self.num_frames += 1
        self._shown = grid

    def _event(self, t: float, data: str) -> None:
        self._last_t = t = max(self._last_t, round(t, 3))  # times never go back, as players require
        self.lines.append(json.dumps([t, "o", data], ensure_ascii=False))

    def text(self, end_t: float) -> str:
        """The whole cast; the last picture stays until end_t, then the cursor comes back below it."""
        self._event(end_t, f"{RESET}\x1b[{self.height};1H\x1b[?25h")
        return "\n".join(self.lines) + "\n"
