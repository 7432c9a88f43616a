"""bench/peer_llamacpp.py's parts that need no llama.cpp: agreement counting, the table, argument errors,
and the one HTTP client against a real batchtop server (the tiny preset)."""

from __future__ import annotations

import pytest

import llamacpp_server
import peer_llamacpp
from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.sched.request import Request
from http_engines import Answer, BatchtopEngine, Pass, run_pass
from tests.conftest import run_all, tiny_config
from tests.support.serving import serving
from token_agreement import agreement


def test_agreement_counts_the_prefix_before_the_first_difference_and_each_position_apart():
    pairs = [([1, 2, 3, 4], [1, 2, 3, 4]),  # identical
             ([1, 2, 9, 4], [1, 2, 3, 4]),  # differs at 2, agrees again at 3
             ([5, 6], [5, 6, 7, 8]),  # one ends early (its EOS): the missing positions disagree
             ([1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 0, 0])]  # past n: not counted
    found = agreement(pairs, n=4)
    assert found.tokens == 16
    assert found.prefix == 4 + 2 + 2 + 4
    assert found.positional == 4 + 3 + 2 + 4
    assert found.identical == 2
    assert found.prefix_share == pytest.approx(12 / 16)
    assert found.as_dict()["positional_share"] == pytest.approx(13 / 16)


def answer(sent: float, arrivals: list[float]) -> Answer:
    return Answer(sent, list(range(len(arrivals))), arrivals)


def test_a_pass_gives_tok_s_over_its_wall_and_ttft_tpot_per_request():
    timed = Pass(2.0, [answer(0.0, [0.5, 0.6, 0.7]), answer(0.0, [1.0, 1.3, 1.6, 1.9, 2.0])])
    s = peer_llamacpp.summarize(timed)
    assert s["generated"] == 8 and s["tok_s"] == pytest.approx(4.0)
    assert s["ttft_p50_s"] == pytest.approx(0.75)  # between 0.5 and 1.0
    assert s["tpot_p50_s"] == pytest.approx((0.1 + 0.25) / 2)


def test_the_table_takes_each_engines_median_over_rounds_and_the_ratio_batchtop_over_llamacpp():
    def run(tok_s: float, tpot: float) -> dict:
        return {"tok_s": tok_s, "ttft_p50_s": 0.2, "ttft_p90_s": 0.4, "tpot_p50_s": tpot, "tpot_p90_s": None}

    median = peer_llamacpp.medians({"batchtop": [run(100, 0.02), run(120, 0.04), run(500, 0.03)],
                                    "llama.cpp": [run(200, 0.01), run(240, 0.01)]})
    assert median["batchtop"]["tok_s"] == 120 and median["llama.cpp"]["tok_s"] == 220
    ratio = peer_llamacpp.ratios(median)
    assert ratio["tok_s"] == pytest.approx(120 / 220) and ratio["tpot_p50_s"] == pytest.approx(3.0)
    assert ratio["tpot_p90_s"] is None
    lines = peer_llamacpp.table(median).splitlines()
    assert lines[1].split() == ["generated", "tok/s", "120.0", "220.0", "0.55"]
    assert lines[4].split() == ["TPOT", "p50", "ms", "30.00", "10.00", "3.00"]
    assert lines[5].split()[-3:] == ["-", "-", "-"]


def test_the_report_sets_batchtops_agreement_beside_llamacpps_against_itself_free_running_and_teacher_forced():
    pairs = [([1, 2, 3, 4], [1, 2, 9, 9]), ([5, 6, 7, 8], [5, 6, 7, 8])]
    result = {"llamacpp_self_agreement": agreement(pairs, 4).as_dict(),
              "teacher_forced": {"agreeing": 7, "positions": 8, "share": 7 / 8, "gap_nats_median": 0.1,
                                 "gap_nats_max": 0.2},
              "teacher_forced_exact": {"share": 1.0}, "llamacpp_self_forced": {"share": 0.75}}
    own, forced = peer_llamacpp.calibration_lines(result)
    assert "-fa off vs its default" in own and "prefix 6 / 8 = 75.0%" in own and "1 answers identical" in own
    assert "llama.cpp's next at 7 / 8 = 87.5%" in forced and "exact math (float32, dequantized) 100.0%" in forced
    assert forced.endswith("llama.cpp -fa off 75.0%")


def test_a_missing_llama_server_is_named_and_exits_2(tmp_path, capsys):
    missing = tmp_path / "no-such-llama-server"
    assert peer_llamacpp.main(["--llama-server", str(missing), "--gguf", __file__]) == 2
    assert f"--llama-server: {missing} is not an executable file" in capsys.readouterr().err


def test_without_a_build_or_a_build_dir_it_says_how_to_get_llama_server(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(llamacpp_server, "DEFAULT_SERVER", tmp_path / "absent")
    assert peer_llamacpp.main(["--gguf", __file__]) == 2
    err = capsys.readouterr().err
    assert "--llama-server: no llama-server at" in err and "--build-dir DIR" in err


def test_a_missing_gguf_file_is_named_and_exits_2(tmp_path, capsys):
    assert peer_llamacpp.main(["--gguf", str(tmp_path / "x.gguf")]) == 2
    assert f"--gguf: {tmp_path / 'x.gguf'} is not a file" in capsys.readouterr().err


def test_counts_below_one_are_refused_by_the_option():
    with pytest.raises(SystemExit) as exit_:
        peer_llamacpp.parse_args(["--slots", "0"])
    assert exit_.value.code == 2


@pytest.mark.parametrize("batch", [1, None])
def test_the_client_streams_batchtops_greedy_tokens_as_the_engine_makes_them_offline(batch):
    prompts = [[5, 9, 13], [7, 7, 7, 7, 7, 1], [300, 2]]
    offline, _, _ = run_all(Engine(tiny_config(max_num_seqs=16, num_kv_blocks=1024)),
                            [Request(f"p{i}", tuple(p), 6) for i, p in enumerate(prompts)])
    with serving() as server:
        timed = run_pass(BatchtopEngine("batchtop", server.url), prompts, 6, batch=batch)
    assert [a.tokens for a in timed.answers] == [list(offline[f"p{i}"]) for i in range(len(prompts))]
    assert timed.generated == 18
    for a in timed.answers:
        assert a.sent < a.arrivals[0] <= a.arrivals[-1] and a.ttft_s > 0 and a.tpot_s >= 0


def test_teacher_forcing_a_server_along_its_own_greedy_answers_agrees_everywhere_and_a_changed_token_is_caught():
    prompts = [[5, 9, 13], [300, 2]]
    with serving() as server:
        engine = BatchtopEngine("batchtop", server.url)
        answers = [a.tokens for a in run_pass(engine, prompts, 5).answers]
        assert peer_llamacpp.forced_by_server(engine, prompts, answers, 5, slots=4) == {
            "positions": 10, "agreeing": 10, "share": 1.0}
        # another engine's answer: the runner-up-like token at position 2, then greedy from its own text
        turned = answers[0][:2] + [(answers[0][2] + 1) % 512]
        turned += run_pass(engine, [prompts[0] + turned], 2).answers[0].tokens
        found = peer_llamacpp.forced_by_server(engine, prompts, [turned, answers[1]], 5, slots=4)
    assert found["agreeing"] == 9  # only the turned position: each later one is asked from that answer's text
