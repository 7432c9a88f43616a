"""Next-token sampling for a whole batch on the device: greedy, temperature, top-p, seeded per request.

Every row draws its randomness from a counter-based hash of (its request's seed, the position of the
token being sampled, the attempt): no generator state, no dependence on who else is in the batch, and
the same integer math on CPU and CUDA. A request with a seed gives the same tokens in any batch.

Top-p keeps the nucleus {i : sum of the probabilities strictly above p_i < top_p} (the tokens a
descending sort keeps, with ties at the boundary all kept), renormalised. Two exact ways to sample it:
- `sample_nucleus_sorted` (the readable definition; CUDA, where a sort is cheap and has no sync):
  sort, find the smallest kept probability, keep everything at or above it, inverse-CDF sample.
- `sample_nucleus_rejection` (CPU, where a full-vocabulary sort costs more than the forward):
  inverse-CDF sample from the tokens above a pivot (0 at first); a sample inside the nucleus is
  accepted, else its probability becomes the pivot and the row draws again. Accepted samples follow
  the nucleus distribution exactly (rejection from a superset with proportional weights); a near-
  uniform row is accepted with probability ~top_p, so it costs ~1.1 passes instead of a sort. Each
  rejection raises the pivot, and a row still rejected after MAX_DRAWS draws (a long run of bad luck,
  or NaN logits) is drawn by the sort instead: the same distribution, and no loop without a bound.

Tiny values mean their limits, whatever float32 makes of them: the top token is always in the nucleus
(nothing lies above it), so a top_p that rounds to 0 keeps only it and its ties; a temperature below
float32's smallest normal number (request.MIN_TEMPERATURE) is greedy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from batchtop.core_engine.sched.request import MIN_TEMPERATURE, Sequence
from batchtop.gpu_kernels import cpu_kernels

MASK32 = 0xFFFFFFFF
_MIX = 0x45D9F3B  # < 2**31, so a 32-bit value times it stays inside int64
SEED_STRIDE = 1_000_003  # default seeds: engine_seed * SEED_STRIDE + the sequence's index
MAX_DRAWS = 32  # rejection draws before a row's nucleus is found by a sort (sampling_cpu.cpp: the same)


@dataclass(slots=True)
class SamplingBatch:
    """Per-row parameters of one step's sampled rows, as device tensors (S,) each."""

    temperature: torch.Tensor  # float32; 0 (below MIN_TEMPERATURE) marks a greedy row
    top_p: torch.Tensor  # float32
    seed_lo: torch.Tensor  # int64, the low 32 bits of the row's seed
    seed_hi: torch.Tensor  # int64, the high 32 bits
    counter: torch.Tensor  # int64, position of the token being sampled
    any_random: bool  # host-side: some row is not greedy
    any_top_p: bool  # host-side: some random row has top_p < 1


def request_seed(seq: Sequence, engine_seed: int) -> int:
    seed = seq.request.sampling.seed
    return (engine_seed * SEED_STRIDE + seq.index if seed is None else seed) & ((1 << 64) - 1)


def _mix32(x):  # a tensor or a Python int: the same bits either way
    x = x ^ (x >> 16)
    x = (x * _MIX) & MASK32
    x = x ^ (x >> 16)
    x = (x * _MIX) & MASK32
    return x ^ (x >> 16)


def uniforms(batch: SamplingBatch, attempt: int, rows: torch.Tensor | None = None) -> torch.Tensor:
    """One float32 in [0, 1) per row (24 random bits), a pure function of (seed, counter, attempt)."""
    lo, hi, counter = batch.seed_lo, batch.seed_hi, batch.counter
    if rows is not None:
        lo, hi, counter = lo[rows], hi[rows], counter[rows]
    h = _mix32((counter & MASK32) ^ _mix32(attempt + 0x9E3779B))  # a host int: no copy to the device
    h = _mix32(lo ^ _mix32(hi ^ h))
    return (h >> 8).to(torch.float32) * (1.0 / (1 << 24))


