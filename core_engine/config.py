"""Frozen, validated configuration: the model's dims, the engine's knobs, and the named presets."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from batchtop.core_engine.errors import ConfigError
from batchtop.core_engine.sched.policies import DEFAULT_MODE, mode_names, mode_problem

MODES = mode_names()  # the scheduling policies' names, from their one registry (sched/policies.py)
MAX_NUM_SEQS_LIMIT = 4096  # the most slots the keys (and the CLI) can ask for
MAX_SEED = 2**64 - 1  # torch.manual_seed's range


def max_num_seqs_problem(value: object, max_num_batched_tokens: int | None = None) -> str | None:
    """The one rule for max_num_seqs, at start-up, in a script and for the live keys: an integer in
    1..MAX_NUM_SEQS_LIMIT, and no more than the token budget, which must hold one decode token for every
    running sequence (vLLM refuses the same)."""
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_NUM_SEQS_LIMIT:
        return f"must be an integer in 1..{MAX_NUM_SEQS_LIMIT}, got {value!r}"
    if max_num_batched_tokens is not None and value > max_num_batched_tokens:
        return (f"{value} is above max_num_batched_tokens {max_num_batched_tokens}: every running sequence "
                "decodes one token per step, so the budget must hold them all")
    return None


def max_num_seqs_cap(max_num_batched_tokens: int) -> int:
    """The most slots a live change may ask for under this token budget."""
    return min(MAX_NUM_SEQS_LIMIT, max_num_batched_tokens)


@dataclass(frozen=True, slots=True)
class RopeScaling:
    """Llama 3.x RoPE scaling ("rope_type": "llama3"): slow rotary frequencies are divided by `factor`,
    fast ones are kept, and those in between are blended, so the model reads past its training length."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int

    def as_dict(self) -> dict:
        return {"rope_type": "llama3", "factor": self.factor, "low_freq_factor": self.low_freq_factor,
                "high_freq_factor": self.high_freq_factor,
                "original_max_position_embeddings": self.original_max_position_embeddings}


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
    head_dim: int = 0  # 0: hidden_size // num_attention_heads; Qwen3 and Mistral Nemo set their own
    attention_bias: bool = False  # biases on q/k/v (Qwen2; Llama's attention_bias)
    o_proj_bias: bool = False  # a bias on o_proj too (Llama's attention_bias, not Qwen2's)
    mlp_bias: bool = False  # biases on gate/up/down (Llama's mlp_bias)
    qk_norm: bool = False  # RMSNorm over each q and k head before RoPE (Qwen3)
    rope_scaling: RopeScaling | None = None
    tie_word_embeddings: bool = False  # the lm_head is the embedding matrix
    eos_token_ids: tuple[int, ...] = ()  # generation stops at these unless the request ignores EOS
    architecture: str = "LlamaForCausalLM"
    checkpoint: str | None = None  # Hugging Face model directory (or GGUF file) the weights load from; None: seeded random
    quantization: str | None = None  # a GGUF file's weight type (Q4_1, Q8_0, ...)
    weights: str | None = None  # a GGUF file's: "quantized" (its blocks computed in place) or "dequantized" (dtype)
    # quantized: stored bits per weight of (the layers' linears, on average; the embedding; the lm_head);
    # None: every weight in the run's dtype
    weight_bits: tuple[float, float, float] | None = None

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "max_position_embeddings"):
            if getattr(self, name) < 1:
                raise ConfigError(f"model.{name}", f"must be >= 1, got {getattr(self, name)}")
        if self.head_dim < 0:
            raise ConfigError("model.head_dim", f"must be >= 1, got {self.head_dim}")
        if not self.head_dim:
            if self.hidden_size % self.num_attention_heads:
                raise ConfigError("model.hidden_size", "must be divisible by num_attention_heads")
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if self.head_dim % 2:
            raise ConfigError("model.head_dim", f"must be even (RoPE rotates pairs), got {self.head_dim}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError("model.num_key_value_heads", "must divide num_attention_heads")

    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_key_value_heads * self.head_dim

    def layer_matmul_params(self) -> int:
        """Weights one token multiplies through in a layer: the GEMM part of the FLOPs."""
        h, q, kv, i = self.hidden_size, self.q_dim, self.kv_dim, self.intermediate_size
        return h * q + 2 * h * kv + q * h + 3 * h * i  # q, k, v, o; gate, up, down

    def layer_params(self) -> int:
        h, q, kv, i = self.hidden_size, self.q_dim, self.kv_dim, self.intermediate_size
        biases = ((q + 2 * kv) * self.attention_bias + h * self.o_proj_bias
                  + (2 * i + h) * self.mlp_bias)
        norms = 2 * h + 2 * self.head_dim * self.qk_norm
        return self.layer_matmul_params() + biases + norms

    def num_params(self) -> int:
        embed = self.vocab_size * self.hidden_size
        lm_head = 0 if self.tie_word_embeddings else embed
        return embed + self.num_hidden_layers * self.layer_params() + self.hidden_size + lm_head

    def as_dict(self) -> dict:
        return {
            "name": self.name, "architecture": self.architecture, "checkpoint": self.checkpoint,
            "quantization": self.quantization, "weights": self.weights,
            "weight_bits": list(self.weight_bits) if self.weight_bits else None,
            "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size, "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads, "head_dim": self.head_dim,
            "max_position_embeddings": self.max_position_embeddings, "rope_theta": self.rope_theta,
            "rms_norm_eps": self.rms_norm_eps, "attention_bias": self.attention_bias,
            "o_proj_bias": self.o_proj_bias, "mlp_bias": self.mlp_bias, "qk_norm": self.qk_norm,
            "rope_scaling": self.rope_scaling.as_dict() if self.rope_scaling else None,
            "tie_word_embeddings": self.tie_word_embeddings, "eos_token_ids": list(self.eos_token_ids),
            "num_params": self.num_params(),
        }

    @classmethod
    def from_dict(cls, data: dict) -> ModelConfig:
        """The inverse of as_dict(); keys it does not know (num_params, newer fields) are skipped."""
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        if fields.get("rope_scaling"):
            fields["rope_scaling"] = RopeScaling(**{k: v for k, v in fields["rope_scaling"].items()
                                                    if k in RopeScaling.__dataclass_fields__})
        fields["eos_token_ids"] = tuple(fields.get("eos_token_ids", ()))
        if fields.get("weight_bits"):
            fields["weight_bits"] = tuple(fields["weight_bits"])
        return cls(**fields)


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
        raise ConfigError("model", f"unknown preset {name!r} (choose auto, {', '.join(PRESETS)})") from None


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """The engine's knobs, resolved: no 'auto' values remain (see core_engine.resolve)."""

    model: ModelConfig
    device: str = "cpu"
    dtype: str = "float32"
    mode: str = DEFAULT_MODE
    max_num_seqs: int = 16  # slots: the most sequences running at once
    max_num_batched_tokens: int = 256  # token budget of one forward step (prefill chunks + decodes)
    block_size: int = 16  # tokens per KV block
    num_kv_blocks: int = 256  # usable blocks in the paged pool
    seed: int = 0
    enforce_eager: bool = False  # CUDA: run decode steps eagerly instead of replaying captured CUDA graphs
    enable_prefix_caching: bool = True  # reuse the KV of full blocks whose tokens (and prefix) match, as vLLM
    # CUDA: size the pool after a profiling forward, to this fraction of the GPU (worker/kv_pool_sizing.py);
    # num_kv_blocks is then the most it may hold. None: num_kv_blocks as given.
    gpu_memory_utilization: float | None = None
    extra: dict = field(default_factory=dict, compare=False)  # free-form provenance for metrics

    def __post_init__(self) -> None:
        for field_name in ("max_num_batched_tokens", "block_size", "num_kv_blocks"):
            value = getattr(self, field_name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(field_name, f"must be an integer >= 1, got {value!r}")
        problem = max_num_seqs_problem(self.max_num_seqs, self.max_num_batched_tokens)
        if problem is not None:
            raise ConfigError("max_num_seqs", problem)
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or not 0 <= self.seed <= MAX_SEED:
            raise ConfigError("seed", f"must be an integer in 0..2**64-1, got {self.seed!r}")
        if not isinstance(self.enable_prefix_caching, bool):
            raise ConfigError("enable_prefix_caching", f"must be true or false, got {self.enable_prefix_caching!r}")
        if (problem := mode_problem(self.mode)) is not None:  # the registry now: a test may register a policy
            raise ConfigError("mode", problem)
        if self.device not in ("cpu", "cuda"):
            raise ConfigError("device", f"must be cpu or cuda once resolved, got {self.device!r}")

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
            "seed": self.seed, "enable_prefix_caching": self.enable_prefix_caching, "model": self.model.as_dict(),
            **self.extra,
        }


def config_from_dict(data: dict) -> EngineConfig:
    """Rebuild an EngineConfig from its as_dict() form (a trace header, a metrics file)."""
    engine_fields = {k: v for k, v in data.items() if k in EngineConfig.__dataclass_fields__ and k != "model"}
    engine_fields.setdefault("enable_prefix_caching", False)  # written before the field: run without one
    return EngineConfig(model=ModelConfig.from_dict(data["model"]), **engine_fields)
