"""What the engine refuses at submit time, and why, before a request can touch the scheduler."""

from __future__ import annotations

import math

from batchtop.core_engine.config import EngineConfig, max_num_seqs_problem
from batchtop.core_engine.sched.kv_cache import cdiv
from batchtop.core_engine.sched.request import Request
from batchtop.core_engine.errors import InvalidRequest, UnservableRequest


def validate_max_num_seqs(value: object, token_budget: int | None = None) -> int:
    """token_budget: max_num_batched_tokens; every running sequence's decode must fit one step."""
    problem = max_num_seqs_problem(value, token_budget)
    if problem is not None:
        raise ValueError(f"max_num_seqs {problem}")
    return value


def validate_request(r: Request, config: EngineConfig, known_ids: set[str]) -> None:
    """Raises InvalidRequest (bad) or UnservableRequest (can never fit); the engine stays up either way."""
    if r.id in known_ids:
        raise InvalidRequest(f"request {r.id!r}: duplicate id")
    if not r.prompt_token_ids:
        raise InvalidRequest(f"request {r.id!r}: empty prompt")
    if r.max_tokens < 1:
        raise InvalidRequest(f"request {r.id!r}: max_tokens must be >= 1, got {r.max_tokens}")
    if not (math.isfinite(r.sampling.temperature) and r.sampling.temperature >= 0 and 0 < r.sampling.top_p <= 1):
        raise InvalidRequest(f"request {r.id!r}: temperature must be >= 0 and top_p in (0, 1]")
    check_fits(r.id, r.prompt_len, r.max_tokens, config)  # sizes before the token scan: a huge prompt is cheap
    vocab = config.model.vocab_size
    if any(not 0 <= t < vocab for t in r.prompt_token_ids):
        raise InvalidRequest(f"request {r.id!r}: token id outside the vocabulary [0, {vocab})")


def check_fits(request_id: str, prompt_len: int, max_tokens: int, config: EngineConfig) -> None:
    """UnservableRequest when a request of these lengths can never run on this engine."""
    total = prompt_len + max_tokens
    if total > config.max_model_len:
        raise UnservableRequest(f"request {request_id!r}: prompt {prompt_len} + max_tokens {max_tokens}"
                                f" = {total} exceeds max_model_len {config.max_model_len}")
    need = cdiv(total - 1, config.block_size)  # the last sampled token never needs a KV slot
    if need > config.num_kv_blocks:
        raise UnservableRequest(
            f"request {request_id!r}: prompt {prompt_len} + max_tokens {max_tokens} needs {need} KV "
            f"blocks of {config.block_size} tokens, the pool has {config.num_kv_blocks}")
