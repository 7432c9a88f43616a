"""`batchtop` with no subcommand: the live dashboard."""

from __future__ import annotations

import sys

import click


def run_dashboard(opts: dict) -> None:
    click.echo("batchtop: the dashboard is not built yet; use `batchtop --headless` or `batchtop compare`.",
               err=True)
    sys.exit(2)
