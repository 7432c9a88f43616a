"""Weights on 2 MiB pages: what the CPU kernels stream each step, placed where the kernel may back it with
transparent huge pages (Linux, madvise(MADV_HUGEPAGE)).

A decode step streams every weight once. On 4 KiB pages that is a TLB miss, and a stop for the hardware
prefetchers (they do not cross a page), every 4 KiB: SmolLM2's 66 MB of Q4_1 layers are 16,000 pages a
step. Copied onto 2 MiB pages the same GEMVs ran 1.1-1.3x as fast on a quiet 2-core Zen 4 host
(bench/huge_pages.py), and a torch sum over 256 MiB read 33 GB/s on one thread where it read 25.

Packs are small (SmolLM2's are 0.07-1.1 MB, below a huge page), so they are carved from shared chunks
of CHUNK bytes, 64-byte aligned; a pack of a quarter of a chunk or more gets a mapping of its own. A chunk
is an anonymous mmap the tensors view (torch.frombuffer keeps it alive): it is unmapped when the last
tensor carved from it is gone. Where madvise or MADV_HUGEPAGE does not exist, the kernel refuses the
advice (built without THP), or THP is off, `place` still copies (the same bytes, ordinary pages), so a
run behaves the same everywhere.
"""

from __future__ import annotations

import math
import mmap
import threading

import torch

HUGE_PAGE = 2 << 20
CHUNK = 32 << 20
ALIGN = 64  # a cache line: a pack's first group starts on one, as torch's own allocations do


def supported() -> bool:
    """Whether this platform can ask for transparent huge pages (whether the kernel grants them is its own)."""
    return hasattr(mmap, "MADV_HUGEPAGE") and hasattr(mmap.mmap, "madvise")


class _Chunk:
    """One anonymous mapping, advised for huge pages, handed out front to back from its first 2 MiB boundary."""

    def __init__(self, size: int) -> None:
        self.map = mmap.mmap(-1, size + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if supported():
            try:
                self.map.madvise(mmap.MADV_HUGEPAGE)
            except OSError:  # a kernel built without THP answers EINVAL: the same bytes, on ordinary pages
                pass
        self.bytes = torch.frombuffer(self.map, dtype=torch.uint8)
        self.offset = -self.bytes.data_ptr() % HUGE_PAGE
        self.end = self.offset + size

    def take(self, nbytes: int) -> torch.Tensor | None:
        start = -(-self.offset // ALIGN) * ALIGN
        if start + nbytes > self.end:
            return None
        self.offset = start + nbytes
        return self.bytes[start:start + nbytes]


_lock = threading.Lock()
_current: _Chunk | None = None


def _bytes(nbytes: int) -> torch.Tensor:
    global _current
    if nbytes >= CHUNK // 4:
        return _Chunk(-(-nbytes // HUGE_PAGE) * HUGE_PAGE).take(nbytes)
    with _lock:
        view = _current.take(nbytes) if _current is not None else None
        if view is None:
            _current = _Chunk(CHUNK)
            view = _current.take(nbytes)
        return view


def place(t: torch.Tensor) -> torch.Tensor:
    """A copy of `t` (a contiguous CPU tensor) on memory advised for huge pages; `t` itself where it is
    not a contiguous CPU tensor or holds nothing."""
    if t.device.type != "cpu" or not t.is_contiguous() or t.numel() == 0:
        return t
    nbytes = t.numel() * t.element_size()
    out = _bytes(nbytes).view(t.dtype).view(t.shape)
    out.copy_(t)
    return out


def empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised contiguous CPU tensor on memory advised for huge pages."""
    nbytes = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
    return _bytes(max(nbytes, 1))[:nbytes].view(dtype).view(shape)
