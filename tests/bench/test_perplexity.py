"""bench/perplexity.py scores each next token with the engine's model forward: its perplexity is exp of
the mean NLL that single-prefix forwards give, token by token."""

from __future__ import annotations

import math

import pytest
import torch

import divergence
import perplexity as bench
from batchtop.core_engine.worker.model_runner import ModelRunner
from batchtop.gpu_kernels.attention.torch_reference import TorchReference
from tests.conftest import tiny_config

IDS = [17, 301, 5, 88, 402, 9, 256, 33, 120]  # 8 tokens to score after the first


def nll_by_prefixes(runner: ModelRunner, ids: list[int]) -> list[float]:
    """The other way: for each prefix alone, one fresh forward, its last row's logits, -log p(next) from
    logsumexp in float64."""
    out = []
    for k in range(1, len(ids)):
        last = bench.window_logits(runner, ids[:k])[-1].double()
        out.append((torch.logsumexp(last, 0) - last[ids[k]]).item())
    return out


@pytest.mark.parametrize("dtype, reference", [("float32", False), ("bfloat16", False), ("float32", True)],
                         ids=["float32", "bfloat16", "prefill-chunks"])
def test_perplexity_is_exp_of_the_mean_nll_that_forwards_over_each_prefix_give(dtype, reference):
    runner = ModelRunner(tiny_config(dtype=dtype))
    if reference:  # a backend that takes prompts as prefill chunks (CUDA's), not the CPU kernels' varlen rows
        runner.attention_backend = TorchReference()
        assert not runner.varlen_prompts
    ppl, scored = bench.perplexity(runner, IDS, context=64)
    nlls = nll_by_prefixes(runner, IDS)
    assert scored == 8 == len(nlls)
    assert ppl == pytest.approx(math.exp(sum(nlls) / len(nlls)), rel=1e-5 if dtype == "float32" else 1e-3)
    assert math.isfinite(ppl) and ppl > 1


def test_each_window_starts_afresh_and_its_first_token_is_not_scored():
    runner = ModelRunner(tiny_config())
    ppl, scored = bench.perplexity(runner, IDS, context=4)  # windows of 4, 4, 1 tokens: 3 + 3 + 0 scored
    nlls = nll_by_prefixes(runner, IDS[:4]) + nll_by_prefixes(runner, IDS[4:8])
    assert scored == 6
    assert ppl == pytest.approx(math.exp(sum(nlls) / 6), rel=1e-5)


@pytest.mark.parametrize("argv, message", [
    (["--context", "1"], "--context: must be >= 2, got 1"),
    (["--text", "/no/such.txt"], "--text: /no/such.txt is not a file"),
    (["--weights", "q8"], "--weights: unknown q8 (choose from quantized, dequantized)"),
    (["--model", "tiny", "--weights", "quantized"], "--weights: only a GGUF file has quantized weights"),
    (["--model", "tiny"], "--model: tiny has no tokenizer to read the text with"),
])
def test_bad_options_are_named_and_exit_2(argv, message, capsys):
    assert bench.main(argv) == 2
    assert message in capsys.readouterr().err


def test_a_first_difference_is_scored_by_the_rank_and_gap_of_the_other_engines_token():
    runner = ModelRunner(tiny_config())
    prompt = [3, 14, 15]
    ours = []
    for _ in range(4):  # the reference's own greedy answer
        ours.append(int(bench.window_logits(runner, prompt + ours)[-1].argmax()))
    logits = bench.window_logits(runner, prompt + ours[:2])[-1]
    second = int(logits.topk(2).indices[1])
    theirs = ours[:2] + [second, 0]  # the other engine took the runner-up at position 2
    found = divergence.first_differences(runner, [prompt, prompt], [ours, ours], [theirs, ours], n=4)
    assert [(f.question, f.position, f.our_rank, f.their_rank) for f in found] == [(0, 2, 1, 2)]
    logp = torch.log_softmax(logits, -1)
    assert found[0].gap_nats == pytest.approx((logp[ours[2]] - logp[second]).item())
    counts = divergence.summary(found)
    assert (counts["ours_top"], counts["theirs_top"], counts["max_rank"]) == (1, 0, 2)


def test_teacher_forced_agreement_counts_each_position_from_the_other_engines_own_context():
    runner = ModelRunner(tiny_config())
    prompt = [3, 14, 15]
    greedy = []
    for _ in range(5):
        greedy.append(int(bench.window_logits(runner, prompt + greedy)[-1].argmax()))
    runner_up = int(bench.window_logits(runner, prompt + greedy[:1])[-1].topk(2).indices[1])
    # the other engine took the runner-up at position 1 and then went on from its own text: every later
    # position is scored after that text, so the engine's own greedy choices from there agree
    theirs = greedy[:1] + [runner_up]
    for _ in range(3):
        theirs.append(int(bench.window_logits(runner, prompt + theirs)[-1].argmax()))
    found = divergence.forced_agreement(runner, [prompt, prompt], [theirs, greedy], n=5)
    assert (found.positions, found.agreeing) == (10, 9)
    logp = torch.log_softmax(bench.window_logits(runner, prompt + greedy[:1])[-1], -1)
    assert found.gap_nats_max == pytest.approx((logp.max() - logp[runner_up]).item(), rel=1e-5)
    assert divergence.forced_agreement(runner, [prompt], [theirs], n=1).agreeing == 1  # only the first n count
