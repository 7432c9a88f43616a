"""How far two engines' greedy tokens for the same prompts agree (bench/peer_vllm.py, bench/peer_llamacpp.py).

Two counts over the first n tokens of each answer:
- prefix: the tokens equal before the first difference. After a difference the two continue from
  different text, so later tokens say nothing about the math; this is the count the goals use.
- positional: the positions where both hold the same token, over the longer of the two answers (an
  answer that ends early, at its end-of-sequence token, disagrees at every position it lacks).
"""

from __future__ import annotations

from dataclasses import dataclass


def prefix_agreement(a: list[int], b: list[int], n: int) -> int:
    """Tokens equal before the first difference, within the first n."""
    agreed = 0
    for x, y in zip(a[:n], b[:n]):
        if x != y:
            break
        agreed += 1
    return agreed


def positional_agreement(a: list[int], b: list[int], n: int) -> int:
    """Positions among the first n where both answers hold the same token."""
    return sum(x == y for x, y in zip(a[:n], b[:n]))


@dataclass(frozen=True)
class Agreement:
    answers: int
    tokens: int  # over the first n of each answer: the longer of the two, up to n
    prefix: int
    positional: int
    identical: int  # answers equal over all their first n tokens

    @property
    def prefix_share(self) -> float:
        return self.prefix / self.tokens if self.tokens else 0.0

    @property
    def positional_share(self) -> float:
        return self.positional / self.tokens if self.tokens else 0.0

    def as_dict(self) -> dict:
        return {"answers": self.answers, "tokens": self.tokens, "prefix_agreeing": self.prefix,
                "positional_agreeing": self.positional, "identical_answers": self.identical,
                "prefix_share": self.prefix_share, "positional_share": self.positional_share}


def agreement(pairs: list[tuple[list[int], list[int]]], n: int) -> Agreement:
    """Both counts over answer pairs (one engine's tokens, the other's), the first n tokens of each."""
    tokens = prefix = positional = identical = 0
    for a, b in pairs:
        length = max(len(a[:n]), len(b[:n]))
        tokens += length
        agreed = prefix_agreement(a, b, n)
        prefix += agreed
        positional += positional_agreement(a, b, n)
        identical += agreed == length
    return Agreement(len(pairs), tokens, prefix, positional, identical)
