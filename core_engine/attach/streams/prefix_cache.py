"""A server's prefix cache rebuilt from its KV events: what is cached, how fast blocks come and go, and
which prefixes are shared.

KV events name content hashes of full blocks, each stored with its parent's hash, so the cached blocks
form a forest of chains. They never say which request hit a block, so a prefix counts as shared when
two or more cached continuations hang off it (a node with >= 2 cached children): those are ranked by
the tokens their sharing saved (tokens x (continuations - 1): a system prompt under ten conversations
before a question asked twice); when nothing branches, the longest lone chains are shown instead. A block
removed while its children stay cached leaves them as roots of a chain that starts mid-prefix, and the
view says so. One cache per publisher (per data-parallel rank): ranks have their own caches and seqs.

The state is bounded (at most MAX_NODES blocks kept; past that they are counted, not kept, and the view
says it is partial), keeps token ids only for the first PREFIX_IDS tokens of a chain, and view() stays
cheap at 10^5 blocks: child counts and the set of branching blocks are kept as events arrive, and with
many blocks the ranking is redone at most once every TOP_EVERY_S.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from batchtop.core_engine.attach.streams.kv_event_frames import (AllBlocksCleared, BlockHash, BlockRemoved,
                                                                 BlockStored, KVEventBatch)

MAX_NODES = 200_000
PREFIX_IDS = 64  # token ids a prefix keeps for the panel's text
TOP = 5
WINDOW_S = 10.0  # the stored / evicted rates are over this many seconds
TOP_EVERY_S = 1.0  # with more than THROTTLE_NODES blocks, the ranking is redone at most this often
THROTTLE_NODES = 10_000
MAX_WALK = 1_000_000  # steps up a chain (links point only at older nodes, so chains cannot loop)
OTHER_TIERS = frozenset({"CPU", "STORAGE", "DISK"})  # offloaded copies, not the serving cache

Decode = Callable[[Sequence[int]], str]


@dataclass(frozen=True, slots=True)
class Prefix:
    tokens: int  # tokens from the start of its chain through its last block
    blocks: int  # cached blocks in the chain through it
    continuations: int  # distinct cached blocks that follow it; 0 for a lone chain
    token_ids: tuple[int, ...]  # the chain's first ids (up to PREFIX_IDS); () when the start is gone
    text: str | None  # those ids decoded; None without a tokenizer
    starts_mid_prefix: bool = False  # the blocks before its first cached one were evicted or never seen


@dataclass(frozen=True, slots=True)
class PrefixCacheView:
    cached_blocks: int
    block_size: int | None  # None before the first stored block
    stored_total: int  # blocks
    removed_total: int
    stored_per_s: float  # over the last WINDOW_S
    removed_per_s: float
    top: tuple[Prefix, ...]
    shared: bool  # top holds shared prefixes (True) or, nothing branching, the longest chains
    malformed: int  # messages that did not decode
    unknown_events: int
    left_out: int  # events past a batch's cap
    restarts: int  # the publisher's sequence went back: the cache was emptied
    last_malformed: str | None = None
    partial: str | None = None  # why this is not the whole cache, in words; None when it is

    @property
    def cached_tokens(self) -> int:
        return self.cached_blocks * (self.block_size or 0)


class _Node:
    """One cached block; `link` is the parent node it was counted under (None: no parent cached then)."""

    __slots__ = ("parent", "link", "tokens_before", "size", "children", "head")

    def __init__(self, parent: BlockHash | None, link: _Node | None, tokens_before: int, size: int,
                 head: tuple[int, ...]) -> None:
        self.parent = parent
        self.link = link
        self.tokens_before = tokens_before
        self.size = size
        self.children = 0
        self.head = head  # its first token ids, kept only near a chain's start


def _worth(node: _Node) -> tuple[int, int]:
    """What a prefix is worth to the cache: the tokens its continuations did not compute again
    (tokens x (continuations - 1)), then its length; a lone chain (no continuations) by its length."""
    tokens = node.tokens_before + node.size
    return tokens * max(1, node.children - 1), tokens


class PrefixCache:
    def __init__(self, *, max_nodes: int = MAX_NODES, window_s: float = WINDOW_S) -> None:
        self.max_nodes = max_nodes
        self.window_s = window_s
        self._nodes: dict[BlockHash, _Node] = {}
        self._branching: set[BlockHash] = set()  # nodes with >= 2 cached children
        self._overflow = 0  # cached blocks past max_nodes: counted, not kept
        self.block_size: int | None = None
        self.stored_total = self.removed_total = 0
        self.not_kept = self.removed_unseen = self.seq_missed = self.other_tier = 0
        self.malformed_count = self.unknown = self.left_out = self.restarts = 0
        self.last_malformed: str | None = None
        self._last_seq: dict[int | None, int] = {}  # per dp rank
        self._last_rank: int | None = None
        self._rates: deque[list[float]] = deque()  # [second, stored, removed], one entry per second
        self._t_first: float | None = None
        self._version = 0
        self._top: tuple[tuple[Prefix, ...], bool] | None = None
        self._top_at: tuple[int, float, Decode | None] = (-1, 0.0, None)

    # --- feeding ----------------------------------------------------------------------------------

    def malformed(self, reason: str) -> None:
        self.malformed_count += 1
        self.last_malformed = reason

    def apply(self, batch: KVEventBatch, t: float) -> None:
        """Apply one decoded batch received at t (seconds on the watch's clock)."""
        rank = batch.dp_rank if batch.dp_rank is not None else self._last_rank  # None too when a batch was cut
        self._last_rank = rank
        last = self._last_seq.get(rank)
        if last is not None and batch.seq < last:
            self.restarts += 1
            self._clear()
        elif last is not None and batch.seq > last + 1:
            self.seq_missed += batch.seq - last - 1
        self._last_seq[rank] = batch.seq
        self.unknown += batch.num_unknown
        self.left_out += batch.num_left_out
        stored = removed = 0
        for event in batch.events:
            if isinstance(event, AllBlocksCleared):
                self._clear()
            elif event.medium is not None and event.medium.upper() in OTHER_TIERS:
                self.other_tier += 1
            elif isinstance(event, BlockStored):
                stored += self._store(event)
            elif isinstance(event, BlockRemoved):
                removed += self._remove(event)
        self.stored_total += stored
        self.removed_total += removed
        self._count_rate(t, stored, removed)
        self._version += 1

    def _clear(self) -> None:
        self._nodes.clear()
        self._branching.clear()
        self._overflow = 0

    def _store(self, event: BlockStored) -> int:
        size, ids = event.block_size, event.token_ids
        self.block_size = size
        parent = event.parent_block_hash
        for i, h in enumerate(event.block_hashes):
            if h in self._nodes or h == parent:  # already cached (vLLM does not resend), or hostile
                parent = h
                continue
            if len(self._nodes) >= self.max_nodes:
                self._overflow += 1
                self.not_kept += 1
                parent = h
                continue
            link = self._nodes.get(parent) if parent is not None else None
            before = link.tokens_before + link.size if link is not None else 0
            head = tuple(ids[i * size:i * size + min(size, PREFIX_IDS)]) if before < PREFIX_IDS or link is None else ()
            self._nodes[h] = _Node(parent, link, before, size, head)
            if link is not None:
                link.children += 1
                if link.children == 2:
                    self._branching.add(parent)
            parent = h
        return len(event.block_hashes)

    def _remove(self, event: BlockRemoved) -> int:
        for h in event.block_hashes:
            node = self._nodes.pop(h, None)
            if node is None:
                if self._overflow > 0:  # most likely one of those not kept
                    self._overflow -= 1
                else:
                    self.removed_unseen += 1
                continue
            self._branching.discard(h)
            link = node.link
            if link is not None and self._nodes.get(node.parent) is link:
                link.children -= 1
                if link.children == 1:
                    self._branching.discard(node.parent)
            node.link, node.head = None, ()  # its children may hold it: it must not hold its ancestors
        return len(event.block_hashes)

    def _count_rate(self, t: float, stored: int, removed: int) -> None:
        if self._t_first is None:
            self._t_first = t
        second = float(int(t))
        if self._rates and self._rates[-1][0] == second:
            self._rates[-1][1] += stored
            self._rates[-1][2] += removed
        else:
            self._rates.append([second, float(stored), float(removed)])
        while self._rates and self._rates[0][0] < second - self.window_s:
            self._rates.popleft()

    # --- viewing ----------------------------------------------------------------------------------

    @property
    def cached_blocks(self) -> int:
        return len(self._nodes) + self._overflow

    def view(self, t: float, decode: Decode | None = None) -> PrefixCacheView:
        stored_s, removed_s = self._per_s(t)
        top, shared = self._ranked(t, decode)
        return PrefixCacheView(self.cached_blocks, self.block_size, self.stored_total, self.removed_total,
                               stored_s, removed_s, top, shared, self.malformed_count, self.unknown,
                               self.left_out, self.restarts, self.last_malformed, self._partial())

    def _per_s(self, t: float) -> tuple[float, float]:
        if self._t_first is None:
            return 0.0, 0.0
        lo = int(t) - self.window_s + 1  # whole seconds, the current one included: a steady rate reads true
        span = max(1.0, t - max(lo, self._t_first))
        recent = [r for r in self._rates if r[0] >= lo]
        return sum(r[1] for r in recent) / span, sum(r[2] for r in recent) / span

    def _partial(self) -> str | None:
        notes = []
        if self.not_kept:
            notes.append(f"{self.not_kept} blocks stored past the {self.max_nodes:,} kept are counted, not ranked")
        if self.removed_unseen:
            notes.append(f"{self.removed_unseen} removed blocks were stored before the watch saw them")
        if self.seq_missed:
            notes.append(f"{self.seq_missed} batches missed")
        if self.left_out:
            notes.append(f"{self.left_out} events past a batch's cap not applied")
        if self.malformed_count:
            notes.append(f"{self.malformed_count} malformed messages skipped")
        return "; ".join(notes) or None

    def _ranked(self, t: float, decode: Decode | None) -> tuple[tuple[Prefix, ...], bool]:
        version, at, decoded_by = self._top_at
        fresh = version == self._version or (len(self._nodes) > THROTTLE_NODES and 0 <= t - at < TOP_EVERY_S)
        if self._top is None or decoded_by != decode or not fresh:  # == : a bound method is made anew each time
            self._top = self._rank(decode)
            self._top_at = (self._version, t, decode)
        return self._top

    def _rank(self, decode: Decode | None) -> tuple[tuple[Prefix, ...], bool]:
        nodes = self._nodes
        key = lambda h: _worth(nodes[h])  # noqa: E731
        shared = bool(self._branching)
        pool = self._branching if shared else (h for h, n in nodes.items() if n.children == 0)
        return tuple(self._prefix(nodes[h], decode) for h in heapq.nlargest(TOP, pool, key=key)), shared

    def _prefix(self, last: _Node, decode: Decode | None) -> Prefix:
        chain, node = [last], last
        for _ in range(MAX_WALK):
            link = node.link
            if link is None or self._nodes.get(node.parent) is not link:
                break
            chain.append(link)
            node = link
        ids: list[int] = []
        for n in reversed(chain):
            ids.extend(n.head)
            if len(n.head) < n.size or len(ids) >= PREFIX_IDS:  # a head short of its block ends the run
                break
        kept = tuple(ids[:PREFIX_IDS])
        text = None
        if decode is not None and kept:
            try:
                text = decode(kept)
            except Exception:  # a tokenizer that cannot decode these ids costs the text, not the view
                text = None
        return Prefix(last.tokens_before + last.size, len(chain), last.children, kept, text,
                      node.parent is not None)
