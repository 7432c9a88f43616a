"""Frozen, validated configuration: the model's dims, the engine's knobs, and the named presets."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from batchtop.core_engine.errors import ConfigError

MODES = ("continuous", "static")


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Dims of a Llama-family decoder; names follow Hugging Face's LlamaConfig."""

    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int  # SwiGLU inner width
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int  # < num_attention_heads means grouped-query attention
    max_position_embeddings: int = 4096  # max_model_len: prompt + output may not exceed it
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "max_position_embeddings"):
            if getattr(self, name) < 1:
                raise ConfigError(f"model.{name}", f"must be >= 1, got {getattr(self, name)}")
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError("model.hidden_size", "must be divisible by num_attention_heads")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError("model.num_key_value_heads", "must divide num_attention_heads")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def kv_dim(self) -> int:
        return self.num_key_value_heads * self.head_dim

    def layer_params(self) -> int:
        h, kv, i = self.hidden_size, self.kv_dim, self.intermediate_size
        attention = h * h + 2 * h * kv + h * h  # q, k, v, o
        mlp = 3 * h * i  # gate, up, down
        return attention + mlp + 2 * h  # two RMSNorm weights

    def num_params(self) -> int:
        embed = self.vocab_size * self.hidden_size
        return embed + self.num_hidden_layers * self.layer_params() + self.hidden_size + embed  # + lm_head

    def as_dict(self) -> dict:
        return {
            "name": self.name, "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size, "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads, "head_dim": self.head_dim,
            "max_position_embeddings": self.max_position_embeddings, "num_params": self.num_params(),
        }


PRESETS: dict[str, ModelConfig] = {
    # Small enough that the whole test suite stays fast; still GQA, several layers, RoPE.
    "tiny": ModelConfig("tiny", vocab_size=512, hidden_size=64, intermediate_size=128,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2),
    # The CPU demo: big enough that a decode step is bound by reading the weights (memory-bound),
    # so batching visibly amortises them; small enough for interactive speed on 2 cores.
    "cpu-demo": ModelConfig("cpu-demo", vocab_size=32000, hidden_size=1024, intermediate_size=2816,
                            num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4,
                            max_position_embeddings=8192),
    # TinyLlama-1.1B dims: a GPU preset that starts in seconds.
    "gpu-1b": ModelConfig("gpu-1b", vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                          num_hidden_layers=22, num_attention_heads=32, num_key_value_heads=4,
                          max_position_embeddings=8192),
    # Llama-3-8B dims: on a large GPU the memory-bound decode regime lasts into the hundreds.
    "gpu-8b": ModelConfig("gpu-8b", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                          num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                          max_position_embeddings=8192, rope_theta=500000.0),
}


def preset(name: str) -> ModelConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError("--model", f"unknown preset {name!r} (choose auto, {', '.join(PRESETS)})") from None


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """The engine's knobs, resolved: no 'auto' values remain (see core_engine.resolve)."""

    model: ModelConfig
    device: str = "cpu"
    dtype: str = "float32"
    mode: str = "continuous"
    max_num_seqs: int = 16  # slots: the most sequences running at once
    max_num_batched_tokens: int = 256  # token budget of one forward step (prefill chunks + decodes)
    block_size: int = 16  # tokens per KV block
    num_kv_blocks: int = 256  # usable blocks in the paged pool
    seed: int = 0
    extra: dict = field(default_factory=dict, compare=False)  # free-form provenance for metrics

    def __post_init__(self) -> None:
        for option, value in (("--max-num-seqs", self.max_num_seqs),
                              ("--max-num-batched-tokens", self.max_num_batched_tokens),
                              ("--block-size", self.block_size),
                              ("--num-kv-blocks", self.num_kv_blocks)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(option, f"must be an integer >= 1, got {value!r}")
        if self.mode not in MODES:
            raise ConfigError("--mode", f"must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.device not in ("cpu", "cuda"):
            raise ConfigError("--device", f"must be cpu or cuda once resolved, got {self.device!r}")

    @property
    def max_model_len(self) -> int:
        return self.model.max_position_embeddings

    def with_(self, **changes) -> EngineConfig:
        return replace(self, **changes)

    def as_dict(self) -> dict:
        return {
            "mode": self.mode, "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens, "block_size": self.block_size,
            "num_kv_blocks": self.num_kv_blocks, "device": self.device, "dtype": self.dtype,
            "seed": self.seed, "model": self.model.as_dict(), **self.extra,
        }


def config_from_dict(data: dict) -> EngineConfig:
    """Rebuild an EngineConfig from its as_dict() form (a trace header, a metrics file)."""
    model_fields = {k: v for k, v in data["model"].items() if k in ModelConfig.__dataclass_fields__}
    engine_fields = {k: v for k, v in data.items() if k in EngineConfig.__dataclass_fields__ and k != "model"}
    return EngineConfig(model=ModelConfig(**model_fields), **engine_fields)
