"""Workloads: synthetic generators and workload files (JSON Lines: session/workload_jsonl.py, Azure
LLM inference trace CSVs: session/azure_csv.py, ShareGPT conversation datasets: session/sharegpt.py),
read as UTF-8 (a byte order mark is fine) and told apart by suffix, else by their first character.

Every loader returns plain Requests sorted by arrival. Lengths given as numbers get random prompt
token ids from a seeded generator, so the same options always give the same workload; text prompts
go through the model's tokenizer.
"""

from __future__ import annotations

import math
import random
import sys
from collections.abc import Sequence as SequenceABC
from dataclasses import dataclass, replace
from fractions import Fraction
from pathlib import Path

from batchtop.core_engine.config import EngineConfig
from batchtop.core_engine.sched.request import Request, SamplingParams
from batchtop.core_engine.engine.validation import check_fits
from batchtop.core_engine.errors import ConfigError, UnservableRequest, WorkloadError
from batchtop.core_engine.model.tokenizer import Tokenizer
from batchtop.core_engine.workload.azure_csv import AZURE_COLUMNS, read_azure_csv
from batchtop.core_engine.workload.sharegpt import read_sharegpt
from batchtop.core_engine.text_files import NotText, input_problem, read_text_file
from batchtop.core_engine.workload.jsonl import JSONL_FIELDS, read_jsonl
from batchtop.core_engine.workload.raw import MAX_ARRIVAL_S, RawRequest, Warn, warn_on_stderr

__all__ = ["AZURE_COLUMNS", "DEFAULT_CHAT", "DEFAULT_TRACE", "JSONL_FIELDS", "RawRequest", "UnbuiltPrompt", "WorkloadSpec",
           "load_workload", "make_burst", "materialise", "read_workload_file", "synthetic", "workload_format"]

DEFAULT_TRACE = Path(__file__).parent.parent / "data" / "azure_conv_sample.csv"
# ~300 chat requests written for batchtop (facts, sums, lists, code, letters, stories...), arriving at
# the bundled trace's first timestamps: the default for a model with a chat template (its answers
# choose their own lengths); max_tokens 1024, scaled to 256 on a CPU
DEFAULT_CHAT = Path(__file__).parent.parent / "data" / "chat_requests.jsonl"
MAX_SYNTHETIC_REQUESTS = 1_000_000
FORMATS_BY_SUFFIX = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".json": "sharegpt"}
# A workload file is read whole (ShareGPT's largest dataset is ~0.7 GB); past this a FIFO or a mistaken
# path is refused, not read until the memory runs out
MAX_WORKLOAD_BYTES = 1 << 30


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """Where requests come from and how they are reshaped to fit the device."""

    path: str | None = None  # None: the bundled Azure sample (or chat requests); "synthetic": generated
    chat: bool = False  # path None: the bundled chat requests instead of the length-only trace
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
        if self.path is not None:
            return self.path
        return f"bundled:{(DEFAULT_CHAT if self.chat else DEFAULT_TRACE).name}"


class UnbuiltPrompt(SequenceABC):
    """The prompt of a length-only request that can never fit the engine it was loaded for: it has a
    length but no tokens, so a billion-token prompt costs nothing. The engine refuses it on arrival
    from its length alone (validation checks sizes before it scans token ids), as it refuses any
    request that cannot fit; reading a token of it is a bug."""

    __slots__ = ("length",)

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index):
        raise TypeError(f"a {self.length}-token prompt that can never fit was not built; it has no tokens")

    def __repr__(self) -> str:
        return f"UnbuiltPrompt({self.length})"


def load_workload(spec: WorkloadSpec, vocab_size: int, tokenizer: Tokenizer | None = None, *,
                  config: EngineConfig | None = None, warn: Warn = warn_on_stderr) -> list[Request]:
    """The requests of `spec`. With the engine's config, a length-only request that can never fit it
    (max_model_len, the KV pool) gets no token list at all (see UnbuiltPrompt): the engine still
    refuses it alone, with both numbers, and the run goes on for the others."""
    if spec.num_requests is not None and spec.num_requests < 1:
        raise ConfigError("num_requests", f"must be >= 1, got {spec.num_requests}")
    for name in ("prompt_scale", "output_scale"):
        if not getattr(spec, name) > 0:
            raise ConfigError(name, f"must be > 0, got {getattr(spec, name)}")
    if not spec.time_scale >= 0:
        raise ConfigError("time_scale", f"must be >= 0, got {spec.time_scale}")
    if spec.path == "synthetic":
        if spec.num_requests is not None and spec.num_requests > MAX_SYNTHETIC_REQUESTS:
            raise ConfigError("num_requests", f"a synthetic workload is generated in memory: at most "
                                                f"{MAX_SYNTHETIC_REQUESTS}, got {spec.num_requests}")
        raw = synthetic(spec)
    else:
        path = Path(spec.path) if spec.path is not None else DEFAULT_CHAT if spec.chat else DEFAULT_TRACE
        raw = read_workload_file(path, vocab_size, tokenizer, spec.num_requests, warn=warn)
        if spec.num_requests is not None:
            raw = raw[:spec.num_requests]
    requests = materialise(raw, spec, vocab_size, config)
    if spec.chat and spec.path is None and config is not None:  # the bundled cap is ours: fit it to the model
        requests = [replace(r, max_tokens=min(r.max_tokens, config.max_model_len - r.prompt_len))
                    if 0 < config.max_model_len - r.prompt_len < r.max_tokens else r for r in requests]
    return requests


