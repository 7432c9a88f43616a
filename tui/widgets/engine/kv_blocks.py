"""The KV blocks panel: the paged pool as a grid, each block in the state a vLLM operator reads off it.

A block is owned by one request (■ in that request's colour), shared by several through the prefix
cache (their number, 2-9 or +, in $kv-shared), free but still holding a cached prefix that a later
request can reuse until the pool needs the block (○ in $kv-cached), or plainly free (· in $kv-free).
With more blocks than cells, each cell aggregates several blocks: its shade says how full the group
is and its colour is the group's main owner ($kv-shared when most of its used blocks are shared).
"""

from __future__ import annotations

from collections import Counter

from rich.text import Text

from batchtop.core_engine.sched.kv_cache import CACHED, FREE
from batchtop.core_engine.engine.snapshot import StepSnapshot
from batchtop.core_engine.run.frame import DashboardFrame
from batchtop.tui.widgets.common.text_fit import first_fit
from batchtop.tui.widgets.common.panel import Panel, Runs

SHADES = "░▒▓█"  # 1-25%, 26-50%, 51-75%, 76-100% of a cell's blocks in use


def blocks_per_cell(num_blocks: int, width: int, height: int) -> int:
    return max(1, -(-num_blocks // max(1, width * height)))


def block_refs(snap: StepSnapshot) -> tuple[int, ...]:
    """Holders per block; a snapshot without them (no prefix cache, an old trace) has one per owned block."""
    return snap.block_refs or tuple(0 if o == FREE else 1 for o in snap.block_owners)


def shared_glyph(holders: int) -> str:
    return str(holders) if holders < 10 else "+"


class KVBlocksPanel(Panel):
    MODELLED = True  # the pool is sized from the simulated device's memory

    def __init__(self, *, id: str | None = "kv") -> None:
        super().__init__(id=id)

    def content_key(self, frame: DashboardFrame) -> object:
        snap = frame.snapshot
        if snap is None:
            return None
        return snap.block_owners, snap.block_refs, snap.num_free_blocks, snap.counters.prefix_hits

    def update_titles(self, frame: DashboardFrame) -> None:
        snap = frame.snapshot
        if snap is None:
            self.border_title = "KV blocks"
            return
        used, total = snap.num_used_blocks, snap.num_blocks
        pct = f"{100 * used / total:.0f}%"
        c = snap.counters
        hit = f" · hit {100 * c.prefix_hits / c.prefix_queries:.0f}%" if c.prefix_queries else ""  # as vLLM counts it
        room = self.title_room()
        # fitted to the border, shortest last: never cut by it
        self.border_title = first_fit([f"KV blocks {used}/{total} used ({pct}){hit}",
                                       f"KV blocks {used}/{total} ({pct}){hit}", f"KV blocks {pct} used{hit}",
                                       f"KV blocks {pct}{hit}", f"KV blocks {pct}"], room)
        per = blocks_per_cell(total, self.content_size.width, self.content_size.height)
        cells = (f"{per} blocks/cell", f"{per} blk/cell") if per > 1 else (f"{snap.num_free_blocks} free",) * 2
        prefix = ("", "")
        if snap.block_refs:
            refs = snap.block_refs
            shared, cached = sum(r > 1 for r in refs), refs.count(CACHED)
            prefix = (f" · {shared} shared · {cached} cached", f" · {shared} shr · {cached} cached")
        short = f"{per}/cell" if per > 1 else f"{snap.num_free_blocks} free"
        self.border_subtitle = first_fit([cells[0] + prefix[0], cells[1] + prefix[0], cells[1] + prefix[1],
                                          short + prefix[1]], room)

    def render(self) -> Text:
        frame = self.frame
        if frame is None or frame.snapshot is None:
            return self.placeholder("no KV pool yet")
        owners, refs = frame.snapshot.block_owners, block_refs(frame.snapshot)
        width, height = max(1, self.content_size.width), max(1, self.content_size.height)
        per = blocks_per_cell(len(owners), width, height)
        free, cached, shared = self.style("kv-free"), self.style("kv-cached"), self.style("kv-shared", bold=True)
        out = Runs()
        for n, start in enumerate(range(0, len(owners), per)):
            if n and n % width == 0:
                out.newline()
            group, held = owners[start:start + per], refs[start:start + per]
            used = [o for o, r in zip(group, held) if r > 0]
            if not used:
                out.add("○", cached) if CACHED in held else out.add("·", free)
            elif per == 1:
                out.add(shared_glyph(held[0]), shared) if held[0] > 1 else out.add("■", self.request_style(used[0]))
            else:
                shade = SHADES[min(3, (4 * len(used) - 1) // len(group))]
                if 2 * sum(r > 1 for r in held) >= len(used):
                    out.add(shade, shared)
                else:
                    out.add(shade, self.request_style(Counter(used).most_common(1)[0][0]))
        return out.text()
