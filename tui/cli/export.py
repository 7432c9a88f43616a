"""`batchtop export-checkpoint DIR`: a preset's weights and a tokenizer, or a GGUF file's dequantized
weights and its own tokenizer, as a Hugging Face model directory."""

from __future__ import annotations

import errno
import os

from batchtop.core_engine.config import PRESETS, preset
from batchtop.core_engine.errors import ConfigError
from batchtop.core_engine.model.export import export_checkpoint
from batchtop.core_engine.model.gguf_export import export_gguf
from batchtop.core_engine.run.resolve import resolve_model
from batchtop.tui.cli.headless import note
from batchtop.tui.cli.options import bad_input_exits


def check_out_dir(out_dir: str) -> None:
    """What export_checkpoint's own check cannot word: an empty path reads as ".", and a symlink loop
    as a path that does not exist."""
    if not out_dir:
        raise ConfigError("DIR", "the path is empty: name the directory to create")
    try:
        os.stat(out_dir)
    except FileNotFoundError:
        pass
    except OSError as exc:
        why = "a symlink loop (it leads back to itself)" if exc.errno == errno.ELOOP else exc.strerror or exc
        raise ConfigError("DIR", f"{out_dir}: {why}") from None


def run_export(out_dir: str, model: str, seed: int, dtype: str) -> None:
    with bad_input_exits():
        check_out_dir(out_dir)
        if model in PRESETS:
            config = preset(model)
            note(f"exporting {config.name} ({config.num_params() / 1e6:.3g}M params, {dtype}, seed {seed}) to {out_dir}")
            path = export_checkpoint(out_dir, config, seed, dtype)
        else:
            config = resolve_model(model, "cpu-demo")
            if config.checkpoint is None or config.quantization is None:
                raise ConfigError("--model", f"{model!r}: export-checkpoint writes a preset, smollm2 or a GGUF file "
                                             "(a Hugging Face directory is one already)")
            note(f"exporting {config.checkpoint} ({config.quantization}, {config.num_params() / 1e6:.3g}M params) "
                 f"dequantized to {dtype}, to {out_dir}")
            path = export_gguf(out_dir, config, dtype)
    note(f"wrote {path}: load it with --model {path}, or with transformers / vLLM")