def workload_format(path: Path, text: str) -> str:
    """jsonl, csv or sharegpt: by the file's suffix (under a .gz one), else by its first non-blank
    character (a JSON Lines file may open with `#` comment lines, as --export-workload writes them)."""
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes[-1:] == [".gz"]:
        suffixes.pop()
    by_suffix = FORMATS_BY_SUFFIX.get(suffixes[-1] if suffixes else "")
    if by_suffix is not None:
        return by_suffix
    first = text.lstrip()[:1]
    if first == "#":
        body = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
        return "jsonl" if body and body[0].lstrip().startswith("{") else "csv"
    return {"{": "jsonl", "[": "sharegpt"}.get(first, "csv")


def read_workload_file(path: Path, vocab_size: int, tokenizer: Tokenizer | None = None,
                       limit: int | None = None, *, warn: Warn = warn_on_stderr) -> list[RawRequest]:
    # anything but a directory is read, as a stream, under the cap: a FIFO or <(zcat w.jsonl.gz) works
    # too, and a gzip file (w.jsonl.gz) is gunzipped on the fly
    problem = input_problem(path, "workload file")
    if problem is not None:
        raise WorkloadError(str(path), problem)
    try:
        text = read_text_file(path, MAX_WORKLOAD_BYTES, "a workload file")
    except NotText as exc:
        raise WorkloadError(str(path), exc.message, exc.line) from None
    kind = workload_format(path, text)
    if kind == "sharegpt":
        return [RawRequest(rid, len(ids), max_tokens, 0.0, ids)
                for rid, ids, max_tokens in read_sharegpt(str(path), text, tokenizer, limit)]
    if kind == "csv":
        return read_azure_csv(str(path), text, warn)
    return read_jsonl(str(path), text, vocab_size, tokenizer, warn)


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


def materialise(raw: list[RawRequest], spec: WorkloadSpec, vocab_size: int,
                config: EngineConfig | None = None) -> list[Request]:
    """Apply the scales and give length-only prompts seeded random token ids (none, when the request
    can never fit `config`)."""
    rng = random.Random(spec.seed + 1)
    vocab = range(vocab_size)
    out = []
    for r in raw:
        ids = r.prompt_token_ids
        max_tokens = _scaled(r.max_tokens, spec.output_scale)
        if ids is None:
            prompt_len = _scaled(r.prompt_len, spec.prompt_scale)
            if prompt_len > sys.maxsize:  # len() cannot count it: no engine could hold it either
                raise ConfigError("prompt_scale", f"request {r.id!r}: the prompt scales to {prompt_len} tokens")
            if config is not None and not _fits(r.id, prompt_len, max_tokens, config):
                ids = UnbuiltPrompt(prompt_len)
            else:
                ids = tuple(rng.choices(vocab, k=prompt_len))
        out.append(Request(r.id, ids, max_tokens, _arrival(r, spec), r.sampling))
    return out


def _arrival(r: RawRequest, spec: WorkloadSpec) -> float:
    """Its scaled arrival time; an error naming what put it past MAX_ARRIVAL_S (or to infinity)."""
    arrival = r.arrival_s * spec.time_scale
    if arrival <= MAX_ARRIVAL_S:
        return arrival
    what = f"request {r.id!r} would arrive {arrival:g} s after the start, past {MAX_ARRIVAL_S:g} s"
    if r.arrival_s <= MAX_ARRIVAL_S and spec.time_scale != 1.0:
        raise ConfigError("--time-scale", f"{spec.time_scale:g}: {what}")
    if spec.path == "synthetic":
        raise ConfigError("--rate", f"{spec.rate:g} arrivals per second: {what}")
    raise WorkloadError(spec.source_name, what)


def _scaled(length: int, scale: float) -> int:
    try:
        return max(1, round(length * scale))
    except OverflowError:  # past a float's range: exact integer arithmetic instead
        return max(1, round(length * Fraction(scale)))


def _fits(request_id: str, prompt_len: int, max_tokens: int, config: EngineConfig) -> bool:
    try:
        check_fits(request_id, prompt_len, max_tokens, config)
    except UnservableRequest:
        return False
    return True


def make_burst(template: list[Request], count: int, seed: int, vocab_size: int, tag: str) -> tuple[Request, ...]:
    """count new requests, lengths drawn from the loaded workload, all arriving now."""
    rng = random.Random(seed)
    template = [r for r in template if not isinstance(r.prompt_token_ids, UnbuiltPrompt)]  # never draw those
    picks = [rng.choice(template) for _ in range(count)] if template else []
    vocab = range(vocab_size)
    # greedy, but a run that ignores EOS (--ignore-eos) keeps ignoring it for its bursts
    return tuple(Request(f"{tag}-{i}", tuple(rng.choices(vocab, k=r.prompt_len)), r.max_tokens, 0.0,
                         SamplingParams(ignore_eos=r.sampling.ignore_eos)) for i, r in enumerate(picks))
