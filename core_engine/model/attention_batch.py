"""One step's attention inputs as every layer reads them: where each token's K/V goes, what each query may
attend to, and the attention backend that runs it (gpu_kernels/attention/). The runner builds one a step."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from batchtop.gpu_kernels.attention import AttentionBackend, PrefillPlan, select_backend


@dataclass(slots=True)
class PrefillChunk:
    token_start: int  # first row of this chunk in the flat batch
    num_tokens: int
    context_start: int  # position of the chunk's first token in its sequence
    block_table: torch.Tensor  # (num_blocks,) long


@dataclass(slots=True)
class VarlenRows:
    """Rows [0, num_rows) of the step (its decode rows, then its prompt chunks' rows) in one kernel call,
    each attending to keys [0, context_lens[r]) of the sequence whose table is tables[row_tables[r]]."""

    tables: torch.Tensor  # (num_sequences, max_blocks)
    row_tables: torch.Tensor  # (num_rows,)
    context_lens: torch.Tensor  # (num_rows,)

    @property
    def num_rows(self) -> int:
        return self.row_tables.shape[0]


@dataclass(slots=True)
class AttentionBatch:
    """Where each token's K/V goes and what each query may attend to, for one step, and the attention
    backend (gpu_kernels/attention/) every layer runs it through."""

    kv_caches: list[tuple[torch.Tensor, torch.Tensor]]  # per layer: (num_blocks, block_size, kvh, hd) x2
    slot_mapping: torch.Tensor  # (T,) flat slot of each token's K/V
    num_decode_rows: int  # rows [0, num_decode_rows) each hold one token of a different sequence
    decode_block_tables: torch.Tensor | None  # (num_decode_rows, max_blocks)
    decode_context_lens: torch.Tensor | None  # (num_decode_rows,)
    prefills: list[PrefillChunk]  # chunks after the decode rows, contiguous (all unless `varlen` takes them)
    decode_mask: torch.Tensor | None = None  # the torch reference's dense decode mask, built once per step
    varlen: VarlenRows | None = None  # the CPU kernel's one call for decode rows and prompt chunks
    backend: AttentionBackend | None = None  # the runner's; None: chosen from the pool's device, dtype, head size
    prefill_plan: PrefillPlan | None = None  # the prefill rows' tables, built once per step (backend.prepare)
    prepared: bool = False  # backend.prepare has run for this step

    def __post_init__(self) -> None:
        if self.backend is None:  # a batch built by hand (tests, tools)
            k_cache = self.kv_caches[0][0]
            self.backend = select_backend(k_cache.device, k_cache.dtype, k_cache.shape[-1])
