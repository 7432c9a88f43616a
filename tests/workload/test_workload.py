"""Workload files and traces: good ones load, bad ones name the file and line."""

from __future__ import annotations

import json

import pytest

from batchtop.core_engine.errors import BadInput, WorkloadError
from batchtop.core_engine.workload.spec import DEFAULT_TRACE, WorkloadSpec, load_workload, make_burst

VOCAB = 512


def write_lines(tmp_path, lines, name="w.jsonl"):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def test_jsonl_with_lengths_or_token_ids_loads_sorted_by_arrival(tmp_path):
    path = write_lines(tmp_path, [
        json.dumps({"id": "late", "prompt_len": 5, "max_tokens": 3, "arrival_s": 2.0}),
        json.dumps({"prompt_token_ids": [1, 2, 3], "max_tokens": 4}),
        "",
    ])
    reqs = load_workload(WorkloadSpec(path=path), VOCAB)
    assert [r.id for r in reqs] == ["line2", "late"]
    assert reqs[0].prompt_token_ids == (1, 2, 3) and reqs[1].prompt_len == 5 and reqs[1].arrival_s == 2.0


@pytest.mark.parametrize("line,message", [
    ("{not json", "not JSON"),
    ('{"max_tokens": 3}', "missing prompt_len"),
    ('{"prompt_len": 4}', "missing max_tokens"),
    ('{"prompt_len": 0, "max_tokens": 3}', "empty prompt"),
    ('{"prompt_token_ids": [], "max_tokens": 3}', "empty prompt"),
    ('{"prompt_token_ids": [1, 9999], "max_tokens": 3}', "token id 9999 outside the vocabulary"),
    ('{"prompt_len": 4, "max_tokens": 0}', "max_tokens must be >= 1"),
    ('{"prompt_len": "4", "max_tokens": 2}', "prompt_len must be an integer"),
    ('{"prompt_len": 4, "max_tokens": 2, "arrival_s": -1}', "arrival_s must be a number >= 0"),
    ('{"prompt_len": 4, "max_tokens": 2, "temperature": NaN}', "temperature must be a number >= 0"),
    ('{"prompt_len": 4, "max_tokens": 2, "temperature": true}', "temperature must be a number >= 0"),
    ('{"prompt_len": 4, "max_tokens": 2, "top_p": Infinity}', "top_p must be in (0, 1]"),
    ('[1, 2]', "must be a JSON object"),
])
def test_a_bad_line_is_an_error_naming_file_and_line(tmp_path, line, message):
    path = write_lines(tmp_path, ['{"prompt_len": 3, "max_tokens": 2}', line])
    with pytest.raises(WorkloadError) as info:
        load_workload(WorkloadSpec(path=path), VOCAB)
    assert f"{path}:2:" in str(info.value) and message in str(info.value)


def test_duplicate_ids_and_missing_files_are_errors(tmp_path):
    path = write_lines(tmp_path, ['{"id": "a", "prompt_len": 3, "max_tokens": 2}'] * 2)
    with pytest.raises(WorkloadError, match=r":2: duplicate id 'a'"):
        load_workload(WorkloadSpec(path=path), VOCAB)
    with pytest.raises(WorkloadError, match="no such workload file"):
        load_workload(WorkloadSpec(path=str(tmp_path / "nope.jsonl")), VOCAB)


def test_azure_trace_reads_arrivals_relative_to_the_first_and_scales(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    "2023-11-16 18:15:46.6805900,374,44\n"
                    "2023-11-16 18:15:50.9951690,396,109\n", encoding="utf-8")
    reqs = load_workload(WorkloadSpec(path=str(path), prompt_scale=0.5, output_scale=0.25, time_scale=2.0), VOCAB)
    assert [r.prompt_len for r in reqs] == [187, 198]
    assert [r.max_tokens for r in reqs] == [11, 27]
    assert reqs[0].arrival_s == 0.0 and reqs[1].arrival_s == pytest.approx(2 * 4.314579, abs=1e-6)


def test_azure_trace_with_a_bad_row_names_the_line(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,3,4\n"
                    "2023-11-16 18:15:47.1,x,4\n", encoding="utf-8")
    with pytest.raises(WorkloadError, match=r"t.csv:3: bad row"):
        load_workload(WorkloadSpec(path=str(path)), VOCAB)
    wrong = tmp_path / "wrong.csv"
    wrong.write_text("a,b\n1,2\n", encoding="utf-8")
    with pytest.raises(WorkloadError, match="missing column"):
        load_workload(WorkloadSpec(path=str(wrong)), VOCAB)


def test_the_bundled_trace_is_real_and_varied():
    reqs = load_workload(WorkloadSpec(), VOCAB)
    assert len(reqs) == 1000 and DEFAULT_TRACE.with_name("README.md").read_text().count("CC-BY 4.0")
    outputs = sorted(r.max_tokens for r in reqs)
    assert outputs[-1] > 4 * outputs[500] > 8 * outputs[100]  # a long tail: what makes static batching waste
    assert reqs[-1].arrival_s > 60


def test_synthetic_is_seeded_and_skewed():
    a = load_workload(WorkloadSpec(path="synthetic", num_requests=300, seed=1, rate=10.0), VOCAB)
    b = load_workload(WorkloadSpec(path="synthetic", num_requests=300, seed=1, rate=10.0), VOCAB)
    assert a == b and len(a) == 300
    outs = sorted(r.max_tokens for r in a)
    assert outs[-1] > 3 * outs[150]
    assert 15 < a[-1].arrival_s < 60  # Poisson at 10/s for 300 requests


def test_slicing_and_bad_scales(tmp_path):
    assert len(load_workload(WorkloadSpec(num_requests=7), VOCAB)) == 7
    with pytest.raises(BadInput, match="prompt_scale"):
        load_workload(WorkloadSpec(prompt_scale=0), VOCAB)
    with pytest.raises(BadInput, match="time_scale"):
        load_workload(WorkloadSpec(time_scale=-1), VOCAB)


def test_burst_draws_lengths_from_the_workload():
    template = load_workload(WorkloadSpec(num_requests=50), VOCAB)
    burst = make_burst(template, 20, seed=3, vocab_size=VOCAB, tag="burst1")
    lengths = {(r.prompt_len, r.max_tokens) for r in template}
    assert len(burst) == 20 and all((r.prompt_len, r.max_tokens) in lengths for r in burst)
    assert len({r.id for r in burst}) == 20
