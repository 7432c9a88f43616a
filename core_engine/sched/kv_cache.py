"""The paged KV pool's bookkeeping: a free list with ref counts, and per-sequence block tables.

The tensors themselves live in the runner; this module imports no torch so it tests anywhere.
"""

from __future__ import annotations

from collections import deque

from batchtop.core_engine.sched.request import Sequence

FREE = -1  # owner id of a free block in the block map


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class BlockAllocator:
    """Hands out fixed-size KV blocks; a block returns to the free list when its ref count hits 0."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(num_blocks))
        self._ref_cnt = [0] * num_blocks
        self._owner = [FREE] * num_blocks  # sequence index per block, for the block map

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= len(self._free)

    def allocate(self, num_blocks: int, owner: int) -> list[int]:
        if num_blocks > len(self._free):
            raise RuntimeError(f"asked for {num_blocks} KV blocks, {len(self._free)} free")
        blocks = [self._free.popleft() for _ in range(num_blocks)]
        for b in blocks:
            self._ref_cnt[b] = 1
            self._owner[b] = owner
        return blocks

    def free(self, blocks: list[int]) -> None:
        """Drop one reference per distinct block; a block named twice in one call is dropped once."""
        for b in dict.fromkeys(blocks):
            if self._ref_cnt[b] <= 0:
                raise RuntimeError(f"double free of KV block {b}")
            self._ref_cnt[b] -= 1
            if self._ref_cnt[b] == 0:
                self._owner[b] = FREE
                self._free.append(b)

    def ref_count(self, block: int) -> int:
        return self._ref_cnt[block]

    def owners(self) -> tuple[int, ...]:
        """Owner sequence index per block (FREE for free blocks): the KV block map."""
        return tuple(self._owner)

    def reset(self) -> None:
        self._free = deque(range(self.num_blocks))
        self._ref_cnt = [0] * self.num_blocks
        self._owner = [FREE] * self.num_blocks

    def check_invariants(self) -> None:
        """Free count equals the list length, no duplicates, free blocks have ref 0, used ones > 0."""
        free = set(self._free)
        assert len(free) == len(self._free), "duplicate block in the free list"
        for b in range(self.num_blocks):
            if b in free:
                assert self._ref_cnt[b] == 0 and self._owner[b] == FREE, f"free block {b} is referenced"
            else:
                assert self._ref_cnt[b] > 0, f"block {b} is neither free nor referenced"


class BlockManager:
    """Grows and frees sequences' block tables on top of the allocator."""

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
        self.allocator.free(seq.block_table)
        seq.block_table = []
