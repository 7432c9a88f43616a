"""The base of every panel: holds the newest frame, redraws only when it changes, reads theme colours."""

from __future__ import annotations

from rich.style import Style
from rich.text import Text
from textual.widget import Widget

from themes import NUM_REQUEST_COLOURS
from tui.frame import DashboardFrame


class Panel(Widget):
    DEFAULT_CLASSES = "panel"

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.frame: DashboardFrame | None = None

    def show(self, frame: DashboardFrame) -> None:
        if frame is not self.frame:
            self.frame = frame
            self.update_titles(frame)
            self.refresh()

    def update_titles(self, frame: DashboardFrame) -> None:
        """Panels put their counts in the border title; override."""

    def colour(self, name: str) -> str:
        return self.app.theme_variables.get(name) or self.app.theme_variables.get("foreground", "default")

    def request_colour(self, index: int) -> str:
        return self.colour(f"req-{index % NUM_REQUEST_COLOURS}")

    def style(self, colour_var: str, *, bgcolor_var: str | None = None, bold: bool = False,
              dim: bool = False) -> Style:
        return Style(color=self.colour(colour_var), bgcolor=self.colour(bgcolor_var) if bgcolor_var else None,
                     bold=bold, dim=dim)

    def placeholder(self, message: str) -> Text:
        return Text(message, style=self.style("muted"))