def _inverse_cdf(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Index drawn with probability proportional to each row's non-negative weights."""
    c = weights.cumsum(-1)
    target = (u * c[:, -1])[:, None]
    return torch.searchsorted(c, target, right=True).squeeze(1).clamp_(max=weights.shape[1] - 1)


def in_nucleus(above: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Whether a token whose higher-ranked tokens hold `above` of the mass is kept: the top token
    (nothing above it) always is, so a top_p that float32 rounds to 0 keeps only it and its ties."""
    return (above <= 0) | (above < top_p) | (top_p >= 1.0)


def sample_nucleus_sorted(probs: torch.Tensor, top_p: torch.Tensor, batch: SamplingBatch, *,
                          rows: torch.Tensor | None = None, attempt: int = 0) -> torch.Tensor:
    """probs (S, V) float32 rows summing to 1 -> (S,) token ids. No host sync. `rows`: which of the
    batch's rows these are (their seeds), `attempt`: which of their uniforms to draw."""
    ordered = probs.sort(dim=-1, descending=True).values
    kept = in_nucleus(ordered.cumsum(-1) - ordered, top_p[:, None])
    smallest = ordered.masked_fill(~kept, float("inf")).amin(-1, keepdim=True)
    return _inverse_cdf(torch.where(probs >= smallest, probs, 0.0), uniforms(batch, attempt, rows))


def sample_nucleus_rejection(probs: torch.Tensor, top_p: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """Same distribution as sample_nucleus_sorted without a sort; syncs once per attempt (CPU)."""
    tokens = torch.empty(probs.shape[0], dtype=torch.long, device=probs.device)
    pending = torch.arange(probs.shape[0], device=probs.device)
    pivot: torch.Tensor | None = None
    p = probs
    for attempt in range(MAX_DRAWS):
        weights = p if pivot is None else torch.where(p > pivot, p, 0.0)
        tok = _inverse_cdf(weights, uniforms(batch, attempt, None if attempt == 0 else pending))
        p_tok = p.gather(1, tok[:, None])
        above = torch.where(p > p_tok, p, 0.0).sum(-1)
        ok = in_nucleus(above, top_p[pending] if attempt else top_p)
        if bool(ok.all()):
            tokens[pending] = tok
            return tokens
        tokens[pending[ok]] = tok[ok]
        retry = ~ok
        pending, pivot, p = pending[retry], p_tok[retry], p[retry]
    tokens[pending] = sample_nucleus_sorted(p, top_p[pending], batch, rows=pending, attempt=MAX_DRAWS)
    return tokens


class Sampler:
    def __init__(self, engine_seed: int, device: str) -> None:
        self.engine_seed = engine_seed
        self.device = device

    def sample(self, logits: torch.Tensor, seqs: list[Sequence], batch: SamplingBatch | None = None) -> torch.Tensor:
        """logits (S, vocab) in the model dtype, one row per sequence in seqs -> (S,) long token ids
        on the same device. `batch` holds the rows' parameters on the device (the runner's buffers);
        without it they are built from seqs. Greedy rows are exactly argmax."""
        if logits.device.type == "cpu" and logits.is_contiguous() and cpu_kernels.usable(logits.dtype, 0):
            return self._sample_on_cpu_kernel(logits, seqs, batch)
        # max's indices are argmax's (the first maximum), and on CPU 5x faster in bf16 (batch 64, one
        # thread: 1.8 vs 9.2 ms; aten's bf16 argmax does not vectorise)
        greedy = logits.max(dim=-1).indices
        if batch is None:
            batch = self.batch_for(seqs, logits.device)
        if batch is None or not batch.any_random:
            return greedy
        sampled = batch.temperature >= MIN_TEMPERATURE  # the others are greedy (request.MIN_TEMPERATURE)
        temperature = torch.where(sampled, batch.temperature, 1.0)
        # shifted first, as softmax shifts anyway: a tiny temperature cannot overflow the logits to inf
        x = logits.float()
        probs = torch.softmax((x - x.amax(-1, keepdim=True)) / temperature[:, None], dim=-1)
        if not batch.any_top_p:
            drawn = _inverse_cdf(probs, uniforms(batch, 0))
        elif logits.is_cuda:
            drawn = sample_nucleus_sorted(probs, batch.top_p, batch)
        else:
            drawn = sample_nucleus_rejection(probs, batch.top_p, batch)
        return torch.where(sampled, drawn, greedy)

    def _sample_on_cpu_kernel(self, logits: torch.Tensor, seqs: list[Sequence],
                              batch: SamplingBatch | None) -> torch.Tensor:
        """The same draw as the torch code above, per row in a few passes (gpu_kernels/csrc/sampling_cpu.cpp)."""
        if batch is None:
            batch = self.batch_for(seqs, logits.device)
        if batch is None or not batch.any_random:
            return cpu_kernels.argmax(logits)
        return cpu_kernels.sample(logits, batch.temperature.contiguous(), batch.top_p.contiguous(),
                                  batch.seed_lo.contiguous(), batch.seed_hi.contiguous(), batch.counter.contiguous())

    def batch_for(self, seqs: list[Sequence], device: torch.device | str) -> SamplingBatch | None:
        """None when every row is greedy: nothing to send to the device."""
        params = [s.request.sampling for s in seqs]
        if all(p.greedy for p in params):
            return None
        seeds = [request_seed(s, self.engine_seed) for s in seqs]
        f32 = {"dtype": torch.float32, "device": device}
        i64 = {"dtype": torch.long, "device": device}
        return SamplingBatch(
            torch.tensor([p.temperature for p in params], **f32), torch.tensor([p.top_p for p in params], **f32),
            torch.tensor([x & MASK32 for x in seeds], **i64), torch.tensor([x >> 32 for x in seeds], **i64),
            torch.tensor([s.num_tokens for s in seqs], **i64),
            any(not p.greedy for p in params), any(not p.greedy and p.top_p < 1.0 for p in params))

    def forget(self, seq: Sequence) -> None:
        """Nothing to drop: a row's randomness is a function of its seed and position."""

    def reset(self) -> None:
        """Nothing to reset (see forget)."""
