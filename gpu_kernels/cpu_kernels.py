"""batchtop's C++ CPU kernels (csrc/): built once per machine, then loaded.

- paged_attention (paged_attention_cpu.cpp) reads each row's keys and values straight from the pool
  through its block table, where the torch reference gathers every table into a dense copy and calls
  SDPA; decode rows and prompt chunks go through one call.
- rms_norm, add_rms_norm, silu_and_mul and rope (fused_ops_cpu.cpp) do each of the decoder layer's
  elementwise steps in one pass, rounded as Hugging Face's separate torch ops round.
- sample and argmax (sampling_cpu.cpp): the sampler's greedy / temperature / top-p draw, a few passes
  over each row where the torch version makes a dozen full-batch ops.
- pack_linear_bf16 and linear_bf16 (linear_bf16_cpu.cpp): bf16 linear layers from a weight packed once,
  streamed front to back, on AVX512_BF16 (decode GEMMs at up to 1.4x oneDNN's speed) or on AVX2 and FMA
  (fp32 arithmetic on the bf16 weights: 1.5-2.4x oneDNN's fp32 GEMMs). A [gate | up] weight packed by
  halves gives silu(gate) * up straight from the GEMM (silu_mul_linear_bf16).
- decoder_layers_bf16 (decoder_layer_cpu.cpp): a step's decoder layers in one call over those kernels,
  bitwise what llama.DecoderLayer computes on them, without a Python call and allocation per op;
  decoder_stack (decoder_stack.h) keeps its per-model arguments, checked once, between steps.
bench/cpu_kernels.py measures each against the torch ops it replaces. The build (cpu_kernel_build.py:
torch's cpp_extension, a C++ compiler and ninja, in a child process) is cached under torch's extensions
directory, keyed by the sources and versions. The dashboard builds them in the background while the
torch ops run and switches them in between two steps (`switch_in`); anything else that asks whether
they are `available()` first builds them in the foreground, its progress on stderr. Where they cannot
be built, or with BATCHTOP_CPU_KERNEL=0, the torch code runs and `why_unavailable()` says why.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
from collections.abc import Callable

import torch

from batchtop.gpu_kernels.cpu_kernel_build import BuildState, ChildBuild, build_dir, is_built, library_path

NAME = "batchtop_cpu_kernels"
DTYPES = (torch.float32, torch.bfloat16)
OPS = ("paged_attention", "rope", "sample", "linear_bf16", "decoder_layers_bf16")
_why: list[str] = []
_lock = threading.Lock()
_active = False  # loaded into this process and in use
_tried = False  # a foreground build or load has been attempted (and failed, if not _active)
_background: ChildBuild | None = None


def _turned_off() -> bool:
    return os.environ.get("BATCHTOP_CPU_KERNEL", "1") == "0"


def _disabled() -> bool:
    if _turned_off():
        _why.append("turned off by BATCHTOP_CPU_KERNEL=0")
        return True
    return False


def _activate(directory) -> bool:
    """Load the built library into this process; True when every op registered."""
    global _active
    try:
        torch.ops.load_library(str(library_path(directory)))
    except Exception as exc:  # a library built for another CPU, a broken file
        _why.append(f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}")
        return False
    if not all(hasattr(torch.ops.batchtop_cpu, op) for op in OPS):
        _why.append(f"{library_path(directory)} lacks some of its ops")
        return False
    _active = True
    return True


def _stderr_progress(state: BuildState) -> None:
    if state.phase == "waiting":
        line = "building the CPU kernels (once per machine and version, under a minute on 2 cores)..."
    elif state.phase == "building":
        line = f"CPU kernels: {state.done}/{state.total} compiled and linked, {state.seconds:.0f} s"
    else:
        line = f"CPU kernels {state.describe()}"
    print(f"batchtop: {line}", file=sys.stderr, flush=True)


def _load_blocking() -> bool:
    """The foreground path: build (or find) the library and load it, progress on stderr."""
    global _tried
    with _lock:
        if _active or _tried:
            return _active
        _tried = True
        if _disabled():
            return False
        directory = build_dir()
        if not is_built(directory):
            _stderr_progress(BuildState("waiting"))
            state = ChildBuild(directory, on_change=_stderr_progress).start().wait()
            if state.phase != "built":
                _why.append(state.why or state.phase)
                return False
        return _activate(directory)


def start_background(on_change: Callable[[BuildState], None] | None = None) -> BuildState | None:
    """Make the kernels ready without waiting for them: load them now when they are built (under a
    second), else build them in a child process while the torch ops run; `switch_in` brings them in
    between two steps. Returns the build's first state, None when nothing is left to build."""
    global _background, _tried
    with _lock:
        if _active or _tried or _background is not None:
            return None
        if _disabled():
            _tried = True
            return None
        directory = build_dir()
        if is_built(directory):
            _tried = True
            _activate(directory)
            return None
        _background = ChildBuild(directory, on_change=on_change).start()
        return _background.state


