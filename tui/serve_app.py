"""The live dashboard with the server running in the same process: the status line shows its URL."""

from __future__ import annotations

from batchtop.tui.app import BatchtopApp
from batchtop.tui.sources.frame import DashboardFrame


class ServeApp(BatchtopApp):
    def __init__(self, *args, url: str, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.url = url

    def status_extra(self, frame: DashboardFrame) -> str:
        extra = super().status_extra(frame)
        return f"serving {self.url}" + (f" · {extra}" if extra else "")
