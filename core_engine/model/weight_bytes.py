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


def _layers_and_norm(model: ModelConfig, element_bytes: float, layer_bits: float) -> float:
    """Every decoder layer's weights (its matrices at layer_bits, its norms and biases in the dtype) and
    the final norm."""
    matmul = model.layer_matmul_params()
    vectors = model.layer_params() - matmul
    return model.num_hidden_layers * (matmul * layer_bits / 8 + vectors * element_bytes) \
        + model.hidden_size * element_bytes


def step_weight_bytes(model: ModelConfig, element_bytes: float) -> float:
    """Weights one forward step reads: every layer's, the final norm and the lm_head (a tied lm_head is the
    embedding's matrix, read once by the lm_head; the embedding's looked-up rows are negligible)."""
    layers, _, head = _bits(model, element_bytes)
    return _layers_and_norm(model, element_bytes, layers) + model.hidden_size * model.vocab_size * head / 8


def stored_weight_bytes(model: ModelConfig, element_bytes: float) -> float:
    """Every weight held in memory: the embedding, the layers, the final norm, an untied lm_head."""
    layers, embed, head = _bits(model, element_bytes)
    matrix = model.hidden_size * model.vocab_size
    lm_head = 0.0 if model.tie_word_embeddings else matrix * head / 8
    return matrix * embed / 8 + _layers_and_norm(model, element_bytes, layers) + lm_head


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
