"""batchtop's themes: Textual Theme objects (palettes.py) whose variables carry every colour the panels use.

Widgets never name a colour: they read `$req-0..$req-11` (request colours), `$phase-*`, `$bubble`,
`$draining`, `$kv-free`, `$kv-cached`, `$kv-shared`, `$roof` and friends from the active theme, so a theme switch recolours everything. This
module imports no Textual: the CLI offers the theme names without loading it.
"""

from __future__ import annotations

from pathlib import Path

STYLESHEET = Path(__file__).with_name("batchtop.tcss")
NUM_REQUEST_COLOURS = 12
THEME_NAMES = ("dark", "light", "colourblind")  # --theme's choices; `t` cycles them in this order


def theme_id(name: str) -> str:
    """The Textual theme a --theme name selects."""
    return f"batchtop-{name}"
