"""Turns user options (with 'auto' and unset values) into a resolved EngineConfig and WorkloadSpec.

Defaults differ by device because the hardware does: a 2-core CPU runs a ~155M-parameter model at
tens of milliseconds per step, a large GPU runs an 8B model at a few.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch

from batchtop.core_engine.config import MAX_NUM_SEQS_LIMIT, PRESETS, EngineConfig, ModelConfig
from batchtop.core_engine.device import DTYPES, resolve_device, resolve_dtype
from batchtop.core_engine.errors import ConfigError
from batchtop.core_engine.sched.policies import DEFAULT_MODE
from batchtop.core_engine.text_files import input_problem
from batchtop.core_engine.model.checkpoint import available_memory, check_checkpoint, check_fits
from batchtop.core_engine.model.gguf_quant_weights import with_weights
from batchtop.core_engine.model.gguf_weights import check_tensors
from batchtop.core_engine.model.hf_config import read_model_config
from batchtop.core_engine.model.smollm2 import NAME as SMOLLM2, require_smollm2, smollm2_file
from batchtop.core_engine.model.sources import is_gguf, read_gguf_config
from batchtop.core_engine.model.weight_bytes import stored_weight_bytes
from batchtop.core_engine.workload.spec import WorkloadSpec
from batchtop.core_engine.worker.memory_need import check_engine_fits
from batchtop.core_engine.simulate.simulated_devices import SimulatedDevice

GIB = 1 << 30


@dataclass(frozen=True, slots=True)
class DeviceDefaults:
    model: str
    max_num_seqs: int
    max_num_batched_tokens: int
    num_kv_blocks: int | None  # None: size the pool from GPU memory


def cuda_memory() -> int:
    return torch.cuda.get_device_properties(0).total_memory


def device_defaults(device: str, memory: int | None = None) -> DeviceDefaults:
    """memory: the GPU's bytes (a simulated one's); None reads the real GPU's."""
    if device == "cuda":
        big = (cuda_memory() if memory is None else memory) >= 40 * GIB
        return DeviceDefaults("gpu-8b" if big else "gpu-1b", 128, 2048, None)
    return DeviceDefaults(cpu_default_model(), 16, 256, 512)


def cpu_default_model() -> str:
    """The real model when it is installed; else the random-weight preset sized for a CPU."""
    return SMOLLM2 if smollm2_file() is not None else "cpu-demo"


def trace_scales(device: str, chat: bool = False) -> tuple[float, float]:
    """(prompt, output) scales of the bundled trace: it is GPU-sized, so a CPU plays it scaled down.
    Prompts shrink more than outputs so decode (where batching pays) dominates the CPU's time. The
    bundled chat requests are text (nothing to scale) capped at 1024 tokens: 256 on a CPU."""
    if device == "cuda":
        return 1.0, 1.0
    return (1.0, 1 / 4) if chat else (1 / 16, 1 / 4)


