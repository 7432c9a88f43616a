"""A linear layer and an embedding that keep a GGUF file's quantized blocks and compute from them.

The weights stay as the file stores them (uint8 rows of blocks, quant_blocks.py), so a decode step
streams the blocks (SmolLM2's Q4_1/Q8_0: ~96 MB) instead of a dequantized bf16 copy (~270 MB). Where
batchtop's C++ kernels run the type (gpu_kernels.quant_kernels), they compute straight from the
blocks, bf16 or float32 activations; elsewhere (CUDA, no compiler, BATCHTOP_CPU_KERNEL=0) each forward
dequantizes the rows a chunk at a time and multiplies in the activations' dtype, caching nothing: memory is the point.

The blocks are parameters (uint8, no gradient), so every place that sizes or tracks a model's weights
(the runner's weight bytes, the fused decoder layer's cache checks) sees them as it sees dense ones.
"""

from __future__ import annotations


import gguf
import torch
import torch.nn.functional as F
from torch import nn

from batchtop.core_engine.model.packed_linear import parameter_registrations
from batchtop.core_engine.model.quant_blocks import dequantize, ggml_id
from batchtop.gpu_kernels import cpu_kernels, huge_pages, quant_kernels


CHUNK_WEIGHTS = 1 << 22  # weights the reference dequantizes at once (16 MB of float32), whatever the matrix


def kernels_expected() -> bool:
    """Whether batchtop's block kernels can run in this process: the C++ kernels are loaded with the op in
    them, or can still be built; builds nothing."""
    if cpu_kernels.active():
        return hasattr(torch.ops.batchtop_cpu, "linear_quant")
    return cpu_kernels.can_build()


def kernel_runs(x: torch.Tensor, type_name: str) -> bool:
    """Whether batchtop's C++ kernel computes this type's blocks for these activations (bf16 or float32)."""
    return x.device.type == "cpu" and x.dtype in (torch.bfloat16, torch.float32) and quant_kernels.usable(type_name)


def kernels_coming() -> bool:
    """Whether the C++ kernels are being built in the background (a first session): they will run the
    blocks within a minute, and until then each linear keeps its dense weight rather than dequantizing
    it every step (~0.2 s a SmolLM2 step: a first session would look hung)."""
    state = cpu_kernels.background_state()
    return state is not None and state.phase != "failed" and not cpu_kernels.active()


