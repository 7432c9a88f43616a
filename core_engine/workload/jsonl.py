"""JSON Lines workloads: one request object per line, checked field by field, errors naming the line.

Fields this reader does not know are ignored with one warning per file (as serve ignores unknown
request fields, as vLLM does), so a file written for a newer batchtop or another tool still loads.
A line that starts with `#` is a comment (no JSON line can): `attach --export-workload` says there
how its lines were derived.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from batchtop.core_engine.sched.request import SamplingParams
from batchtop.core_engine.errors import WorkloadError
from batchtop.core_engine.model.tokenizer import Tokenizer
from batchtop.core_engine.text_files import NotText, parse_json
from batchtop.core_engine.workload.prompt_tokens import chat_tokens, text_tokens
from batchtop.core_engine.workload.raw import MAX_ARRIVAL_S, RawRequest, Warn

JSONL_FIELDS = {"id", "prompt", "messages", "prompt_len", "prompt_token_ids", "max_tokens", "arrival_s",
                "temperature", "top_p", "seed"}
PROMPT_FIELDS = ("prompt", "messages", "prompt_token_ids", "prompt_len")
SEED_RANGE = (-(1 << 63), (1 << 64) - 1)  # what torch.Generator.manual_seed accepts (serve's range too)
MAX_LENGTH = (1 << 63) - 1
NO_TOKENIZER = ("a text prompt needs a tokenizer: run with --model DIR (a model directory with a tokenizer.json), "
                "--model FILE.gguf or --model smollm2")


def read_jsonl(path: str, text: str, vocab_size: int, tokenizer: Tokenizer | None, warn: Warn) -> list[RawRequest]:
    out: list[RawRequest] = []
    seen: set[str] = set()
    unknown: dict[str, int] = {}  # field -> first line it appeared on
    for lineno, line in enumerate(_lines(text), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            obj = parse_json(line)
        except NotText as exc:
            raise WorkloadError(path, exc.message, lineno) from None
        if isinstance(obj, dict):
            for name in obj.keys() - JSONL_FIELDS:
                unknown.setdefault(name, lineno)
        req = parse_request(obj, lineno, vocab_size, lambda msg: WorkloadError(path, msg, lineno), tokenizer)
        if req.id in seen:
            raise WorkloadError(path, f"duplicate id {req.id!r}", lineno)
        seen.add(req.id)
        out.append(req)
    if not out:
        raise WorkloadError(path, "no requests in workload file")
    if unknown:
        first = min(unknown.values())
        warn(f"{path}:{first}: ignoring unknown field(s) {', '.join(sorted(unknown))} "
             f"(known: {', '.join(sorted(JSONL_FIELDS))})")
    return sorted(out, key=lambda r: r.arrival_s)


def parse_request(obj: object, lineno: int, vocab_size: int, error,
                  tokenizer: Tokenizer | None = None) -> RawRequest:
    if not isinstance(obj, dict):
        raise error("each line must be a JSON object")
    rid = obj.get("id", f"line{lineno}")
    if not isinstance(rid, (str, int)) or isinstance(rid, bool):
        raise error("id must be a string")
    ids = None
    given = [f for f in PROMPT_FIELDS if f in obj]
    if len(given) > 1:
        raise error(f"give one of {', '.join(PROMPT_FIELDS)} (this line has {' and '.join(given)})")
    if "messages" in obj:
        obj = {**obj, "prompt_token_ids": chat_prompt(obj["messages"], error, tokenizer)}
    if "prompt" in obj:
        if not isinstance(obj["prompt"], str) or not obj["prompt"]:
            raise error(f"prompt must be a non-empty string, got {obj['prompt']!r}")
        if tokenizer is None:
            raise error(NO_TOKENIZER)
        obj = {**obj, "prompt_token_ids": text_tokens(tokenizer, obj["prompt"], "prompt", error)}
    if "prompt_token_ids" in obj:
        ids = obj["prompt_token_ids"]
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise error("prompt_token_ids must be a list of integers")
        if not ids:
            raise error("empty prompt (prompt_token_ids is [])")
        bad = next((t for t in ids if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise error(f"token id {bad} outside the vocabulary [0, {vocab_size})")
        prompt_len = len(ids)
    elif "prompt_len" in obj:
        prompt_len = _int_field(obj, "prompt_len", error)
        if prompt_len < 1:
            raise error(f"empty prompt (prompt_len is {prompt_len})")
    else:
        raise error("missing prompt_len (or prompt_token_ids, or a text prompt)")
    if "max_tokens" not in obj:
        raise error("missing max_tokens")
    max_tokens = _int_field(obj, "max_tokens", error)
    if max_tokens < 1:
        raise error(f"max_tokens must be >= 1, got {max_tokens}")
    arrival = obj.get("arrival_s", 0.0)
    if not is_number(arrival) or not 0 <= arrival <= MAX_ARRIVAL_S:
        raise error(f"arrival_s must be a number >= 0 and at most {MAX_ARRIVAL_S:g} (seconds from the start), "
                    f"got {arrival!r}")
    temperature, top_p = obj.get("temperature", 0.0), obj.get("top_p", 1.0)
    if not is_number(temperature) or temperature < 0:
        raise error(f"temperature must be a number >= 0, got {temperature!r}")
    if not is_number(top_p) or not 0 < top_p <= 1:
        raise error(f"top_p must be in (0, 1], got {top_p!r}")
    seed = obj.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)
                             or not SEED_RANGE[0] <= seed <= SEED_RANGE[1]):
        raise error(f"seed must be an integer in -2**63..2**64-1, got {seed!r}")
    sampling = SamplingParams(temperature=float(temperature), top_p=float(top_p), seed=seed)
    return RawRequest(str(rid), prompt_len, max_tokens, float(arrival),
                      tuple(ids) if ids is not None else None, sampling)


def chat_prompt(messages: object, error, tokenizer: Tokenizer | None) -> list[int]:
    """A conversation rendered by the model's chat template (assistant turn opened), tokenized."""
    if not isinstance(messages, list) or not messages:
        raise error(f"messages must be a non-empty list of {{\"role\": ..., \"content\": ...}} objects, "
                    f"got {_show(messages)}")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise error(f"messages[{i}] must be an object with string \"role\" and \"content\", got {_show(m)}")
    if tokenizer is None:
        raise error(NO_TOKENIZER.replace("a text prompt", "a messages prompt"))
    if tokenizer.chat_template is None:
        raise error("messages need the model's chat template, and this model has none: give a raw "
                    "\"prompt\" (text completed as it is) instead")
    return chat_tokens(tokenizer, [{"role": m["role"], "content": m["content"]} for m in messages], "messages", error)


def _lines(text: str) -> Iterator[str]:
    """The text's lines one at a time (a list of them all would double a large file's memory)."""
    start = 0
    while start <= len(text):
        end = text.find("\n", start)
        end = len(text) if end < 0 else end
        yield text[start:end]
        start = end + 1


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:60] + "..."


def is_number(value: object) -> bool:
    """A finite JSON number: not a bool, not NaN or Infinity (Python's json reads both)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer too large for a float
        return False


def _int_field(obj: dict, name: str, error) -> int:
    value = obj[name]
    if not isinstance(value, int) or isinstance(value, bool):
        raise error(f"{name} must be an integer, got {value!r}")
    if value > MAX_LENGTH:  # a length no sequence can have (len() itself stops there)
        raise error(f"{name} must be at most 2**63-1, got an integer of {len(str(value))} digits")
    return value
