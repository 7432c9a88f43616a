"""nn.Linear whose weight is packed once for the CPU's GEMM library: small-batch decode much faster.

Three packings, by dtype and CPU (bench/packed_linear.py measures them against F.linear):
- bf16 where batchtop's CPU kernels are built with AVX512_BF16: gpu_kernels' linear_bf16, whose
  layout streams each weight front to back. A step's 33 cpu-demo matrices (246 MB, one thread, cold):
  8.8 ms at 1 row (28 GB/s, oneDNN 12.4 ms), 12.0 ms at 8 rows (oneDNN 17.0), level with oneDNN
  from 64 rows on. fp32 accumulation in another order than oneDNN's: within bf16 rounding of
  F.linear, not bitwise; each row's result is the same whatever rows share its GEMM.
- bf16 elsewhere (AVX512_BF16 / AMX, kernels not built): F.linear reorders the weight into oneDNN's
  blocked layout on every call; at decode batch sizes that reorder costs about as much as the GEMM
  itself. Packed once, as torch.compile's CPU backend does, the result is bitwise the same; decode
  steps 1.2-1.4x faster.
- fp32: F.linear goes to MKL's general sgemm, whose cost at 2-16 rows grows with the rows although
  the weights are read once (a 1024x5632 GEMM: 0.41 ms at 1 row, 2.1 ms at 13); MKL's packed GEMM
  keeps it near 0.4-0.7 ms up to 16 rows, the memory-bound picture decode should give. cpu-demo
  decode steps, packed for 256 rows vs plain: 8 rows 32 vs 57 ms, 13: 40 vs 83, 24: 45 vs 55,
  64: 77 vs 108. Past MKL_PACK_ROWS rows (a big prefill) F.linear is used. Same math in another
  summation order: equal to F.linear within fp32 rounding, not bitwise.
The pack is a cache: state_dict and load_state_dict see the plain weight (so the model stays Hugging
Face-compatible), and the pack is rebuilt whenever the weight is written to.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from batchtop.gpu_kernels import cpu_kernels, huge_pages

MKL_PACK_ROWS = 256  # MKL's packing hint, and the most rows the packed sgemm is used for
# Fewer rows than this are padded with zero rows for the bf16 GEMM: oneDNN (3.12, AVX512_BF16 without
# AMX) streams a step's weights in 16.8 ms at 1 row and 19.4 ms at 2, but 14.5 ms at 4
# (bench/packed_linear.py --rows); the padding rows' outputs are dropped.
ONEDNN_MIN_ROWS = 4


@functools.cache
def packing(device: torch.device, dtype: torch.dtype) -> str | None:
    """'batchtop' or 'onednn' (bf16), 'mkl' (fp32), or None where none pays off or exists."""
    if device.type != "cpu":
        return None
    if dtype == torch.bfloat16 and cpu_kernels.linear_bf16_usable():
        return "batchtop"
    if dtype == torch.bfloat16 and torch.backends.mkldnn.is_available() \
            and torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return "onednn"
    if dtype == torch.float32 and torch.backends.mkl.is_available():
        return "mkl"
    return None


def can_pack(device: torch.device, dtype: torch.dtype) -> bool:
    return packing(device, dtype) is not None


def weight_key(weight: torch.Tensor) -> tuple:
    """Changes whenever the weight is replaced or written to. A weight created under inference mode
    keeps no version counter; such a weight is only ever written under inference mode too, which no
    loader does, so its storage identifies it."""
    return id(weight), weight.data_ptr(), None if weight.is_inference() else weight._version


_registrations = [0]  # parameters registered on any module in this process so far


def _count_registration(module: nn.Module, name: str, param) -> None:
    _registrations[0] += 1


torch.nn.modules.module.register_module_parameter_registration_hook(_count_registration)


def parameter_registrations() -> int:
    """A count that moves whenever any module has a parameter registered or replaced (setattr or
    register_parameter): a cache of packs that also checks each weight's storage and version
    (a DecoderStack) need not look every parameter up again to see that none was replaced."""
    return _registrations[0]


PACKERS = {"batchtop": cpu_kernels.pack_linear_bf16,
           "onednn": lambda w, half: torch.ops.mkldnn._reorder_linear_weight(w),
           "mkl": lambda w, half: torch.ops.mkl._mkl_reorder_linear_weight(w, MKL_PACK_ROWS)}


class PackedLinear(nn.Linear):
    def __init__(self, in_features: int, out_features: int, bias: bool = True, halves: bool = False,
                 **kwargs) -> None:
        """halves: the output is two halves [gate | up] that batchtop's bf16 kernel may pack interleaved,
        so that its SiLU-and-mul epilogue finds each column's gate and up side by side (silu_mul)."""
        super().__init__(in_features, out_features, bias, **kwargs)
        self._packed: torch.Tensor | None = None
        self._packed_key: tuple | None = None
        self._halves = halves and out_features % 64 == 0

    def half(self, kind: str | None) -> int:
        """The half length the pack interleaves (0: a plain pack)."""
        return self.out_features // 2 if self._halves and kind == "batchtop" else 0

    def pack(self, kind: str) -> torch.Tensor:
        """The weight packed for `kind`, repacked whenever the weight has changed."""
        weight = self.weight
        key = (kind, *weight_key(weight))
        if self._packed is None or self._packed_key != key:
            packed = PACKERS[kind](weight.detach(), self.half(kind))
            self._packed = huge_pages.place(packed) if kind == "batchtop" else packed
            self._packed_key = key
        return self._packed

    def bf16_pack(self) -> torch.Tensor | None:
        """The pack of batchtop's bf16 kernel, or None where that kernel does not run this weight."""
        weight = self.weight
        return self.pack("batchtop") if packing(weight.device, weight.dtype) == "batchtop" else None

    def silu_mul(self, x: torch.Tensor) -> torch.Tensor | None:
        """silu(gate) * up of this [gate | up] projection in one kernel, or None where it has none."""
        packed = self.bf16_pack() if self._halves and x.dim() == 2 else None
        if packed is None:
            return None
        return cpu_kernels.silu_mul_linear_bf16(x, packed, self.bias, self.out_features // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        kind = packing(weight.device, weight.dtype) if x.dim() == 2 else None
        if kind is None or (kind == "mkl" and x.shape[0] > MKL_PACK_ROWS):
            return F.linear(x, weight, self.bias)
        self.pack(kind)
        if kind == "batchtop":
            return cpu_kernels.linear_bf16(x, self._packed, self.bias, self.out_features, self.half(kind))
        if kind == "onednn":
            rows = x.shape[0]
            if rows < ONEDNN_MIN_ROWS:  # oneDNN's 1- and 2-row kernels stream the weights slower than its 4-row one
                x = F.pad(x, (0, 0, 0, ONEDNN_MIN_ROWS - rows))
            out = torch.ops.mkldnn._linear_pointwise(x, self._packed, self.bias, "none", [], "")
            return out if out.shape[0] == rows else out[:rows]
        # the last argument must equal x's rows, or the op falls back to plain F.linear; a weight
        # packed for MKL_PACK_ROWS rows computes any row count correctly
        return torch.ops.mkl._mkl_linear(x, self._packed, weight, self.bias, x.shape[0])
