"""Weights moved onto memory advised for huge pages hold the same values, stay 64-byte aligned, and
outlive the tensors they were copied from and the chunk's other tensors; where huge pages are
unavailable (no MADV_HUGEPAGE, a kernel that refuses the advice) the same copies land on ordinary pages."""

from __future__ import annotations

import errno
import gc
import json
import mmap
import types

import pytest
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


class _RefusedAdvice(mmap.mmap):
    """A mapping on a kernel built without transparent huge pages: madvise(MADV_HUGEPAGE) is EINVAL."""

    def madvise(self, *args) -> None:
        raise OSError(errno.EINVAL, "Invalid argument")


def _without_huge_pages(monkeypatch, refused: bool) -> None:
    """Huge pages unavailable: the kernel refuses the advice, or the platform has no MADV_HUGEPAGE at all."""
    fake = types.SimpleNamespace(mmap=_RefusedAdvice if refused else mmap.mmap, MAP_PRIVATE=mmap.MAP_PRIVATE,
                                 MAP_ANONYMOUS=mmap.MAP_ANONYMOUS,
                                 **({"MADV_HUGEPAGE": getattr(mmap, "MADV_HUGEPAGE", 14)} if refused else {}))
    monkeypatch.setattr(huge_pages, "mmap", fake)
    monkeypatch.setattr(huge_pages, "_current", None)  # a chunk of its own, mapped without the advice


@pytest.mark.parametrize("refused", [True, False], ids=["kernel-refuses", "no-madvise"])
def test_without_huge_pages_the_copies_are_the_same_on_ordinary_pages(monkeypatch, refused):
    _without_huge_pages(monkeypatch, refused)
    assert huge_pages.supported() is refused
    for t in (torch.randn(3, 7), torch.randn(4 << 20)):  # from a shared chunk, and a mapping of its own
        placed = huge_pages.place(t)
        assert placed is not t and torch.equal(placed, t) and placed.data_ptr() % 64 == 0
    assert huge_pages.empty((4, 6), torch.bfloat16).shape == (4, 6)


def test_a_quantized_gguf_run_without_huge_pages_answers_as_with_them(monkeypatch, tmp_path):
    from click.testing import CliRunner

    from batchtop.tui.cli import main
    from tests.support.gguf_files import Q, plain_llama, write_gguf

    path = tmp_path / "m.gguf"
    write_gguf(path, plain_llama(), "llama", Q.Q4_1)
    args = ["--headless", "--device", "cpu", "--model", str(path), "--weights", "quantized", "--num-requests", "3",
            "--time-scale", "0", "--seed", "3"]
    runs = []
    for refused in (None, True):
        if refused is not None:
            _without_huge_pages(monkeypatch, refused)
        result = CliRunner().invoke(main, [*args, "-o", str(tmp_path / f"{refused}.json")])
        assert result.exit_code == 0, result.output
        runs.append(json.loads((tmp_path / f"{refused}.json").read_text())["tokens"])
    assert runs[0] == runs[1] and runs[0]["generated"] > 0
