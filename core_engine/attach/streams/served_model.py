"""The served model, where batchtop can read it on this machine: the directory or GGUF file --model
names, else the server's own model name when that is a local path (vLLM names a model served from a
directory by that directory). Its dims price the logged steps; its tokenizer turns cached prefixes
into text."""

from __future__ import annotations

from pathlib import Path

from batchtop.core_engine.attach.server_point import ModelEstimate
from batchtop.core_engine.attach.streams.stream_state import Decode


def served_tokenizer(model: str | None) -> Decode | None:
    """The tokenizer's decode for --model (a directory, a GGUF file or smollm2), None for a preset or none."""
    if not model:
        return None
    from batchtop.core_engine.model.smollm2 import NAME as SMOLLM2, require_smollm2
    from batchtop.core_engine.model.sources import load_tokenizer
    try:
        path = str(require_smollm2()) if model == SMOLLM2 else model
        tokenizer = load_tokenizer(path) if Path(path).exists() else None
    except (OSError, ValueError):  # BadInput included: no tokenizer is no error here, only ids on screen
        return None
    return tokenizer.decode if tokenizer is not None else None


def local_model(name: str | None, dtype: str) -> tuple[ModelEstimate | None, Decode | None]:
    """The dims and tokenizer of a model the server names by a local directory; (None, None) otherwise."""
    if not name or not (Path(name) / "config.json").is_file():
        return None, None
    from batchtop.core_engine.run.resolve import resolve_model
    try:
        estimate = ModelEstimate(resolve_model(name, "cpu-demo"), dtype)
    except (OSError, ValueError):
        estimate = None
    return estimate, served_tokenizer(name)
