"""Weights moved onto memory advised for huge pages hold the same values, stay 64-byte aligned, and
outlive the tensors they were copied from and the chunk's other tensors."""

from __future__ import annotations

import gc

import torch

from batchtop.gpu_kernels import huge_pages


def test_a_placed_tensor_is_an_aligned_equal_copy():
    for t in (torch.randn(3, 7), torch.arange(1000, dtype=torch.int64).reshape(10, 100),
              torch.randint(0, 255, (37,), dtype=torch.uint8), torch.randn(5, 64).to(torch.bfloat16)):
        placed = huge_pages.place(t)
        assert placed is not t and torch.equal(placed, t) and placed.dtype == t.dtype
        assert placed.is_contiguous() and placed.data_ptr() % 64 == 0
        t.zero_() if t.dtype != torch.uint8 else t.fill_(0)
        assert placed.data_ptr() != t.data_ptr()


def test_a_large_tensor_and_an_empty_one():
    big = torch.randn(4 << 20)  # 16 MiB: a mapping of its own, starting on a 2 MiB boundary
    placed = huge_pages.place(big)
    assert torch.equal(placed, big) and placed.data_ptr() % huge_pages.HUGE_PAGE == 0
    empty = torch.empty(0, 5)
    assert huge_pages.place(empty) is empty
    assert huge_pages.empty((0, 3), torch.float32).shape == (0, 3)


def test_a_placed_tensor_outlives_its_source_and_its_neighbours():
    kept = huge_pages.place(torch.full((1000,), 7.0))
    others = [huge_pages.place(torch.randn(2000)) for _ in range(50)]
    del others
    gc.collect()
    filler = [huge_pages.place(torch.zeros(100_000)) for _ in range(100)]  # past a chunk: a new one begins
    assert torch.equal(kept, torch.full((1000,), 7.0))
    assert all(float(f.sum()) == 0.0 for f in filler)


def test_empty_gives_the_shape_and_dtype_asked_for():
    t = huge_pages.empty((4, 6), torch.bfloat16)
    assert t.shape == (4, 6) and t.dtype == torch.bfloat16 and t.is_contiguous()
    t.fill_(1.5)
    assert float(t.float().sum()) == 36.0
