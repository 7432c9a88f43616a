"""One engine step from a server's own log line: vLLM's per-step iteration line
(`--enable-logging-iteration-details`), or SGLang's prefill and decode batch lines (a prefill line per
prefill batch; a decode line every --decode-log-interval decode steps, 40 by default, so those are
samples, not every step). Any other line is not a step; a line that names a step but does not parse
(another version's wording) is told apart, so the caller can count both."""

from __future__ import annotations

import re
from dataclasses import dataclass

# vLLM 0.32: "Engine 000: Iteration(2): 0 context requests, 0 context tokens, 8 generation requests,
# 8 generation tokens, iteration elapsed time: 48.32 ms, CPU KV cache usage: 2.5%" ("context" = prefill)
VLLM_MARK = "Iteration("
_VLLM = re.compile(
    r"(?:Engine (?P<engine>\d+): )?Iteration\((?P<iteration>\d+)\): (?P<cr>\d+) context requests, (?P<ct>\d+) context "
    r"tokens, (?P<gr>\d+) generation requests, (?P<gt>\d+) generation tokens, iteration elapsed time: "
    r"(?P<ms>[0-9.]+) ms(?:, (?P<device>\w+) KV cache usage: (?P<kv>[0-9.]+)%)?")
# SGLang: "Prefill batch. #new-seq: 1, #new-token: 364, #cached-token: 0, token usage: 0.05, #running-req: 0,
# #queue-req: 0" and "Decode batch. #running-req: 8, #token: 3000, token usage: 0.10, ... #queue-req: 0"
SGLANG_MARKS = ("Prefill batch", "Decode batch")
_SG_FIELD = re.compile(r"#?([a-z][a-z -]*?(?:\(token/s\))?): ([0-9.]+)")
MARKS = (VLLM_MARK, *SGLANG_MARKS)
MAX_LINE = 4096  # a step line is ~250 characters; anything longer is not one


@dataclass(frozen=True, slots=True)
class LoggedStep:
    """What one step line says, in the timeline's words: prefill rows and tokens, decode rows and tokens."""

    source: str  # "vllm" or "sglang"
    engine: int  # vLLM's engine index (a data-parallel rank), 0 for SGLang
    iteration: int | None  # vLLM's step counter; SGLang's lines have none
    prefill_rows: int
    prefill_tokens: int
    decode_rows: int
    decode_tokens: int
    elapsed_s: float | None  # the step's own time (vLLM); SGLang's lines do not say it
    kv_usage: float | None  # 0..1
    waiting: int | None = None  # SGLang's #queue-req
    sampled: bool = False  # one line stands for several steps (SGLang's decode lines)
    cached_tokens: int | None = None  # SGLang's #cached-token: prompt tokens found in its prefix cache

    @property
    def rows(self) -> int:
        return self.prefill_rows + self.decode_rows

    @property
    def tokens(self) -> int:
        return self.prefill_tokens + self.decode_tokens

    def as_dict(self) -> dict:
        return {"source": self.source, "engine": self.engine, "iteration": self.iteration,
                "prefill_rows": self.prefill_rows, "prefill_tokens": self.prefill_tokens,
                "decode_rows": self.decode_rows, "decode_tokens": self.decode_tokens, "elapsed_s": self.elapsed_s,
                "kv_usage": self.kv_usage, "waiting": self.waiting, "sampled": self.sampled}


class NotAStep(ValueError):
    """The line names a step (its marker is there) but its wording is not one this parser knows."""


def is_step_line(line: str) -> bool:
    """Cheap: does the line carry a step marker at all (most of a server's log does not)."""
    return any(mark in line for mark in MARKS)


def parse_step(line: str) -> LoggedStep | None:
    """The step a line logs; None for a line that is not a step line; NotAStep for one that should be."""
    if VLLM_MARK in line:
        return _vllm(line)
    for mark in SGLANG_MARKS:
        if mark in line:
            return _sglang(line, prefill=mark.startswith("Prefill"))
    return None


def _vllm(line: str) -> LoggedStep:
    m = _VLLM.search(line, 0, MAX_LINE)
    if m is None:
        raise NotAStep("an Iteration( line in a wording this batchtop does not know")
    kv = m["kv"]
    return LoggedStep("vllm", int(m["engine"] or 0), int(m["iteration"]), int(m["cr"]), int(m["ct"]),
                      int(m["gr"]), int(m["gt"]), float(m["ms"]) / 1000.0,
                      min(1.0, float(kv) / 100.0) if kv is not None else None)


def _sglang(line: str, *, prefill: bool) -> LoggedStep:
    fields = {name.strip(): value for name, value in _SG_FIELD.findall(line[:MAX_LINE])}
    try:
        usage = float(fields["token usage"]) if "token usage" in fields else None
        waiting = int(float(fields["queue-req"])) if "queue-req" in fields else None
        running = int(float(fields["running-req"]))
        if prefill:
            return LoggedStep("sglang", 0, None, int(float(fields["new-seq"])), int(float(fields["new-token"])),
                              0, 0, None, usage, waiting, cached_tokens=int(float(fields.get("cached-token", 0))))
    except KeyError as exc:
        raise NotAStep(f"a SGLang batch line without {exc.args[0]}") from None
    return LoggedStep("sglang", 0, None, 0, 0, running, running, None, usage, waiting, sampled=True)
