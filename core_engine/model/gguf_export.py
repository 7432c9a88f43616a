"""A GGUF file as a Hugging Face model directory: the dequantized weights batchtop runs, its tokenizer
and chat template, and generation_config.json with every end-of-generation id.

transformers and vLLM then run exactly the weights batchtop runs (dequantized once, in float32 by
default, which rounds to the engine's weights at any dtype), with the same tokenizer.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from batchtop.core_engine.config import ModelConfig
from batchtop.core_engine.device import DTYPES
from batchtop.core_engine.model.checkpoint import check_fits
from batchtop.core_engine.model.export import check_export_dir, current_umask, save_weights
from batchtop.core_engine.model.gguf_file import read_header
from batchtop.core_engine.model.gguf_tokenizer import gguf_tokenizer
from batchtop.core_engine.model.gguf_weights import load_gguf_model
from batchtop.core_engine.model.hf_config import config_json
from batchtop.core_engine.model.tokenizer import TOKENIZER_CONFIG, TOKENIZER_FILE, Tokenizer


def tokenizer_config(tok: Tokenizer, model_max_length: int) -> dict:
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": model_max_length,
              "bos_token": tok.bos_token, "eos_token": tok.eos_token, "clean_up_tokenization_spaces": False}
    if tok.chat_template is not None:
        config["chat_template"] = tok.chat_template
    return {k: v for k, v in config.items() if v is not None}


def export_gguf(out_dir: str | Path, config: ModelConfig, dtype: str = "float32") -> Path:
    """Write the GGUF model `config` names as a model directory; it appears whole or not at all."""
    out = Path(out_dir)
    check_export_dir(out)
    header = read_header(config.checkpoint)
    tok = gguf_tokenizer(header)
    check_fits(config, dtype, "cpu")
    bos = tok.tokenizer.token_to_id(tok.bos_token) if tok.bos_token is not None else None
    hf_config = config_json(config, dtype, bos, tok.eos_token_ids)  # before any weights: it may refuse
    work = out.resolve().parent / f".{out.name}.partial-{os.getpid()}"
    work.mkdir()
    try:
        model = load_gguf_model(config, "cpu", DTYPES[dtype])
        state = model.state_dict()
        if config.tie_word_embeddings:
            state.pop("lm_head.weight", None)  # as save_pretrained writes a tied checkpoint
        save_weights(state, work)
        del model, state
        files = {
            "config.json": hf_config,
            "generation_config.json": {"bos_token_id": bos, "eos_token_id": list(tok.eos_token_ids)},
            TOKENIZER_CONFIG: tokenizer_config(tok, config.max_position_embeddings),
        }
        for name, data in files.items():
            (work / name).write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        tok.tokenizer.save(str(work / TOKENIZER_FILE))
        file_mode = 0o666 & ~current_umask()
        for file in work.iterdir():
            file.chmod(file_mode)
        os.replace(work, out)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return out

