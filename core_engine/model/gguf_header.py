"""A parsed GGUF file's header: its metadata and its tensor table (gguf_file.py reads and checks it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    type_name: str  # GGMLQuantizationType name: F32, F16, Q4_1, Q4_K, ...
    shape: tuple[int, ...]  # PyTorch order (rows first), as Hugging Face stores the tensor
    byte_shape: tuple[int, ...]  # the raw bytes' shape, as gguf.quants.dequantize takes them
    offset: int  # absolute byte offset of the data in the file
    nbytes: int


@dataclass(frozen=True, slots=True)
class GGUFHeader:
    path: Path
    metadata: dict[str, Any]  # every key/value, arrays as lists
    tensors: dict[str, TensorInfo]

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def key(self, name: str) -> Any:
        """An architecture key: 'block_count' -> metadata['llama.block_count']."""
        return self.metadata.get(f"{self.architecture}.{name}")

    @property
    def quantization(self) -> str:
        """The file's weight type as llama.cpp names it (Q4_1, Q8_0, F16, ...)."""
        file_type = self.metadata.get("general.file_type")
        try:
            return gguf.LlamaFileType(file_type).name.removeprefix("MOSTLY_")
        except (ValueError, TypeError):
            kinds = [t.type_name for t in self.tensors.values() if len(t.shape) == 2]
            return max(set(kinds), key=kinds.count) if kinds else "F32"
