"""The decoder layer's elementwise steps as one Triton kernel each, where attention runs Triton (CUDA, or the
CPU under TRITON_INTERPRET=1, as the tests run them):

- add_rmsnorm_: the residual add and the next RMSNorm (two kernels in torch);
- rope_and_store_kv: RoPE on q and k, read from a cos/sin table built once per model, and the K/V write
  into the paged pool (five kernels in torch: three for RoPE, two index copies, plus the table every step);
- silu_mul: SiLU(gate) * up (two kernels in torch).

Each rounds where the torch ops it replaces round (core_engine/model/llama.py keeps those as the readable
definition), so the engine's tokens do not change. `plan_*` return the launches (what the offline sm_90
compile builds its signatures from, on meta tensors); the wrappers run them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

import batchtop.gpu_kernels.triton_decode_kernels as decode_kernels
from batchtop.gpu_kernels.triton_decode_kernels import constexpr, tl

SILU_BLOCK = 1024  # columns of the activation per program


class Launch(NamedTuple):
    kernel: Callable  # the plain function; triton_decode_kernels.jit makes it launchable
    grid: tuple[int, ...]
    args: tuple
    constexprs: dict
    options: dict


def _silu_mul_kernel(in_ptr, out_ptr, half, stride_in, stride_out, BLOCK: constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < half
    gate = tl.load(in_ptr + row * stride_in + cols, mask=ok, other=0.0).to(tl.float32)
    up = tl.load(in_ptr + row * stride_in + half + cols, mask=ok, other=0.0).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    act = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)  # F.silu rounds before the product
    tl.store(out_ptr + row * stride_out + cols, (act * up).to(dtype), mask=ok)


def _add_rmsnorm_kernel(x_ptr, res_ptr, w_ptr, stride_x, stride_r, n, eps, BLOCK: constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < n
    x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    r = tl.load(res_ptr + row * stride_r + cols, mask=ok, other=0.0).to(tl.float32)
    total = (x + r).to(res_ptr.dtype.element_ty)  # the residual stream, in the model dtype
    tl.store(res_ptr + row * stride_r + cols, total, mask=ok)
    s = total.to(tl.float32)
    inv_rms = 1.0 / tl.sqrt(tl.sum(s * s, axis=0) / n + eps)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(x_ptr + row * stride_x + cols, (s * inv_rms * w).to(x_ptr.dtype.element_ty), mask=ok)


def _rope_store_kernel(qk_ptr, v_ptr, table_ptr, pos_ptr, k_cache_ptr, v_cache_ptr, slots_ptr,
                       stride_qkt, stride_qkh, stride_vt, stride_vh, stride_table, stride_slot, stride_ch,
                       NQ: constexpr, NKV: constexpr, HEADS_P: constexpr, KV_P: constexpr, HALF: constexpr,
                       HALF_P: constexpr):
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    slot = tl.load(slots_ptr + t).to(tl.int64)
    dtype = qk_ptr.dtype.element_ty
    d = tl.arange(0, HALF_P)
    d_ok = d < HALF
    # the table in the model dtype, as rope_cos_sin rounds it
    cos = tl.load(table_ptr + pos * stride_table + d, mask=d_ok, other=0.0).to(dtype).to(tl.float32)
    sin = tl.load(table_ptr + pos * stride_table + HALF + d, mask=d_ok, other=0.0).to(dtype).to(tl.float32)
    h = tl.arange(0, HEADS_P)
    m = (h < NQ + NKV)[:, None] & d_ok[None, :]
    lo = qk_ptr + t * stride_qkt + h[:, None] * stride_qkh + d[None, :]
    x1 = tl.load(lo, mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(lo + HALF, mask=m, other=0.0).to(tl.float32)
    # apply_rope: round(round(x * cos) + roll(x) * [-sin, sin])
    out1 = ((x1 * cos[None, :]).to(dtype).to(tl.float32) - x2 * sin[None, :]).to(dtype)
    out2 = ((x2 * cos[None, :]).to(dtype).to(tl.float32) + x1 * sin[None, :]).to(dtype)
    tl.store(lo, out1, mask=m)
    tl.store(lo + HALF, out2, mask=m)
    # the rotated k heads (rows NQ.. of qk) and v into the pool at this token's slot
    km = ((h >= NQ) & (h < NQ + NKV))[:, None] & d_ok[None, :]
    k_at = k_cache_ptr + slot * stride_slot + (h - NQ)[:, None] * stride_ch + d[None, :]
    tl.store(k_at, out1.to(k_cache_ptr.dtype.element_ty), mask=km)
    tl.store(k_at + HALF, out2.to(k_cache_ptr.dtype.element_ty), mask=km)
    hv = tl.arange(0, KV_P)
    vm = (hv < NKV)[:, None] & d_ok[None, :]
    v_at = v_ptr + t * stride_vt + hv[:, None] * stride_vh + d[None, :]
    c_at = v_cache_ptr + slot * stride_slot + hv[:, None] * stride_ch + d[None, :]
    tl.store(c_at, tl.load(v_at, mask=vm, other=0.0).to(v_cache_ptr.dtype.element_ty), mask=vm)
    tl.store(c_at + HALF, tl.load(v_at + HALF, mask=vm, other=0.0).to(v_cache_ptr.dtype.element_ty), mask=vm)


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _warps(elements: int) -> int:
    return 4 if elements <= 2048 else 8 if elements <= 8192 else 16


def _rows(x: torch.Tensor, name: str) -> None:
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"{name}: rows with a contiguous last dimension wanted, got shape {tuple(x.shape)} "
                         f"strides {x.stride()}")


def plan_silu_mul(gate_up: torch.Tensor) -> tuple[torch.Tensor, list[Launch]]:
    _rows(gate_up, "gate_up")
    rows, half = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty((rows, half), dtype=gate_up.dtype, device=gate_up.device)
    block = min(SILU_BLOCK, _pow2(half))
    return out, [Launch(_silu_mul_kernel, (rows, -(-half // block)),
                        (gate_up, out, half, gate_up.stride(0), out.stride(0)), dict(BLOCK=block),
                        dict(num_warps=_warps(block)))]


def plan_add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> list[Launch]:
    _rows(x, "x")
    _rows(residual, "residual")
    if x.shape != residual.shape or weight.shape != x.shape[1:]:
        raise ValueError(f"add_rmsnorm_: x {tuple(x.shape)}, residual {tuple(residual.shape)} and weight "
                         f"{tuple(weight.shape)} do not match")
    block = _pow2(x.shape[1])
    return [Launch(_add_rmsnorm_kernel, (x.shape[0],),
                   (x, residual, weight, x.stride(0), residual.stride(0), x.shape[1], float(eps)),
                   dict(BLOCK=block), dict(num_warps=_warps(block)))]


def plan_rope_and_store_kv(qk: torch.Tensor, v: torch.Tensor, cos_sin_cache: torch.Tensor, positions: torch.Tensor,
                           k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor,
                           num_q_heads: int) -> list[Launch]:
    t, heads, hd = qk.shape
    kvh = heads - num_q_heads
    if (qk.stride(2) != 1 or v.stride(2) != 1 or hd % 2 or v.shape != (t, kvh, hd)
            or cos_sin_cache.shape[1] != hd or cos_sin_cache.stride(1) != 1
            or k_cache.shape[-2:] != (kvh, hd) or not (k_cache.is_contiguous() and v_cache.is_contiguous())):
        raise ValueError(f"rope_and_store_kv: qk {tuple(qk.shape)}, v {tuple(v.shape)}, table "
                         f"{tuple(cos_sin_cache.shape)}, cache {tuple(k_cache.shape)} do not fit "
                         f"({num_q_heads} query heads, contiguous head rows and caches)")
    heads_p = _pow2(heads)
    return [Launch(_rope_store_kernel, (t,), (
        qk, v, cos_sin_cache, positions, k_cache, v_cache, slot_mapping, qk.stride(0), qk.stride(1),
        v.stride(0), v.stride(1), cos_sin_cache.stride(0), k_cache.stride(1), k_cache.stride(2)),
        dict(NQ=num_q_heads, NKV=kvh, HEADS_P=heads_p, KV_P=_pow2(kvh), HALF=hd // 2, HALF_P=_pow2(hd // 2)),
        dict(num_warps=_warps(heads_p * hd // 2)))]


def _launch(launches: list[Launch]) -> None:
    for launch in launches:
        if all(launch.grid):  # no rows: nothing to launch
            kernel = decode_kernels.jit(launch.kernel)[launch.grid]
            kernel(*launch.args, **launch.constexprs, **launch.options)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up of gate_up = [gate | up] (rows, 2 * I) -> (rows, I), as F.silu(gate) * up computes it."""
    out, launches = plan_silu_mul(gate_up)
    _launch(launches)
    return out


