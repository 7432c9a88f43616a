"""The Waiting panel: the queue in order, how long each request has waited, and why the head waits."""

from __future__ import annotations

from rich.text import Text

from batchtop.core_engine.engine.request import Phase
from batchtop.core_engine.engine.snapshot import StepSnapshot
from batchtop.tui.frame import DashboardFrame
from batchtop.tui.widgets.panel import Panel, Runs


def head_blocker(snap: StepSnapshot, block_size: int, width: int) -> str | None:
    """Why the first waiting request is not running: the limit it is up against (short if narrow)."""
    if not snap.waiting:
        return None
    running = [s for s in snap.slots if s.phase is not Phase.EMPTY]
    need = -(-snap.waiting[0].prompt_len // block_size)
    if snap.mode == "static" and running:
        long, short = "static batch running: head-of-line blocked until it ends", "HOL: static batch running"
    elif len(running) >= snap.max_num_seqs:
        long, short = f"slots full: {len(running)} running, max_num_seqs={snap.max_num_seqs}", \
            f"slots full {len(running)}/{snap.max_num_seqs}"
    elif need > snap.num_free_blocks:
        long, short = f"KV full: head needs {need} blocks, {snap.num_free_blocks} free", \
            f"KV full: {need} > {snap.num_free_blocks} free"
    else:
        return None
    return long if len(long) <= width else short


class WaitingPanel(Panel):
    def __init__(self, block_size: int, *, id: str | None = "waiting") -> None:
        super().__init__(id=id)
        self.block_size = block_size

    def content_key(self, frame: DashboardFrame) -> object:
        snap = frame.snapshot
        if snap is None:
            return None
        head = tuple((w.request_id, w.num_preemptions) for w in snap.waiting[:40])
        # waited times are shown in whole seconds when narrow and tenths when wide: tenths it is
        return head, snap.num_waiting, snap.num_pending_arrivals, round(snap.t, 1), snap.mode, \
            snap.num_free_blocks, sum(1 for s in snap.slots if s.request_id is not None)

    def update_titles(self, frame: DashboardFrame) -> None:
        snap = frame.snapshot
        n = snap.num_waiting if snap is not None else 0
        self.border_title = f"Waiting {n}"
        later = snap.num_pending_arrivals if snap is not None else 0
        self.border_subtitle = f"{later} not yet arrived" if later else ""

    def render(self) -> Text:
        frame = self.frame
        if frame is None or frame.snapshot is None:
            return self.placeholder("no requests yet")
        snap = frame.snapshot
        if not snap.waiting:
            return self.placeholder("queue empty")
        width, height = self.content_size.width, self.content_size.height
        out = Runs()
        lines = 0
        blocker = head_blocker(snap, self.block_size, width)
        if blocker:
            out.add(blocker[:width] + "\n", self.style("warning", bold=True))
            lines += 1
        wide = width >= 30
        header = f"{'request':<9}{'prompt':>7}{'max':>6}{'waited':>8}" if wide else f"{'req':<7}{'prompt':>6}{'wait':>5}"
        out.add(header, self.style("muted"))
        lines += 1
        for w in snap.waiting[:max(0, height - lines)]:
            out.newline()
            waited = max(0.0, snap.t - w.arrival_s)
            out.add(f"{w.request_id:<9.9}" if wide else f"{w.request_id:<7.7}", self.request_style(w.index))
            out.add(f"{w.prompt_len:>7}{w.max_tokens:>6}{waited:>7.1f}s" if wide else f"{w.prompt_len:>6}{waited:>4.0f}s",
                    self.style("foreground"))
            if w.num_preemptions:
                out.add(f" ↺{w.num_preemptions}", self.style("warning"))
        return out.text()
