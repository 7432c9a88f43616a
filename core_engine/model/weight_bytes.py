"""How many bytes a model's weights take: in memory, and streamed by one forward step.

A dense run holds every weight in its dtype. A quantized GGUF run (ModelConfig.weights == "quantized")
holds its layers' linears, its embedding and its lm_head as the file's blocks, at their stored bits per
weight (ModelConfig.weight_bits); the norms and biases stay in the run's dtype.
"""

from __future__ import annotations

from batchtop.core_engine.config import ModelConfig
from batchtop.core_engine.device import DTYPES


def _bits(model: ModelConfig, element_bytes: float) -> tuple[float, float, float]:
    """(layer linears, embedding, lm_head) bits per weight."""
    if model.weights == "quantized" and model.weight_bits is not None:
        return model.weight_bits
    dense = 8.0 * element_bytes
    return dense, dense, dense


def step_weight_bytes(model: ModelConfig, element_bytes: float) -> float:
    """Weights one forward step reads: every layer's, the final norm and the lm_head (a tied lm_head is the
    embedding's matrix, read once by the lm_head; the embedding's looked-up rows are negligible)."""
    layers, _, head = _bits(model, element_bytes)
    h, v, n = model.hidden_size, model.vocab_size, model.num_hidden_layers
    matmul = model.layer_matmul_params()
    vectors = model.layer_params() - matmul  # norms and biases: dtype
    return n * (matmul * layers / 8 + vectors * element_bytes) + h * v * head / 8 + h * element_bytes


def stored_weight_bytes(model: ModelConfig, element_bytes: float) -> float:
    """Every weight held in memory: the embedding, the layers, the final norm, an untied lm_head."""
    layers, embed, head = _bits(model, element_bytes)
    h, v, n = model.hidden_size, model.vocab_size, model.num_hidden_layers
    matmul = model.layer_matmul_params()
    vectors = model.layer_params() - matmul
    lm_head = 0.0 if model.tie_word_embeddings else h * v * head / 8
    return h * v * embed / 8 + n * (matmul * layers / 8 + vectors * element_bytes) + h * element_bytes + lm_head


def mean_bits_per_weight(model: ModelConfig, element_bytes: float) -> float:
    return 8 * stored_weight_bytes(model, element_bytes) / model.num_params()


def weights_text(model: ModelConfig, dtype: str) -> str:
    """How the run holds its weights, for a start-up line or a panel: 'Q4_1, 5.7 bits/weight' (quantized),
    'Q4_1 dequantized to bfloat16', or the dtype."""
    if model.quantization is None:
        return dtype
    if model.weights == "quantized":
        return f"{model.quantization}, {mean_bits_per_weight(model, DTYPES[dtype].itemsize):.1f} bits/weight"
    return f"{model.quantization} dequantized to {dtype}"
