"""`batchtop serve --headless` says what it is doing every few seconds, in one line (like vLLM's log)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.serve.exporter import num_running
from batchtop.core_engine.serve.hub import RequestHub


class StatusLog:
    def __init__(self, engine: Engine, hub: RequestHub, write: Callable[[str], None], every_s: float = 5.0) -> None:
        self.engine = engine
        self.hub = hub
        self.write = write
        self.every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="batchtop-status", daemon=True)
        self._last = (time.monotonic(), 0, 0, 0)  # time, prompt tokens, generated tokens, completed

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(self.every_s)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            line = self.line()
            if line is not None:
                self.write(line)

    def line(self) -> str | None:
        """The summary since the last line; None when nothing happened (an idle server stays quiet)."""
        snap = self.engine.latest
        if snap is None:
            return None
        c = snap.counters
        now = time.monotonic()
        t0, prompt0, generated0, completed0 = self._last
        self._last = (now, c.prompt_tokens, c.generated_tokens, c.completed)
        running = num_running(snap)
        if (c.generated_tokens, c.prompt_tokens) == (generated0, prompt0) and not running and not snap.num_waiting:
            return None
        dt = max(now - t0, 1e-9)
        kv = snap.num_used_blocks / snap.num_blocks if snap.num_blocks else 0.0
        return (f"running {running} · waiting {snap.num_waiting} · KV {100 * kv:.1f}% · "
                f"prompt {(c.prompt_tokens - prompt0) / dt:.1f} tok/s · generation "
                f"{(c.generated_tokens - generated0) / dt:.1f} tok/s · completed {c.completed} "
                f"(+{c.completed - completed0}) · in flight {self.hub.num_in_flight} · {snap.mode}, "
                f"max_num_seqs {snap.max_num_seqs}")
