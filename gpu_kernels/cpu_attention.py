"""The CPU paged-attention kernel (csrc/paged_attention_cpu.cpp): built once per machine, then loaded.

It reads each row's keys and values straight from the pool through its block table, where the torch
reference gathers every table into a dense copy and calls SDPA with a mask; at decode sizes that
gather and SDPA's per-call setup are most of attention's time (bench/attention_cpu.py).
The build uses torch's cpp_extension (a C++ compiler and ninja) and is cached under torch's
extensions directory; where it cannot be built, or with BATCHTOP_CPU_KERNEL=0, the reference is used
and `why_unavailable()` says why.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("csrc") / "paged_attention_cpu.cpp"
DTYPES = (torch.float32, torch.bfloat16)
_why: list[str] = []


@functools.cache
def _load() -> bool:
    if os.environ.get("BATCHTOP_CPU_KERNEL", "1") == "0":
        _why.append("turned off by BATCHTOP_CPU_KERNEL=0")
        return False
    try:
        from torch.utils import cpp_extension

        build = Path(cpp_extension._get_build_directory("batchtop_cpu_attention", verbose=False))
        if not any(build.glob("*.so")):
            print("batchtop: building the CPU attention kernel (once per machine, ~1 min)...", file=sys.stderr)
        cpp_extension.load("batchtop_cpu_attention", [str(SOURCE)], is_python_module=False,
                           extra_cflags=["-O3", "-march=native", "-fopenmp"], extra_ldflags=["-fopenmp"])
        return hasattr(torch.ops.batchtop_cpu, "paged_attention")
    except Exception as exc:  # no compiler, no ninja, an unsupported CPU: the reference still works
        _why.append(f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}")
        return False


def available() -> bool:
    return _load()


def why_unavailable() -> str | None:
    return None if available() else _why[-1] if _why else "not built"


def usable(dtype: torch.dtype, head_dim: int) -> bool:
    return dtype in DTYPES and head_dim <= 256 and available()


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                    row_tables: torch.Tensor | None, context_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """Each query row r (rows, heads, hd) attends to keys [0, context_lens[r]) of the sequence whose
    block table is block_tables[row_tables[r]] (block_tables[r] when row_tables is None).
    Returns (rows, heads, hd) in q's dtype."""
    out = torch.empty(q.shape, dtype=q.dtype)
    torch.ops.batchtop_cpu.paged_attention(out, q, k_cache, v_cache, block_tables, row_tables, context_lens, scale)
    return out
