"""The attach dashboard's first line: what bounds the batch right now (the verdict and the numbers
that say so), and under it the one thing to try."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from batchtop.core_engine.attach.monitor import AttachFrame
from batchtop.core_engine.attach.verdict.verdict import Verdict

HELD = 5.0  # seconds a verdict must hold before its age is worth showing


def verdict_text(verdict: Verdict | None) -> Text:
    text = Text(no_wrap=True, overflow="ellipsis")
    if verdict is None:
        text.append(" WATCHING ", "bold reverse")
        text.append(" no scrape yet")
        return text
    text.append(f" {verdict.headline} ", "bold reverse")
    text.append(f" {verdict.line}", "bold")
    if verdict.since_s is not None and verdict.since_s >= HELD:
        text.append(f"  (for {verdict.since_s:.0f} s)", "dim")
    if verdict.candidate is not None and verdict.kind != "watching":
        text.append(f"  (turning to {verdict.candidate}?)", "dim")
    text.append("\n ")
    text.append(verdict.advice or "try: -", "italic" if verdict.advice else "dim")
    return text


class AttachVerdictLine(Static):
    def show(self, frame: AttachFrame) -> None:
        self.update(verdict_text(frame.verdict))
