"""The prefix cache in the allocator alone: keys, sharing, LRU eviction, and what the KV map reports."""

from __future__ import annotations

import pytest

from batchtop.core_engine.sched.kv_cache import CACHED, FREE, BlockAllocator, BlockManager
from batchtop.core_engine.sched.prefix_cache import ROOT_DIGEST, PrefixIndex, block_digest, extend_digests
from batchtop.core_engine.sched.request import Request, Sequence

BS = 4


def seq(index: int, tokens: tuple[int, ...]) -> Sequence:
    return Sequence(Request(f"s{index}", tokens, 4), index, 0.0)


def written(manager: BlockManager, s: Sequence) -> None:
    """Admit s with its cached prefix and key the blocks its whole prompt fills, as a step that
    computes the rest of the prompt does."""
    manager.admit(s, s.num_tokens, manager.cached_prefix(s))
    manager.cache_blocks(s, s.num_computed_tokens, s.num_tokens)


def test_a_key_names_the_whole_prefix_not_only_the_blocks_tokens():
    a = block_digest(block_digest(ROOT_DIGEST, (1, 2, 3, 4)), (5, 6, 7, 8))
    b = block_digest(block_digest(ROOT_DIGEST, (9, 2, 3, 4)), (5, 6, 7, 8))  # same tokens, other parent
    assert a != b and len(a) == 32
    assert block_digest(ROOT_DIGEST, (1, 2, 3, 4)) == block_digest(ROOT_DIGEST, [1, 2, 3, 4])
    assert block_digest(ROOT_DIGEST, (1, 2)) != block_digest(ROOT_DIGEST, (1 << 32 | 1, 2))  # 8 bytes a token
    digests: list[bytes] = []
    extend_digests(digests, list(range(11)), BS, 11)
    assert len(digests) == 2  # only full blocks get a key


def test_a_shared_prefix_is_held_twice_and_freed_to_the_cache_not_to_plain_free():
    manager = BlockManager(BlockAllocator(8, BS, enable_caching=True))
    alloc = manager.allocator
    a = seq(0, tuple(range(10)))  # 2 full blocks + 2 tokens
    written(manager, a)
    b = seq(1, tuple(range(8)) + (99, 98, 97))
    hits = manager.cached_prefix(b)
    assert hits == a.block_table[:2]
    assert manager.blocks_to_admit(b, b.num_tokens, hits) == 1  # only its third block is new
    written(manager, b)
    assert b.num_computed_tokens == b.num_cached_tokens == 8
    assert [alloc.ref_count(x) for x in a.block_table] == [2, 2, 1]
    assert alloc.owners()[a.block_table[0]] == 0  # the oldest holder colours the block
    manager.release(a)
    assert [alloc.ref_count(x) for x in b.block_table] == [1, 1, 1]
    assert alloc.owners()[b.block_table[0]] == 1
    manager.release(b)
    refs = alloc.block_refs()
    assert alloc.num_free_blocks == 8 and alloc.num_cached_free_blocks == 2
    assert sorted(refs) == [CACHED, CACHED, 0, 0, 0, 0, 0, 0] and set(alloc.owners()) == {FREE}
    alloc.check_invariants()


def test_a_whole_cached_prompt_still_computes_its_last_token():
    manager = BlockManager(BlockAllocator(8, BS, enable_caching=True))
    written(manager, seq(0, tuple(range(8))))
    again = seq(1, tuple(range(8)))
    assert len(manager.cached_prefix(again)) == 1  # 7 tokens may hit: a whole block of them
    written(manager, again)
    assert again.num_uncomputed == 4
    # its second block holds the same tokens as the first request's: it stays unkeyed (one block a key)
    assert manager.allocator.cache.digest_of(again.block_table[1]) is None


def test_eviction_takes_the_least_recently_freed_block_and_a_requests_tail_first():
    manager = BlockManager(BlockAllocator(7, BS, enable_caching=True))
    alloc = manager.allocator
    first, second = seq(0, tuple(range(12)) + (1,)), seq(1, tuple(range(50, 58)) + (1,))
    written(manager, first)  # blocks 0 1 2 keyed, 3 partial
    written(manager, second)  # blocks 4 5 keyed, 6 partial
    f, s = list(first.block_table), list(second.block_table)
    manager.release(first)
    manager.release(second)
    # freed tail first, oldest release first: the next blocks handed out are first's tail
    assert alloc.free_order() == [f[3], f[2], f[1], f[0], s[2], s[1], s[0]]
    assert alloc.num_cached_free_blocks == 5
    taken = alloc.allocate(2, owner=7)
    assert taken == [f[3], f[2]]
    assert alloc.cache.digest_of(f[2]) is None and alloc.num_cached_free_blocks == 4  # f[2] evicted
    # what is left of first's prefix is found again; the evicted block ends the hit
    assert manager.cached_prefix(seq(2, tuple(range(12)) + (5,))) == f[:2]
    assert manager.cached_prefix(seq(3, tuple(range(50, 58)) + (2,))) == s[:2]
    alloc.check_invariants()


def test_a_hit_on_a_free_block_takes_it_off_the_free_list_and_keeps_it_from_eviction():
    manager = BlockManager(BlockAllocator(4, BS, enable_caching=True))
    alloc = manager.allocator
    a = seq(0, tuple(range(8)) + (1,))
    written(manager, a)
    prefix = list(a.block_table[:2])
    manager.release(a)
    b = seq(1, tuple(range(8)) + (2, 3))
    written(manager, b)
    assert b.block_table[:2] == prefix and alloc.num_free_blocks == 1
    assert alloc.allocate(1, owner=5) != prefix[:1]
    assert not alloc.can_allocate(1)
    alloc.check_invariants()


def test_with_caching_off_nothing_is_found_and_freed_blocks_are_plain_free():
    manager = BlockManager(BlockAllocator(8, BS))
    a = seq(0, tuple(range(9)))
    written(manager, a)
    assert manager.cached_prefix(seq(1, tuple(range(9)))) == []
    manager.release(a)
    assert manager.allocator.block_refs() == (0,) * 8 and manager.allocator.num_cached_free_blocks == 0


def test_misuse_is_refused_before_anything_changes():
    alloc = BlockAllocator(4, BS, enable_caching=True)
    blocks = alloc.allocate(2, owner=0)
    with pytest.raises(RuntimeError, match="holds no cached prefix"):
        alloc.share(blocks[0], owner=1)
    alloc.cache.register(blocks[0], b"k" * 32)
    alloc.share(blocks[0], owner=1)
    with pytest.raises(RuntimeError, match="already holds"):
        alloc.share(blocks[0], owner=1)
    with pytest.raises(RuntimeError, match="not held by sequence 3"):
        alloc.free(blocks, owner=3)
    assert [alloc.ref_count(b) for b in blocks] == [2, 1]
    alloc.free(blocks, owner=0)
    with pytest.raises(RuntimeError, match="double free"):
        alloc.free(blocks, owner=1)  # blocks[1] is free already: blocks[0] keeps its holder
    assert alloc.ref_count(blocks[0]) == 1
    alloc.check_invariants()


def test_the_index_keeps_one_block_per_key():
    index = PrefixIndex(3)
    assert index.register(0, b"a") and not index.register(1, b"a") and not index.register(0, b"b")
    assert index.longest_prefix([b"a", b"b"], 2) == [0]
    assert index.forget(0) and not index.forget(0) and index.longest_prefix([b"a"], 1) == []
    index.check_invariants()
