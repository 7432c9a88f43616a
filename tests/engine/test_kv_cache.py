"""Block allocator and block manager: the free list, ref counts and block tables stay consistent."""

import pytest

from batchtop.core_engine.sched.kv_cache import FREE, BlockAllocator, BlockManager
from batchtop.core_engine.sched.request import Request, Sequence


def test_allocate_and_free_restore_the_pool():
    alloc = BlockAllocator(8, 4)
    a = alloc.allocate(3, owner=0)
    b = alloc.allocate(2, owner=1)
    assert alloc.num_free_blocks == 3 and not set(a) & set(b)
    assert [alloc.owners()[x] for x in a] == [0, 0, 0]
    alloc.free(a)
    alloc.free(b)
    assert alloc.num_free_blocks == 8
    assert all(alloc.ref_count(x) == 0 for x in range(8))
    assert set(alloc.owners()) == {FREE}
    alloc.check_invariants()


def test_double_free_is_refused_and_leaves_the_free_list_intact():
    alloc = BlockAllocator(4, 4)
    blocks = alloc.allocate(2, owner=0)
    alloc.free(blocks)
    with pytest.raises(RuntimeError, match="double free"):
        alloc.free(blocks)
    assert alloc.num_free_blocks == 4
    alloc.check_invariants()


def test_a_block_named_twice_in_one_free_is_released_once():
    alloc = BlockAllocator(4, 4)
    (b,) = alloc.allocate(1, owner=0)
    alloc.free([b, b])
    assert alloc.num_free_blocks == 4
    alloc.check_invariants()


def test_allocating_more_than_is_free_fails_without_side_effects():
    alloc = BlockAllocator(4, 4)
    alloc.allocate(3, owner=0)
    assert not alloc.can_allocate(2)
    with pytest.raises(RuntimeError):
        alloc.allocate(2, owner=1)
    assert alloc.num_free_blocks == 1
    alloc.check_invariants()


def test_block_manager_grows_tables_by_whole_blocks():
    manager = BlockManager(BlockAllocator(16, 4))
    seq = Sequence(Request("a", (1,) * 5, 3), index=0, arrival_s=0.0)
    assert manager.blocks_needed(seq, 5) == 2
    manager.grow(seq, 5)
    assert len(seq.block_table) == 2
    manager.grow(seq, 8)  # still fits in two blocks
    assert len(seq.block_table) == 2
    manager.grow(seq, 9)
    assert len(seq.block_table) == 3
    manager.release(seq)
    assert seq.block_table == [] and manager.allocator.num_free_blocks == 16
