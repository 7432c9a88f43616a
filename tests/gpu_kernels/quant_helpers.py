"""Random GGUF block matrices for the quantized-kernel tests, and the float64 reference they are held to."""

from __future__ import annotations

import numpy as np
import torch
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

QUANTIZABLE = ("Q4_0", "Q4_1", "Q8_0")  # the types gguf.quants.quantize writes; the K-quants get random blocks
# where each type keeps its fp16 scales: (byte offset, low, high) of every fp16 field written in range
SCALE_FIELDS = {"Q4_0": [(0, -0.05, 0.05)], "Q4_1": [(0, 0.0, 0.02), (2, -0.1, 0.1)], "Q8_0": [(0, -0.05, 0.05)],
                "Q4_K": [(0, 0.0, 0.01), (2, 0.0, 0.01)], "Q6_K": [(208, -0.01, 0.01)]}


def block_matrix(type_name: str, n: int, k: int, seed: int = 0) -> torch.Tensor:
    """A valid (n, row_bytes) uint8 block matrix: quantized normal weights where gguf can quantize the type,
    else random bytes with finite fp16 scales (every bit pattern of the rest is a valid block)."""
    qtype = GGMLQuantizationType[type_name]
    rng = np.random.default_rng(seed)
    if type_name in QUANTIZABLE:
        return torch.from_numpy(quants.quantize(rng.normal(0, 0.05, (n, k)).astype(np.float32), qtype).copy())
    size, nbytes = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n, k // size, nbytes), dtype=np.uint8)
    for offset, low, high in SCALE_FIELDS[type_name]:
        raw[:, :, offset:offset + 2] = rng.uniform(low, high, (n, k // size)).astype(np.float16)[..., None].view(np.uint8)
    return torch.from_numpy(raw.reshape(n, -1).copy())


def dequantized(blocks: torch.Tensor, type_name: str) -> np.ndarray:
    """The block matrix's weights (n, k) in float64, by gguf's reference dequantizer."""
    n = blocks.shape[0]
    return quants.dequantize(blocks.numpy(), GGMLQuantizationType[type_name]).reshape(n, -1).astype(np.float64)


def reference_and_bound(x: torch.Tensor, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x W^T in float64, and how far the kernel may be from it. The kernel rounds each 32-feature block of
    a row to int8 at scale max|x_block| / 127, so every feature is off by at most half a step,
    max|x_block| / 254; the block's weights turn that into at most max|x_block| / 254 * sum|w| (summed over
    the row's blocks). Beyond it: the bf16 output's rounding (2^-8 relative) and fp32 sums (1e-5 of the
    absolute products)."""
    xf = x.double().numpy()
    rows, k = xf.shape
    block_max = np.abs(xf.reshape(rows, k // 32, 32)).max(-1).repeat(32, -1)
    ref = xf @ w.T
    return ref, block_max / 254 @ np.abs(w).T + np.abs(ref) * 2.0 ** -8 + 1e-5 * (np.abs(xf) @ np.abs(w).T)
