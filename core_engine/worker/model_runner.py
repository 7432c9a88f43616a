"""Owns the model and the paged KV tensors; turns a scheduler plan into forwards within the token
budget (one, unless a static batch planned more) and their tokens."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from batchtop.core_engine.config import EngineConfig
from batchtop.core_engine.device import DTYPES
from batchtop.core_engine.model.weights import load_model
from batchtop.core_engine.model.attention_batch import AttentionBatch, PrefillChunk, VarlenRows
from batchtop.core_engine.model.parameters import build_model
from batchtop.core_engine.sched.request import Sequence
from batchtop.core_engine.worker.decode_graphs import DecodeGraphs, bucket_sizes
from batchtop.core_engine.worker.forward_pieces import ForwardPiece, split_to_budget
from batchtop.core_engine.worker.input_buffers import DecodeTables, StagedInputs
from batchtop.core_engine.worker.kv_pool_sizing import (GRAPH_POOL, device_memory, kv_pool_bytes, measure_peak,
                                                        pool_sizing_note)
from batchtop.core_engine.worker.sampler import MASK32, Sampler, SamplingBatch, request_seed
from batchtop.core_engine.sched import SchedulerOutput
from batchtop.gpu_kernels.attention import select_backend

PAD_TOKEN_ID = 0  # what a static batch's prompt padding feeds; its outputs are never read


@dataclass(slots=True)
class PreparedBatch:
    input_ids: torch.Tensor  # (T,)
    positions: torch.Tensor  # (T,)
    attention: AttentionBatch
    logits_rows: torch.Tensor  # rows that reach the lm_head: the S sampled ones first, then padding
    sampled_seqs: list[Sequence]  # the S sampled sequences, in row order
    sampling: SamplingBatch | None = None  # their parameters on the device; None: all greedy


@dataclass(slots=True)
class SplitBatch:
    """A plan over the token budget, run as several forwards; each piece is staged when its turn comes
    (the staging buffers and decode tables hold one forward at a time)."""

    pieces: list[ForwardPiece]
    logits_rows: range  # how many rows reach the lm_head over all the pieces
    sampled_seqs: list[Sequence]  # in the order run() returns their tokens


class ModelRunner:
    def __init__(self, config: EngineConfig, bucketed_decode: bool | None = None,
                 model: torch.nn.Module | None = None) -> None:
        """bucketed_decode: run pure decode steps through DecodeGraphs (None: on CUDA with the Triton
        kernel unless config.enforce_eager; True on a CPU runs the padded buckets eagerly, for tests).
        model: another runner's model to share (a forward only reads its weights), so several engines
        can hold their own KV pools at once on one copy of the weights; None builds or loads one."""
        self.config = config
        self.device = torch.device(config.device)
        self.dtype = DTYPES[config.dtype]
        m = config.model
        if model is not None:
            self.model = model
        elif m.checkpoint is None:
            self.model = build_model(m, config.device, self.dtype, config.seed)
        else:
            self.model = load_model(m, config.device, self.dtype)
        self.block_size = config.block_size
        self.graphs = None
        self.select_attention_backend()
        self.sampler = Sampler(config.seed, config.device)
        self.staged = StagedInputs(self.device, 4 * (config.max_num_batched_tokens + config.max_num_seqs) + 1024)
        self.num_kv_blocks = config.num_kv_blocks
        self.pool_note: str | None = None  # how a pool sized from GPU memory was sized
        if config.gpu_memory_utilization is not None:
            self._allocate_pool(0)  # the scratch block alone, for the profiling forward
            self.num_kv_blocks, self.pool_note = self._blocks_from_memory(config.gpu_memory_utilization)
        self._allocate_pool(self.num_kv_blocks)
        max_blocks = min(-(-config.max_model_len // config.block_size), self.num_kv_blocks)
        self.decode_tables = DecodeTables(self.device, config.max_num_seqs, max_blocks, self.scratch_block)
        capture = self.device.type == "cuda" and self.attention_backend.captures_decode_graphs
        if bucketed_decode is None:
            bucketed_decode = capture and not config.enforce_eager
        if bucketed_decode:
            self.graphs = DecodeGraphs(self.model, self.kv_caches, max_blocks, self.scratch_block, self.block_size,
                                       bucket_sizes(config.max_num_seqs), self.device, capture=capture,
                                       backend=self.attention_backend)
            if capture:
                self.graphs.capture_all()

    def select_attention_backend(self) -> None:
        """The attention backend for this engine's device, dtype and head size: chosen once, and again
        only when batchtop's CPU kernels come in mid-run (worker/kernel_switch.py)."""
        self.attention_backend = select_backend(self.device, self.dtype, self.config.model.head_dim)
        if self.graphs is not None:
            self.graphs.backend = self.attention_backend

    @property
    def varlen_prompts(self) -> bool:
        """Whether prompt chunks' rows join the decode rows in the backend's one decode call (the CPU
        kernels); their sequences' tables take the persistent table's rows after the decode rows'."""
        return self.attention_backend.prompts_join_decode_call

    def _allocate_pool(self, num_blocks: int) -> None:
        # One physical block past the usable ones: static batching's padding rows and prompt padding
        # write their throw-away K/V there, so no sequence's real cache is ever overwritten.
        m = self.config.model
        self.scratch_block = num_blocks
        shape = (num_blocks + 1, self.block_size, m.num_key_value_heads, m.head_dim)
        self.kv_caches = []  # the old pool goes before the new one is made
        self.kv_caches = [(torch.zeros(shape, dtype=self.dtype, device=self.device),
                           torch.zeros(shape, dtype=self.dtype, device=self.device))
                          for _ in range(m.num_hidden_layers)]
        self._scratch_table = torch.tensor([self.scratch_block], dtype=torch.long, device=self.device)

    def _blocks_from_memory(self, utilization: float) -> tuple[int, str]:
        """Blocks for the pool after one forward at the full token budget, with max_num_seqs rows
        through the lm_head (the most any step samples or pads), measured the way vLLM profiles."""
        budget = self.config.max_num_batched_tokens
        batch = self._prepare(ForwardPiece(prompt_padding=[budget]))
        rows = torch.arange(min(budget, self.config.max_num_seqs), device=self.device)
        peak = measure_peak(lambda: self.model(batch.input_ids, batch.positions, batch.attention, rows), self.device)
        weights = sum(p.numel() * p.element_size() for p in self.model.parameters())
        graphs = GRAPH_POOL if self.device.type == "cuda" and not self.config.enforce_eager else 0
        figures = device_memory(self.device, weights, peak, graphs)
        block_bytes = sum(k[0].nbytes + v[0].nbytes for k, v in self.kv_caches)
        blocks = min(self.config.num_kv_blocks, kv_pool_bytes(figures, utilization) // block_bytes)
        return blocks, pool_sizing_note(figures, utilization, blocks, block_bytes)

    def prepare(self, plan: SchedulerOutput) -> PreparedBatch | SplitBatch:
        """The plan as one forward, or as forwards within max_num_batched_tokens when it plans more
        (a static batch's padded prefill: see forward_pieces)."""
        pieces = split_to_budget(plan, self.config.max_num_batched_tokens)
        if len(pieces) == 1:
            return self._prepare(pieces[0])
        sampled = [seq for p in pieces for seq in p.sampled()]
        return SplitBatch(pieces, range(len(sampled) + sum(len(p.padding) for p in pieces)), sampled)

    def _prepare(self, piece: ForwardPiece) -> PreparedBatch:
        """Flatten one forward: one-token rows (decodes, then padding) first, then prompt padding and
        prefill chunks; stage it all and send it to the device in one copy."""
        bs, scratch = self.block_size, self.scratch_block * self.block_size
        ids: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        tables: list[list[int]] = []
        ctx_lens: list[int] = []
        logits_rows: list[int] = []
        sampled: list[Sequence] = []

        for seq in piece.decodes:
            p = seq.num_computed_tokens
            logits_rows.append(len(ids))
            sampled.append(seq)
            ids.append(seq.token_ids[p])
            pos.append(p)
            slots.append(seq.block_table[p // bs] * bs + p % bs)
            tables.append(seq.block_table)
            ctx_lens.append(p + 1)
        padding_rows: list[int] = []
        for seq in piece.padding:
            # A finished row recomputes its last token and its logits, as Hugging Face's generate()
            # does for the finished rows of a batch; its K/V goes to scratch, unseen by anyone.
            p = seq.num_computed_tokens
            padding_rows.append(len(ids))
            ids.append(seq.token_ids[-1])
            pos.append(p)
            slots.append(scratch)
            tables.append(seq.block_table)
            ctx_lens.append(p)
        num_decode_rows = len(ids)

        staged = self.staged
        staged.begin()
        chunk_specs: list[tuple[int, int, int, tuple[int, int]]] = []
        varlen_tables: list[int] = []  # per row of a prompt chunk the kernel takes: its sequence's table row
        varlen_lens: list[int] = []
        for seq, start, n in piece.prefills:
            if self.varlen_prompts:  # one kernel call for all of them, beside the decode rows
                varlen_tables.extend([len(tables)] * n)
                varlen_lens.extend(range(start + 1, start + n + 1))
                tables.append(seq.block_table)
            else:
                chunk_specs.append((len(ids), n, start, staged.put(seq.block_table)))
            ids.extend(seq.token_ids[start:start + n])
            pos.extend(range(start, start + n))
            table = seq.block_table
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, start + n))
            if start + n == seq.num_tokens:  # the chunk completes the prompt: sample from its last row
                logits_rows.append(len(ids) - 1)
                sampled.append(seq)
        for n in piece.prompt_padding:
            # A static batch's left padding: pad tokens at positions 0..n-1, computed through every
            # layer (attending only to each other, as a padding mask leaves them) and thrown away;
            # their K/V goes to scratch, so the member's own cache holds exactly its prompt.
            chunk_specs.append((len(ids), n, 0, self._scratch_table))
            ids.extend([PAD_TOKEN_ID] * n)
            pos.extend(range(n))
            slots.extend(scratch + p % bs for p in range(n))
        logits_rows += padding_rows  # computed and thrown away, after the rows that are sampled

        r_ids, r_pos, r_slots, r_rows = staged.put(ids), staged.put(pos), staged.put(slots), staged.put(logits_rows)
        r_ctx = staged.put(ctx_lens) if num_decode_rows else None
        r_varlen = None
        if varlen_tables:
            r_varlen = staged.put([*range(num_decode_rows), *varlen_tables]), staged.put(ctx_lens + varlen_lens)
        change = self.decode_tables.stage_changes(staged, tables) if tables else None
        r_sampling = self._stage_sampling(sampled)
        staged.commit()

        block_tables = context_lens = varlen = None
        if tables:
            self.decode_tables.apply(staged, change)
            width = max(len(t) for t in tables)
            block_tables = self.decode_tables.table[:len(tables), :width]
            if self.graphs is None:  # every layer reads it: make the slice contiguous once, not per layer
                block_tables = block_tables.contiguous()
            if r_varlen is not None:
                varlen = VarlenRows(block_tables, staged.view(r_varlen[0]), staged.view(r_varlen[1]))
            block_tables = block_tables[:num_decode_rows] if num_decode_rows else None
            context_lens = staged.view(r_ctx) if num_decode_rows else None
        chunks = [PrefillChunk(row, n, start, table if isinstance(table, torch.Tensor) else staged.view(table))
                  for row, n, start, table in chunk_specs]
        attention = AttentionBatch(self.kv_caches, staged.view(r_slots), num_decode_rows, block_tables,
                                   context_lens, chunks, varlen=varlen, backend=self.attention_backend)
        self.attention_backend.prepare(attention)  # the step's masks and prefill tables, once for every layer
        positions = staged.view(r_pos)
        rows = staged.view(r_rows)
        return PreparedBatch(staged.view(r_ids), positions, attention, rows, sampled,
                             self._sampling_batch(r_sampling, positions, rows, len(sampled)))

    def _stage_sampling(self, sampled: list[Sequence]) -> tuple | None:
        """Per-row temperature, top-p and seed, staged only when some row is not greedy."""
        params = [s.request.sampling for s in sampled]
        if all(p.greedy for p in params):
            return None
        seeds = [request_seed(s, self.config.seed) for s in sampled]
        return (self.staged.put_floats([p.temperature for p in params]),
                self.staged.put_floats([p.top_p for p in params]),
                self.staged.put([x & MASK32 for x in seeds]), self.staged.put([x >> 32 for x in seeds]),
                any(not p.greedy and p.top_p < 1.0 for p in params))

    def _sampling_batch(self, staged: tuple | None, positions: torch.Tensor, rows: torch.Tensor,
                        n: int) -> SamplingBatch | None:
        if staged is None:
            return None
        temp, top_p, lo, hi, any_top_p = staged
        counter = positions[rows[:n]] + 1  # the position the sampled token will take
        return SamplingBatch(self.staged.view_f32(temp), self.staged.view_f32(top_p), self.staged.view(lo),
                             self.staged.view(hi), counter, True, any_top_p)

    def run(self, batch: PreparedBatch | SplitBatch) -> list[tuple[Sequence, int]]:
        """One forward over the whole batch (or each piece of a split one in turn), then one sampled
        token per completed sequence: one device-to-host read a forward."""
        if isinstance(batch, SplitBatch):
            return [pair for piece in batch.pieces for pair in self._forward(self._prepare(piece))]
        return self._forward(batch)

    def _forward(self, batch: PreparedBatch) -> list[tuple[Sequence, int]]:
        bucket = self.graphs.fits(batch.attention, batch.input_ids.shape[0]) if self.graphs else None
        if bucket is None:
            logits = self.model(batch.input_ids, batch.positions, batch.attention, batch.logits_rows)
        else:
            logits = self.graphs.run(bucket, batch.input_ids, batch.positions, batch.attention,
                                     self.decode_tables.table, batch.logits_rows)
        n = len(batch.sampled_seqs)
        tokens = self.sampler.sample(logits[:n], batch.sampled_seqs, batch.sampling).tolist() if n else []
        return list(zip(batch.sampled_seqs, tokens))
