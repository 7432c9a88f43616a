"""What attach knows about one server family, in one record: how to tell its /metrics apart, the names
it uses for the quantities attach reads, what it cannot expose (in the panels' words), and the launch
options the verdict's "try" turns (its advice). servers/__init__.py lists the records."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class MetricNames:
    """A family's sample names for each quantity; None where it exposes no such series."""

    running: str
    waiting: str
    kv_usage: str | None = None  # a 0..1 share of the KV pool
    prompt_tokens: str | None = None  # counters
    generation_tokens: str | None = None
    ttft: str | None = None
    itl: tuple[str, ...] = ()  # the first one exposed wins (SGLang renamed its ITL histogram)
    e2e: str | None = None
    queue_time: str | None = None
    waiting_by_reason: str | None = None
    preemptions: str | None = None
    success: str | None = None  # a counter of finished requests, labelled finished_reason where it says it
    failures: str | None = None  # a counter of failed requests (counted as finished "error")
    iteration_tokens: str | None = None
    prompt_len: str | None = None  # per-request prompt length histogram
    generation_len: str | None = None
    flops: str | None = None
    read_bytes: str | None = None
    write_bytes: str | None = None
    cache_info: str | None = None  # an info gauge labelled num_gpu_blocks, block_size
    kv_capacity_tokens: str | None = None  # a gauge: the pool's size in tokens
    prefix_queries: str | None = None  # prefix-cache tokens looked up, and found cached (counters)
    prefix_hits: str | None = None
    ceiling: str | None = None  # a gauge: the most requests that may run at once
    token_budget: str | None = None  # a gauge: the most tokens one engine step may hold
    steps: str | None = None  # a counter of engine steps
    mode: str | None = None  # a gauge labelled mode, above 0 for the batching policy in use
    tokens_from_requests: bool = False  # no token counters: the per-request length histograms' sums instead


@dataclass(frozen=True, slots=True)
class Knobs:
    """The server's own launch options for what a verdict's "try" turns."""

    slots: str  # the slot ceiling
    budget: str  # the per-step token budget
    kv: str  # the KV pool


GENERIC_KNOBS = Knobs("the engine's max_num_seqs", "the engine's max_num_batched_tokens",
                      "a larger or quantized KV cache")

# what a family may leave empty (the keys of `gaps`): the JSON's `cannot_fill` lists them in this order
WHATS = ("ceiling", "kv", "waiting_reasons", "preemptions", "ttft", "steps", "finished", "lengths", "tokens")


@dataclass(frozen=True, slots=True)
class ServerFamily:
    name: str  # the flavour samples, recordings and the JSON carry: "vllm"
    label: str  # as the screen names it: "vLLM"
    documented: str  # where its metric names come from
    names: MetricNames | None  # None: it answers JSON, not Prometheus text (TensorRT-LLM: scrape/trtllm_stats.py)
    prefix: str | None = None  # every sample name of its own starts with this ("vllm:", "tgi_")
    markers: frozenset[str] = frozenset()  # unprefixed names that only it exposes (NIM)
    extends: str | None = None  # it exposes that family's names plus its own prefix (batchtop serve: vLLM's)
    gaps: dict[str, str] = field(default_factory=dict)  # a WHATS it cannot fill -> why, in the panels' words
    knobs: Knobs | None = None  # None: the generic words (a server that passes its engine's options through)
    slots_endpoint: bool = False  # it says its slot ceiling at /slots beside /metrics (llama.cpp)
    ceiling_limit: int | None = None  # the most slots it ever runs: a larger ceiling gauge is BAD

    def __post_init__(self) -> None:
        unknown = sorted(set(self.gaps) - set(WHATS))
        if unknown:
            raise ValueError(f"server family {self.name}: gaps {unknown} are not among {WHATS}")

    def owns(self, sample_name: str) -> bool:
        """Whether a sample name is one of this family's own (process_*, python_* belong to none)."""
        return bool(self.prefix) and sample_name.startswith(self.prefix) or sample_name in self.markers
