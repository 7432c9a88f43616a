"""Hostile workload files, run as a user runs them: absurd sizes are refused alone and at once, bytes
that are not UTF-8 name their file and line, a byte order mark is fine, CSV rows name what they lack,
and unknown columns or fields are ignored with one warning."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from batchtop.core_engine.workload import spec as workload
from batchtop.core_engine.workload.spec import WorkloadSpec, load_workload
from batchtop.tui.cli import main
from tests.conftest import tiny_config

TINY = ["--model", "tiny", "--device", "cpu", "--dtype", "float32"]
HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
BILLION = 1_000_000_000


def headless(tmp_path, *args: str):
    out = tmp_path / "metrics.json"
    result = CliRunner().invoke(main, ["--headless", *TINY, "--time-scale", "0", "-o", str(out), *args])
    return result, (json.loads(out.read_text()) if out.exists() else None)


def jsonl(tmp_path, rows: list[dict], name: str = "w.jsonl") -> str:
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def assert_bad_input(result, *fragments: str) -> None:
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert "Traceback" not in result.output and result.exception is None or isinstance(result.exception, SystemExit)
    for fragment in fragments:
        assert fragment in result.output, (fragment, result.output)


# -- 6: absurd sizes ------------------------------------------------------------------------------

@pytest.mark.parametrize("huge", [
    {"id": "huge", "prompt_len": BILLION, "max_tokens": 4},
    {"id": "huge", "prompt_len": 2 ** 62, "max_tokens": 4},
    {"id": "huge", "prompt_len": 5, "max_tokens": BILLION},
])
def test_a_billion_token_request_in_jsonl_is_refused_alone_and_the_run_goes_on(tmp_path, huge):
    path = jsonl(tmp_path, [{"id": "a", "prompt_len": 5, "max_tokens": 3}, huge,
                            {"id": "b", "prompt_len": 6, "max_tokens": 2}])
    result, metrics = headless(tmp_path, "--workload", path)
    assert result.exit_code == 0, result.output
    assert metrics["requests"] == {"submitted": 3, "completed": 2, "rejected": 1}
    assert "rejected request 'huge': prompt" in result.stderr and "exceeds max_model_len 4096" in result.stderr


def test_a_billion_token_row_in_an_azure_csv_is_refused_alone(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(HEADER + "2023-11-16 18:15:46.1,7,3\n"
                    f"2023-11-16 18:15:46.2,{BILLION},3\n2023-11-16 18:15:46.3,9,2\n", encoding="utf-8")
    result, metrics = headless(tmp_path, "--workload", str(path))
    assert result.exit_code == 0, result.output
    assert metrics["requests"] == {"submitted": 3, "completed": 2, "rejected": 1}
    assert f"prompt {BILLION} + max_tokens 3" in result.stderr


def test_an_unservable_length_only_prompt_is_never_built():
    config = tiny_config(num_kv_blocks=8, block_size=4)  # 32 tokens of KV
    spec = WorkloadSpec(path="synthetic", num_requests=4, prompt_mean=1e12, output_mean=4, seed=1)
    requests = load_workload(spec, 512, config=config)
    assert all(isinstance(r.prompt_token_ids, workload.UnbuiltPrompt) and r.prompt_len > 10 ** 9 for r in requests)
    fits = load_workload(WorkloadSpec(path="synthetic", num_requests=4, prompt_mean=4, output_mean=4), 512,
                         config=config)
    assert all(isinstance(r.prompt_token_ids, tuple) for r in fits)  # what fits is built as before


# -- 7: bytes that are not UTF-8 --------------------------------------------------------------------

def bad_utf8(tmp_path, name: str, lines: list[bytes]) -> str:
    path = tmp_path / name
    path.write_bytes(b"\n".join(lines) + b"\n")
    return str(path)


@pytest.mark.parametrize("name,lines", [
    ("w.jsonl", [b'{"prompt_len": 3, "max_tokens": 2}', b'{"prompt_len": 4, "max_tokens": 2}',
                 b'{"id": "caf\xe9", "prompt_len": 4, "max_tokens": 2}']),
    ("t.csv", [HEADER.strip().encode(), b"2023-11-16 18:15:46.1,3,4", b"2023-11-16 18:15:47.1,3,4\xff"]),
    ("sharegpt.json", [b'[{"conversations": [', b'{"from": "human", "value": "hi"},',
                       b'{"from": "gpt", "value": "\xc3\x28"}]}]']),
])
def test_invalid_utf8_in_a_workload_file_names_the_file_and_line(tmp_path, name, lines):
    path = bad_utf8(tmp_path, name, lines)
    result, _ = headless(tmp_path, "--workload", path)
    assert_bad_input(result, f"{path}:3: not UTF-8 text")


def test_invalid_utf8_in_a_script_or_a_calibration_file_names_the_file_and_line(tmp_path):
    script = bad_utf8(tmp_path, "demo.json", [b'[{"at": 0,', b' "caption": "na\xefve"}]'])
    result, _ = headless(tmp_path, "--script", script, "--num-requests", "2")
    assert_bad_input(result, f"{script}:2: not UTF-8 text")
    calibration = bad_utf8(tmp_path, "cal.json", [b'{"compute_efficiency": 0.5,', b'"memory_efficiency": 0.8,',
                                                  b'"step_overhead_s": 0.002, "note": "\x80"}'])
    out = tmp_path / "sim.json"
    result = CliRunner().invoke(main, ["--headless", "--model", "tiny", "--simulate", "cpu", "--calibration",
                                       calibration, "--num-requests", "2", "-o", str(out)])
    assert_bad_input(result, f"{calibration}: not UTF-8 text", "at line 3")


# -- 8: byte order marks, formats, CSV rows, unknown columns --------------------------------------

def test_a_byte_order_mark_at_the_start_of_jsonl_or_csv_is_accepted(tmp_path):
    bom = b"\xef\xbb\xbf"
    (tmp_path / "w.jsonl").write_bytes(bom + b'{"id": "a", "prompt_len": 3, "max_tokens": 2}\n')
    (tmp_path / "t.csv").write_bytes(bom + (HEADER + "2023-11-16 18:15:46.1,3,4\n").encode())
    (tmp_path / "noext").write_bytes(bom + b'{"id": "a", "prompt_len": 3, "max_tokens": 2}\n')
    for name in ("w.jsonl", "t.csv", "noext"):
        result, metrics = headless(tmp_path, "--workload", str(tmp_path / name))
        assert result.exit_code == 0, (name, result.output)
        assert metrics["requests"]["completed"] == 1


def test_a_jsonl_file_is_never_reported_as_not_an_azure_csv(tmp_path):
    path = tmp_path / "w.jsonl"
    path.write_text('["not", "an object"]\n{"prompt_len": 3, "max_tokens": 2}\n', encoding="utf-8")
    result, _ = headless(tmp_path, "--workload", str(path))
    assert_bad_input(result, f"{path}:1: each line must be a JSON object")
    assert "Azure" not in result.output
    path.write_text('prompt_len=3\n', encoding="utf-8")
    result, _ = headless(tmp_path, "--workload", str(path))
    assert_bad_input(result, f"{path}:1: not JSON")
    assert "Azure" not in result.output


@pytest.mark.parametrize("row,message", [
    ("2023-11-16 18:15:47.1,5", "bad row: missing GeneratedTokens (the row has 2 of 3 values)"),
    ("2023-11-16 18:15:47.1", "bad row: missing ContextTokens, GeneratedTokens"),
    ("2023-11-16 18:15:47.1,5,", "bad row: GeneratedTokens '' is not an integer"),
    ("2023-11-16 18:15:47.1,5,6,7", "bad row: it has 4 values, the header names 3 columns"),
    ("yesterday,5,6", "bad row: TIMESTAMP 'yesterday' is not a time"),
])
def test_a_bad_csv_row_names_its_line_and_the_column(tmp_path, row, message):
    path = tmp_path / "t.csv"
    path.write_text(HEADER + "2023-11-16 18:15:46.1,3,4\n" + row + "\n", encoding="utf-8")
    result, _ = headless(tmp_path, "--workload", str(path))
    assert_bad_input(result, f"{path}:3: {message}")


def test_unknown_csv_columns_and_jsonl_fields_are_ignored_with_one_warning(tmp_path):
    csv_path = tmp_path / "t.csv"
    csv_path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens,Model\n2023-11-16 18:15:46.1,3,4,x\n"
                        "2023-11-16 18:15:46.2,5,2,y\n", encoding="utf-8")
    result, metrics = headless(tmp_path, "--workload", str(csv_path))
    assert result.exit_code == 0 and metrics["requests"]["completed"] == 2
    assert result.stderr.count("warning") == 1 and f"{csv_path}:1: ignoring column(s) Model" in result.stderr
    path = jsonl(tmp_path, [{"id": "a", "prompt_len": 3, "max_tokens": 2, "max_token": 9},
                            {"id": "b", "prompt_len": 3, "max_tokens": 2, "priority": 1, "max_token": 1}])
    result, metrics = headless(tmp_path, "--workload", path)
    assert result.exit_code == 0 and metrics["requests"]["completed"] == 2
    assert result.stderr.count("warning") == 1
    assert f"{path}:1: ignoring unknown field(s) max_token, priority (known: " in result.stderr


def test_a_per_request_seed_outside_what_sampling_accepts_names_the_line(tmp_path):
    path = jsonl(tmp_path, [{"prompt_len": 3, "max_tokens": 2}, {"prompt_len": 3, "max_tokens": 2,
                                                                 "temperature": 1.0, "seed": 2 ** 64}])
    result, _ = headless(tmp_path, "--workload", path)
    assert_bad_input(result, f"{path}:2: seed must be an integer in -2**63..2**64-1")


def test_json_nested_past_the_parser_or_with_a_huge_integer_names_the_line(tmp_path):
    path = tmp_path / "w.jsonl"
    path.write_text('{"prompt_len": 3, "max_tokens": 2}\n' + "[" * 100_000 + "\n", encoding="utf-8")
    result, _ = headless(tmp_path, "--workload", str(path))
    assert_bad_input(result, f"{path}:2: not JSON (nested too deeply)")
    path.write_text('{"prompt_len": 3, "max_tokens": 2}\n{"prompt_len": 1' + "0" * 5000 + ', "max_tokens": 2}\n',
                    encoding="utf-8")
    result, _ = headless(tmp_path, "--workload", str(path))
    assert_bad_input(result, f"{path}:2: not JSON")
    path.write_text('{"prompt_len": 1' + "0" * 400 + ', "max_tokens": 2}\n', encoding="utf-8")  # past a float
    result, _ = headless(tmp_path, "--workload", str(path))
    assert_bad_input(result, f"{path}:1: prompt_len must be at most 2**63-1, got an integer of 401 digits")


def test_a_model_directorys_chat_template_that_is_not_utf8_is_bad_input(tmp_path):
    model = tmp_path / "tiny-hf"
    assert CliRunner().invoke(main, ["export-checkpoint", str(model), "--model", "tiny"]).exit_code == 0
    (model / "chat_template.jinja").write_bytes(b"{{ messages }}\xff")
    out = tmp_path / "m.json"
    result = CliRunner().invoke(main, ["--headless", "--model", str(model), "--device", "cpu", "--num-requests", "2",
                                       "--time-scale", "0", "-o", str(out)])
    assert_bad_input(result, f"{model / 'chat_template.jinja'}: not UTF-8 text (byte 0xff at column 15)")


@pytest.mark.parametrize("at", ["NaN", "Infinity"])
def test_a_script_action_at_nan_or_infinity_is_refused_naming_the_action(tmp_path, at):
    script = tmp_path / "demo.json"
    script.write_text(f'[{{"at": 0, "caption": "go"}}, {{"at": {at}, "quit": true}}]', encoding="utf-8")
    result, _ = headless(tmp_path, "--script", str(script), "--num-requests", "2")
    assert_bad_input(result, f"{script}: action 2: 'at' must be seconds >= 0, got {float(at)!r}")


def test_a_synthetic_workload_of_a_billion_requests_is_refused_before_it_is_generated(tmp_path):
    result, _ = headless(tmp_path, "--workload", "synthetic", "--num-requests", str(BILLION))
    assert_bad_input(result, "--num-requests: a synthetic workload is generated in memory: at most 1000000")


def test_a_workload_from_a_fifo_is_read_and_a_directory_is_named(tmp_path):
    import os
    import threading
    fifo = tmp_path / "w.fifo"
    os.mkfifo(fifo)
    body = b'{"id": "a", "prompt_len": 3, "max_tokens": 2}\n{"id": "b", "prompt_len": 4, "max_tokens": 2}\n'
    writer = threading.Thread(target=lambda: fifo.write_bytes(body), daemon=True)  # as <(zcat w.jsonl.gz) does
    writer.start()
    result, metrics = headless(tmp_path, "--workload", str(fifo))
    writer.join(10)
    assert result.exit_code == 0, result.output
    assert metrics["requests"]["completed"] == 2
    result, _ = headless(tmp_path, "--workload", str(tmp_path))
    assert_bad_input(result, f"{tmp_path}: is a directory, not a workload file")


def test_a_sharegpt_dataset_with_a_byte_order_mark_loads(tmp_path):
    model = tmp_path / "tiny-hf"
    assert CliRunner().invoke(main, ["export-checkpoint", str(model), "--model", "tiny"]).exit_code == 0
    data = [{"conversations": [{"from": "human", "value": "hello there"}, {"from": "gpt", "value": "hi, friend"}]}]
    path = tmp_path / "sharegpt.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(data).encode())
    out = tmp_path / "m.json"
    result = CliRunner().invoke(main, ["--headless", "--model", str(model), "--device", "cpu", "--workload", str(path),
                                       "--time-scale", "0", "--ignore-eos", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["requests"]["completed"] == 1


def test_a_script_and_a_calibration_from_a_fifo_are_read_and_directories_named(tmp_path):
    import os
    import threading
    script, calibration = tmp_path / "demo.fifo", tmp_path / "cal.fifo"
    for fifo, body in ((script, b'[{"at": 0, "caption": "from a pipe"}]'),
                       (calibration, b'{"compute_efficiency": 0.5, "memory_efficiency": 0.7, "step_overhead_s": 0.001}')):
        os.mkfifo(fifo)
        threading.Thread(target=lambda f=fifo, b=body: f.write_bytes(b), daemon=True).start()
    result, metrics = headless(tmp_path, "--script", str(script), "--num-requests", "2")
    assert result.exit_code == 0, result.output
    out = tmp_path / "sim.json"
    result = CliRunner().invoke(main, ["--headless", "--model", "tiny", "--simulate", "cpu", "--calibration",
                                       str(calibration), "--num-requests", "2", "--time-scale", "0", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["simulated"]["calibration"]["compute_efficiency"] == 0.5
    result, _ = headless(tmp_path, "--script", str(tmp_path))
    assert_bad_input(result, f"{tmp_path}: is a directory, not a script")
