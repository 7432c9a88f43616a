"""When a sequence stops: the model's EOS (unless the request ignores it) or its max_tokens."""

from __future__ import annotations

from collections.abc import Container

from batchtop.core_engine.sched.request import FinishReason, Sequence


def stop_reason(seq: Sequence, token: int, eos_token_ids: Container[int]) -> FinishReason | None:
    """Why seq stops after sampling `token` (already appended), or None while it goes on."""
    if token in eos_token_ids and not seq.request.sampling.ignore_eos:  # the EOS token stays in the output
        return FinishReason.STOP
    if seq.num_output_tokens >= seq.max_tokens:
        return FinishReason.LENGTH
    return None
