"""A Hugging Face model directory's config.json (and generation_config.json) <-> ModelConfig.

Reads the architectures of the families in families.py; anything else is refused by name, as is any
option the model would silently get wrong (another activation, another RoPE type) and any number that
would run wrong (a RoPE theta <= 0, a negative norm epsilon, NaN or Infinity anywhere in the file).
`config_json` is batchtop's one config.json writer (a preset's export, a GGUF file's export).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from batchtop.core_engine.config import ModelConfig, RopeScaling
from batchtop.core_engine.errors import BadInput, ConfigError
from batchtop.core_engine.model.families import Flag, ModelFamily, by_hf_architecture, by_model_type
from batchtop.core_engine.model.model_numbers import RMS_NORM_EPS, ROPE_THETA, checked_number
from batchtop.core_engine.text_files import NotText, read_text_file


MAX_JSON_BYTES = 64 << 20  # config.json, tokenizer_config.json: kilobytes to a few MiB


def read_json(path: Path) -> dict:
    """A JSON object with only finite numbers (a NaN would reach the metrics); BadInput names the file
    and, for a number, its key."""
    try:
        data = json.loads(read_text_file(path, MAX_JSON_BYTES, "a model's JSON file"))
    except NotText as exc:
        raise BadInput(f"{path}: {exc.message}") from None
    except json.JSONDecodeError as exc:
        raise BadInput(f"{path}: not JSON ({exc.msg}, line {exc.lineno})") from None
    except RecursionError:
        raise BadInput(f"{path}: not JSON that can be read (nested too deeply)") from None
    except ValueError as exc:  # an integer of more digits than Python converts
        raise BadInput(f"{path}: not JSON that can be read ({exc})") from None
    if not isinstance(data, dict):
        raise BadInput(f"{path}: expected a JSON object")
    bad = _non_finite(data)
    if bad is not None:
        raise BadInput(f"{path}: {bad[0]!r} must be a finite number, got {bad[1]!r}")
    return data


def _non_finite(data: dict) -> tuple[str, float] | None:
    """The first key (a.b[2] for a nested one) whose value is NaN or +-Infinity, and the value."""
    stack: list[tuple[str, object]] = [("", data)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            return where, value
        if isinstance(value, dict):
            stack.extend((f"{where}.{k}" if where else str(k), v) for k, v in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend((f"{where}[{i}]", v) for i, v in reversed(list(enumerate(value))))
    return None


class _Fields:
    """Typed access to one JSON object; every error names the file and the key."""

    def __init__(self, path: Path, data: dict) -> None:
        self.path, self.data = path, data

    def int(self, key: str, default: int | None = None) -> int:
        value = self.data.get(key, default)
        if value is None and default is not None:
            value = default
        if not isinstance(value, int) or isinstance(value, bool):
            raise BadInput(f"{self.path}: {key!r} must be an integer, got {value!r}")
        return value

    def float(self, key: str, default: float, data: dict | None = None, *, above: float | None = None,
              at_least: float | None = None) -> float:
        value = (self.data if data is None else data).get(key, default)
        return checked_number(value, f"{self.path}: {key!r}", above=above, at_least=at_least)

    def bool(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if not isinstance(value, bool):
            raise BadInput(f"{self.path}: {key!r} must be true or false, got {value!r}")
        return value


def family_of(path: Path, cfg: dict) -> ModelFamily:
    archs = cfg.get("architectures")
    if isinstance(archs, list) and archs:
        return by_hf_architecture(archs[0], str(path))
    return by_model_type(cfg.get("model_type"), str(path))


def rope_of(f: _Fields, family: ModelFamily) -> tuple[float, RopeScaling | None]:
    """transformers 5 writes rope_parameters (theta inside); older checkpoints rope_scaling + rope_theta."""
    rope = f.data.get("rope_parameters") or f.data.get("rope_scaling") or {}
    if not isinstance(rope, dict):
        raise BadInput(f"{f.path}: 'rope_scaling' must be an object or null, got {rope!r}")
    theta = f.float("rope_theta", f.float("rope_theta", 10000.0, **ROPE_THETA), data=rope, **ROPE_THETA)
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind == "default":
        return theta, None
    if kind not in family.rope_scaling_kinds:
        raise BadInput(f"{f.path}: RoPE type {kind!r} is not supported "
                       f"(supported: {', '.join(('default', *family.rope_scaling_kinds))})")
    try:
        scaling = RopeScaling(f.float("factor", None, rope, above=0), f.float("low_freq_factor", None, rope, above=0),
                              f.float("high_freq_factor", None, rope, above=0),
                              int(f.float("original_max_position_embeddings", None, rope, at_least=1)))
    except BadInput as exc:
        raise BadInput(f"{exc} (in its llama3 rope scaling)") from None
    if scaling.high_freq_factor <= scaling.low_freq_factor:
        raise BadInput(f"{f.path}: llama3 rope scaling needs high_freq_factor > low_freq_factor")
    return theta, scaling


def eos_token_ids(model_dir: Path, cfg: dict) -> tuple[int, ...]:
    """The ids generation stops at: generation_config.json's, else config.json's (int or list)."""
    gen_path = model_dir / "generation_config.json"
    gen = read_json(gen_path) if gen_path.is_file() else {}
    source, value = (gen_path, gen["eos_token_id"]) if gen.get("eos_token_id") is not None else \
        (model_dir / "config.json", cfg.get("eos_token_id"))
    if value is None:
        return ()
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise BadInput(f"{source}: 'eos_token_id' must be a token id or a list of them, got {value!r}")
    return tuple(values)


def read_model_config(model_dir: str | Path) -> ModelConfig:
    """The ModelConfig of a Hugging Face model directory; BadInput names the file and key at fault."""
    d = Path(model_dir)
    path = d / "config.json"
    if not path.is_file():
        raise BadInput(f"--model {model_dir}: no config.json in this directory (is it a Hugging Face model?)")
    cfg = read_json(path)
    family = family_of(path, cfg)
    f = _Fields(path, cfg)
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise BadInput(f"{path}: hidden_act {act!r} is not supported (only silu)")
    heads = f.int("num_attention_heads")
    theta, scaling = rope_of(f, family)

    def flag(which: Flag) -> bool:
        return which.default if which.fixed else f.bool(which.key, which.default)

    max_len = f.int("max_position_embeddings", 4096)
    window = cfg.get("sliding_window")
    windowed = family.sliding_window == "always" or (family.sliding_window == "flag"
                                                     and cfg.get("use_sliding_window", False))
    if windowed and isinstance(window, int) and 0 < window < max_len:
        max_len = window  # sequences never outgrow the window, so full attention is exact
    try:
        return ModelConfig(
            name=d.resolve().name, vocab_size=f.int("vocab_size"), hidden_size=f.int("hidden_size"),
            intermediate_size=f.int("intermediate_size"), num_hidden_layers=f.int("num_hidden_layers"),
            num_attention_heads=heads, num_key_value_heads=f.int("num_key_value_heads", heads),
            max_position_embeddings=max_len, rope_theta=theta,
            rms_norm_eps=f.float("rms_norm_eps", 1e-6, **RMS_NORM_EPS), head_dim=f.int("head_dim", 0),
            attention_bias=flag(family.qkv_bias), o_proj_bias=flag(family.o_bias), mlp_bias=flag(family.mlp_bias),
            qk_norm=family.qk_norm, rope_scaling=scaling,
            tie_word_embeddings=f.bool("tie_word_embeddings", family.tie_word_embeddings),
            eos_token_ids=eos_token_ids(d, cfg), architecture=family.hf_architecture, checkpoint=str(d.resolve()))
    except ConfigError as exc:
        raise BadInput(f"{path}: {exc}") from None


def _flag_keys(m: ModelConfig, family: ModelFamily) -> dict[str, bool]:
    """config.json's keys for the model's biases; BadInput when the family cannot say what the model holds."""
    arch = family.hf_architecture
    keys: dict[str, tuple[bool, str]] = {}
    for which, value, what in ((family.qkv_bias, m.attention_bias, "q/k/v biases"),
                               (family.o_bias, m.o_proj_bias, "an o_proj bias"),
                               (family.mlp_bias, m.mlp_bias, "MLP biases")):
        if which.fixed and value != which.default:
            raise BadInput(f"{m.name}: a {arch} {'always has' if which.default else 'has no'} {what}, this model "
                           f"{'does' if value else 'does not'}")
        if not which.fixed:
            first, first_what = keys.setdefault(which.key, (value, what))
            if first != value:
                raise BadInput(f"{m.name}: {which.key!r} in a {arch}'s config.json sets {first_what} and {what} "
                               "together; this model has one without the other")
    if m.qk_norm != family.qk_norm:
        raise BadInput(f"{m.name}: a {arch} {'always has' if family.qk_norm else 'has no'} q/k RMSNorm, this model "
                       f"{'does' if m.qk_norm else 'does not'}")
    return {key: value for key, (value, _) in keys.items()}


def config_json(config: ModelConfig, dtype: str, bos_token_id: int | None, eos_token_ids: tuple[int, ...]) -> dict:
    """config.json for the model, in the form Hub checkpoints of its family use (which transformers 4
    and 5 and vLLM all read); BadInput when its family's config cannot describe the model."""
    m = config
    family = by_hf_architecture(m.architecture, m.name)
    eos = None if not eos_token_ids else eos_token_ids[0] if len(eos_token_ids) == 1 else list(eos_token_ids)
    out = {
        "architectures": [family.hf_architecture], "model_type": family.model_type, "vocab_size": m.vocab_size,
        "hidden_size": m.hidden_size, "intermediate_size": m.intermediate_size,
        "num_hidden_layers": m.num_hidden_layers, "num_attention_heads": m.num_attention_heads,
        "num_key_value_heads": m.num_key_value_heads, "head_dim": m.head_dim, "hidden_act": "silu",
        "max_position_embeddings": m.max_position_embeddings, "rms_norm_eps": m.rms_norm_eps,
        "rope_theta": m.rope_theta, "rope_scaling": None if m.rope_scaling is None else m.rope_scaling.as_dict(),
        **_flag_keys(m, family), "tie_word_embeddings": m.tie_word_embeddings, "initializer_range": 0.02,
        "bos_token_id": bos_token_id, "eos_token_id": eos, "torch_dtype": dtype, "dtype": dtype, "use_cache": True,
    }
    if family.sliding_window == "flag":
        out["use_sliding_window"] = False
    if family.sliding_window is not None:
        out["sliding_window"] = None  # max_position_embeddings is already capped at any window
    return out