def kv_blocks_for_memory(model: ModelConfig, dtype: str, block_size: int, fraction: float, memory: int) -> int:
    """Blocks that fit in `fraction` of `memory` bytes of GPU memory after the weights and a working reserve."""
    if not 0 < fraction <= 1:
        raise ConfigError("gpu_memory_utilization", f"must be in (0, 1], got {fraction}")
    weights = stored_weight_bytes(model, DTYPES[dtype].itemsize)
    reserve = 2 * GIB + 8 * model.vocab_size * 4 * 2048  # activations and fp32 logits of a full step
    per_block = kv_block_bytes(model, dtype, block_size)
    room = memory * fraction - weights - reserve
    blocks = int(room // per_block)
    if blocks < 1 and room > 0:  # the weights fit: it is the block that does not
        raise ConfigError("block_size", f"{block_size:,} tokens a block need {per_block / GIB:,.2f} GiB each; "
                                        f"{fraction} of {memory / GIB:.0f} GiB leaves {room / GIB:.2f} GiB for KV blocks")
    if blocks < 1:
        raise ConfigError("gpu_memory_utilization", f"{fraction} of {memory / GIB:.0f} GiB leaves no room "
                                                      f"for KV blocks after {weights / GIB:.1f} GiB of weights")
    return blocks


def kv_blocks_ever_used(model: ModelConfig, block_size: int, max_num_batched_tokens: int) -> int:
    """The most blocks the engine can ever hold at once: every slot a live change may open (up to
    max_num_batched_tokens of them, see Engine.max_num_seqs_cap) at max_model_len tokens. A pool sized
    from memory stops there: a small model on a large GPU would otherwise build tens of millions of
    blocks it can never fill (tiny on an H200: 32.7M, 48 s and 4.3 GB to start)."""
    slots = min(MAX_NUM_SEQS_LIMIT, max_num_batched_tokens)
    return slots * -(-model.max_position_embeddings // block_size)


def kv_block_bytes(model: ModelConfig, dtype: str, block_size: int) -> int:
    return 2 * model.num_hidden_layers * block_size * model.kv_dim * DTYPES[dtype].itemsize


def check_pool_fits(model: ModelConfig, dtype: str, block_size: int, num_kv_blocks: int, device: str,
                    memory: int | None) -> None:
    """An explicit --num-kv-blocks that cannot be allocated fails now, with both numbers, instead of
    as an out-of-memory error (or minutes of swapping) while the engine is built."""
    have = memory if memory is not None else available_memory(device)
    pool = num_kv_blocks * kv_block_bytes(model, dtype, block_size)
    weights = stored_weight_bytes(model, DTYPES[dtype].itemsize)
    if have is not None and pool + weights > have:
        where = "the simulated GPU has" if memory is not None else ("the GPU has" if device == "cuda"
                                                                    else "the machine has")
        raise ConfigError("num_kv_blocks", f"{num_kv_blocks} blocks of {block_size} tokens need "
                                             f"{pool / GIB:.2f} GiB of KV cache beside {weights / GIB:.2f} GiB of "
                                             f"weights; {where} {have / GIB:.2f} GiB available")


def resolve_model(model: str, default: str) -> ModelConfig:
    """A preset by name ('auto': the device's default), smollm2 (the installed GGUF), else a Hugging
    Face model directory or a GGUF file (a path that shares a preset's name is reached as ./NAME)."""
    if model == "auto":
        model = default
    if model in PRESETS:
        return PRESETS[model]
    if model == SMOLLM2:
        return read_gguf_config(require_smollm2(), SMOLLM2)
    path = Path(model)
    if path.is_dir():
        return read_model_config(path)
    if path.suffix.lower() == ".gguf" or is_gguf(path):
        return read_gguf_config(path)
    why = input_problem(path, "file or directory") or "not a model directory or GGUF file"
    raise ConfigError("model", f"{model!r} is neither a preset (auto, {', '.join(PRESETS)}, {SMOLLM2}) nor a "
                                 f"model directory or GGUF file ({why})")


def resolve_config(*, model: str = "auto", device: str = "auto", dtype: str = "auto",
                   weights: str = "auto", mode: str = DEFAULT_MODE, max_num_seqs: int | None = None,
                   max_num_batched_tokens: int | None = None, block_size: int = 16,
                   num_kv_blocks: int | None = None, gpu_memory_utilization: float = 0.9,
                   seed: int = 0, simulate: SimulatedDevice | None = None) -> EngineConfig:
    """simulate: resolve for that device (its kind and memory) instead of the one torch sees. weights: how a
    GGUF file's blocks run, quantized or dequantized (gguf_quant_weights.with_weights)."""
    if simulate is None:
        dev, memory = resolve_device(device), None
    elif device != "auto":
        raise ConfigError("device", f"cannot be combined with --simulate (the simulated {simulate.name} is the device)")
    else:
        dev, memory = simulate.kind, simulate.memory
    defaults = device_defaults(dev, memory)
    if simulate is not None and defaults.model == SMOLLM2:  # no model runs, so no answer ends early:
        defaults = replace(defaults, model="cpu-demo")  # a what-if keeps the length-only preset
    model_cfg = resolve_model(model, defaults.model)
    dt = resolve_dtype(dtype, dev)
    if dev == "cpu" and dt == "float16":
        raise ConfigError("dtype", "float16 is slow on CPU; use bfloat16 or float32")
    model_cfg = with_weights(model_cfg, weights, dev, dt)
    if model_cfg.checkpoint is not None and simulate is None:  # fail now, not after minutes of loading
        if is_gguf(model_cfg.checkpoint):
            check_tensors(model_cfg)
        else:
            check_checkpoint(model_cfg)
        check_fits(model_cfg, dt, dev)
    if num_kv_blocks is not None and isinstance(block_size, int) and block_size >= 1:
        check_pool_fits(model_cfg, dt, block_size, num_kv_blocks, dev, memory)
    budget = defaults.max_num_batched_tokens if max_num_batched_tokens is None else max_num_batched_tokens
    extra = {}
    profiled_utilization = None
    if num_kv_blocks is None:
        if defaults.num_kv_blocks is not None:
            num_kv_blocks = defaults.num_kv_blocks
        else:
            if not isinstance(block_size, int) or block_size < 1:
                raise ConfigError("block_size", f"must be an integer >= 1, got {block_size!r}")
            num_kv_blocks = kv_blocks_for_memory(model_cfg, dt, block_size, gpu_memory_utilization,
                                                 cuda_memory() if memory is None else memory)
            if simulate is None:  # a real GPU: the runner sizes the pool after a profiling forward, this at most
                profiled_utilization = gpu_memory_utilization
            if isinstance(budget, int) and budget >= 1:
                most = kv_blocks_ever_used(model_cfg, block_size, budget)
                if num_kv_blocks > most:
                    extra["kv_pool_capped_from"] = num_kv_blocks  # what the memory would have held
                    num_kv_blocks = most
    config = EngineConfig(
        model=model_cfg, device=dev, dtype=dt, mode=mode,
        max_num_seqs=defaults.max_num_seqs if max_num_seqs is None else max_num_seqs,
        max_num_batched_tokens=budget, block_size=block_size, num_kv_blocks=num_kv_blocks, seed=seed,
        gpu_memory_utilization=profiled_utilization, extra=extra)
    check_engine_fits(config, memory)  # every size against memory, before any buffer is allocated
    return config


def pool_note(config: EngineConfig) -> str | None:
    """The startup note's words for a pool capped by kv_blocks_ever_used (None when it was not)."""
    memory_blocks = config.extra.get("kv_pool_capped_from")
    if memory_blocks is None:
        return None
    slots = min(MAX_NUM_SEQS_LIMIT, config.max_num_batched_tokens)
    return (f"KV pool capped at {config.num_kv_blocks} blocks, all that {slots} sequences (the most the live "
            f"keys can open) of max_model_len {config.max_model_len} can use; the memory would hold "
            f"{memory_blocks}")


def resolve_workload(config: EngineConfig, *, path: str | None = None, num_requests: int | None = None,
                     length_scale: float | None = None, prompt_scale: float | None = None,
                     output_scale: float | None = None, time_scale: float | None = None,
                     rate: float = 0.0, prompt_mean: float = 64.0, output_mean: float = 128.0,
                     chat: bool = False) -> WorkloadSpec:
    """Scales left unset take the device defaults for the bundled trace, and 1.0 for anything else; the
    bundled trace's arrivals are paced to the engine's measured capacity unless --time-scale is given.
    chat: the model has a chat template, so the bundled workload is the chat requests."""
    bundled = path is None
    base_prompt, base_output = trace_scales(config.device, chat) if bundled else (1.0, 1.0)
    if length_scale is not None:
        base_prompt = base_output = length_scale
    return WorkloadSpec(
        path=path, chat=bundled and chat, num_requests=num_requests,
        prompt_scale=base_prompt if prompt_scale is None else prompt_scale,
        output_scale=base_output if output_scale is None else output_scale,
        time_scale=1.0 if time_scale is None else time_scale, auto_pace=bundled and time_scale is None,
        seed=config.seed, prompt_mean=prompt_mean, output_mean=output_mean, rate=rate)
