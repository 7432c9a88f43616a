"""Where a model's weights and tokenizer come from: a Hugging Face directory or a GGUF file.

A ModelConfig's `checkpoint` names either; everything that opens one (the loader, the tokenizer,
export-checkpoint) asks here which it is.
"""

from __future__ import annotations

import math
from pathlib import Path

from batchtop.core_engine.config import ModelConfig
from batchtop.core_engine.model.gguf_file import model_config, read_header
from batchtop.core_engine.model.hf_config import read_json
from batchtop.core_engine.model.gguf_tokenizer import end_of_generation_ids, gguf_tokenizer, tokens_of
from batchtop.core_engine.model.tokenizer import Tokenizer


def is_gguf(checkpoint: str | Path) -> bool:
    return Path(checkpoint).is_file()


def read_gguf_config(path: str | Path, name: str | None = None) -> ModelConfig:
    """The config of a GGUF file, its end-of-generation ids from its tokenizer metadata."""
    header = read_header(path)
    eog = end_of_generation_ids(header, tokens_of(header)[0])
    return model_config(header, name or Path(path).name.removesuffix(".gguf"), eog)


GENERATION_KEYS = {"temperature": "temperature", "top_p": "top_p"}  # the sampling batchtop does
GGUF_SAMPLING_KEYS = {"general.sampling.temp": "temperature", "general.sampling.top_p": "top_p"}


def sampling_defaults(checkpoint: str | None) -> dict[str, float]:
    """The model's own sampling defaults: generation_config.json's temperature and top_p (a GGUF
    file's general.sampling.*), as vLLM applies them to requests that leave them unset."""
    if checkpoint is None:
        return {}
    if is_gguf(checkpoint):
        source, keys = read_header(checkpoint).metadata, GGUF_SAMPLING_KEYS
    else:
        path = Path(checkpoint) / "generation_config.json"
        source, keys = (read_json(path) if path.is_file() else {}), GENERATION_KEYS
    out = {}
    for key, name in keys.items():
        value = source.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[name] = float(value)
    if not 0 < out.get("top_p", 1.0) <= 1 or out.get("temperature", 0.0) < 0:
        return {}  # values no request could ask for are not defaults either
    return out


def load_tokenizer(checkpoint: str | None) -> Tokenizer | None:
    """The checkpoint's tokenizer; None for a preset, or a directory without tokenizer.json."""
    if checkpoint is None:
        return None
    if is_gguf(checkpoint):
        return gguf_tokenizer(read_header(checkpoint))
    return Tokenizer.from_dir(checkpoint)
