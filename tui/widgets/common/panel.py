"""The base of every panel: holds the newest frame, redraws only when it changes, reads theme colours.

Panels redraw beside a busy engine on the same two cores, so drawing must be cheap: styles are
built once per theme and reused, and text is assembled in runs (one span per stretch of equal
style) rather than one span per cell — Textual's cost grows with the number of spans.
"""

from __future__ import annotations

from rich.style import Style
from rich.text import Text
from textual.widget import Widget

from batchtop.themes import NUM_REQUEST_COLOURS
from batchtop.core_engine.run.frame import DashboardFrame


class Runs:
    """Builds a Text from pieces, merging neighbours that share a style object."""

    __slots__ = ("_parts",)

    def __init__(self) -> None:
        self._parts: list[list] = []

    def add(self, text: str, style: Style | None = None) -> None:
        if self._parts and self._parts[-1][1] is style:
            self._parts[-1][0] += text
        else:
            self._parts.append([text, style])

    def newline(self) -> None:
        if self._parts:
            self._parts[-1][0] += "\n"
        else:
            self._parts.append(["\n", None])

    def text(self) -> Text:
        out = Text(no_wrap=True, overflow="crop")
        for piece, style in self._parts:
            out.append(piece, style)
        return out


class Panel(Widget):
    DEFAULT_CLASSES = "panel"
    MODELLED = False  # its numbers come from the clock or the device: a what-if run says they are modelled

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.frame: DashboardFrame | None = None
        self._key: object = None
        self._styles: dict[tuple, Style] = {}
        self._styles_theme: str | None = None
        self.modelled_tag = ""  # "SIMULATED <device>" in a what-if run's modelled panels

    def show(self, frame: DashboardFrame, force: bool = False) -> None:
        """Repaint only when what this panel draws has changed. The dashboard decides when a frame is
        shown and hands the same one to every panel, so all panels always show the same step."""
        key = self.content_key(frame)
        if key == self._key and not force:
            return
        self._key, self.frame = key, frame
        self._retitle(frame)
        self.refresh()

    def _retitle(self, frame: DashboardFrame) -> None:
        self.update_titles(frame)
        if self.modelled_tag:
            self.border_title = f"{self.border_title} · {self.modelled_tag}"

    def on_resize(self) -> None:
        """Titles that are fitted to the width are fitted again."""
        if self.frame is not None:
            self._retitle(self.frame)

    def title_room(self) -> int:
        """Cells the border title (or subtitle) can take before the border cuts it; unbounded before layout."""
        width = self.outer_size.width  # the border's corners, a rule and a space on either side take 6
        return width - 6 if width else 1 << 16

    def content_key(self, frame: DashboardFrame) -> object:
        """What this panel's picture depends on; equal keys mean nothing to repaint."""
        return frame

    def update_titles(self, frame: DashboardFrame) -> None:
        """Panels put their counts in the border title; override."""

    def colour(self, name: str) -> str:
        return self.app.theme_variables.get(name) or self.app.theme_variables.get("foreground", "default")

    def style(self, colour_var: str, *, bgcolor_var: str | None = None, bold: bool = False,
              dim: bool = False, reverse: bool = False) -> Style:
        """The (cached) style for a theme colour; the same object each time, so runs can merge."""
        if self._styles_theme != self.app.theme:
            self._styles.clear()
            self._styles_theme = self.app.theme
        key = (colour_var, bgcolor_var, bold, dim, reverse)
        style = self._styles.get(key)
        if style is None:
            # reverse=None, not False, unless asked: an explicit False is another Style to Rich
            style = self._styles[key] = Style(color=self.colour(colour_var), bold=bold, dim=dim,
                                              reverse=reverse or None,
                                              bgcolor=self.colour(bgcolor_var) if bgcolor_var else None)
        return style

    def request_style(self, index: int, **kwargs) -> Style:
        return self.style(f"req-{index % NUM_REQUEST_COLOURS}", **kwargs)

    def add_cells(self, out: Runs, cells: list[tuple[str, str]]) -> None:
        """A line of (glyph, colour) cells; a colour ending in "!" is bold, other points are dimmed."""
        for glyph, colour in cells:
            bold = colour.endswith("!")
            out.add(glyph, self.style(colour.rstrip("!"), bold=bold, dim=not bold and colour.startswith("point")))

    def placeholder(self, message: str) -> Text:
        return Text(message, style=self.style("muted"))
