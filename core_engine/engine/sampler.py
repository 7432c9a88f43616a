"""Next-token sampling: greedy by default; temperature / top-p with a per-request seeded generator."""

from __future__ import annotations

import torch

from batchtop.core_engine.engine.request import Sequence


class Sampler:
    def __init__(self, engine_seed: int, device: str) -> None:
        self.engine_seed = engine_seed
        self.device = device
        self._generators: dict[int, torch.Generator] = {}

    def sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
        """logits: (S, vocab) in the model dtype, one row per sequence in seqs."""
        if all(s.request.sampling.greedy for s in seqs):
            return logits.argmax(dim=-1).tolist()
        return [self._sample_row(row, seq) for row, seq in zip(logits.float(), seqs)]

    def _sample_row(self, logits: torch.Tensor, seq: Sequence) -> int:
        params = seq.request.sampling
        if params.greedy:
            return int(logits.argmax())
        probs = torch.softmax(logits / params.temperature, dim=-1)
        if params.top_p < 1.0:
            sorted_probs, order = probs.sort(descending=True)
            keep = sorted_probs.cumsum(-1) - sorted_probs < params.top_p  # always keeps the top token
            probs = torch.zeros_like(probs).scatter_(0, order[keep], sorted_probs[keep])
        return int(torch.multinomial(probs, 1, generator=self._generator(seq)))

    def _generator(self, seq: Sequence) -> torch.Generator:
        """One stream per request, so its samples do not depend on who else is in the batch."""
        gen = self._generators.get(seq.index)
        if gen is None:
            seed = seq.request.sampling.seed
            if seed is None:
                seed = self.engine_seed * 1_000_003 + seq.index
            gen = self._generators[seq.index] = torch.Generator(device=self.device).manual_seed(seed)
        return gen

    def forget(self, seq: Sequence) -> None:
        self._generators.pop(seq.index, None)

    def reset(self) -> None:
        self._generators.clear()