def background_state() -> BuildState | None:
    """The background build's state (None: none was started)."""
    return _background.state if _background is not None else None


def switch_in() -> bool:
    """Between two steps, on the thread that runs them: bring a finished background build in; True when
    the kernels became active now (the engine then makes its cached choices of path again:
    core_engine/worker/kernel_switch.py)."""
    global _background, _tried
    build = _background
    if _active or build is None or not build.finished.is_set():
        return False
    with _lock:
        _background, _tried = None, True
        if build.state.phase != "built":
            _why.append(build.state.why or build.state.phase)
            return False
        return _activate(build.directory)


def stop_background() -> None:
    """The process is leaving: stop a build still running (its lock is released with it)."""
    if _background is not None:
        _background.stop()


def can_build() -> bool:
    """Whether the kernels can be here (not turned off, a C++ compiler on PATH); builds nothing."""
    return not _turned_off() and shutil.which(os.environ.get("CXX", "c++")) is not None


def active() -> bool:
    """Whether the kernels run now; never builds (a UI thread may ask)."""
    return _active



def available() -> bool:
    """Whether the kernels run now. While a background build runs, False (the torch ops run); with none
    started, the first call builds them in the foreground."""
    if _active:
        return True
    if _background is not None or _tried:
        return False
    return _load_blocking()


def why_unavailable() -> str | None:
    if _active:
        return None
    state = background_state()
    if state is not None and state.phase != "failed":
        return f"{state.describe()} in the background; the torch ops run meanwhile"
    if not available():
        return _why[-1] if _why else "not built"
    return None


def usable(dtype: torch.dtype, head_dim: int) -> bool:
    return dtype in DTYPES and head_dim <= 256 and available()


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                    row_tables: torch.Tensor | None, context_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """Each query row r (rows, heads, hd) attends to keys [0, context_lens[r]) of the sequence whose
    block table is block_tables[row_tables[r]] (block_tables[r] when row_tables is None).
    Returns (rows, heads, hd) in q's dtype."""
    out = torch.empty(q.shape, dtype=q.dtype)
    torch.ops.batchtop_cpu.paged_attention(out, q, k_cache, v_cache, block_tables, row_tables, context_lens, scale)
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    out = torch.empty_like(x)
    torch.ops.batchtop_cpu.rms_norm(out, x, weight, eps)
    return out


