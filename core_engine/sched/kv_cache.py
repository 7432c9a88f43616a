"""The paged KV pool's bookkeeping: a free list in LRU order with ref counts, per-sequence block tables,
and (when prefix caching is on) the index of full blocks whose KV can be reused.

A free block that holds a cached prefix keeps its KV and key until it is handed out again: freed
blocks join the tail of the free list and allocation takes from the head, so the least recently used
cached block is evicted first. The tensors themselves live in the runner; this module imports no
torch so it tests anywhere.
"""

from __future__ import annotations

from collections import OrderedDict

from batchtop.core_engine.sched.prefix_cache import ROOT_DIGEST, PrefixIndex, block_digest, extend_digests
from batchtop.core_engine.sched.request import Sequence

FREE = -1  # owner id of a free block in the block map
CACHED = -1  # block_refs() of a free block that still holds a cached prefix (evictable)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class BlockAllocator:
    """Hands out fixed-size KV blocks; a block returns to the free list when its last holder lets go."""

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = False) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.cache = PrefixIndex(num_blocks) if enable_caching else None
        self.reset()

    def reset(self) -> None:
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(self.num_blocks))  # head: evicted first
        self._holders: list[list[int]] = [[] for _ in range(self.num_blocks)]  # sequence indexes; ref count = len
        # kept in step with _holders, so the per-step block maps are one C-speed copy each
        self._owner = [FREE] * self.num_blocks  # the oldest holder
        self._refs = [0] * self.num_blocks  # len(_holders), or CACHED for a free block that keeps a key
        self._num_cached_free = 0
        if self.cache is not None:
            self.cache.clear()

    @property
    def num_free_blocks(self) -> int:
        """Blocks a request can be given, cached ones (evictable) included."""
        return len(self._free)

    @property
    def num_cached_free_blocks(self) -> int:
        """Free blocks that still hold a cached prefix."""
        return self._num_cached_free

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= len(self._free)

    def allocate(self, num_blocks: int, owner: int) -> list[int]:
        """num_blocks blocks from the head of the free list; a cached one among them loses its key."""
        if num_blocks > len(self._free):
            raise RuntimeError(f"asked for {num_blocks} KV blocks, {len(self._free)} free")
        blocks = []
        for _ in range(num_blocks):
            b, _ = self._free.popitem(last=False)
            if self.cache is not None and self.cache.forget(b):
                self._num_cached_free -= 1
            self._holders[b] = [owner]
            self._owner[b], self._refs[b] = owner, 1
            blocks.append(b)
        return blocks

    def share(self, block: int, owner: int) -> None:
        """owner takes a cached block (a prefix hit): one more holder; a free one leaves the free list."""
        if self.cache is None or self.cache.digest_of(block) is None:
            raise RuntimeError(f"KV block {block} holds no cached prefix")
        holders = self._holders[block]
        if owner in holders:
            raise RuntimeError(f"sequence {owner} already holds KV block {block}")
        if not holders:
            del self._free[block]
            self._num_cached_free -= 1
            self._owner[block] = owner
        holders.append(owner)
        self._refs[block] = len(holders)

    def free(self, blocks: list[int], owner: int | None = None) -> None:
        """Drop owner's hold (the oldest holder's when None) on each distinct block, in order: a block
        nobody holds joins the free list's tail, keeping its cached prefix. A block named twice in one
        call is dropped once; a double free raises before anything changes."""
        distinct = list(dict.fromkeys(blocks))
        for b in distinct:
            holders = self._holders[b]
            if not holders:
                raise RuntimeError(f"double free of KV block {b}")
            if owner is not None and owner not in holders:
                raise RuntimeError(f"KV block {b} is not held by sequence {owner}")
        for b in distinct:
            holders = self._holders[b]
            holders.remove(holders[0] if owner is None else owner)
            if holders:
                self._owner[b], self._refs[b] = holders[0], len(holders)
                continue
            self._free[b] = None
            self._owner[b], self._refs[b] = FREE, 0
            if self.cache is not None and self.cache.digest_of(b) is not None:
                self._num_cached_free += 1
                self._refs[b] = CACHED

    def ref_count(self, block: int) -> int:
        return len(self._holders[block])

    def is_free(self, block: int) -> bool:
        return not self._holders[block]

    def free_order(self) -> list[int]:
        """The free list, next to be handed out first."""
        return list(self._free)

    def owners(self) -> tuple[int, ...]:
        """Owner sequence index per block (its oldest holder; FREE for free blocks): the KV block map."""
        return tuple(self._owner)

    def block_refs(self) -> tuple[int, ...]:
        """Holders per block; 0 for a free block, CACHED for a free one that still holds a cached prefix."""
        return tuple(self._refs)

    def check_invariants(self) -> None:
        """Free exactly when nobody holds it, no holder twice, the cached count and the index agree."""
        cached_free = 0
        for b in range(self.num_blocks):
            holders = self._holders[b]
            assert len(set(holders)) == len(holders), f"block {b} has a holder twice: {holders}"
            assert self._owner[b] == (holders[0] if holders else FREE), f"block {b}: owner out of step"
            keyed = self.cache is not None and self.cache.digest_of(b) is not None
            assert self._refs[b] == (len(holders) or (CACHED if keyed else 0)), f"block {b}: refs out of step"
            if b in self._free:
                assert not holders, f"free block {b} is referenced"
                cached_free += self.cache is not None and self.cache.digest_of(b) is not None
            else:
                assert holders, f"block {b} is neither free nor referenced"
        assert cached_free == self._num_cached_free, "cached free blocks miscounted"
        if self.cache is not None:
            self.cache.check_invariants()


