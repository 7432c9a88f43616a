"""What an engine will allocate, from its config alone, checked against memory before any of it is.

Every size a user can give multiplies into a buffer: --block-size and --num-kv-blocks into the KV
pool (one scratch block more), --max-num-batched-tokens into the staged inputs and a full step's
activations, --max-num-seqs into the logits and the decode block tables, the model's dims into its
weights. A size no memory can hold is refused here, naming the option that asks for the most and
what it would need, instead of an allocator traceback asking for terabytes (or minutes of swapping).
The step and logits figures are lower bounds (the activations a forward must hold at once).
"""

from __future__ import annotations

from dataclasses import dataclass

from batchtop.core_engine.config import EngineConfig
from batchtop.core_engine.device import DTYPES
from batchtop.core_engine.errors import ConfigError
from batchtop.core_engine.model.checkpoint import available_memory
from batchtop.core_engine.model.weight_bytes import stored_weight_bytes, weights_text

INT64 = 8
FLOAT32 = 4


@dataclass(frozen=True, slots=True)
class MemoryNeed:
    weights: int
    kv_pool: int  # num_kv_blocks usable blocks and the scratch block, K and V, every layer
    step: int  # staged int64 inputs and the activations of a step of max_num_batched_tokens tokens
    slots: int  # float32 logits of every slot's row and the persistent decode block tables

    @property
    def total(self) -> int:
        return self.weights + self.kv_pool + self.step + self.slots


def memory_need(config: EngineConfig) -> MemoryNeed:
    m, elem = config.model, DTYPES[config.dtype].itemsize
    tokens, seqs = config.max_num_batched_tokens, config.max_num_seqs
    # a GPU pool sized after a profiling forward (worker/kv_pool_sizing.py) gets what is left, its
    # num_kv_blocks only a ceiling: what it needs for certain is one block (and the scratch one)
    sized_later = config.device == "cuda" and config.gpu_memory_utilization is not None
    blocks = 1 if sized_later else config.num_kv_blocks
    kv_pool = 2 * m.num_hidden_layers * (blocks + 1) * config.block_size * m.kv_dim * elem
    copies = 2 if config.device == "cuda" else 1  # the staged inputs: a pinned host buffer and its device copy
    staged = copies * INT64 * (4 * (tokens + seqs) + 1024)
    # live at once in a layer: the residual, its norm, q, k, v, attention out, o_proj out, gate, up, act
    per_token = 3 * m.hidden_size + 2 * m.q_dim + 2 * m.kv_dim + 3 * m.intermediate_size
    table_width = min(-(-config.max_model_len // config.block_size), config.num_kv_blocks)
    return MemoryNeed(weights=int(stored_weight_bytes(m, elem)), kv_pool=kv_pool,
                      step=staged + tokens * per_token * elem,
                      slots=seqs * (m.vocab_size * FLOAT32 + table_width * INT64))


def check_memory(config: EngineConfig, have: int | None, where: str = "the machine has") -> None:
    """ConfigError naming the option whose buffer asks for the most, when the engine cannot fit in
    `have` bytes (None: unknown, nothing checked)."""
    need = memory_need(config)
    if have is None or need.total <= have:
        return
    parts = {"model": need.weights, "kv_pool": need.kv_pool, "step": need.step, "slots": need.slots}
    biggest = max(parts, key=parts.get)
    field, what = _blame(config, biggest, parts[biggest])
    others = ", ".join(f"{_size(parts[p])} {WORDS[p]}" for p in parts if p != biggest)
    raise ConfigError(field, f"{what}, beside {others}: {_size(need.total)} in all; {where} {_size(have)} available")


def check_engine_fits(config: EngineConfig, simulated_memory: int | None = None) -> None:
    """check_memory against a simulated GPU's bytes, else what this machine (or its GPU) has free now."""
    if simulated_memory is not None:
        check_memory(config, simulated_memory, "the simulated GPU has")
    else:
        where = "the GPU has" if config.device == "cuda" else "the machine has"
        check_memory(config, available_memory(config.device), where)


WORDS = {"model": "of weights", "kv_pool": "of KV cache", "step": "for a step's inputs and activations",
         "slots": "for the slots' logits and block tables"}


def _blame(config: EngineConfig, part: str, size: int) -> tuple[str, str]:
    m = config.model
    if part == "model":
        return "model", (f"{m.name}'s {m.num_params():,} parameters need {_size(size)} "
                         f"({weights_text(m, config.dtype)})")
    if part == "kv_pool":
        pool = (f"the KV pool ({config.num_kv_blocks:,} blocks and one scratch block, {config.block_size:,} "
                f"tokens each) needs {_size(size)}")
        # a block longer than any sequence is the odd size out; else it is the number of blocks
        if config.block_size > config.max_model_len:
            return ("block_size",
                    f"{config.block_size:,} tokens a block (max_model_len is {config.max_model_len:,}): {pool}")
        return "num_kv_blocks", f"{config.num_kv_blocks:,} blocks: {pool}"
    if part == "step":
        return ("max_num_batched_tokens", f"{config.max_num_batched_tokens:,} tokens a step need {_size(size)} "
                                          f"of inputs and activations")
    return "max_num_seqs", f"{config.max_num_seqs:,} slots need {_size(size)} of logits and block tables"


def _size(n: int) -> str:
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20)):
        if n >= scale:
            return f"{n / scale:,.2f} {unit}"
    return f"{n / (1 << 20):.2f} MiB"
