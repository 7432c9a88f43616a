"""The three palettes as Textual Theme objects: dark, light and colour-blind safe."""

from __future__ import annotations

from textual.theme import Theme

from batchtop.themes import NUM_REQUEST_COLOURS, THEME_NAMES, theme_id


def _variables(requests: list[str], **named: str) -> dict[str, str]:
    assert len(requests) == NUM_REQUEST_COLOURS
    out = {f"req-{i}": c for i, c in enumerate(requests)}
    out.update({k.replace("_", "-"): v for k, v in named.items()})
    return out


DARK = Theme(
    name="batchtop-dark", dark=True,
    primary="#5fafff", secondary="#8787d7", accent="#ffaf5f", warning="#ffaf00", error="#ff5f5f",
    success="#5fd787", foreground="#d7dae0", background="#101218", surface="#181b23", panel="#20242e",
    variables=_variables(
        ["#4e9df5", "#f5a742", "#57c785", "#d4a373", "#b48ef0", "#e0c04c",
         "#4fc1c9", "#f07fb8", "#9bbf4a", "#8fbcbb", "#7f9cf5", "#c9c9c9"],
        phase_prefill="#ffd75f", phase_decode="#5fd787", phase_padding="#6c6f7a", prompt_pad="#9c8a5c", slot_empty="#3a3f4b",
        bubble="#ff5f5f", draining="#3f3a52", kv_free="#2c313c", kv_cached="#5c6a88", kv_shared="#ff87ff", roof="#8a8f9c", point_decode="#5fd7ff", point_prefill="#ffaf5f",
        muted="#8a8f9c"),
)

LIGHT = Theme(
    name="batchtop-light", dark=False,
    primary="#0063b1", secondary="#5c4db1", accent="#b35c00", warning="#9a6700", error="#c62828",
    success="#1a7f37", foreground="#1f2328", background="#fbfbfc", surface="#f2f3f5", panel="#e6e8ec",
    variables=_variables(
        ["#1f6fd1", "#c46a00", "#1a8a4a", "#00695c", "#7b4fd1", "#8f7400",
         "#00838f", "#37474f", "#5d8a00", "#827717", "#3f51b5", "#616161"],
        phase_prefill="#9a6700", phase_decode="#1a7f37", phase_padding="#9ea3ab", prompt_pad="#b39a5c", slot_empty="#d5d8dd",
        bubble="#c62828", draining="#e2d9f0", kv_free="#e1e4e8", kv_cached="#98a6c4", kv_shared="#a3009c", roof="#6e7781", point_decode="#0063b1", point_prefill="#b35c00",
        muted="#6e7781"),
)

# Okabe-Ito (plus a few of Tol's): distinguishable under the common colour-vision deficiencies.
# Phase is also carried by glyphs everywhere, so colour is never the only channel. No request colour
# in any theme is close to $bubble: a bubble must never look like a request. $draining is a background
# (slots past a lowered max_num_seqs keep their request's colour on it, and a ↓).
COLOUR_BLIND = Theme(
    name="batchtop-colourblind", dark=True,
    primary="#56b4e9", secondary="#cc79a7", accent="#e69f00", warning="#f0e442", error="#d55e00",
    success="#009e73", foreground="#e8e8e8", background="#111111", surface="#1a1a1a", panel="#242424",
    variables=_variables(
        ["#e69f00", "#56b4e9", "#009e73", "#f0e442", "#0072b2", "#882255",
         "#cc79a7", "#ffffff", "#999999", "#b3de69", "#80b1d3", "#fdb462"],
        phase_prefill="#f0e442", phase_decode="#56b4e9", phase_padding="#777777", prompt_pad="#c8b88a", slot_empty="#333333",
        bubble="#d55e00", draining="#46465e", kv_free="#2a2a2a", kv_cached="#6a6a8a", kv_shared="#d0a0ff", roof="#999999", point_decode="#56b4e9", point_prefill="#e69f00",
        muted="#999999"),
)

THEMES: tuple[Theme, ...] = (DARK, LIGHT, COLOUR_BLIND)
assert tuple(t.name for t in THEMES) == tuple(theme_id(n) for n in THEME_NAMES)


def next_theme(name: str) -> str:
    """The theme `t` switches to after `name` (the first one after an unknown name)."""
    names = [t.name for t in THEMES]
    return names[(names.index(name) + 1) % len(names)] if name in names else names[0]