class BlockManager:
    """Grows and frees sequences' block tables on top of the allocator, and finds their cached prefixes."""

    def __init__(self, allocator: BlockAllocator) -> None:
        self.allocator = allocator
        self.block_size = allocator.block_size

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        """New blocks seq needs so that num_tokens of its tokens have a KV slot."""
        return max(0, cdiv(num_tokens, self.block_size) - len(seq.block_table))

    def can_grow(self, seq: Sequence, num_tokens: int) -> bool:
        return self.allocator.can_allocate(self.blocks_needed(seq, num_tokens))

    def grow(self, seq: Sequence, num_tokens: int) -> None:
        need = self.blocks_needed(seq, num_tokens)
        if need:
            seq.block_table.extend(self.allocator.allocate(need, seq.index))

    def release(self, seq: Sequence) -> None:
        """Free seq's blocks last first, so its tail (the least likely to be shared) is evicted first."""
        self.allocator.free(seq.block_table[::-1], seq.index)
        seq.block_table = []

    # -- prefix caching -----------------------------------------------------------------------
    def cached_prefix(self, seq: Sequence) -> list[int]:
        """The blocks of seq's longest cached prefix, leaving at least one token to compute (the step
        samples from it); empty with caching off or for a sequence that holds blocks already."""
        cache = self.allocator.cache
        if cache is None or seq.block_table:
            return []
        extend_digests(seq.block_digests, seq.token_ids, self.block_size, seq.num_tokens)
        return cache.longest_prefix(seq.block_digests, (seq.num_tokens - 1) // self.block_size)

    def blocks_to_admit(self, seq: Sequence, kv_tokens: int, hits: list[int]) -> int:
        """Free blocks admitting seq would take: new ones past its cached prefix, plus the cached
        blocks of that prefix that sit in the free list (taking them evicts nothing, but they are
        no longer free for anyone else)."""
        new = max(0, cdiv(kv_tokens, self.block_size) - len(hits))
        return new + sum(self.allocator.is_free(b) for b in hits)

    def admit(self, seq: Sequence, kv_tokens: int, hits: list[int]) -> None:
        """Give seq its cached prefix's blocks (their KV counts as computed) and new ones up to kv_tokens."""
        for b in hits:
            self.allocator.share(b, seq.index)
        seq.block_table = list(hits)
        seq.num_computed_tokens = len(hits) * self.block_size
        seq.num_cached_tokens = seq.num_computed_tokens
        self.grow(seq, kv_tokens)

    def cache_blocks(self, seq: Sequence, start: int, end: int) -> None:
        """Key seq's blocks that become full with tokens [start, end), which this step computes: a request
        admitted later in the same step finds them (the step writes each layer's KV before reading it)."""
        cache = self.allocator.cache
        if cache is None or end // self.block_size <= start // self.block_size:
            return
        extend_digests(seq.block_digests, seq.token_ids, self.block_size, end)
        for i in range(start // self.block_size, end // self.block_size):
            cache.register(seq.block_table[i], seq.block_digests[i])

    def check_cached_blocks(self, seq: Sequence) -> None:
        """Each keyed block in seq's table lies within its computed tokens, and its key is the one
        seq's own tokens there give (so whoever finds it finds exactly these tokens' KV)."""
        cache = self.allocator.cache
        if cache is None:
            return
        bs, parent = self.block_size, ROOT_DIGEST
        for i, b in enumerate(seq.block_table):
            if (i + 1) * bs > seq.num_computed_tokens:
                assert cache.digest_of(b) is None, f"block {b} of {seq.id} is keyed before it is computed"
                continue
            parent = block_digest(parent, seq.token_ids[i * bs:(i + 1) * bs])
            digest = cache.digest_of(b)
            assert digest is None or digest == parent, f"block {b} of {seq.id}: its key names other tokens"
