"""The `p` key: an SVG of the screen as a new file in the working directory, never one already there."""

from __future__ import annotations

import os
import time
from pathlib import Path

from textual.app import App

from batchtop.core_engine.output_files import OutputError, write_text


def new_screenshot_path(prefix: str) -> Path:
    stamp = time.strftime("%Y%m%d_%H%M%S")
    path, n = Path(f"{prefix}_{stamp}.svg"), 1
    while os.path.lexists(path):  # whatever is there (a file, a FIFO, a dangling link) is left alone
        path, n = Path(f"{prefix}_{stamp}-{n}.svg"), n + 1
    return path


def save_screenshot(app: App, prefix: str) -> None:
    path = new_screenshot_path(prefix)
    try:
        write_text(app.export_screenshot(), str(path))
    except OutputError as exc:
        app.notify(str(exc), title="screenshot not saved", severity="error", timeout=5)
        return
    app.notify(f"screenshot saved to {path.resolve()}", timeout=3)
