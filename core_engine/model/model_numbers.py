"""The real numbers of a model's architecture that would run wrong without an error (a NaN RoPE base
ends every answer after one token; an infinite one turns rotary embeddings off), checked by one rule
for config.json and for GGUF metadata alike. Each message starts with the caller's label: the file
and the key."""

from __future__ import annotations

import math

from batchtop.core_engine.errors import BadInput

ROPE_THETA = {"above": 0.0}  # config.json's rope_theta, GGUF's {arch}.rope.freq_base
RMS_NORM_EPS = {"at_least": 0.0}  # rms_norm_eps, {arch}.attention.layer_norm_rms_epsilon


def checked_number(value: object, label: str, *, above: float | None = None,
                   at_least: float | None = None) -> float:
    """`value` as a finite float within the bounds; BadInput starting with `label` otherwise."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise BadInput(f"{label} must be a number, got {value!r}")
    try:
        number = float(value)
    except OverflowError:  # an integer past a float
        raise BadInput(f"{label} must be a finite number, got an integer of {len(str(value))} digits") from None
    if not math.isfinite(number):
        raise BadInput(f"{label} must be a finite number, got {value!r}")
    if above is not None and not number > above:
        raise BadInput(f"{label} must be > {above:g}, got {value!r}")
    if at_least is not None and not number >= at_least:
        raise BadInput(f"{label} must be >= {at_least:g}, got {value!r}")
    return number
