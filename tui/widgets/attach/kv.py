"""KV blocks in attach mode: the pool's filled share as a map of its num_gpu_blocks cells. /metrics
says how full the pool is, not which request owns which block, so the cells fill in order. With the
server's KV events (--kv-events), its prefix cache above the map (prefix_lines.py)."""

from __future__ import annotations

from rich.text import Text

from batchtop.core_engine.attach.monitor import AttachFrame
from batchtop.tui.widgets.attach.prefix_lines import prefix_lines
from batchtop.tui.widgets.common.panel import Panel, Runs
from batchtop.tui.widgets.common.text_fit import clip
from batchtop.tui.widgets.engine.kv_blocks import blocks_per_cell

UNKNOWN_POOL = 100  # cells drawn when the server does not say its pool size (each 1%)


class AttachKVPanel(Panel):
    def __init__(self, *, id: str | None = "attach-kv") -> None:
        super().__init__(id=id)

    def content_key(self, frame: AttachFrame) -> object:
        m = frame.main
        streams = frame.streams
        return m.kv_usage, m.num_gpu_blocks, m.status, m.prefix_cache, \
            (streams.prefix, streams.kv_link) if streams is not None else None

    def update_titles(self, frame: AttachFrame) -> None:
        m = frame.main
        if m.kv_usage is None:
            self.border_title = "KV blocks (filled share; no per-request owners in /metrics)"
            return
        total = m.num_gpu_blocks
        used = f"{round(m.kv_usage * total)}/{total} used" if total else "pool size not exposed"
        events = frame.streams is not None and frame.streams.prefix is not None
        what = "its prefix cache from KV events" if events else "filled share, no owners in /metrics"
        self.border_title = f"KV blocks {used} ({100 * m.kv_usage:.0f}%) · {what}"
        per = blocks_per_cell(total or UNKNOWN_POOL, self.content_size.width, self.content_size.height)
        self.border_subtitle = f"{per} blocks/cell" if total and per > 1 else ("1%/cell" if not total else "")

    def render(self) -> Text:
        frame: AttachFrame | None = self.frame
        width, height = max(1, self.content_size.width), max(1, self.content_size.height)
        out = Runs()
        prefix = frame.streams.prefix if frame is not None and frame.streams is not None else None
        used_rows = 0
        if prefix is not None:
            lines = prefix_lines(prefix, frame.main, frame.streams.kv_link)[:max(1, height - 2)]
            for text, colour in lines:
                out.add(clip(text, width), self.style(colour))
                out.newline()
            used_rows = len(lines)
        if frame is None or frame.main.kv_usage is None:
            gaps = frame.main.cannot_fill if frame is not None else {}
            if prefix is None:
                return self.placeholder(gaps.get("kv", "KV usage not exposed yet"))
            return out.text()
        self._pool_map(out, frame, width, max(1, height - used_rows))
        return out.text()

    def _pool_map(self, out: Runs, frame: AttachFrame, width: int, height: int) -> None:
        m = frame.main
        total = m.num_gpu_blocks or UNKNOWN_POOL
        per = blocks_per_cell(total, width, height)
        cells = -(-total // per)
        used_blocks = m.kv_usage * total
        used_style, free_style = self.style("req-0"), self.style("kv-free")
        for n in range(cells):
            if n and n % width == 0:
                out.newline()
            share = min(1.0, max(0.0, (used_blocks - n * per) / per))
            if share <= 0:
                out.add("·", free_style)
            else:
                out.add("■" if share >= 1 or per == 1 else "░▒▓█"[min(3, int(share * 4))], used_style)
