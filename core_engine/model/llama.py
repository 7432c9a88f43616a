"""A Llama-family decoder (RMSNorm, RoPE, GQA, SwiGLU) over a flat, paged token batch.

Parameter names and math match Hugging Face's LlamaForCausalLM, so its state_dict loads both ways;
the options Mistral, Qwen2 and Qwen3 add (q/k/v biases, q/k RMSNorm, an explicit head_dim, Llama 3's
RoPE scaling, a tied lm_head) come from the ModelConfig.
The forward takes every scheduled token of every sequence as one flat batch of T tokens (no padding),
and attends through the paged KV pool that the runner owns and describes in an AttentionBatch
(attention_batch.py). Where attention runs Triton the same math runs as llama_triton.py's fused kernels.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from batchtop.core_engine.config import ModelConfig
from batchtop.core_engine.model.packed_linear import PackedLinear, packing, parameter_registrations, weight_key
from batchtop.core_engine.model.attention_batch import AttentionBatch
from batchtop.core_engine.model.llama_triton import forward_on_triton, fused_on_triton
from batchtop.core_engine.model.quant_linear import (fused_layer_options, fused_linear, layers_fuse, norm_and_head,
                                                    weight_slots)
from batchtop.gpu_kernels import cpu_kernels, store_kv, uses_cpu_kernel


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if fused_on_cpu(x):  # HF's exact rounding, in one pass
            return cpu_kernels.rms_norm(x, self.weight, self.variance_epsilon)
        # HF's math (normalise in fp32, scale) as one torch op; it rounds to the model dtype once at
        # the end where HF rounds before the scale too, which differs only in the last bf16 bit.
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.variance_epsilon)

    def add_and_norm(self, residual: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(residual + x, its norm); on the CPU kernels the sum is written into residual."""
        if fused_on_cpu(x) and residual.is_contiguous():
            return residual, cpu_kernels.add_rms_norm(residual, x, self.weight, self.variance_epsilon)
        residual = residual + x
        return residual, self(residual)


