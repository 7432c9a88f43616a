"""The KV blocks panel: the paged pool as a grid, each block coloured by the request that owns it.

With more blocks than cells, each cell aggregates several blocks: its shade says how full the group
is and its colour is the group's main owner. Free blocks are plainly free (· in $kv-free).
"""

from __future__ import annotations

from collections import Counter

from rich.text import Text

from batchtop.core_engine.sched.kv_cache import FREE
from batchtop.tui.sources.frame import DashboardFrame
from batchtop.tui.widgets.common.panel import Panel, Runs

SHADES = "░▒▓█"  # 1-25%, 26-50%, 51-75%, 76-100% of a cell's blocks in use


def blocks_per_cell(num_blocks: int, width: int, height: int) -> int:
    return max(1, -(-num_blocks // max(1, width * height)))


class KVBlocksPanel(Panel):
    MODELLED = True  # the pool is sized from the simulated device's memory

    def __init__(self, *, id: str | None = "kv") -> None:
        super().__init__(id=id)

    def content_key(self, frame: DashboardFrame) -> object:
        snap = frame.snapshot
        return None if snap is None else (snap.block_owners, snap.num_free_blocks)

    def update_titles(self, frame: DashboardFrame) -> None:
        snap = frame.snapshot
        if snap is None:
            self.border_title = "KV blocks"
            return
        used, total = snap.num_used_blocks, snap.num_blocks
        self.border_title = f"KV blocks {used}/{total} used ({100 * used / total:.0f}%)"
        per = blocks_per_cell(total, self.content_size.width, self.content_size.height)
        self.border_subtitle = f"{per} blocks/cell" if per > 1 else f"{snap.num_free_blocks} free"

    def render(self) -> Text:
        frame = self.frame
        if frame is None or frame.snapshot is None:
            return self.placeholder("no KV pool yet")
        owners = frame.snapshot.block_owners
        width, height = max(1, self.content_size.width), max(1, self.content_size.height)
        per = blocks_per_cell(len(owners), width, height)
        free = self.style("kv-free")
        out = Runs()
        for n, start in enumerate(range(0, len(owners), per)):
            if n and n % width == 0:
                out.newline()
            group = owners[start:start + per]
            used = [o for o in group if o != FREE]
            if not used:
                out.add("·", free)
                continue
            owner = Counter(used).most_common(1)[0][0] if per > 1 else used[0]
            shade = "■" if per == 1 else SHADES[min(3, (4 * len(used) - 1) // len(group))]
            out.add(shade, self.request_style(owner))
        return out.text()
