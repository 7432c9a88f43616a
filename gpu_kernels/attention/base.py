"""What every attention backend offers the model: decode rows, the step's prefill rows in one call, and
the per-step tables they read, built once before the first layer."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Protocol

import torch

from batchtop.gpu_kernels.attention.padded_sdpa import padded_prefill_attention
from batchtop.gpu_kernels.attention.prefill_plan import PrefillPlan, plan_prefill


class StepBatch(Protocol):
    """What a backend reads of a step: core_engine/model/attention_batch.py's AttentionBatch, which the runner
    builds (gpu_kernels never imports the engine)."""

    kv_caches: list[tuple[torch.Tensor, torch.Tensor]]
    num_decode_rows: int
    decode_block_tables: torch.Tensor | None
    decode_context_lens: torch.Tensor | None
    prefills: list  # PrefillChunks: token_start, num_tokens, context_start, block_table
    decode_mask: torch.Tensor | None
    varlen: object | None  # VarlenRows: tables, row_tables, context_lens, num_rows
    prefill_plan: PrefillPlan | None
    prepared: bool


class AttentionBackend(ABC):
    """One implementation of paged attention. A subclass sets `name`, says where it runs (`usable`) and
    computes `decode`; it may replace `prefill` (the default is the batched SDPA call) and `forward`."""

    name = "?"
    prompts_join_decode_call = False  # the runner hands prompt rows to the decode kernel as VarlenRows
    captures_decode_graphs = False  # decode reads no host-side size: one CUDA graph serves any context

    @classmethod
    @abstractmethod
    def usable(cls, device: torch.device, dtype: torch.dtype, head_dim: int) -> bool:
        """Whether this implementation runs for this device, dtype and head size."""

    def prepare(self, batch: StepBatch) -> None:
        """Once per step, before the first layer: the tables every layer reads (idempotent)."""
        if not batch.prepared:
            if batch.prefills:
                batch.prefill_plan = self._plan(batch)
            batch.prepared = True

    @abstractmethod
    def decode(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
               context_lens: torch.Tensor, scale: float, mask: torch.Tensor | None = None) -> torch.Tensor:
        """One query row per sequence (B, nh, hd) over its first context_lens[b] keys; mask: the dense
        decode mask where this backend reads one."""

    def prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, plan: PrefillPlan, scale: float) -> torch.Tensor:
        """Every prefill row of the step (T_p, nh, hd) in one call; their K/V is in the pool already."""
        return padded_prefill_attention(q, k, v, k_cache, v_cache, plan, scale)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, batch: StepBatch, scale: float) -> torch.Tensor:
        """One layer's attention for the whole step: decode rows, then prefill rows. (T, nh, hd)."""
        d, t = batch.num_decode_rows, q.shape[0]
        if d == t:
            return self.decode(q, k_cache, v_cache, batch.decode_block_tables, batch.decode_context_lens, scale,
                               batch.decode_mask)
        plan = batch.prefill_plan or self._plan(batch)
        if d == 0:
            return self.prefill(q, k, v, k_cache, v_cache, plan, scale)
        out = torch.empty_like(q)
        out[:d] = self.decode(q[:d], k_cache, v_cache, batch.decode_block_tables, batch.decode_context_lens, scale,
                              batch.decode_mask)
        out[d:] = self.prefill(q[d:], k[d:], v[d:], k_cache, v_cache, plan, scale)
        return out

    def _plan(self, batch: StepBatch) -> PrefillPlan:
        k_cache = batch.kv_caches[0][0]
        return plan_prefill(batch.prefills, k_cache.shape[1], k_cache.device)
