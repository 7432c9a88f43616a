"""Where two engines' greedy answers first differ, how close a call was it? Scored by batchtop's model in
float32 on the file's dequantized weights (the file's exact math): each engine's token's rank there and
the log-probability between the two. Ranks 1 and 2 a few hundredths of a nat apart say the difference
is a near-tie that rounding flips, not a wrong model.

And teacher-forced agreement: along the other engine's own answer, at how many positions batchtop's top
token is the one that engine chose next. Free-running greedy agreement stops counting at the first
near-tie either engine's rounding flips, and after it the two answers continue from different text; the
teacher-forced count asks the same question at every position, each from the same context.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch

from perplexity import engine_config, window_logits  # bench/
from token_agreement import prefix_agreement
from batchtop.core_engine.worker.model_runner import ModelRunner


@dataclass(frozen=True)
class FirstDifference:
    question: int
    position: int
    our_rank: int  # of the first engine's token under the reference (1: its top token)
    their_rank: int  # of the other engine's
    gap_nats: float  # |log p(our token) - log p(their token)| under the reference


def first_differences(runner: ModelRunner, prompts: list[list[int]], ours: list[list[int]],
                      theirs: list[list[int]], n: int) -> list[FirstDifference]:
    """Each answer pair that differs within its first n tokens (both still running there), scored after
    the prompt and the tokens they share."""
    found = []
    for i, (prompt, a, b) in enumerate(zip(prompts, ours, theirs)):
        k = prefix_agreement(a, b, n)
        if k >= min(len(a), len(b), n):
            continue
        logits = window_logits(runner, prompt + a[:k])[-1]
        logp = torch.log_softmax(logits, dim=-1)
        found.append(FirstDifference(i, k, int((logits > logits[a[k]]).sum()) + 1,
                                     int((logits > logits[b[k]]).sum()) + 1, abs(logp[a[k]] - logp[b[k]]).item()))
    return found


@dataclass(frozen=True)
class Forced:
    positions: int
    agreeing: int  # positions where batchtop's top token is the other engine's next token
    gap_nats_median: float  # at the others: log p(batchtop's top) - log p(their token), batchtop's own model
    gap_nats_max: float

    @property
    def share(self) -> float:
        return self.agreeing / self.positions if self.positions else 0.0

    def as_dict(self) -> dict:
        return {"positions": self.positions, "agreeing": self.agreeing, "share": self.share,
                "gap_nats_median": self.gap_nats_median, "gap_nats_max": self.gap_nats_max}


def forced_agreement(runner: ModelRunner, prompts: list[list[int]], answers: list[list[int]], n: int) -> Forced:
    """Teacher-forced over the first n tokens of each answer: one forward of prompt + answer, its top token
    after each prefix against the answer's next token."""
    positions = agreeing = 0
    gaps = []
    for prompt, answer in zip(prompts, answers):
        answer = answer[:n]
        if not answer:
            continue
        logits = window_logits(runner, prompt + answer[:-1])[len(prompt) - 1:]
        target = torch.tensor(answer)
        top = logits.argmax(dim=-1)
        positions += len(answer)
        agreeing += int((top == target).sum())
        logp = torch.log_softmax(logits, dim=-1)
        missed = top != target
        gaps += (logp.max(dim=-1).values - logp.gather(1, target[:, None]).squeeze(1))[missed].tolist()
    return Forced(positions, agreeing, statistics.median(gaps) if gaps else 0.0, max(gaps, default=0.0))


def summary(found: list[FirstDifference]) -> dict:
    """How many first differences; whose token was the reference's top one; how far apart the two were."""
    if not found:
        return {"first_differences": 0}
    gaps = [f.gap_nats for f in found]
    return {"first_differences": len(found), "ours_top": sum(f.our_rank == 1 for f in found),
            "theirs_top": sum(f.their_rank == 1 for f in found),
            "max_rank": max(max(f.our_rank, f.their_rank) for f in found),
            "gap_nats_median": statistics.median(gaps), "gap_nats_max": max(gaps)}


def runner_for(gguf: str, prompts: list[list[int]], n: int, dtype: str = "float32",
               weights: str | None = "dequantized") -> ModelRunner:
    """batchtop's model of the file, its pool one window of the longest prompt + n tokens; by default the
    float32 model on the dequantized weights, the file's exact math (the reference first differences are
    scored under)."""
    return ModelRunner(engine_config(gguf, dtype, max(len(p) for p in prompts) + n, weights))


def explain(runner: ModelRunner, prompts: list[list[int]], ours: list[list[int]], theirs: list[list[int]],
            n: int) -> dict:
    """first_differences under the reference runner, summarised."""
    return summary(first_differences(runner, prompts, ours, theirs, n))
