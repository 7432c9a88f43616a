"""CUDA graphs for pure decode steps: captured once per batch-size bucket, replayed when a batch fits.

A decode step of n rows runs as the graph of the smallest bucket >= n. Its static inputs are filled
on the device from the step's staged inputs (device-to-device copies, no sync); rows n..bucket-1 are
padding that feeds token 0 at position 0, writes its K/V into the scratch block and attends to that
block alone, so no real sequence's cache is touched and its logits are never read. The graph holds
the whole model forward (every layer, the final norm and the lm_head); sampling runs after it.

Decode attention inside a graph must not depend on host-side sizes: graphs are captured only on a
backend that says so (captures_decode_graphs: the Triton one), whose kernel reads the
full-width persistent block table and stops at each row's context length, so one capture serves any
context. Prefill and mixed steps, batches above the largest bucket, --enforce-eager and devices other
than CUDA run eagerly. `capture=False` runs the same bucketed, padded forward eagerly: what the CPU
tests use to check the padding without a GPU.
"""

from __future__ import annotations

import torch

from batchtop.core_engine.model.attention_batch import AttentionBatch
from batchtop.gpu_kernels.attention import AttentionBackend


def bucket_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, then every multiple of 8 up to max_num_seqs rounded up to one (up to 4 slots: 1, 2, ...,
    max_num_seqs)."""
    sizes = [b for b in (1, 2, 4) if b < max_num_seqs]
    if max_num_seqs <= 4:
        return sizes + [max_num_seqs]
    return sizes + list(range(8, -(-max_num_seqs // 8) * 8 + 1, 8))


def bucket_for(n: int, sizes: list[int]) -> int | None:
    """The smallest bucket that holds n rows, or None when n is above them all."""
    for b in sizes:
        if b >= n:
            return b
    return None


class DecodeGraphs:
    def __init__(self, model: torch.nn.Module, kv_caches: list, table_width: int, scratch_block: int,
                 block_size: int, sizes: list[int], device: torch.device, capture: bool = True,
                 backend: AttentionBackend | None = None) -> None:
        self.model, self.kv_caches, self.sizes, self.capture = model, kv_caches, sizes, capture
        self.backend = backend  # the runner's attention backend (None: chosen from the pool)
        top = sizes[-1]
        long = {"dtype": torch.long, "device": device}
        self.input_ids = torch.zeros(top, **long)
        self.positions = torch.zeros(top, **long)
        self.slot_mapping = torch.full((top,), scratch_block * block_size, **long)
        self.block_tables = torch.full((top, table_width), scratch_block, **long)
        self.context_lens = torch.ones(top, **long)
        self.rows = torch.arange(top, **long)
        self.scratch_slot = scratch_block * block_size
        self.scratch_block = scratch_block
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.replays = 0

    def _forward(self, b: int) -> torch.Tensor:
        attention = AttentionBatch(self.kv_caches, self.slot_mapping[:b], b, self.block_tables[:b],
                                   self.context_lens[:b], [], backend=self.backend)
        return self.model(self.input_ids[:b], self.positions[:b], attention, self.rows[:b])

    def capture_all(self) -> None:
        """Capture every bucket, largest first, sharing one memory pool (the padding inputs are
        in place, so each warm-up and capture forward writes only the scratch block)."""
        pool = None
        for b in reversed(self.sizes):
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):  # warm-up: cuBLAS handles, Triton compilation, the allocator
                    self._forward(b)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[b] = self._forward(b)
            pool = graph.pool()
            self.graphs[b] = graph
        torch.cuda.synchronize()

    def fits(self, attention: AttentionBatch, num_rows: int) -> int | None:
        """The bucket for a pure decode step, or None when it must run eagerly."""
        if attention.prefills or attention.num_decode_rows != num_rows:
            return None
        return bucket_for(num_rows, self.sizes)

    def run(self, b: int, input_ids: torch.Tensor, positions: torch.Tensor, attention: AttentionBatch,
            table: torch.Tensor, logits_rows: torch.Tensor) -> torch.Tensor:
        """Logits (len(logits_rows), vocab) of an n-row decode step through bucket b's graph. `table`
        is the persistent (rows >= n, width) block table."""
        n = input_ids.shape[0]
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.slot_mapping[:n].copy_(attention.slot_mapping)
        self.context_lens[:n].copy_(attention.decode_context_lens)
        self.block_tables[:n].copy_(table[:n, :self.block_tables.shape[1]])
        self._pad(n, b)
        if self.capture:
            self.graphs[b].replay()
            logits = self.outputs[b]
        else:
            logits = self._forward(b)
        self.replays += 1
        return logits.index_select(0, logits_rows)  # decode rows are rows 0..n-1: the row order holds

    def _pad(self, n: int, b: int) -> None:
        if n < b:
            self.input_ids[n:b].zero_()
            self.positions[n:b].zero_()
            self.slot_mapping[n:b].fill_(self.scratch_slot)
            self.context_lens[n:b].fill_(1)
            self.block_tables[n:b].fill_(self.scratch_block)
