"""The KV pool sized as vLLM does: what total x utilization leaves after everything in use, a measured
full-budget forward, the graphs and a margin; never more than there is, and a clear error when nothing is left."""

from __future__ import annotations

import pytest
import torch

from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.errors import ConfigError
from batchtop.core_engine.worker import model_runner
from batchtop.core_engine.worker.kv_pool_sizing import GIB, MARGIN, MemoryFigures, kv_pool_bytes
from tests.conftest import tiny_config

H200 = 140 * GIB
WEIGHTS_8B = 16 * GIB


def test_an_idle_gpu_gives_the_pool_all_that_the_utilization_leaves():
    figures = MemoryFigures(total=H200, free=H200 - WEIGHTS_8B - GIB, weights=WEIGHTS_8B,
                            activation_peak=3 * GIB, graphs=GIB // 4)
    pool = kv_pool_bytes(figures, 0.9)
    assert pool == int(0.9 * H200) - WEIGHTS_8B - GIB - 3 * GIB - GIB // 4 - MARGIN


def test_memory_another_process_holds_is_not_taken():
    idle = MemoryFigures(H200, H200 - WEIGHTS_8B, WEIGHTS_8B, 3 * GIB)
    shared = MemoryFigures(H200, H200 - WEIGHTS_8B - 4 * GIB, WEIGHTS_8B, 3 * GIB)  # someone holds 4 GiB
    assert kv_pool_bytes(idle, 0.9) - kv_pool_bytes(shared, 0.9) == 4 * GIB
    assert shared.others == 4 * GIB


def test_a_gpu_too_full_for_any_pool_names_the_option_with_every_figure():
    crowded = MemoryFigures(H200, 10 * GIB, WEIGHTS_8B, 3 * GIB)  # 130 GiB held elsewhere
    with pytest.raises(ConfigError) as err:
        kv_pool_bytes(crowded, 0.9)
    assert err.value.field == "gpu_memory_utilization"
    assert "other processes and pools 114.00 GiB" in err.value.message and "activations 3.00 GiB" in err.value.message


def fake_gpu(monkeypatch, free: int, total: int = H200, peak: int = 2 * GIB) -> None:
    """The runner's profiling on a CPU (a real forward), with the device's figures made up."""

    def measure(forward, device):
        forward()
        return peak

    monkeypatch.setattr(model_runner, "measure_peak", measure)
    monkeypatch.setattr(model_runner, "device_memory",
                        lambda device, weights, peak, graphs: MemoryFigures(total, free, weights, peak, graphs))


def test_the_engine_takes_the_profiled_pool_and_says_how_it_was_sized(monkeypatch):
    config = tiny_config(num_kv_blocks=10_000, gpu_memory_utilization=0.5)
    per_block = 2 * config.model.num_hidden_layers * config.block_size * config.model.kv_dim * 4  # fp32
    in_use = int(0.5 * H200) - 2 * GIB - MARGIN - 100 * per_block  # leaves exactly 100 blocks
    fake_gpu(monkeypatch, free=H200 - in_use)
    sizes = []
    monkeypatch.setattr(torch.nn.Embedding, "forward",
                        lambda self, ids: sizes.append(ids.shape[0]) or torch.nn.functional.embedding(ids, self.weight))
    engine = Engine(config)
    assert sizes == [config.max_num_batched_tokens]  # one profiling forward at the full budget
    assert engine.config.num_kv_blocks == engine.allocator.num_blocks == 100
    assert engine.runner.kv_caches[0][0].shape[0] == 101  # and the scratch block
    assert engine.config.extra["kv_pool"].startswith("KV pool: 100 blocks")


def test_the_profiled_pool_never_exceeds_what_the_engine_can_use(monkeypatch):
    fake_gpu(monkeypatch, free=H200 - GIB)
    engine = Engine(tiny_config(num_kv_blocks=64, gpu_memory_utilization=0.9))
    assert engine.config.num_kv_blocks == 64


def test_no_room_for_a_pool_is_a_usage_error_before_any_step(monkeypatch):
    fake_gpu(monkeypatch, free=GIB)
    with pytest.raises(ConfigError, match="gpu_memory_utilization"):
        Engine(tiny_config(gpu_memory_utilization=0.9))
