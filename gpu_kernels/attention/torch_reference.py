"""The readable definition on any device: decode as SDPA over each row's gathered blocks under a dense
mask (paged_attention.paged_decode_attention), prefill as one batched SDPA call (padded_sdpa)."""

from __future__ import annotations

import torch

from batchtop.gpu_kernels.attention.base import AttentionBackend, StepBatch
from batchtop.gpu_kernels.paged_attention import decode_mask, paged_decode_attention


class TorchReference(AttentionBackend):
    name = "torch_reference"

    @classmethod
    def usable(cls, device: torch.device, dtype: torch.dtype, head_dim: int) -> bool:
        return True

    def prepare(self, batch: StepBatch) -> None:
        if not batch.prepared and batch.num_decode_rows and batch.decode_mask is None:
            # the same for every layer of the step
            batch.decode_mask = decode_mask(batch.decode_block_tables, batch.decode_context_lens,
                                            batch.kv_caches[0][0].shape[1])
        super().prepare(batch)

    def decode(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
               context_lens: torch.Tensor, scale: float, mask: torch.Tensor | None = None) -> torch.Tensor:
        return paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale, mask)