def reference_linear(x: torch.Tensor, blocks: torch.Tensor, type_name: str, bias: torch.Tensor | None) -> torch.Tensor:
    """x (rows, K) @ dequantize(blocks)^T + bias in x's dtype, the weight dequantized a chunk of rows at a time."""
    n, k = blocks.shape[0], x.shape[1]
    step = max(1, CHUNK_WEIGHTS // k)
    if step >= n:
        return F.linear(x, dequantize(blocks, type_name).to(x.dtype), bias)
    out = torch.empty((x.shape[0], n), dtype=x.dtype, device=x.device)
    for start in range(0, n, step):
        rows = slice(start, start + step)
        out[:, rows] = F.linear(x, dequantize(blocks[rows], type_name).to(x.dtype),
                                None if bias is None else bias[rows])
    return out


class QuantLinear(nn.Module):
    """y = x W^T + b with W held as blocks: one block matrix, or several parts of different types (a fused
    q/k/v of a Q4_K_M file, whose v is Q6_K), each computing its own slice of the output."""

    def __init__(self, in_features: int, parts: list[tuple[str, torch.Tensor]], bias: torch.Tensor | None = None,
                 halves: bool = False) -> None:
        """parts: (GGML type name, uint8 (rows, row_bytes) blocks or a Parameter holding them), in output
        order; halves: the output is [gate | up] (silu_mul). Blocks given as a tensor become this layer's
        own: where the kernels read a repack of them (gpu_kernels.quant_kernels.pack), the repack takes
        their place, so one copy is held. A Parameter given is shared (a tied embedding reads it too) and
        kept as it is, its repack beside it."""
        super().__init__()
        self.owned = tuple(not isinstance(b, nn.Parameter) for _, b in parts)
        self.repacked = [False] * len(parts)  # blocks[i] holds the kernels' repack, not the file's blocks
        self.placed = [False] * len(parts)  # blocks[i], read by the kernels as they are, moved to huge pages
        self.in_features = in_features
        self.types = tuple(t for t, _ in parts)
        self.splits = tuple(b.shape[0] for _, b in parts)
        self.out_features = sum(self.splits)
        self.blocks = nn.ParameterList(b if isinstance(b, nn.Parameter) else nn.Parameter(b, requires_grad=False)
                                       for _, b in parts)
        self.bias = bias if bias is None or isinstance(bias, nn.Parameter) else nn.Parameter(bias)
        self.halves = halves

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, types={'+'.join(self.types)}"

    def _part(self, x: torch.Tensor, i: int, bias: torch.Tensor | None) -> torch.Tensor:
        type_name = self.types[i]
        if kernel_runs(x, type_name):
            self.__dict__.pop("_interim", None)
            return quant_kernels.linear_quant(x, self.kernel_blocks(i), type_name, bias, self.splits[i], packed=True)
        if self.repacked[i]:  # the kernels, once in, stay in: only a test that turns them off gets here
            raise RuntimeError(f"{type_name} blocks were repacked for batchtop's kernels, which no longer run them")
        if x.device.type == "cpu" and kernels_coming():
            return F.linear(x, self._interim_weight(i, x.dtype), bias)
        return reference_linear(x, self.blocks[i], type_name, bias)

    def kernel_blocks(self, i: int) -> torch.Tensor:
        """What the kernels read for part i: its repack, which replaces the file's blocks where they are this
        layer's own (a weight held once), or the blocks themselves for a type without one."""
        if self.repacked[i]:
            return self.blocks[i]
        blocks = self.blocks[i]
        packed = quant_kernels.pack(blocks, self.types[i])
        if packed is not blocks and self.owned[i]:
            self.blocks[i] = nn.Parameter(packed, requires_grad=False)
            self.repacked[i] = True
        elif packed is blocks and self.owned[i] and not self.placed[i]:  # read in place: on huge pages too
            packed = huge_pages.place(blocks)
            self.blocks[i] = nn.Parameter(packed, requires_grad=False)
            self.placed[i] = True
        return packed

    def _interim_weight(self, i: int, dtype: torch.dtype) -> torch.Tensor:
        """Part i dequantized to `dtype`, held only while the kernels are being built (dropped as they come
        in): the first session's steps cost what a dequantized run's do, not a dequantization each."""
        interim = self.__dict__.setdefault("_interim", {})
        if (i, dtype) not in interim:
            interim[(i, dtype)] = dequantize(self.blocks[i], self.types[i]).to(dtype)
        return interim[(i, dtype)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x = x.reshape(-1, x.shape[-1])
        if x.stride(-1) != 1:
            x = x.contiguous()
        if len(self.types) == 1:
            out = self._part(x, 0, self.bias)
        else:
            biases = self.bias.split(self.splits) if self.bias is not None else (None,) * len(self.types)
            out = torch.cat([self._part(x, i, b) for i, b in enumerate(biases)], dim=1)
        return out.reshape(*lead, self.out_features)

    def silu_mul(self, x: torch.Tensor) -> torch.Tensor | None:
        """silu(gate) * up of this [gate | up] projection in one kernel, or None where it has none."""
        if not self.halves or x.dim() != 2 or len(self.types) != 1 or not kernel_runs(x, self.types[0]):
            return None
        return quant_kernels.linear_quant(x, self.kernel_blocks(0), self.types[0], self.bias, self.out_features,
                                          epilogue="silu_mul", packed=True)


class QuantEmbedding(nn.Module):
    """An embedding table held as blocks: a lookup dequantizes only the rows it reads. A tied lm_head
    (QuantLinear) holds the same Parameter: one copy of the blocks."""

    def __init__(self, blocks: nn.Parameter, type_name: str, embedding_dim: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.blocks = blocks
        self.type_name = type_name
        self.embedding_dim = embedding_dim
        self.dtype = dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1)
        if flat.device.type == "cpu" and quant_kernels.embeds(self.type_name, self.dtype):
            rows = quant_kernels.quant_embedding(self.blocks, flat, self.type_name, self.dtype)
        else:
            rows = dequantize(self.blocks.index_select(0, flat), self.type_name).to(self.dtype)
        return rows.reshape(*ids.shape, self.embedding_dim)


def norm_and_head(norm: nn.Module, head: nn.Module, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor | None:
    """head(norm(x[rows])) in one kernel call (norm_head_quant), bitwise the three ops, where `head` is a
    one-part GGUF lm_head the kernels compute; None elsewhere."""
    if (not isinstance(head, QuantLinear) or len(head.types) != 1 or head.bias is not None or not x.is_contiguous()
            or not kernel_runs(x, head.types[0]) or not hasattr(torch.ops.batchtop_cpu, "norm_head_quant")):
        return None
    logits = torch.empty(rows.shape[0], head.out_features, dtype=x.dtype)
    torch.ops.batchtop_cpu.norm_head_quant(logits, x, rows, norm.weight, norm.variance_epsilon, head.kernel_blocks(0),
                                           ggml_id(head.types[0]))
    return logits


# The C++ decoder layer (decoder_layers_bf16): which linears it can take, and what to pass for each.

def fused_linear(linear: nn.Module) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(what decoder_layers_bf16 reads for this linear, its bias): a PackedLinear's bf16 pack, or a
    QuantLinear's one block matrix."""
    if isinstance(linear, QuantLinear):
        return linear.kernel_blocks(0), linear.bias
    return linear.bf16_pack(), linear.bias


def weight_slots(module: nn.Module) -> list[tuple[dict, str]]:
    """Where each of a module's parameters (its sub-modules' too) is registered: what a cache of weights
    built from it checks for a replaced parameter."""
    return [(owner._parameters, name) for owner in module.modules()
            for name, p in owner._parameters.items() if p is not None]


def _linear_type(linear: nn.Module) -> int | None:
    if not isinstance(linear, QuantLinear):
        return -1
    return ggml_id(linear.types[0]) if len(linear.types) == 1 else None


def linear_types(model: nn.Module) -> list[int] | None:
    """Four a layer (qkv, o, gate_up, down): -1 for a dense (bf16-packed) linear, else the GGML type id of
    its one block matrix; None when some linear is several parts (those layers run op by op). Kept until
    a parameter is registered anywhere (a module replaced)."""
    cached = model.__dict__.get("_linear_types")
    if cached is not None and cached[0] == parameter_registrations():
        return cached[1]
    types = []
    for layer in model.model.layers:
        for linear in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj):
            types.append(_linear_type(linear))
    result = None if None in types else types
    model.__dict__["_linear_types"] = (parameter_registrations(), result)
    return result


def layers_fuse(model: nn.Module) -> bool:
    """Whether decoder_layers_bf16 can run this model's layers as they hold their linears: every one a bf16
    pack, or a block matrix of a type the kernels compute."""
    types = linear_types(model)
    if types is None:
        return False
    quantized = {t for t in types if t >= 0}
    if not quantized:
        return True
    return all(quant_kernels.usable(gguf.GGMLQuantizationType(t).name) for t in quantized)


def fused_layer_options(model: nn.Module) -> dict:
    """decoder_layers_bf16's keyword for a model with block matrices (none for an all-bf16 one)."""
    types = linear_types(model)
    return {"linear_types": types} if types and max(types) >= 0 else {}
