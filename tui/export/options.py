"""The --export options checked before any frame is drawn: a bad name or size exits 2 at once, naming
its option, not after a minute of drawing. No Textual here."""

from __future__ import annotations

import re
from dataclasses import dataclass

from batchtop.core_engine.errors import ConfigError

FORMATS = {".cast": "asciicast", ".svg": "svg"}
DEFAULT_SIZE = "120x40"
DEFAULT_FPS = 4.0  # frames per second of the recording: enough to follow a step, few enough for a small SVG
MIN_COLUMNS, MIN_ROWS, MAX_CELLS = 40, 12, 500


@dataclass(frozen=True, slots=True)
class ExportPlan:
    """Where the export goes and how it is drawn."""

    path: str
    format: str  # "asciicast" | "svg"
    columns: int
    rows: int
    fps: float  # frames per second of the exported file's time
    speed: float = 1.0  # recorded seconds per exported second


def export_format(path: str) -> str:
    """The format the file's suffix names; ConfigError naming --export for any other suffix."""
    for suffix, name in FORMATS.items():
        if path.lower().endswith(suffix):
            return name
    raise ConfigError("--export", f"{path!r}: the name must end in .cast (asciicast v2, for asciinema) "
                                  "or .svg (an animated SVG)")


def parse_size(text: str) -> tuple[int, int]:
    """COLUMNSxROWS, as a terminal would be sized."""
    match = re.fullmatch(r"\s*(\d+)\s*[xX×]\s*(\d+)\s*", text)
    if match is None:
        raise ConfigError("--export-size", f"{text!r}: give COLUMNSxROWS, e.g. {DEFAULT_SIZE}")
    columns, rows = int(match[1]), int(match[2])
    if not (MIN_COLUMNS <= columns <= MAX_CELLS and MIN_ROWS <= rows <= MAX_CELLS):
        raise ConfigError("--export-size", f"{text!r}: {MIN_COLUMNS}-{MAX_CELLS} columns and "
                                           f"{MIN_ROWS}-{MAX_CELLS} rows")
    return columns, rows


def export_plan(path: str, size: str, fps: float, speed: float = 1.0) -> ExportPlan:
    columns, rows = parse_size(size)
    return ExportPlan(path, export_format(path), columns, rows, fps, speed)
