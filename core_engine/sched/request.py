"""A request as submitted (immutable) and the sequence the engine runs for it (mutable state)."""

from __future__ import annotations

import enum
from dataclasses import dataclass


# float32's smallest normal number: a temperature below it (a denormal, or one that rounds to 0 in the
# sampler's float32) has a reciprocal past float32's range, so its softmax is the argmax: it is greedy
MIN_TEMPERATURE = 2.0 ** -126


@dataclass(frozen=True, slots=True)
class SamplingParams:
    temperature: float = 0.0  # 0 (or anything below MIN_TEMPERATURE) means greedy
    top_p: float = 1.0
    seed: int | None = None  # per-request sampling seed; None derives one from the engine seed
    ignore_eos: bool = False  # True: run to max_tokens past the model's EOS ids (benchmarks want that)

    @property
    def greedy(self) -> bool:
        return self.temperature < MIN_TEMPERATURE


@dataclass(frozen=True, slots=True)
class Request:
    id: str
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    arrival_s: float = 0.0  # offset from the start of the run
    sampling: SamplingParams = SamplingParams()

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Phase(str, enum.Enum):
    """What a slot's sequence does in a step; the Slots panel colours by it."""

    EMPTY = "empty"
    PREFILL = "prefill"
    DECODE = "decode"
    PADDING = "padding"  # static batching: finished, but its row is still computed until the batch ends
    IDLE = "idle"  # holds a slot but got no tokens this step (token budget exhausted)
    # left its slot at the end of this step, its KV blocks freed: it sampled its last token (continuous), or
    # its static batch ended; the slot shows who left for this one step, then it is empty
    FINISHED = "finished"


class FinishReason(str, enum.Enum):
    LENGTH = "length"
    STOP = "stop"
    ABORT = "abort"


class Sequence:
    """Runtime state of one request: its tokens, KV progress, block table and timestamps."""

    __slots__ = ("request", "index", "token_ids", "num_computed_tokens", "block_table", "slot",
                 "status", "finish_reason", "arrival_s", "first_token_s", "finish_s",
                 "num_preemptions", "padding", "block_digests", "num_cached_tokens")

    def __init__(self, request: Request, index: int, arrival_s: float) -> None:
        self.request = request
        self.index = index  # stable small integer per engine run; panels colour by it
        self.token_ids: list[int] = list(request.prompt_token_ids)
        self.num_computed_tokens = 0  # tokens whose K/V sit in the cache
        self.block_table: list[int] = []
        self.slot: int | None = None
        self.status = SeqStatus.WAITING
        self.finish_reason: FinishReason | None = None
        self.arrival_s = arrival_s
        self.first_token_s: float | None = None
        self.finish_s: float | None = None
        self.num_preemptions = 0
        self.padding = False  # static batching: finished, slot still held, row still computed
        self.block_digests: list[bytes] = []  # prefix-cache keys of its full blocks (prefix_cache.py)
        self.num_cached_tokens = 0  # tokens found in the prefix cache at its latest admission

    @property
    def id(self) -> str:
        return self.request.id

    @property
    def prompt_len(self) -> int:
        return self.request.prompt_len

    @property
    def max_tokens(self) -> int:
        return self.request.max_tokens

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.request.prompt_len

    @property
    def num_uncomputed(self) -> int:
        """Tokens to feed before the next one can be sampled (1 while decoding)."""
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_prefill(self) -> bool:
        return self.num_output_tokens == 0 or self.num_uncomputed > 1

    def __repr__(self) -> str:
        return (f"Sequence({self.id!r}, status={self.status.value}, tokens={self.num_tokens}, "
                f"computed={self.num_computed_tokens}, blocks={len(self.block_table)}, slot={self.slot})")
