"""A preset as a Hugging Face model directory: its seeded weights, config and a byte-level BPE tokenizer.

transformers and vLLM then load exactly the weights batchtop runs: the engine's own init (drawn on
the CPU) in float32, which rounds to the same bfloat16 weights the engine uses at that dtype.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from batchtop.core_engine.config import ModelConfig
from batchtop.core_engine.device import DTYPES
from batchtop.core_engine.errors import ConfigError
from batchtop.core_engine.model.checkpoint import INDEX_FILE, SINGLE_FILE, check_fits
from batchtop.core_engine.model.hf_config import config_json
from batchtop.core_engine.model.parameters import build_model
from batchtop.core_engine.model.tokenizer import TOKENIZER_CONFIG, TOKENIZER_FILE

CORPUS = Path(__file__).parent.parent / "data" / "tokenizer_corpus.txt"
BOS, EOS = "<s>", "</s>"  # ids 0 and 1
SHARD_BYTES = 2 << 30
# A plain template so chat requests work against an export; real checkpoints bring their own.
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}{{ eos_token }}\n"
                 "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def train_byte_level_bpe(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """Byte-level BPE trained on `texts`, with <s> (0) and </s> (1) and a BOS added to every encode.

    When the merges found in `texts` run out before vocab_size, the remaining ids become reserved
    special tokens, so every id a model of that vocabulary can emit decodes.
    """
    specials = [BOS, EOS]
    if vocab_size < 256 + len(specials):
        raise ConfigError("model", f"a byte-level tokenizer needs a vocabulary of >= 258, got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    missing = vocab_size - tok.get_vocab_size()
    tok.add_special_tokens([f"<|reserved_{i}|>" for i in range(missing)])
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B",
                                                       special_tokens=[(BOS, 0)])
    return tok


def save_tokenizer(tok: Tokenizer, out_dir: Path, model_max_length: int) -> None:
    tok.save(str(out_dir / TOKENIZER_FILE))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOS,
              "model_max_length": model_max_length, "chat_template": CHAT_TEMPLATE}
    (out_dir / TOKENIZER_CONFIG).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def save_weights(state: dict[str, torch.Tensor], out_dir: Path, shard_bytes: int = SHARD_BYTES) -> list[Path]:
    """model.safetensors, or shards of at most shard_bytes (a bigger tensor gets one of its own) and
    model.safetensors.index.json, as transformers writes them."""
    shards: list[list[str]] = [[]]
    size = 0
    for name, tensor in state.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    files = [out_dir / SINGLE_FILE] if len(shards) == 1 else \
        [out_dir / f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    for file, names in zip(files, shards):
        # clone: the fused projections' parts share storage, which safetensors refuses to write
        save_file({n: state[n].detach().clone() for n in names}, str(file), metadata={"format": "pt"})
    if len(shards) > 1:
        index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in state.values())},
                 "weight_map": {n: file.name for file, names in zip(files, shards) for n in names}}
        (out_dir / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    return files


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def check_export_dir(path: Path) -> None:
    """Never write into a directory that holds anything, nor over a file."""
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise ConfigError("DIR", f"{path} exists and is not an empty directory")
    if not path.resolve().parent.is_dir():
        raise ConfigError("DIR", f"directory {path.resolve().parent} does not exist")


def export_checkpoint(out_dir: str | Path, config: ModelConfig, seed: int, dtype: str = "float32",
                      shard_bytes: int = SHARD_BYTES) -> Path:
    """Write the preset as a model directory; it appears whole or not at all."""
    out = Path(out_dir)
    check_export_dir(out)
    check_fits(config, dtype, "cpu")
    work = out.resolve().parent / f".{out.name}.partial-{os.getpid()}"
    work.mkdir()  # with the user's umask, unlike a mkdtemp
    try:
        model = build_model(config, "cpu", DTYPES[dtype], seed)
        save_weights(model.state_dict(), work, shard_bytes)
        del model
        bos_id, eos_id = 0, 1
        (work / "config.json").write_text(json.dumps(config_json(config, dtype, bos_id, (eos_id,)), indent=2) + "\n",
                                          encoding="utf-8")
        generation = {"bos_token_id": bos_id, "eos_token_id": eos_id, "do_sample": False}
        (work / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n", encoding="utf-8")
        corpus = CORPUS.read_text(encoding="utf-8").split("\n\n")
        save_tokenizer(train_byte_level_bpe(corpus, config.vocab_size), work, config.max_position_embeddings)
        file_mode = 0o666 & ~current_umask()
        for file in work.iterdir():  # safetensors creates its files readable by their owner only
            file.chmod(file_mode)
        os.replace(work, out)  # onto an empty directory, or a new name
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return out
