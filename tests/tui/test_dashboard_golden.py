"""Golden screenshots of the main screen (fixed size, seed, clock and step count) in both modes.

The plain-text screen is compared on any Textual version; the full SVG (colours included) only on
the Textual version that recorded it. BATCHTOP_UPDATE_GOLDEN=1 rewrites them after a deliberate
layout change: review the new files before committing them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import textual

from tests.tui.test_dashboard import make_app, screen_text, step

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
SIZE = (100, 30)
STEPS = 6
UPDATE = os.environ.get("BATCHTOP_UPDATE_GOLDEN") == "1"


@pytest.mark.parametrize("mode", ["continuous", "static"])
async def test_main_screen_matches_the_golden_screenshot(mode):
    app = make_app(mode=mode)
    async with app.run_test(size=SIZE) as pilot:
        await step(pilot, STEPS)
        text = screen_text(app)
        svg = app.export_screenshot(title=f"batchtop — {mode}")
    text_file, svg_file = GOLDEN / f"dashboard_{mode}.txt", GOLDEN / f"dashboard_{mode}.svg"
    version_file = GOLDEN / "TEXTUAL_VERSION"
    if UPDATE:
        text_file.write_text(text, encoding="utf-8")
        svg_file.write_text(svg, encoding="utf-8")
        version_file.write_text(textual.__version__ + "\n", encoding="utf-8")
    assert text == text_file.read_text(encoding="utf-8")
    if version_file.read_text(encoding="utf-8").strip() == textual.__version__:
        assert svg == svg_file.read_text(encoding="utf-8")
