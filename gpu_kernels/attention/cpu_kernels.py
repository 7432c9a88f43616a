"""batchtop's C++ CPU kernels (gpu_kernels/cpu_kernels.py): the decode rows and every real prompt chunk
of a step in one varlen call that reads the pool in place (the runner lists the prompt rows beside the
decode rows as VarlenRows); static batching's padding chunks, whose K/V goes to the scratch block, take
the batched SDPA call over their fresh K/V. The default CPU path, and a tuned one: nothing here runs
per layer but the kernel call."""

from __future__ import annotations

import torch

from batchtop.gpu_kernels import cpu_kernels, uses_cpu_kernel
from batchtop.gpu_kernels.attention.base import AttentionBackend, StepBatch


class CpuKernels(AttentionBackend):
    name = "cpu_kernels"
    prompts_join_decode_call = True

    @classmethod
    def usable(cls, device: torch.device, dtype: torch.dtype, head_dim: int) -> bool:
        return uses_cpu_kernel(device, dtype, head_dim)

    def decode(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
               context_lens: torch.Tensor, scale: float, mask: torch.Tensor | None = None) -> torch.Tensor:
        return cpu_kernels.paged_attention(q, k_cache, v_cache, block_tables, None, context_lens, scale)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, batch: StepBatch, scale: float) -> torch.Tensor:
        varlen = batch.varlen
        if varlen is None:  # decode rows alone (and padding chunks, if any)
            return super().forward(q, k, v, k_cache, v_cache, batch, scale)
        d = varlen.num_rows
        rows = cpu_kernels.paged_attention(q[:d], k_cache, v_cache, varlen.tables, varlen.row_tables,
                                           varlen.context_lens, scale)
        if d == q.shape[0]:
            return rows
        out = torch.empty_like(q)
        out[:d] = rows
        out[d:] = self.prefill(q[d:], k[d:], v[d:], k_cache, v_cache, batch.prefill_plan or self._plan(batch), scale)
        return out
