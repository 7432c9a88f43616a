"""What every workload reader returns (requests before scaling), and how readers warn."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

from batchtop.core_engine.sched.request import SamplingParams

Warn = Callable[[str], None]
# The latest arrival a workload may ask for, in seconds from the start (~31 years): past it a request
# would never come (or, scaled, reach infinity), and sums of such times overflow the metrics.
MAX_ARRIVAL_S = 1e9


def warn_on_stderr(message: str) -> None:
    print(f"batchtop: warning: {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True, slots=True)
class RawRequest:
    """A request before scaling: lengths and arrival as the source gave them."""

    id: str
    prompt_len: int
    max_tokens: int
    arrival_s: float
    prompt_token_ids: tuple[int, ...] | None = None
    sampling: SamplingParams = SamplingParams()
