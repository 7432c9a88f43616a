"""KV blocks in attach mode: the pool's filled share as a map of its num_gpu_blocks cells. /metrics
says how full the pool is, not which request owns which block, so the cells fill in order."""

from __future__ import annotations

from rich.text import Text

from batchtop.core_engine.attach.monitor import AttachFrame
from batchtop.tui.widgets.engine.kv_blocks import blocks_per_cell
from batchtop.tui.widgets.common.panel import Panel, Runs

UNKNOWN_POOL = 100  # cells drawn when the server does not say its pool size (each 1%)


class AttachKVPanel(Panel):
    def __init__(self, *, id: str | None = "attach-kv") -> None:
        super().__init__(id=id)

    def content_key(self, frame: AttachFrame) -> object:
        m = frame.main
        return m.kv_usage, m.num_gpu_blocks, m.status

    def update_titles(self, frame: AttachFrame) -> None:
        m = frame.main
        if m.kv_usage is None:
            self.border_title = "KV blocks (filled share; no per-request owners in /metrics)"
            return
        total = m.num_gpu_blocks
        used = f"{round(m.kv_usage * total)}/{total} used" if total else "pool size not exposed"
        self.border_title = f"KV blocks {used} ({100 * m.kv_usage:.0f}%) · filled share, no owners in /metrics"
        per = blocks_per_cell(total or UNKNOWN_POOL, self.content_size.width, self.content_size.height)
        self.border_subtitle = f"{per} blocks/cell" if total and per > 1 else ("1%/cell" if not total else "")

    def render(self) -> Text:
        frame: AttachFrame | None = self.frame
        if frame is None or frame.main.kv_usage is None:
            gaps = frame.main.cannot_fill if frame is not None else {}
            return self.placeholder(gaps.get("kv", "KV usage not exposed yet"))
        m = frame.main
        total = m.num_gpu_blocks or UNKNOWN_POOL
        width, height = max(1, self.content_size.width), max(1, self.content_size.height)
        per = blocks_per_cell(total, width, height)
        cells = -(-total // per)
        used_blocks = m.kv_usage * total
        out = Runs()
        used_style, free_style = self.style("req-0"), self.style("kv-free")
        for n in range(cells):
            if n and n % width == 0:
                out.newline()
            share = min(1.0, max(0.0, (used_blocks - n * per) / per))
            if share <= 0:
                out.add("·", free_style)
            else:
                out.add("■" if share >= 1 or per == 1 else "░▒▓█"[min(3, int(share * 4))], used_style)
        return out.text()
