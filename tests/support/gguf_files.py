"""Tiny GGUF files written with gguf.GGUFWriter as llama.cpp's converter writes them: transformers'
random models' weights (q/k rows permuted for a llama file), some tensors quantized (F16, Q8_0, Q4_1),
and a tokenizer of either kind (gpt2 byte-level BPE with merges, llama SentencePiece with scores).

`gguf_pair` returns the file and the transformers model holding exactly the weights the file holds
(each quantized tensor dequantized back), so batchtop's logits on the file can be compared to
transformers' at fp32 tolerance.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import torch

from tests.support.hf_checkpoints import COMMON, EOS_ID, SENTENCES, hf_model, tokenizer

CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
LAYER_NAMES = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
               "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
               "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate",
               "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
Q = gguf.GGMLQuantizationType


def plain_llama(seed: int = 0, tied: bool = True) -> torch.nn.Module:
    """A Llama without RoPE scaling (what a GGUF file of a Llama 2 / SmolLM / TinyLlama holds)."""
    import transformers
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(**COMMON, tie_word_embeddings=tied, rope_theta=10000.0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    reference = hf_model("mistral", seed)  # same initialisation scales as the other test checkpoints
    with torch.no_grad():
        ref = dict(reference.named_parameters())
        for name, param in model.named_parameters():
            param.copy_(ref[name] if name in ref else 0.3 * torch.randn_like(param))
    return model


def gguf_name(hf: str) -> str:
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    if hf in top:
        return top[hf]
    _, _, layer, *rest = hf.split(".")
    return f"blk.{layer}.{LAYER_NAMES['.'.join(rest[:-1])]}.{rest[-1]}"


def permute(rows: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter's row order for q/k (written here from its description: each head's two
    rotary halves interleaved)."""
    head = rows.shape[0] // heads
    return rows.reshape(heads, 2, head // 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def weight_type(name: str, quant: Q) -> Q:
    if name.endswith("norm.weight") or name.endswith(".bias"):
        return Q.F32
    if name == "model.embed_tokens.weight":
        return Q.Q8_0 if quant != Q.F16 else Q.F16
    return quant


def write_tokenizer(w: gguf.GGUFWriter, kind: str, vocab: int) -> None:
    if kind == "gpt2":
        tok = tokenizer()
        model = json.loads(tok.to_str())["model"]
        tokens = [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1])]
        merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
        special = {t.content for t in tok.get_added_tokens_decoder().values()}
        tokens += ["<|im_start|>", "<|im_end|>"]
        tokens += [f"<|pad_{i}|>" for i in range(vocab - len(tokens))]
        types = [gguf.TokenType.CONTROL if t in special or t.startswith("<|") else gguf.TokenType.NORMAL
                 for t in tokens]
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("gpt-2")
        w.add_token_merges(merges)
    else:
        tokens, scores, types = sentencepiece_vocab(vocab)
        w.add_tokenizer_model("llama")
        w.add_token_scores(scores)
        w.add_uint32("tokenizer.ggml.unknown_token_id", 0)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_bos_token_id(0 if kind == "gpt2" else 1)
    w.add_eos_token_id(EOS_ID if kind == "gpt2" else 2)
    w.add_add_bos_token(True)
    w.add_chat_template(CHAT_TEMPLATE)


def sentencepiece_vocab(vocab: int) -> tuple[list[str], list[float], list[int]]:
    """<unk> <s> </s>, 256 byte tokens, then pieces of the test sentences (characters, then merges
    best-first), as a SentencePiece BPE model lists them: a merged piece's score is minus its rank."""
    from tokenizers import SentencePieceBPETokenizer
    tokens = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [gguf.TokenType.UNKNOWN] + [gguf.TokenType.CONTROL] * 4 + [gguf.TokenType.BYTE] * 256
    scores = [0.0] * len(tokens)
    trained = SentencePieceBPETokenizer()
    trained.train_from_iterator(SENTENCES * 4, vocab_size=vocab - len(tokens) + 1, show_progress=False,
                                special_tokens=[])
    model = json.loads(trained.to_str())["model"]
    merged = {(m if isinstance(m, str) else " ".join(m)).replace(" ", "") for m in model["merges"]}
    for piece, rank in sorted(model["vocab"].items(), key=lambda kv: kv[1]):
        if len(tokens) == vocab:
            break
        tokens.append(piece)
        types.append(gguf.TokenType.NORMAL)
        scores.append(-float(rank) if piece in merged else -1000.0 - rank)
    return tokens, scores, types


def write_gguf(path: Path, model: torch.nn.Module, arch: str, quant: Q = Q.Q8_0, tokenizer_kind: str = "gpt2",
               extra=None, context_length: int | None = None) -> torch.nn.Module:
    """Write `model` as a GGUF file; returns it with every quantized tensor replaced by its dequantized
    value, i.e. exactly the weights the file holds."""
    cfg = model.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(context_length or cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    rope = getattr(cfg, "rope_parameters", None) or {}
    w.add_rope_freq_base(float(rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_file_type({Q.Q8_0: gguf.LlamaFileType.MOSTLY_Q8_0, Q.Q4_1: gguf.LlamaFileType.MOSTLY_Q4_1,
                     Q.F16: gguf.LlamaFileType.MOSTLY_F16, Q.Q4_0: gguf.LlamaFileType.MOSTLY_Q4_0}[quant])
    write_tokenizer(w, tokenizer_kind, cfg.vocab_size)
    if extra is not None:
        extra(w)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name == "lm_head.weight" and cfg.tie_word_embeddings:
                continue
            data = param.detach().numpy().astype(np.float32)
            kind = weight_type(name, quant)
            stored = gguf.quants.quantize(data, kind) if kind not in (Q.F32, Q.F16) else data.astype(
                np.float16 if kind == Q.F16 else np.float32)
            param.copy_(torch.from_numpy(np.ascontiguousarray(gguf.quants.dequantize(stored, kind)).reshape(data.shape)))
            if arch == "llama" and (".q_proj." in name or ".k_proj." in name):
                heads = cfg.num_attention_heads if ".q_proj." in name else cfg.num_key_value_heads
                stored = permute(stored, heads)
            w.add_tensor(gguf_name(name), stored, raw_dtype=kind if kind not in (Q.F32, Q.F16) else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return model
