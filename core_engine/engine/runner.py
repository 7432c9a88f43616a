"""Owns the model and the paged KV tensors; turns a scheduler plan into one forward and its tokens."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from batchtop.core_engine.config import EngineConfig
from batchtop.core_engine.device import DTYPES
from batchtop.core_engine.model.checkpoint import load_model
from batchtop.core_engine.model.llama import AttentionBatch, PrefillChunk, build_model
from batchtop.core_engine.engine.request import Sequence
from batchtop.core_engine.engine.sampler import Sampler
from batchtop.core_engine.engine.scheduler import SchedulerOutput

PAD_TOKEN_ID = 0  # what a static batch's prompt padding feeds; its outputs are never read


@dataclass(slots=True)
class PreparedBatch:
    input_ids: torch.Tensor  # (T,)
    positions: torch.Tensor  # (T,)
    attention: AttentionBatch
    logits_rows: torch.Tensor  # rows that reach the lm_head: the S sampled ones first, then padding
    sampled_seqs: list[Sequence]  # the S sampled sequences, in row order


class ModelRunner:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.device = torch.device(config.device)
        self.dtype = DTYPES[config.dtype]
        m = config.model
        self.model = (build_model(m, config.device, self.dtype, config.seed) if m.checkpoint is None
                      else load_model(m, config.device, self.dtype))
        self.block_size = config.block_size
        # One physical block past the usable ones: static batching's padding rows and prompt padding
        # write their throw-away K/V there, so no sequence's real cache is ever overwritten.
        self.scratch_block = config.num_kv_blocks
        shape = (config.num_kv_blocks + 1, config.block_size, m.num_key_value_heads, m.head_dim)
        self.kv_caches = [(torch.zeros(shape, dtype=self.dtype, device=self.device),
                           torch.zeros(shape, dtype=self.dtype, device=self.device))
                          for _ in range(m.num_hidden_layers)]
        self._scratch_table = self._tensor([self.scratch_block])
        self.sampler = Sampler(config.seed, config.device)

    def _slot(self, seq: Sequence, pos: int) -> int:
        return seq.block_table[pos // self.block_size] * self.block_size + pos % self.block_size

    def prepare(self, plan: SchedulerOutput) -> PreparedBatch:
        """Flatten the plan: one-token rows (decodes, then padding) first, then prompt padding and
        prefill chunks."""
        ids: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        tables: list[list[int]] = []
        ctx_lens: list[int] = []
        logits_rows: list[int] = []
        sampled: list[Sequence] = []
        prefill_plan: list[tuple[Sequence, int]] = []

        for seq, n in plan.scheduled:
            if seq.is_prefill:
                prefill_plan.append((seq, n))
                continue
            p = seq.num_computed_tokens
            logits_rows.append(len(ids))
            sampled.append(seq)
            ids.append(seq.token_ids[p])
            pos.append(p)
            slots.append(self._slot(seq, p))
            tables.append(seq.block_table)
            ctx_lens.append(p + 1)
        padding_rows: list[int] = []
        for seq in plan.padding:
            # A finished row recomputes its last token and its logits, as Hugging Face's generate()
            # does for the finished rows of a batch; its K/V goes to scratch, unseen by anyone.
            p = seq.num_computed_tokens
            padding_rows.append(len(ids))
            ids.append(seq.token_ids[-1])
            pos.append(p)
            slots.append(self.scratch_block * self.block_size)
            tables.append(seq.block_table)
            ctx_lens.append(p)
        num_decode_rows = len(ids)

        chunks: list[PrefillChunk] = []
        for _, n in plan.prompt_padding:
            # A static batch's left padding: pad tokens at positions 0..n-1, computed through every
            # layer (attending only to each other, as a padding mask leaves them) and thrown away;
            # their K/V goes to scratch, so the member's own cache holds exactly its prompt.
            chunks.append(PrefillChunk(len(ids), n, 0, self._scratch_table))
            ids.extend([PAD_TOKEN_ID] * n)
            pos.extend(range(n))
            slots.extend(self.scratch_block * self.block_size + p % self.block_size for p in range(n))
        for seq, n in prefill_plan:
            start = seq.num_computed_tokens
            chunks.append(PrefillChunk(len(ids), n, start, self._tensor(seq.block_table)))
            ids.extend(seq.token_ids[start:start + n])
            pos.extend(range(start, start + n))
            slots.extend(self._slot(seq, p) for p in range(start, start + n))
            if start + n == seq.num_tokens:  # the chunk completes the prompt: sample from its last row
                logits_rows.append(len(ids) - 1)
                sampled.append(seq)

        logits_rows += padding_rows  # computed and thrown away, after the rows that are sampled
        block_tables = context_lens = None
        if num_decode_rows:
            width = max(len(t) for t in tables)
            padded = [t + [self.scratch_block] * (width - len(t)) for t in tables]
            block_tables = self._tensor(padded)
            context_lens = self._tensor(ctx_lens)
        attention = AttentionBatch(self.kv_caches, self._tensor(slots), num_decode_rows, block_tables,
                                   context_lens, chunks)
        return PreparedBatch(self._tensor(ids), self._tensor(pos), attention, self._tensor(logits_rows),
                             sampled)

    def run(self, batch: PreparedBatch) -> list[tuple[Sequence, int]]:
        """One forward over the whole batch, then one sampled token per completed sequence."""
        logits = self.model(batch.input_ids, batch.positions, batch.attention, batch.logits_rows)
        n = len(batch.sampled_seqs)
        tokens = self.sampler.sample(logits[:n], batch.sampled_seqs).tolist() if n else []
        return list(zip(batch.sampled_seqs, tokens))

    def _tensor(self, values: list) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)
