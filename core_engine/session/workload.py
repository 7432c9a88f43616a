"""Workloads: synthetic generators, JSON Lines workload files, Azure LLM inference trace CSVs and
ShareGPT conversation datasets (session/sharegpt.py).

Every loader returns plain Requests sorted by arrival. Lengths given as numbers get random prompt
token ids from a seeded generator, so the same options always give the same workload; text prompts
go through the model's tokenizer.
"""

from __future__ import annotations

import csv
import json
import math
import random
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from batchtop.core_engine.errors import ConfigError, WorkloadError
from batchtop.core_engine.engine.request import Request, SamplingParams
from batchtop.core_engine.model.tokenizer import Tokenizer
from batchtop.core_engine.session.sharegpt import read_sharegpt

DEFAULT_TRACE = Path(__file__).parent.parent / "data" / "azure_conv_sample.csv"
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
JSONL_FIELDS = {"id", "prompt", "prompt_len", "prompt_token_ids", "max_tokens", "arrival_s", "temperature",
                "top_p", "seed"}
NO_TOKENIZER = "a text prompt needs a tokenizer: run with --model DIR (a model directory with a tokenizer.json)"


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """Where requests come from and how they are reshaped to fit the device."""

    path: str | None = None  # None: the bundled Azure sample; "synthetic": generated
    num_requests: int | None = None  # keep the first N (synthetic: generate N)
    prompt_scale: float = 1.0  # multiply prompt lengths (a CPU plays a GPU-sized trace)
    output_scale: float = 1.0  # multiply max_tokens
    time_scale: float = 1.0  # multiply arrival times (0: everyone arrives at once)
    auto_pace: bool = False  # rescale arrivals from the engine's measured capacity (session.pacing)
    pace_note: str | None = None  # how the pace was chosen, once it has been
    seed: int = 0
    # synthetic only: lognormal lengths (heavy right tail, like production traffic)
    prompt_mean: float = 64.0
    output_mean: float = 128.0
    length_sigma: float = 0.8
    rate: float = 0.0  # Poisson arrivals per second; 0 = all at t=0

    @property
    def source_name(self) -> str:
        return self.path if self.path is not None else f"bundled:{DEFAULT_TRACE.name}"


@dataclass(frozen=True, slots=True)
class RawRequest:
    """A request before scaling: lengths and arrival as the source gave them."""

    id: str
    prompt_len: int
    max_tokens: int
    arrival_s: float
    prompt_token_ids: tuple[int, ...] | None = None
    sampling: SamplingParams = SamplingParams()


def load_workload(spec: WorkloadSpec, vocab_size: int, tokenizer: Tokenizer | None = None) -> list[Request]:
    if spec.num_requests is not None and spec.num_requests < 1:
        raise ConfigError("--num-requests", f"must be >= 1, got {spec.num_requests}")
    for name in ("prompt_scale", "output_scale"):
        if not getattr(spec, name) > 0:
            raise ConfigError(f"--{name.replace('_', '-')}", f"must be > 0, got {getattr(spec, name)}")
    if not spec.time_scale >= 0:
        raise ConfigError("--time-scale", f"must be >= 0, got {spec.time_scale}")
    if spec.path == "synthetic":
        raw = synthetic(spec)
    else:
        path = Path(spec.path) if spec.path is not None else DEFAULT_TRACE
        raw = read_workload_file(path, vocab_size, tokenizer, spec.num_requests)
        if spec.num_requests is not None:
            raw = raw[:spec.num_requests]
    return materialise(raw, spec, vocab_size)


def read_workload_file(path: Path, vocab_size: int, tokenizer: Tokenizer | None = None,
                       limit: int | None = None) -> list[RawRequest]:
    if not path.is_file():
        raise WorkloadError(str(path), "no such workload file")
    if path.suffix.lower() == ".json":
        return [RawRequest(rid, len(ids), max_tokens, 0.0, ids)
                for rid, ids, max_tokens in read_sharegpt(path, tokenizer, limit)]
    try:
        with path.open(encoding="utf-8") as f:
            first = f.readline().lstrip()
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkloadError(str(path), f"cannot read: {exc}") from None
    if path.suffix.lower() == ".csv" or (first and not first.startswith("{")):
        return read_azure_csv(path)
    return read_jsonl(path, vocab_size, tokenizer)


def read_jsonl(path: Path, vocab_size: int, tokenizer: Tokenizer | None = None) -> list[RawRequest]:
    out: list[RawRequest] = []
    seen: set[str] = set()
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise WorkloadError(str(path), f"not JSON ({exc.msg})", lineno) from None
            req = _parse_jsonl_object(obj, lineno, vocab_size, lambda msg: WorkloadError(str(path), msg, lineno),
                                      tokenizer)
            if req.id in seen:
                raise WorkloadError(str(path), f"duplicate id {req.id!r}", lineno)
            seen.add(req.id)
            out.append(req)
    if not out:
        raise WorkloadError(str(path), "no requests in workload file")
    return sorted(out, key=lambda r: r.arrival_s)


