"""`batchtop export-checkpoint DIR`: a preset's weights and a tokenizer as a Hugging Face model directory."""

from __future__ import annotations

from batchtop.core_engine.config import preset
from batchtop.core_engine.model.export import export_checkpoint
from batchtop.tui.cli.headless import note
from batchtop.tui.cli.options import bad_input_exits


def run_export(out_dir: str, model: str, seed: int, dtype: str) -> None:
    with bad_input_exits():
        config = preset(model)
        note(f"exporting {config.name} ({config.num_params() / 1e6:.0f}M params, {dtype}, seed {seed}) to {out_dir}")
        path = export_checkpoint(out_dir, config, seed, dtype)
    note(f"wrote {path}: load it with --model {path}, or with transformers / vLLM")
