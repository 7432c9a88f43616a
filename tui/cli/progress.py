"""A one-line progress bar on stderr for headless runs (only when stderr is a terminal)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from batchtop.core_engine.perf.metrics import RateWindow
from batchtop.core_engine.engine.snapshot import StepSnapshot


class StderrProgress:
    def __init__(self, total: int, label: str = "", stream: TextIO | None = None, min_interval_s: float = 0.1) -> None:
        self.total = max(total, 1)
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = self.stream.isatty()
        self.min_interval_s = min_interval_s
        self._last_draw = 0.0
        self._rate = RateWindow()
        self._generated = 0

    def update(self, snap: StepSnapshot) -> None:
        generated = snap.counters.generated_tokens
        self._rate.add(snap.t, generated - self._generated)
        self._generated = generated
        now = time.monotonic()
        if not self.enabled or now - self._last_draw < self.min_interval_s:
            return
        self._last_draw = now
        c = snap.counters
        done = c.completed + c.rejected
        width = 24
        filled = int(width * done / self.total)
        bar = "#" * filled + "-" * (width - filled)
        line = (f"\r{self.label}[{bar}] {done}/{self.total} requests · step {snap.step} · "
                f"{self._rate.rate():.0f} tok/s · waiting {snap.num_waiting} · {snap.t:.0f}s ")
        self.stream.write(line)
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()
