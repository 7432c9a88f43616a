"""The attach KV panel's prefix-cache lines (--kv-events): blocks cached and how fast they are stored
and evicted, vLLM's own hit rate beside them, the link's health, and the shared prefixes as text (ids without the server's tokenizer). Lines of (text, theme colour), laid out by the panel."""

from __future__ import annotations

from batchtop.core_engine.attach.stats import ReplicaStats
from batchtop.core_engine.attach.streams.prefix_cache import Prefix, PrefixCacheView

Line = tuple[str, str]


def prefix_label(p: Prefix) -> str:
    """A prefix as one line: how long, how many continuations, what it says."""
    what = p.text if p.text is not None else " ".join(map(str, p.token_ids)) or "(its start was evicted)"
    what = what.replace("\n", "⏎")
    shared = f" ×{p.continuations}" if p.continuations >= 2 else ""
    return f"{p.tokens:>6,} tok{shared}{' …' if p.starts_mid_prefix else ''}  {what}"


def prefix_lines(view: PrefixCacheView, m: ReplicaStats, link: str | None) -> list[Line]:
    size = f" ({view.cached_tokens:,} tok)" if view.block_size else ""
    out = [(f"prefix cache: {view.cached_blocks:,} blocks cached{size} · stored {view.stored_per_s:.1f}/s · "
            f"evicted {view.removed_per_s:.1f}/s (KV events)", "foreground"),
           (f"hit rate (the server's counters): {m.prefix_cache}", "muted")]
    if link is not None:
        out.append((link, "warning" if "missed" in link or "stopped" in link else "muted"))
    if view.partial:
        out.append((f"partial: {view.partial}", "warning"))
    if view.top:
        out.append(("shared prefixes, most reused first:" if view.shared else "longest cached chains (none shared yet):",
                    "muted"))
        out.extend((prefix_label(p), "kv-shared" if view.shared else "kv-cached") for p in view.top)
    return out
