"""Perplexity of batchtop's model on a text, through the engine's own model forward (its KV pool, its
attention backend, its weights path: --weights quantized or dequantized for a GGUF file).

    python bench/perplexity.py                               # SmolLM2 on core_engine/data/tokenizer_corpus.txt
    python bench/perplexity.py --weights quantized,dequantized

The text is tokenized with the model's tokenizer and cut into windows of --context tokens; each window
is one prefill from position 0 (logits for every row), and every token of a window but its first is
scored: its negative log-likelihood under the model given the window's tokens before it. Perplexity is
exp of the mean over all scored tokens. (llama.cpp's llama-perplexity scores only each window's second
half, so its numbers run lower on the same text; compare batchtop with itself across --weights.)
"""

from __future__ import annotations

import argparse
import inspect
import math
import sys
import time
from pathlib import Path

import torch

from batchtop.core_engine.config import EngineConfig
from batchtop.core_engine.model.attention_batch import AttentionBatch, PrefillChunk, VarlenRows
from batchtop.core_engine.worker.model_runner import ModelRunner

DEFAULT_TEXT = Path(__file__).resolve().parent.parent / "core_engine" / "data" / "tokenizer_corpus.txt"
WEIGHTS = ("quantized", "dequantized")


def prompt_batch(runner: ModelRunner, n: int) -> AttentionBatch:
    """One sequence's first n tokens as one prefill over blocks 0.. of the runner's pool, laid out as the
    runner lays out a prompt chunk for its attention backend."""
    table = torch.arange(-(-n // runner.block_size), device=runner.device)
    slots = torch.arange(n, device=runner.device)  # block b holds positions b*block_size.. (the table is 0, 1, ...)
    if runner.varlen_prompts:
        rows = VarlenRows(table[None], torch.zeros(n, dtype=torch.long, device=runner.device),
                          torch.arange(1, n + 1, device=runner.device))
        return AttentionBatch(runner.kv_caches, slots, 0, None, None, [], varlen=rows, backend=runner.attention_backend)
    return AttentionBatch(runner.kv_caches, slots, 0, None, None, [PrefillChunk(0, n, 0, table)],
                          backend=runner.attention_backend)


def window_logits(runner: ModelRunner, ids: list[int]) -> torch.Tensor:
    """(len(ids), vocab) float32: the next-token logits after each prefix of ids, in one forward."""
    n = len(ids)
    if n > runner.num_kv_blocks * runner.block_size:
        raise ValueError(f"a window of {n} tokens does not fit the pool of {runner.num_kv_blocks} blocks")
    device = runner.device
    logits = runner.model(torch.tensor(ids, device=device), torch.arange(n, device=device), prompt_batch(runner, n),
                          torch.arange(n, device=device))
    return logits.float()


def token_nlls(runner: ModelRunner, ids: list[int], context: int) -> torch.Tensor:
    """Negative log-likelihood of every token of ids but each window's first, windows of `context` tokens."""
    nlls = []
    for start in range(0, len(ids), context):
        window = ids[start:start + context]
        if len(window) < 2:
            break
        logp = torch.log_softmax(window_logits(runner, window)[:-1], dim=-1)
        targets = torch.tensor(window[1:], device=logp.device)
        nlls.append(-logp.gather(1, targets[:, None]).squeeze(1))
    return torch.cat(nlls)


def perplexity(runner: ModelRunner, ids: list[int], context: int) -> tuple[float, int]:
    """(perplexity, tokens scored)."""
    nlls = token_nlls(runner, ids, context)
    return math.exp(nlls.double().mean().item()), nlls.numel()


def weights_option_exists() -> bool:
    """Whether this batchtop resolves a GGUF file's weights path (issue 43): --weights quantized|dequantized."""
    from batchtop.core_engine.run.resolve import resolve_config

    return "weights" in inspect.signature(resolve_config).parameters


def engine_config(model: str, dtype: str, context: int, weights: str | None) -> EngineConfig:
    """batchtop's config for the model, with a pool of one window and, for a GGUF, the weights path asked for."""
    from batchtop.core_engine.run.resolve import resolve_config

    chosen = {"weights": weights} if weights is not None else {}
    return resolve_config(model=model, device="cpu", dtype=dtype, num_kv_blocks=-(-context // 16),
                          max_num_batched_tokens=context, **chosen)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default="smollm2", help="a GGUF file, a model directory or smollm2")
    p.add_argument("--text", type=Path, default=DEFAULT_TEXT, help="UTF-8 text to score")
    p.add_argument("--context", type=int, default=512, help="tokens per window")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    p.add_argument("--weights", type=lambda text: text.split(","),
                   help="comma-separated: quantized, dequantized (a GGUF file) [default: both where batchtop "
                        "has the option, else its one path]")
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.context < 2:
        return fail(f"--context: must be >= 2, got {args.context}")
    if not args.text.is_file():
        return fail(f"--text: {args.text} is not a file")
    if args.weights is not None:
        unknown = [w for w in args.weights if w not in WEIGHTS]
        if unknown:
            return fail(f"--weights: unknown {', '.join(unknown)} (choose from {', '.join(WEIGHTS)})")
        if not weights_option_exists():
            return fail("--weights: this batchtop has no weights option yet (it runs the dequantized path)")
    torch.set_num_threads(args.threads)
    from batchtop.core_engine.errors import ConfigError
    from batchtop.core_engine.model.sources import is_gguf, load_tokenizer
    from batchtop.core_engine.run.resolve import resolve_model

    try:
        checkpoint = resolve_model(args.model, args.model).checkpoint
        gguf = checkpoint is not None and is_gguf(checkpoint)
    except ConfigError as exc:
        return fail(f"--model: {exc.message}")
    if args.weights is not None and not gguf:
        return fail(f"--weights: only a GGUF file has quantized weights; {args.model} is not one")
    paths = args.weights or (list(WEIGHTS) if gguf and weights_option_exists() else [None])

    for weights in paths:
        try:
            config = engine_config(args.model, args.dtype, args.context, weights)
        except ConfigError as exc:
            return fail(f"--{exc.field.replace('_', '-')}: {exc.message}")
        tokenizer = load_tokenizer(config.model.checkpoint)
        if tokenizer is None:
            return fail(f"--model: {args.model} has no tokenizer to read the text with")
        ids = tokenizer.encode(args.text.read_text(encoding="utf-8"), add_special_tokens=False)
        runner = ModelRunner(config)
        t0 = time.perf_counter()
        ppl, scored = perplexity(runner, ids, args.context)
        print(f"{config.model.name} {config.dtype}, weights {getattr(config.model, 'weights', None) or 'dequantized'}: perplexity "
              f"{ppl:.3f} over {scored} tokens of {args.text.name} (windows of {args.context}; "
              f"{time.perf_counter() - t0:.1f} s, {args.threads} threads)", flush=True)
    return 0


def fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