def add_rmsnorm_(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """residual += x (rounded to its dtype); x = rms_norm(residual) * weight (normalised in fp32, rounded
    once). Both in place; returns (residual, x). x, residual: (rows, hidden), last dim contiguous."""
    _launch(plan_add_rmsnorm(x, residual, weight, eps))
    return residual, x


def rope_and_store_kv(qk: torch.Tensor, v: torch.Tensor, cos_sin_cache: torch.Tensor, positions: torch.Tensor,
                      k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor,
                      num_q_heads: int) -> None:
    """Rotate q and k (qk: (T, nh + kvh, hd), the first num_q_heads heads q) in place by each token's position
    (rotate_half layout, as apply_rope), reading cos_sin_cache (max_positions, hd) = [cos | sin] per position
    (cos_sin_table); write the rotated k and v (T, kvh, hd) into the pools (num_blocks, block_size, kvh, hd)
    at slot_mapping (T,), as store_kv."""
    _launch(plan_rope_and_store_kv(qk, v, cos_sin_cache, positions, k_cache, v_cache, slot_mapping, num_q_heads))


def cos_sin_table(inv_freq: torch.Tensor, max_positions: int, device: torch.device) -> torch.Tensor:
    """(max_positions, head_dim) fp32: [cos | sin] of position * inv_freq, the same fp32 products
    rope_cos_sin computes for the positions of one step."""
    freqs = torch.arange(max_positions, dtype=torch.float32, device=device)[:, None] * inv_freq.to(device)[None, :]
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).contiguous()
