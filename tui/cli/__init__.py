"""The `batchtop` command line: click commands, no Textual until a dashboard starts."""

from batchtop.tui.cli.main import main

__all__ = ["main"]