def fused_on_cpu(x: torch.Tensor, head_dim: int = 0) -> bool:
    """Whether the decoder's elementwise steps run as batchtop's fused CPU kernels (same math as the
    torch ops beside them, which stay the readable definition and run everywhere else)."""
    return x.device.type == "cpu" and x.is_contiguous() and cpu_kernels.usable(x.dtype, head_dim)


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    """Rotary frequencies (head_dim / 2,) in fp32 on the CPU, with Llama 3's scaling where configured."""
    hd = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float32, device="cpu") / hd))
    scaling = config.rope_scaling
    if scaling is None:
        return inv_freq
    # A frequency whose wavelength is short next to the original context keeps its value; one whose
    # wavelength is long is slowed by `factor`; in between, the two are blended linearly in
    # original_context / wavelength, from low_freq_factor (all slowed) to high_freq_factor (all kept).
    context = scaling.original_max_position_embeddings
    wavelength = 2 * math.pi / inv_freq
    slowed = inv_freq / scaling.factor
    keep = (context / wavelength - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    blended = (1 - keep) * slowed + keep * inv_freq
    out = torch.where(wavelength > context / scaling.low_freq_factor, slowed, blended)
    return torch.where(wavelength < context / scaling.high_freq_factor, inv_freq, out)


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor,
                 dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and signed sin tables (T, 1, head_dim) for the given positions, computed in fp32 as HF does.
    The sin table carries rotate_half's sign ([-sin, sin]), so apply_rope needs no negation or cat."""
    freqs = positions.float()[:, None] * inv_freq[None, :]
    cos, sin = freqs.cos(), freqs.sin()
    return torch.cat((cos, cos), dim=-1).to(dtype)[:, None, :], torch.cat((-sin, sin), dim=-1).to(dtype)[:, None, :]


class RopeTable:
    """rope_cos_sin's rows for positions [0, length) on the CPU, computed once (grown by doubling): a step's
    tables are then two row gathers, where computing them took eight small ops (~50 us of a SmolLM2
    decode step, its caches cold after the weights went through). Every row holds the bits rope_cos_sin
    gives its position."""

    def __init__(self, inv_freq: torch.Tensor, dtype: torch.dtype) -> None:
        self.inv_freq, self.dtype = inv_freq, dtype
        self.cos = self.sin = torch.empty(0, 1, 2 * inv_freq.numel(), dtype=dtype)

    def __call__(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.cover(positions)
        return self.cos.index_select(0, positions), self.sin.index_select(0, positions)

    def cover(self, positions: torch.Tensor) -> None:
        """Grow the tables (to a power of two, at least 256 rows) until they hold every one of positions."""
        need = int(positions.max()) + 1 if positions.numel() else 0
        if need > self.cos.shape[0]:
            length = max(256, 1 << (need - 1).bit_length())
            self.cos, self.sin = rope_cos_sin(torch.arange(length), self.inv_freq, self.dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """HF's x * cos + rotate_half(x) * sin, with rotate_half(x) = [-x2, x1] written as roll(x) = [x2, x1]
    times [-sin, sin]: three kernels a layer instead of six. x: (T, heads, hd); tables (T, 1, hd)."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), signed_sin)


def register_fused(module: nn.Module, fused: str, parts: tuple[tuple[str, int], ...]) -> None:
    """Store one fused projection (weight and bias) under Hugging Face's separate names.

    One GEMM over [q; k; v] (and [gate; up]) streams the weights in one pass, which is measurably
    faster for small-batch decode on CPU; state-dict hooks keep state_dict() and load_state_dict() in
    HF form, and `fused_parts` tells hf_parameters() (the checkpoint loader) where each part lives.
    """
    if not hasattr(module, "fused_parts"):
        module.fused_parts = {}
    module.fused_parts[fused] = parts
    sizes = [n for _, n in parts]

    def save(module, state_dict, prefix, local_metadata):
        for leaf in ("weight", "bias"):
            tensor = state_dict.pop(f"{prefix}{fused}.{leaf}", None)
            if tensor is not None:
                for (name, _), piece in zip(parts, tensor.split(sizes)):
                    state_dict[f"{prefix}{name}.{leaf}"] = piece

    def load(module, state_dict, prefix, *args):
        for leaf in ("weight", "bias"):
            names = [f"{prefix}{name}.{leaf}" for name, _ in parts]
            if all(n in state_dict for n in names):
                state_dict[f"{prefix}{fused}.{leaf}"] = torch.cat([state_dict.pop(n) for n in names])

    module._register_state_dict_hook(save)
    module.register_load_state_dict_pre_hook(load)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.scale = self.head_dim ** -0.5
        h = config.hidden_size
        self.q_size, self.kv_size = config.q_dim, config.kv_dim
        # HF: q_proj, k_proj, v_proj
        self.qkv_proj = PackedLinear(h, self.q_size + 2 * self.kv_size, bias=config.attention_bias)
        self.o_proj = PackedLinear(self.q_size, h, bias=config.o_proj_bias)
        register_fused(self, "qkv_proj", (("q_proj", self.q_size), ("k_proj", self.kv_size),
                                          ("v_proj", self.kv_size)))
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if config.qk_norm else None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                batch: AttentionBatch) -> torch.Tensor:
        t = x.shape[0]
        qkv = self.qkv_proj(x)
        # q and k heads sit side by side in qkv: rotate them in one pass
        qk = qkv[:, :self.q_size + self.kv_size].view(t, self.num_heads + self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:  # Qwen3: each head normalised before RoPE
            qk = torch.cat((self.q_norm(qk[:, :self.num_heads]), self.k_norm(qk[:, self.num_heads:])), dim=1)
        qk = cpu_kernels.rope_(qk, cos, sin) if fused_on_cpu(x, self.head_dim) else apply_rope(qk, cos, sin)
        q, k = qk[:, :self.num_heads], qk[:, self.num_heads:]  # (T, nh, hd), (T, kvh, hd)
        v = qkv[:, self.q_size + self.kv_size:].view(t, self.num_kv_heads, self.head_dim)
        k_cache, v_cache = batch.kv_caches[self.layer_idx]
        store_kv(k, v, k_cache, v_cache, batch.slot_mapping)

        out = batch.backend.forward(q, k, v, k_cache, v_cache, batch, self.scale)  # the step's backend
        return self.o_proj(out.reshape(t, self.q_size))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        i = config.intermediate_size
        # HF: gate_proj, up_proj
        self.gate_up_proj = PackedLinear(config.hidden_size, 2 * i, bias=config.mlp_bias, halves=True)
        self.down_proj = PackedLinear(i, config.hidden_size, bias=config.mlp_bias)
        register_fused(self, "gate_up_proj", (("gate_proj", i), ("up_proj", i)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        act = self.gate_up_proj.silu_mul(x)  # batchtop's bf16 kernel: SiLU-and-mul as the GEMM's epilogue
        if act is not None:
            return self.down_proj(act)
        gate_up = self.gate_up_proj(x)
        if fused_on_cpu(gate_up):
            return self.down_proj(cpu_kernels.silu_and_mul(gate_up))
        gate, up = gate_up.chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = Attention(config, layer_idx)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                batch: AttentionBatch) -> torch.Tensor:
        attended = self.self_attn(self.input_layernorm(x), cos, sin, batch)
        x, normed = self.post_attention_layernorm.add_and_norm(x, attended)
        return x + self.mlp(normed)

    def fused_weights(self) -> tuple:
        """The layer's ten weights as decoder_layers_bf16 takes them (norms, then each linear's pack or
        block matrix, and bias), kept between steps: building them costs ~25 us a layer, 0.8 ms a SmolLM2
        step. Rebuilt when a parameter is replaced or written to (weight_key)."""
        cached = self.__dict__.get("_fused")
        if cached is not None:
            slots, params, keys, weights = cached
            current = tuple(d[name] for d, name in slots)
            if all(a is b for a, b in zip(current, params)) and keys == tuple(weight_key(p) for p in current):
                return weights
        linears = (self.self_attn.qkv_proj, self.self_attn.o_proj, self.mlp.gate_up_proj, self.mlp.down_proj)
        slots = tuple(slot for m in (self.input_layernorm, self.post_attention_layernorm, *linears)
                      for slot in weight_slots(m))
        params = tuple(d[name] for d, name in slots)
        weights = (self.input_layernorm.weight, self.post_attention_layernorm.weight,
                   *(t for lin in linears for t in fused_linear(lin)))
        self.__dict__["_fused"] = (slots, params, tuple(weight_key(p) for p in params), weights)
        return weights

    def fused_parameters(self) -> tuple:
        """The parameters fused_weights was last built from."""
        return self.__dict__["_fused"][1]


class LlamaBody(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        # weights are always set after construction (init_weights, a checkpoint): _weight skips nn.Embedding's
        # normal_ init, which on the meta device imports torch._dynamo, 2 s of every start
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size,
                                         _weight=torch.empty(config.vocab_size, config.hidden_size))
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """Same module tree as transformers.LlamaForCausalLM: `model.*` plus an `lm_head`."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaBody(config)
        self.lm_head = PackedLinear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()
        self._inv_freq = rope_inv_freq(config)
        self.fuse_layers = True  # False: every layer op by op, even where decoder_layers_bf16 could run them

    def tie_weights(self) -> None:
        """With tie_word_embeddings the lm_head reads the embedding matrix (one tensor, not a copy)."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def _fused_rows(self, x: torch.Tensor, batch: AttentionBatch) -> tuple | None:
        """What the fused layers attend with: every row in the one kernel call (decode rows, or the varlen
        rows of decode rows and prompt chunks), or None where the layers run op by op."""
        if not self.fuse_layers or batch.prefills or not self._layers_fuse(x):
            return None
        if batch.varlen is not None:
            return batch.varlen.tables, batch.varlen.row_tables, batch.varlen.context_lens
        if batch.decode_block_tables is None:
            return None
        return batch.decode_block_tables, None, batch.decode_context_lens

    def _layers_fuse(self, x: torch.Tensor) -> bool:
        """fusable_layers and layers_fuse, asked again only when a parameter is registered anywhere or the
        CPU kernels come or go: ~50 us of every SmolLM2 decode step otherwise, its caches cold."""
        key = (x.device, x.dtype, parameter_registrations(), cpu_kernels.available())
        cached = self.__dict__.get("_fuse")
        if cached is None or cached[0] != key:
            fuse = fusable_layers(self.config, x.device, x.dtype) and layers_fuse(self)
            cached = self.__dict__["_fuse"] = (key, fuse)
        return cached[1]

    def _decoder_stack(self) -> object:
        """The layers as one DecoderStack (cpu_kernels.decoder_stack), kept between steps and built anew
        where a parameter was registered anywhere since: its ~300 weights converted and checked once, not
        every step (with the check that no parameter changed, 0.2-0.3 ms of a SmolLM2 step, its caches
        cold). The stack itself refuses to run once a parameter its packs came from is replaced or
        written (_run_layers then builds it again)."""
        cached = self.__dict__.get("_stack")
        if cached is not None and cached[0] == parameter_registrations():
            return cached[1]
        attn, norm = self.model.layers[0].self_attn, self.model.layers[0].input_layernorm
        stack = cpu_kernels.decoder_stack(
            [w for layer in self.model.layers for w in layer.fused_weights()], attn.num_heads, attn.num_kv_heads,
            attn.head_dim, norm.variance_epsilon, attn.scale,
            [p for layer in self.model.layers for p in layer.fused_parameters()], **fused_layer_options(self))
        self.__dict__["_stack"] = (parameter_registrations(), stack)
        return stack

    def _cpu_rope_table(self, dtype: torch.dtype) -> RopeTable:
        """rope_cos_sin's rows for the CPU, kept between steps."""
        table = self.__dict__.get("_cpu_rope")
        if table is None or table.dtype != dtype:
            table = self.__dict__["_cpu_rope"] = RopeTable(self._inv_freq.cpu(), dtype)
        return table

    def _run_layers(self, x: torch.Tensor, positions: torch.Tensor, batch: AttentionBatch, rows: tuple) -> None:
        """Every layer over x in place, in one DecoderStack call, which takes each row's RoPE row from the
        whole tables itself (gathering them here took ~35 us of a SmolLM2 step, its caches cold)."""
        table = self._cpu_rope_table(x.dtype)
        pools = [k for k, _ in batch.kv_caches], [v for _, v in batch.kv_caches]
        status = None
        for _ in range(3):  # at most: the parameters changed, then a position past the tables
            status = self._decoder_stack().run(x, *pools, table.cos, table.sin, positions, batch.slot_mapping, *rows)
            if status == cpu_kernels.STACK_RAN:
                return
            if status == cpu_kernels.STACK_PARAMS_CHANGED:  # a weight was written or replaced since: build it anew
                self.__dict__.pop("_stack")
            elif status == cpu_kernels.STACK_POSITIONS_PAST:
                table.cover(positions)
        span = f"{int(positions.min())}-{int(positions.max())}" if positions.numel() else "none"
        raise RuntimeError(f"the decoder stack did not run (status {status}): positions {span} against rope "
                           f"tables of {table.cos.shape[0]} rows")

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, batch: AttentionBatch,
                logits_rows: torch.Tensor) -> torch.Tensor:
        """input_ids/positions: (T,); logits_rows: rows whose next token is sampled. -> (S, vocab)."""
        x = self.model.embed_tokens(input_ids)  # (T, H)
        if fused_on_triton(x):
            return forward_on_triton(self, x, positions, batch, logits_rows)
        batch.backend.prepare(batch)  # once per step (the runner's prepare already did, unless hand-built)
        rows = self._fused_rows(x, batch)
        if rows is not None:
            self._run_layers(x, positions, batch, rows)
        else:
            if positions.device.type == "cpu":
                cos, sin = self._cpu_rope_table(x.dtype)(positions)
            else:
                if self._inv_freq.device != positions.device:
                    self._inv_freq = self._inv_freq.to(positions.device)
                cos, sin = rope_cos_sin(positions, self._inv_freq, x.dtype)
            for layer in self.model.layers:
                x = layer(x, cos, sin, batch)
        logits = norm_and_head(self.model.norm, self.lm_head, x, logits_rows) if x.device.type == "cpu" else None
        if logits is not None:
            return logits
        x = self.model.norm(x.index_select(0, logits_rows))  # only the rows we sample from reach the lm_head
        return self.lm_head(x)  # model dtype: greedy argmax needs no fp32 copy


def fusable_layers(config: ModelConfig, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether decoder_layers_bf16 computes this model's layers here: bf16 on the CPU kernels with
    batchtop's GEMM, no per-head q/k norms, the MLP packed by halves."""
    return (dtype == torch.bfloat16 and packing(device, dtype) == "batchtop" and not config.qk_norm
            and config.intermediate_size % 32 == 0 and config.hidden_size % 2 == 0
            and uses_cpu_kernel(device, dtype, config.head_dim) and cpu_kernels.decoder_layer_usable())
