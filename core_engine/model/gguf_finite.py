"""Every number a GGUF tensor is made of must be finite, checked as its bytes are read: one Inf block
scale in token_embd.weight made every logit NaN, and the run went on with exit 0, each answer ending
empty after one step. A block type's scales (fp16; Q8_K's fp32) sit at fixed offsets in ggml's block
structs and are checked there; a float tensor's values are checked themselves.
"""

from __future__ import annotations

import numpy as np

from batchtop.core_engine.errors import BadInput
from batchtop.core_engine.model.gguf_header import GGUFHeader, TensorInfo

# type -> (bytes a block, its scales' byte offsets, their dtype), from ggml-common.h's block_* structs
SCALES: dict[str, tuple[int, tuple[int, ...], type]] = {
    "Q4_0": (18, (0,), np.float16), "Q4_1": (20, (0, 2), np.float16), "Q5_0": (22, (0,), np.float16),
    "Q5_1": (24, (0, 2), np.float16), "Q8_0": (34, (0,), np.float16), "Q2_K": (84, (80, 82), np.float16),
    "Q3_K": (110, (108,), np.float16), "Q4_K": (144, (0, 2), np.float16), "Q5_K": (176, (0, 2), np.float16),
    "Q6_K": (210, (208,), np.float16), "Q8_K": (292, (0,), np.float32),
}
FLOATS = {"F32": np.float32, "F16": np.float16}


def check_finite(h: GGUFHeader, info: TensorInfo, raw: np.ndarray) -> None:
    """BadInput naming the file, the tensor, how many of its blocks (or values) are not finite, and the
    first; raw is the tensor's bytes as the file stores them. BF16 is checked after dequantizing."""
    if info.type_name in SCALES:
        nbytes, offsets, kind = SCALES[info.type_name]
        blocks = raw.reshape(-1, nbytes)
        width = np.dtype(kind).itemsize
        scales = np.stack([np.ascontiguousarray(blocks[:, o:o + width]).view(kind)[:, 0] for o in offsets], axis=1)
        _refuse(h, info, scales, "block scales", "blocks")
    elif info.type_name in FLOATS:
        _refuse(h, info, raw.view(FLOATS[info.type_name]).reshape(-1, 1), "values", "values")


def check_finite_values(h: GGUFHeader, info: TensorInfo, values: np.ndarray) -> None:
    """The same for a tensor's dequantized values (a type whose bytes check_finite does not read)."""
    _refuse(h, info, values.reshape(-1, 1), "values", "values")


def _refuse(h: GGUFHeader, info: TensorInfo, numbers: np.ndarray, what: str, units: str) -> None:
    """numbers: (units, numbers each); a unit with any that is not finite is refused."""
    finite = np.isfinite(numbers)
    if finite.all():
        return
    bad = ~finite.all(axis=1)
    first = int(np.argmax(bad))
    value = float(numbers[first][~finite[first]][0])
    raise BadInput(f"{h.path}: tensor {info.name} ({info.type_name}) has non-finite {what}: {int(bad.sum()):,} of "
                   f"its {bad.size:,} {units} (the first, {units[:-1]} {first:,}, holds {value}); the file is "
                   "damaged or was written wrong, and every logit would be NaN")
