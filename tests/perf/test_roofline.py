"""FLOP/byte accounting against a hand calculation, and how intensity moves with batch size."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from batchtop.core_engine.perf import device_peaks as dp
from batchtop.core_engine.config import ModelConfig, preset
from batchtop.core_engine.perf.device_peaks import DevicePeaks, datasheet_peaks
from batchtop.core_engine.model.cost import Chunk, step_cost
from batchtop.core_engine.perf.roofline import attention_time, device_time, marginal_sequence_cost
from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.simulate.calibration import Calibration
from batchtop.core_engine.run.frame import FrameBuilder
from batchtop.tui.widgets.engine.roofline import RooflinePanel
from tests.conftest import make_requests, tiny_config

HAND = ModelConfig("hand", vocab_size=10, hidden_size=4, intermediate_size=8, num_hidden_layers=1,
                   num_attention_heads=2, num_key_value_heads=1)


def test_one_decode_row_matches_a_hand_calculation():
    # one sequence decoding at position 5 (it sees 6 keys), fp32 (4 bytes), one sampled row
    cost = step_cost(HAND, "float32", [Chunk(start=5, num_tokens=1)], num_logit_rows=1)
    gemm_weights = 4 * 4 + 2 * 4 * 2 + 4 * 4 + 3 * 4 * 8  # q, k+v (kv_dim 2), o, gate+up+down = 144
    assert cost.weight_flops == 2 * gemm_weights + 2 * 4 * 10  # layer GEMMs + the lm_head row = 368
    assert cost.attn_flops == 4 * 2 * 2 * 6  # QK and PV: 4 * heads * head_dim * keys = 96
    assert cost.flops == 464
    assert cost.weight_bytes == (gemm_weights + 8 + 40 + 4) * 4  # + two norms, lm_head, final norm = 784
    assert cost.kv_bytes == 2 * 2 * 4 * (6 + 1)  # K and V rows: 6 read + 1 written = 112
    assert cost.bytes == 784 + 112 + 4 * (8 + 12 + 8 + 24 + 12)  # + activations in and out = 1152


def test_an_explicit_head_dim_biases_q_k_norms_and_a_tied_lm_head_are_counted():
    # Qwen3-like: head_dim 4 (not hidden / heads = 2), q/k/v biases, q/k RMSNorm, lm_head = embedding
    m = ModelConfig("qk", vocab_size=10, hidden_size=4, intermediate_size=8, num_hidden_layers=1,
                    num_attention_heads=2, num_key_value_heads=1, head_dim=4, attention_bias=True, qk_norm=True,
                    tie_word_embeddings=True)
    cost = step_cost(m, "float32", [Chunk(start=5, num_tokens=1)], num_logit_rows=1)
    gemm_weights = 4 * 8 + 2 * 4 * 4 + 8 * 4 + 3 * 4 * 8  # q (q_dim 8), k+v (kv_dim 4), o, MLP = 192
    assert cost.weight_flops == 2 * gemm_weights + 2 * 4 * 10
    assert cost.attn_flops == 4 * 2 * 4 * 6  # heads * head_dim, not hidden
    layer = gemm_weights + (8 + 2 * 4) + (2 * 4 + 2 * 4)  # + q/k/v biases + two norms and q/k norms = 224
    assert m.num_params() == 10 * 4 + layer + 4  # embedding (also the lm_head) + layer + final norm
    assert cost.weight_bytes == (layer + 40 + 4) * 4  # the tied lm_head is still read every step
    assert cost.kv_bytes == 2 * 4 * 4 * (6 + 1)
    assert cost.bytes == cost.weight_bytes + cost.kv_bytes + 4 * ((4 + 8) + 2 * (4 + 4) + (8 + 4) + 2 * (4 + 8) + (8 + 4))


def test_a_prefill_chunk_counts_causal_keys():
    cost = step_cost(HAND, "float32", [Chunk(start=3, num_tokens=4)], num_logit_rows=1)
    keys = 4 + 5 + 6 + 7  # positions 3..6 see 4..7 keys
    assert cost.attn_flops == 4 * 2 * 2 * keys


def test_a_prefill_chunk_reads_its_keys_once_per_tile_of_queries_not_once_per_query():
    """What a flash-attention kernel moves: the 4-token chunk reads its 7 keys once (and writes 4);
    300 tokens from position 0 are tiles of 128, 128 and 44 queries reading 128, 256 and 300 keys."""
    kv_row = 2 * 2 * 4  # K and V, kv_dim 2, fp32
    assert step_cost(HAND, "float32", [Chunk(3, 4)], 1).kv_bytes == kv_row * (7 + 4)
    long = step_cost(HAND, "float32", [Chunk(0, 300)], 1)
    assert long.kv_bytes == kv_row * (128 + 256 + 300 + 300)
    assert long.attn_flops == 4 * 2 * 2 * (300 * 301 // 2)  # the FLOPs still count every query's keys


def decode_step(batch: int, context: int = 512):
    return step_cost(preset("cpu-demo"), "bfloat16", [Chunk(context, 1)] * batch, num_logit_rows=batch)


def decode_frame(cost, rows: int) -> SimpleNamespace:
    """A frame whose newest decode step is `rows` decode rows and nothing else."""
    return SimpleNamespace(last_decode=SimpleNamespace(cost=cost, decode_cost=cost, num_decode_rows=rows,
                                                       num_prefill_tokens=0))


def test_gemm_intensity_grows_with_batch_but_attention_intensity_does_not():
    one, eight, sixty_four = decode_step(1), decode_step(8), decode_step(64)
    gemm = [c.weight_flops / c.weight_bytes for c in (one, eight, sixty_four)]
    assert gemm[1] / gemm[0] == pytest.approx(8, rel=0.01)
    assert gemm[2] / gemm[0] == pytest.approx(64, rel=0.01)
    attn = [c.attn_flops / c.kv_bytes for c in (one, eight, sixty_four)]
    assert attn[0] == pytest.approx(attn[1]) == pytest.approx(attn[2])
    assert one.intensity < eight.intensity < sixty_four.intensity


def test_one_more_sequence_is_nearly_free_below_the_ridge_and_proportional_above():
    cpu = DevicePeaks("cpu", peak_flops=400e9, peak_bytes_per_s=35e9, source="test")
    assert marginal_sequence_cost(decode_step(1), 1, cpu.peak_flops, cpu.peak_bytes_per_s) < 0.02
    compute_starved = DevicePeaks("slow-alu", peak_flops=1e9, peak_bytes_per_s=1e15, source="test")
    cost = marginal_sequence_cost(decode_step(64), 64, compute_starved.peak_flops, compute_starved.peak_bytes_per_s)
    assert cost == pytest.approx(1 / 64, rel=0.01)


@pytest.mark.parametrize("batch,context,peaks", [
    (1, 512, DevicePeaks("cpu", 170e9, 22e9, "test")),  # GEMMs and attention memory-bound
    (32, 1024, DevicePeaks("cpu", 170e9, 22e9, "test")),  # GEMMs compute-bound, attention memory-bound
    (512, 1100, DevicePeaks("h200", 989e12, 4.8e12, "test")),
])
def test_the_one_more_sequence_verdict_is_the_what_if_time_of_one_more_row(batch, context, peaks):
    at_peaks = Calibration(compute_efficiency=1.0, memory_efficiency=1.0, attention_efficiency=1.0,
                           step_overhead_s=1e-6)
    now, more = (at_peaks.device_time(decode_step(b, context), peaks) for b in (batch, batch + 1))
    verdict = marginal_sequence_cost(decode_step(batch, context), batch, peaks.peak_flops, peaks.peak_bytes_per_s)
    assert verdict == pytest.approx(more / now - 1, rel=1e-9)


def test_a_simulated_sessions_one_more_sequence_is_its_own_step_time_of_one_more_row():
    peaks = DevicePeaks("cpu", 170e9, 22e9, "test")
    cal = Calibration(compute_efficiency=2.2, memory_efficiency=4.0, attention_efficiency=0.6, step_overhead_s=0.007)
    now, more = (cal.step_time(decode_step(b, 300), peaks) for b in (32, 33))
    extra = cal.marginal_sequence_cost(decode_step(32, 300), 32, peaks)
    assert extra == pytest.approx(more / now - 1, rel=1e-9)
    at_peaks = marginal_sequence_cost(decode_step(32, 300), 32, peaks.peak_flops, peaks.peak_bytes_per_s)
    frame = decode_frame(decode_step(32, 300), 32)
    assert f"+1 seq +{100 * extra:.0f}%" in RooflinePanel(peaks, calibration=cal).verdict(frame)
    assert f"+1 seq +{100 * at_peaks:.0f}%" in RooflinePanel(peaks).verdict(frame)
    assert round(100 * extra) != round(100 * at_peaks)  # the overhead and the fitted roofs change the answer


@pytest.mark.parametrize("batch,context,peaks,verdict", [
    (1, 512, DevicePeaks("cpu", 170e9, 22e9, "test"), "decode x1: memory-bound, +1 seq +"),
    # a CPU's ridge (7.7 here) is what makes 32 rows compute-bound, and the verdict says so
    (32, 128, DevicePeaks("cpu", 170e9, 22e9, "test"),
     "decode x32: compute-bound on this device (ridge 8 FLOP/B), +1 seq +"),
    (512, 1100, DevicePeaks("h200", 989e12, 4.8e12, "test"), "decode x512: memory-bound, +1 seq +"),
])
def test_the_verdict_names_a_kernel_whose_roof_differs_from_the_steps(batch, context, peaks, verdict):
    # the step's intensity averages its GEMMs (past the ridge at 32 rows on a CPU, at 512 on an H200)
    # and its attention (a few FLOP per KV byte at any batch)
    frame = decode_frame(decode_step(batch, context), batch)
    text = RooflinePanel(peaks).verdict(frame)
    assert text.startswith(verdict)
    odd = {(1, 512): "", (32, 128): " · attention memory-bound", (512, 1100): " · GEMMs compute-bound"}
    assert text.endswith("%" + odd[batch, context])


def test_attention_reads_the_kv_at_its_own_roof_the_peak_unless_given():
    cost, flops, peak = decode_step(8, 1024), 170e9, 22e9
    assert cost.kv_bytes / cost.attn_flops > 1 / 7.7  # memory-bound attention at these roofs
    assert attention_time(cost, flops, peak) == pytest.approx(cost.kv_bytes / peak)
    assert attention_time(cost, flops, peak, 13e9) == pytest.approx(cost.kv_bytes / 13e9)
    # the GEMMs keep the peak bandwidth: only the KV read slows
    slower = device_time(cost, flops, peak, 13e9) - device_time(cost, flops, peak)
    assert slower == pytest.approx(cost.kv_bytes / 13e9 - cost.kv_bytes / peak)


@pytest.mark.parametrize("name,entry", [("NVIDIA H200", "H200"), ("NVIDIA H100 PCIe", "H100 PCIe"),
                                        ("NVIDIA H100 80GB HBM3", "H100"), ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB"),
                                        ("NVIDIA L4", "L4"), ("NVIDIA L40S", "L40S"),
                                        ("NVIDIA GeForce RTX 4090", "RTX 4090")])
def test_datasheet_lookup_by_device_name(name, entry):
    peaks = datasheet_peaks(name)
    assert peaks is not None and peaks.source == f"datasheet:{entry}"
    assert 10 < peaks.ridge_flop_per_byte < 1000


def test_unknown_devices_have_no_datasheet_entry():
    assert datasheet_peaks("AMD EPYC 9654") is None


def test_cpu_peaks_are_measured_once_then_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("BATCHTOP_CACHE_DIR", str(tmp_path))
    calls = []
    real_measure = dp.measure_peaks

    def small_measure(device, dtype):
        calls.append(device)
        return real_measure(device, dtype, copy_mib=8, gemm_n=128)

    monkeypatch.setattr(dp, "measure_peaks", small_measure)
    first = dp.device_peaks("cpu", "float32")
    second = dp.device_peaks("cpu", "float32")
    assert calls == ["cpu"]
    assert first.peak_flops > 1e8 and first.peak_bytes_per_s > 1e8
    assert second.source == first.source + " (cached)" and second.peak_flops == first.peak_flops
    assert len(list(tmp_path.glob("batchtop/peaks-*.json"))) == 1


def test_while_every_step_carries_a_prompt_chunk_the_verdict_asks_about_its_decode_rows():
    # a queue longer than the slots and a budget of 8 tokens: once the first requests decode, each step
    # also prefills a chunk of the next prompt, so no step is decode alone
    config = tiny_config(max_num_seqs=4, max_num_batched_tokens=8)
    engine, builder = Engine(config), FrameBuilder()
    for r in make_requests(8, seed=1, prompt=(20, 30), output=(8, 12)):
        engine.add_request(r)
    while True:
        snap = engine.step()
        builder.observe(snap)
        if snap.num_prefill_tokens and snap.num_decode_rows:
            break
    frame, rows = builder.frame("running"), snap.num_decode_rows
    assert frame.last_decode is snap
    one_token_each = step_cost(config.model, config.dtype, [Chunk(1, 1)] * rows, num_logit_rows=rows)
    assert snap.decode_cost.weight_flops == one_token_each.weight_flops < snap.cost.weight_flops
    peaks = DevicePeaks("cpu", 170e9, 22e9, "test")
    extra = marginal_sequence_cost(snap.decode_cost, rows, peaks.peak_flops, peaks.peak_bytes_per_s)
    assert RooflinePanel(peaks).verdict(frame).startswith(f"decode x{rows} (mixed): ")
    assert f"+1 seq +{100 * extra:.0f}%" in RooflinePanel(peaks).verdict(frame)


def test_a_steps_attention_work_and_kv_traffic_are_the_sums_of_its_rows_and_chunks():
    model = preset("cpu-demo")
    chunks = [Chunk(300, 1), Chunk(7, 1, keys_offset=0), Chunk(0, 200), Chunk(130, 129), Chunk(5, 1)]
    whole = step_cost(model, "bfloat16", chunks, num_logit_rows=4)
    alone = [step_cost(model, "bfloat16", [c], num_logit_rows=1) for c in chunks]
    assert whole.attn_flops == sum(a.attn_flops for a in alone)
    assert whole.kv_bytes == sum(a.kv_bytes for a in alone)
