"""The model families batchtop runs, one row each: what sets a family apart from plain Llama.

Every family here is the same decoder (llama.py) with ModelConfig flags set differently; a row says
which names it goes by (Hugging Face architecture and model_type, llama.cpp's general.architecture),
which flags it fixes and which it reads from config.json (or from the tensors a GGUF file holds), how
llama.cpp names its tensors where that differs from Llama, and whether llama.cpp permuted its q/k rows.
The config.json reader and writer (hf_config.py), the GGUF reader (gguf_file.py, gguf_weights.py) and
the GGUF exporter read these rows and nothing else: adding a Llama-compatible family is one row.

No family carries a chat template: every checkpoint brings its own (tokenizer_config.json, the GGUF
metadata), and batchtop does not guess one.
"""

from __future__ import annotations

from dataclasses import dataclass

from batchtop.core_engine.errors import BadInput


@dataclass(frozen=True, slots=True)
class Flag:
    """A yes/no of the architecture: fixed by the family (key None), or config.json's `key` (default
    when the key is absent). In a GGUF file a keyed flag is whether its tensor is there."""
    key: str | None
    default: bool = False

    @property
    def fixed(self) -> bool:
        return self.key is None


NEVER, ALWAYS = Flag(None, False), Flag(None, True)

# Hugging Face name -> llama.cpp's: Llama's names, every family's unless its row renames a layer's module.
GGUF_TOP_LEVEL = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                  "lm_head.weight": "output.weight"}
GGUF_LAYER = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
              "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
              "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
              "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
ROPE_PERMUTED = ("self_attn.q_proj", "self_attn.k_proj")  # the rows llama.cpp reorders, where a family's file does


@dataclass(frozen=True, slots=True)
class ModelFamily:
    name: str  # for people: help text, docs
    hf_architectures: tuple[str, ...]  # config.json's "architectures"; the first is what batchtop writes
    model_type: str
    gguf_architecture: str | None  # general.architecture; None: llama.cpp writes it as another family's
    qkv_bias: Flag = NEVER
    o_bias: Flag = NEVER
    mlp_bias: Flag = NEVER
    qk_norm: bool = False  # RMSNorm over each q and k head before RoPE
    tie_word_embeddings: bool = False  # when config.json does not say
    rope_scaling_kinds: tuple[str, ...] = ("llama3",)  # besides "default"; llama3 is the one RopeScaling holds
    # "always": config.json's sliding_window applies whenever set; "flag": only with use_sliding_window true
    sliding_window: str | None = None
    gguf_permuted_qk: bool = False  # llama.cpp's converter interleaved each q/k head's rotary halves
    gguf_renames: tuple[tuple[str, str], ...] = ()  # (HF module, llama.cpp name) where not GGUF_LAYER's

    @property
    def hf_architecture(self) -> str:
        return self.hf_architectures[0]

    def gguf_layer_names(self) -> dict[str, str]:
        """HF module inside a layer -> llama.cpp's name for it, in this family's files."""
        return GGUF_LAYER | dict(self.gguf_renames)


FAMILIES: tuple[ModelFamily, ...] = (
    ModelFamily("Llama", ("LlamaForCausalLM",), "llama", "llama", qkv_bias=Flag("attention_bias"),
                o_bias=Flag("attention_bias"), mlp_bias=Flag("mlp_bias"), gguf_permuted_qk=True),
    ModelFamily("Mistral", ("MistralForCausalLM",), "mistral", None, sliding_window="always"),
    ModelFamily("Qwen2", ("Qwen2ForCausalLM",), "qwen2", "qwen2", qkv_bias=ALWAYS, sliding_window="flag"),
    ModelFamily("Qwen3", ("Qwen3ForCausalLM",), "qwen3", "qwen3", qkv_bias=Flag("attention_bias"),
                o_bias=Flag("attention_bias"), qk_norm=True, sliding_window="flag"),
    ModelFamily("Seed-OSS", ("SeedOssForCausalLM",), "seed_oss", "seed_oss", qkv_bias=Flag("attention_bias", True),
                o_bias=Flag("attention_out_bias"), mlp_bias=Flag("mlp_bias"),
                gguf_renames=(("post_attention_layernorm", "post_attention_norm"),)),
)


def family_names() -> str:
    return ", ".join(f.name for f in FAMILIES)


def _find(where: str, what: str, value: object, known: list[str], found: ModelFamily | None) -> ModelFamily:
    if found is None:
        raise BadInput(f"{where}: {what} {value!r} is not supported (supported: {', '.join(known)})")
    return found


def by_hf_architecture(name: object, where: str) -> ModelFamily:
    """The family config.json's architecture names; BadInput (prefixed by `where`) lists the supported ones."""
    found = next((f for f in FAMILIES if name in f.hf_architectures), None)
    return _find(where, "architecture", name, [a for f in FAMILIES for a in f.hf_architectures], found)


def by_model_type(model_type: object, where: str) -> ModelFamily:
    found = next((f for f in FAMILIES if f.model_type == model_type), None)
    return _find(where, "model_type", model_type, [f.model_type for f in FAMILIES], found)


def by_gguf_architecture(arch: str, where: str) -> ModelFamily:
    """The family a GGUF file's general.architecture names."""
    found = next((f for f in FAMILIES if f.gguf_architecture is not None and f.gguf_architecture == arch), None)
    return _find(where, "architecture", arch or "(none)",
                 [f.gguf_architecture for f in FAMILIES if f.gguf_architecture is not None], found)
