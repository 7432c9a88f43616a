"""A bare Textual App around one panel, for tests that look at a panel alone."""

from textual.app import App, ComposeResult


class Host(App):
    def __init__(self, panel) -> None:
        super().__init__()
        self.panel = panel

    def compose(self) -> ComposeResult:
        yield self.panel