def _parse_jsonl_object(obj: object, lineno: int, vocab_size: int, error,
                        tokenizer: Tokenizer | None = None) -> RawRequest:
    if not isinstance(obj, dict):
        raise error("each line must be a JSON object")
    unknown = set(obj) - JSONL_FIELDS
    if unknown:
        raise error(f"unknown field(s) {', '.join(sorted(unknown))} (known: {', '.join(sorted(JSONL_FIELDS))})")
    rid = obj.get("id", f"line{lineno}")
    if not isinstance(rid, (str, int)) or isinstance(rid, bool):
        raise error("id must be a string")
    ids = None
    if "prompt" in obj:
        if "prompt_token_ids" in obj or "prompt_len" in obj:
            raise error("give one of prompt, prompt_token_ids or prompt_len")
        if not isinstance(obj["prompt"], str) or not obj["prompt"]:
            raise error(f"prompt must be a non-empty string, got {obj['prompt']!r}")
        if tokenizer is None:
            raise error(NO_TOKENIZER)
        obj = {**obj, "prompt_token_ids": tokenizer.encode(obj["prompt"])}
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
    if not _is_number(arrival) or arrival < 0:
        raise error(f"arrival_s must be a number >= 0, got {arrival!r}")
    temperature, top_p = obj.get("temperature", 0.0), obj.get("top_p", 1.0)
    if not _is_number(temperature) or temperature < 0:
        raise error(f"temperature must be a number >= 0, got {temperature!r}")
    if not _is_number(top_p) or not 0 < top_p <= 1:
        raise error(f"top_p must be in (0, 1], got {top_p!r}")
    seed = obj.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise error(f"seed must be an integer, got {seed!r}")
    sampling = SamplingParams(temperature=float(temperature), top_p=float(top_p), seed=seed)
    return RawRequest(str(rid), prompt_len, max_tokens, float(arrival),
                      tuple(ids) if ids is not None else None, sampling)


def _is_number(value: object) -> bool:
    """A finite JSON number: not a bool, not NaN or Infinity (Python's json reads both)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _int_field(obj: dict, name: str, error) -> int:
    value = obj[name]
    if not isinstance(value, int) or isinstance(value, bool):
        raise error(f"{name} must be an integer, got {value!r}")
    return value


def read_azure_csv(path: Path) -> list[RawRequest]:
    """Azure LLM inference trace: TIMESTAMP, ContextTokens, GeneratedTokens; arrivals from the first."""
    out: list[RawRequest] = []
    with path.open(encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in AZURE_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise WorkloadError(str(path), f"not an Azure trace CSV: missing column(s) {', '.join(missing)}", 1)
        t0 = None
        for row in reader:
            lineno = reader.line_num
            try:
                t = _parse_timestamp(row["TIMESTAMP"])
                prompt_len, output_len = int(row["ContextTokens"]), int(row["GeneratedTokens"])
            except (TypeError, ValueError) as exc:
                raise WorkloadError(str(path), f"bad row ({exc})", lineno) from None
            if prompt_len < 1 or output_len < 1:
                raise WorkloadError(str(path), "ContextTokens and GeneratedTokens must be >= 1", lineno)
            t0 = t if t0 is None else t0
            out.append(RawRequest(f"az{len(out)}", prompt_len, output_len, max(0.0, t - t0)))
    if not out:
        raise WorkloadError(str(path), "no requests in trace")
    return sorted(out, key=lambda r: r.arrival_s)


def _parse_timestamp(text: str) -> float:
    """'2023-11-16 18:15:46.6805900' -> seconds; tolerates more than 6 fractional digits."""
    whole, _, frac = text.strip().partition(".")
    base = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S").timestamp()
    return base + (float("0." + frac) if frac else 0.0)


def synthetic(spec: WorkloadSpec) -> list[RawRequest]:
    rng = random.Random(spec.seed)
    n = spec.num_requests if spec.num_requests is not None else 256
    out, t = [], 0.0
    for i in range(n):
        if spec.rate > 0:
            t += rng.expovariate(spec.rate)
        out.append(RawRequest(f"s{i}", _lognormal(rng, spec.prompt_mean, spec.length_sigma),
                              _lognormal(rng, spec.output_mean, spec.length_sigma), t))
    return out


def _lognormal(rng: random.Random, mean: float, sigma: float) -> int:
    mu = math.log(max(mean, 1.0)) - sigma * sigma / 2  # so that the mean is `mean`
    return max(1, round(rng.lognormvariate(mu, sigma)))


def materialise(raw: list[RawRequest], spec: WorkloadSpec, vocab_size: int) -> list[Request]:
    """Apply the scales and give length-only prompts seeded random token ids."""
    rng = random.Random(spec.seed + 1)
    vocab = range(vocab_size)
    out = []
    for r in raw:
        ids = r.prompt_token_ids
        if ids is None:
            ids = tuple(rng.choices(vocab, k=max(1, round(r.prompt_len * spec.prompt_scale))))
        max_tokens = max(1, round(r.max_tokens * spec.output_scale))
        out.append(Request(r.id, ids, max_tokens, r.arrival_s * spec.time_scale, r.sampling))
    return out


def make_burst(template: list[Request], count: int, seed: int, vocab_size: int, tag: str) -> tuple[Request, ...]:
    """count new requests, lengths drawn from the loaded workload, all arriving now."""
    rng = random.Random(seed)
    picks = [rng.choice(template) for _ in range(count)] if template else []
    vocab = range(vocab_size)
    # greedy, but a run that ignores EOS (--ignore-eos) keeps ignoring it for its bursts
    return tuple(Request(f"{tag}-{i}", tuple(rng.choices(vocab, k=r.prompt_len)), r.max_tokens, 0.0,
                         SamplingParams(ignore_eos=r.sampling.ignore_eos)) for i, r in enumerate(picks))
