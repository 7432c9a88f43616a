"""Themes: every colour a panel names exists in every theme, and bubbles never look like a request."""

from __future__ import annotations

import re
from pathlib import Path

from textual.color import Color

from batchtop.themes import NUM_REQUEST_COLOURS, STYLESHEET
from batchtop.themes.palettes import THEMES

WIDGETS = Path(__file__).resolve().parents[2] / "tui" / "widgets"


def used_variables() -> set[str]:
    names = set()
    for path in [*WIDGETS.rglob("*.py"), STYLESHEET]:
        text = path.read_text(encoding="utf-8")
        names |= set(re.findall(r'style\("([a-z-]+)"', text)) | set(re.findall(r'bgcolor_var="([a-z-]+)"', text))
        names |= {m for m in re.findall(r"\$([a-z][a-z-]*)", text)}
    return {n for n in names if not n.endswith("-")}  # "req-" and "phase-" are f-string prefixes


def test_every_colour_the_panels_use_is_defined_by_every_theme():
    builtin = {"background", "foreground", "primary", "secondary", "accent", "warning", "error", "success",
               "surface", "panel", "text-muted"}
    custom = used_variables() - builtin
    assert {"bubble", "kv-free", "slot-empty", "phase-padding", "muted"} <= custom
    for theme in THEMES:
        assert custom <= set(theme.variables), (theme.name, custom - set(theme.variables))
        assert all(f"req-{i}" in theme.variables for i in range(NUM_REQUEST_COLOURS))


def distance(a: str, b: str) -> float:
    ca, cb = Color.parse(a), Color.parse(b)
    return ((ca.r - cb.r) ** 2 + (ca.g - cb.g) ** 2 + (ca.b - cb.b) ** 2) ** 0.5


def test_no_request_colour_can_be_mistaken_for_a_bubble_and_themes_cover_light_and_dark():
    for theme in THEMES:
        bubble = theme.variables["bubble"]
        closest = min(distance(theme.variables[f"req-{i}"], bubble) for i in range(NUM_REQUEST_COLOURS))
        assert closest > 60, (theme.name, closest)
    assert {t.dark for t in THEMES} == {True, False}
    assert any("colourblind" in t.name for t in THEMES)


def test_the_three_kinds_of_waste_look_unlike_each_other_and_unlike_any_request():
    for theme in THEMES:
        v = theme.variables
        waste = ("bubble", "phase-padding", "prompt-pad")
        for name in waste:
            closest = min(distance(v[f"req-{i}"], v[name]) for i in range(NUM_REQUEST_COLOURS))
            assert closest > 50, (theme.name, name, closest)
        pairs = [(a, b) for i, a in enumerate(waste) for b in waste[i + 1:]]
        assert all(distance(v[a], v[b]) > 50 for a, b in pairs), theme.name


def test_the_kv_maps_prefix_cache_states_stand_apart():
    """A shared block must not pass for one request's, and a cached free block not for a plain free one."""
    for theme in THEMES:
        v = theme.variables
        closest = min(distance(v[f"req-{i}"], v["kv-shared"]) for i in range(NUM_REQUEST_COLOURS))
        assert closest > 50, (theme.name, closest)
        assert distance(v["kv-cached"], v["kv-free"]) > 40, theme.name