def add_rms_norm(residual: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """residual += x (in place, rounded to its dtype); returns rms_norm(residual)."""
    out = torch.empty_like(x)
    torch.ops.batchtop_cpu.add_rms_norm(residual, x, out, weight, eps)
    return out


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up over gate_up = [gate | up] on its last dim."""
    out = torch.empty((*gate_up.shape[:-1], gate_up.shape[-1] // 2), dtype=gate_up.dtype)
    torch.ops.batchtop_cpu.silu_and_mul(out, gate_up)
    return out


def rope_(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """apply_rope in place on x (rows, heads, head_dim); tables (rows, 1, head_dim) or (rows, head_dim)."""
    torch.ops.batchtop_cpu.rope(x, cos, signed_sin)
    return x


def sample(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor, seed_lo: torch.Tensor,
           seed_hi: torch.Tensor, counter: torch.Tensor) -> torch.Tensor:
    """One token per row (S,): sampler.Sampler's distribution and uniforms, per row in one pass."""
    tokens = torch.empty(logits.shape[0], dtype=torch.long)
    torch.ops.batchtop_cpu.sample(tokens, logits, temperature, top_p, seed_lo, seed_hi, counter)
    return tokens


def linear_bf16_usable() -> bool:
    return available() and torch.ops.batchtop_cpu.linear_bf16_supported()


def interleave_halves(weight: torch.Tensor) -> torch.Tensor:
    """The rows of a (2h, K) weight [gate; up] (h a multiple of 32) as linear_bf16 packed by halves reads
    them: each 64-row group holds 32 rows of each half, 16 of gate, 16 of up, 16 of gate, 16 of up."""
    n, k = weight.shape
    return weight.reshape(2, n // 64, 2, 16, k).permute(1, 2, 0, 3, 4).reshape(n, k)


def decoder_layer_usable() -> bool:
    return linear_bf16_usable() and hasattr(torch.ops.batchtop_cpu, "decoder_layers_bf16")


def pack_linear_bf16(weight: torch.Tensor, half: int = 0) -> torch.Tensor:
    """The (N, K) weight in linear_bf16's layout: 64-column groups of K/2 feature pairs (K padded to even);
    half > 0 (N / 2): packed by halves (interleave_halves), for silu_mul_linear_bf16."""
    return torch.ops.batchtop_cpu.pack_linear_bf16(interleave_halves(weight) if half else weight)


def _features(x: torch.Tensor) -> torch.Tensor:
    if x.stride(-1) != 1:
        x = x.contiguous()
    if x.shape[1] % 2:
        x = torch.nn.functional.pad(x, (0, 1))  # the packed weight's padding feature is zero
    return x


def linear_bf16(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, out_features: int,
                half: int = 0) -> torch.Tensor:
    """x (rows, K) @ W^T + bias in bfloat16, fp32 accumulation; each row's result independent of the others.
    half: what the weight was packed with."""
    x = _features(x)
    out = torch.empty((x.shape[0], out_features), dtype=x.dtype)
    torch.ops.batchtop_cpu.linear_bf16(out, x, packed, bias, half, 0)
    return out


def silu_mul_linear_bf16(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, half: int) -> torch.Tensor:
    """silu_and_mul(linear_bf16(x, ...)) in one kernel, bitwise the same: the weight packed by halves."""
    x = _features(x)
    out = torch.empty((x.shape[0], half), dtype=x.dtype)
    torch.ops.batchtop_cpu.linear_bf16(out, x, packed, bias, half, 1)
    return out


def decoder_layers_bf16(x: torch.Tensor, weights: list, k_caches: list[torch.Tensor], v_caches: list[torch.Tensor],
                        cos: torch.Tensor, sin: torch.Tensor, slot_mapping: torch.Tensor, block_tables: torch.Tensor,
                        row_tables: torch.Tensor | None, context_lens: torch.Tensor, num_heads: int, eps: float,
                        scale: float, linear_types: list[int] | None = None) -> None:
    """Decoder layers in turn on x (rows, hidden), in place. weights: ten a layer, flat: the input and
    post-attention norms, then (pack, bias or None) of qkv, o, gate_up (packed by halves) and down; layer
    i's pool layer k_caches[i], v_caches[i]; the attention's tables as for paged_attention. Writes each
    row's K/V at its slot in every layer. linear_types: four a layer (qkv, o, gate_up, down), -1 for a
    pack_linear_bf16 pack, else the ggml type id of a GGUF block matrix (N, row_bytes) uint8 that
    linear_quant reads (gate_up: its gate rows then its up rows), as quant_kernels.pack returns it;
    None: every linear a bf16 pack."""
    torch.ops.batchtop_cpu.decoder_layers_bf16(x, weights, k_caches, v_caches, cos, sin, slot_mapping, block_tables,
                                               row_tables, context_lens, num_heads, eps, scale,
                                               list(linear_types) if linear_types is not None else [])


STACK_RAN, STACK_PARAMS_CHANGED, STACK_POSITIONS_PAST = 0, 1, 2  # what DecoderStack.run did (decoder_stack.h)


def decoder_stack(weights: list, num_heads: int, kv_heads: int, head_dim: int, eps: float, scale: float,
                  params: list[torch.Tensor], linear_types: list[int] | None = None):
    """decoder_layers_bf16's arguments that stay the same from step to step, checked once and kept in C++
    (decoder_stack.h): a DecoderStack whose run(x, k_caches, v_caches, cos, sin, positions, slot_mapping,
    block_tables, row_tables, context_lens) is decoder_layers_bf16 over them, step row r roped with row
    positions[r] of the whole cos and sin tables, and returns STACK_RAN; or runs nothing and returns
    STACK_PARAMS_CHANGED, once any of params (what the weights were built from) was replaced or written,
    or STACK_POSITIONS_PAST, where a position is past the tables' rows."""
    return torch.classes.batchtop_cpu.DecoderStack(weights, list(linear_types) if linear_types is not None else [],
                                                   num_heads, kv_heads, head_dim, eps, scale, list(params))


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """The first maximum of each row (S,)."""
    tokens = torch.empty(logits.shape[0], dtype=torch.long)
    torch.ops.batchtop_cpu.argmax(tokens, logits)
    return tokens
