"""The prefill rows of one step, described once for every layer: the varlen tables a paged prefill
kernel reads (query_start_loc, context_starts, block_tables) and the padded layout of the interim
batched SDPA call (padded_sdpa.py).

The step's prompt chunks sit after its decode rows, one after another. Chunk s has n_s query rows at
positions context_starts[s] .. context_starts[s] + n_s - 1 of its sequence; row i of it sees keys
< context_starts[s] + i + 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence

KEY_ALIGN = 16  # padded key length a multiple of this: what CUDA's memory-efficient SDPA kernel reads best


@dataclass(slots=True)
class PrefillPlan:
    num_chunks: int  # S
    max_query: int  # Lq: the longest chunk
    max_context: int  # Lc: cached keys gathered per chunk (0: no chunk continues a cached prefix)
    query_start_loc: torch.Tensor  # (S+1,) int32: chunk s is prefill rows [qsl[s], qsl[s+1])
    context_starts: torch.Tensor  # (S,) int32: tokens cached before each chunk
    block_tables: torch.Tensor  # (S, W) long, wide enough for every chunk's last position
    padded_rows: torch.Tensor  # (S*Lq,) long: the prefill row at (chunk, i); past a chunk's end, its last row
    token_rows: torch.Tensor  # (T_p,) long: the padded row (s*Lq + i) of each prefill row
    context_slots: torch.Tensor | None  # (S*Lc,) long: pool slot of cached key j of chunk s
    mask: torch.Tensor | None  # (S, 1, Lq, Lc+Lq) bool: cached keys, then the chunk's own (None when Lc == 0)
    _folded: dict[int, torch.Tensor] = field(default_factory=dict)

    def folded_mask(self, group: int) -> torch.Tensor:
        """The mask for queries folded as (S, kvh, group*Lq, hd): each KV head's query heads as rows."""
        folded = self._folded.get(group)
        if folded is None:
            s, _, lq, lk = self.mask.shape
            folded = self.mask[:, :, None].expand(s, 1, group, lq, lk).reshape(s, 1, group * lq, lk)
            self._folded[group] = folded
        return folded


def plan_prefill(chunks: list, block_size: int, device: torch.device) -> PrefillPlan:
    """chunks: PrefillChunks (token_start, num_tokens, context_start, block_table), contiguous rows."""
    first = chunks[0].token_start
    sizes = [c.num_tokens for c in chunks]
    starts = [c.context_start for c in chunks]
    offsets = [c.token_start - first for c in chunks]
    total = offsets[-1] + sizes[-1]
    s, lq = len(chunks), max(sizes)
    lc = max(starts)
    if lc:  # the extra keys are masked; they keep each key row aligned for the fused kernels
        lc += -(lc + lq) % KEY_ALIGN
    host = torch.tensor([*offsets, total, *starts, *sizes], dtype=torch.int32)
    numbers = host.to(device, non_blocking=True)
    qsl, ctx, n = numbers[:s + 1], numbers[s + 1:2 * s + 1], numbers[2 * s + 1:]
    long_qsl, long_n = qsl.long(), n.long()

    i = torch.arange(lq, device=device)
    padded_rows = (long_qsl[:-1, None] + torch.minimum(i[None, :], long_n[:, None] - 1)).reshape(-1)
    chunk_of_row = torch.repeat_interleave(torch.arange(s, device=device), long_n, output_size=total)
    token_rows = chunk_of_row * lq + torch.arange(total, device=device) - long_qsl[chunk_of_row]

    width = max(-(-(c + k) // block_size) for c, k in zip(starts, sizes))
    # Block 0 pads each table to the width a kernel may index (static batching's padding chunks have a
    # one-block scratch table however long they are): read there, never attended to.
    tables = pad_sequence([c.block_table[:width] for c in chunks], batch_first=True)
    tables = F.pad(tables, (0, width - tables.shape[1]))

    context_slots = mask = None
    if lc:
        j = torch.arange(lc, device=device)
        blocks = tables.index_select(1, (j // block_size).clamp(max=width - 1))  # (S, Lc)
        context_slots = (blocks * block_size + j % block_size).reshape(-1)
        cached = (j[None, :] < ctx[:, None])[:, None, :].expand(s, lq, lc)
        causal = torch.ones(lq, lq, dtype=torch.bool, device=device).tril().expand(s, lq, lq)
        mask = torch.cat((cached, causal), dim=-1)[:, None]
    return PrefillPlan(s, lq, lc, qsl, ctx, tables, padded_rows, token_rows, context_slots, mask)
