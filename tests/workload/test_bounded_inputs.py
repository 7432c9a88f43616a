"""Files batchtop reads are read in bounded pieces (issue 41, finding 4): a FIFO fed without end, a
file over its cap and a gzip file that inflates past it are refused naming the cap, never read until
the memory runs out; a .jsonl.gz workload works; a path that cannot be read says why (a symlink
loop is not "no such file"); and text no tokenizer takes (a lone surrogate, finding 11) names its line."""

from __future__ import annotations

import gzip
import json
import os
import re
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from batchtop.core_engine.errors import ConfigError, WorkloadError
from batchtop.core_engine.model.tokenizer import Tokenizer
from batchtop.core_engine.run.script import load_script
from batchtop.core_engine.simulate.calibration import load_calibration
from batchtop.core_engine.trace import trace as trace_module
from batchtop.core_engine.trace.trace import TraceError, read_trace
from batchtop.core_engine.workload import spec as workload
from batchtop.core_engine.workload.spec import read_workload_file
from batchtop.tui.cli import main
from tests.support.hf_checkpoints import tokenizer as bpe_tokenizer

LINE = b'{"prompt_len": 1, "max_tokens": 1}\n'
TINY = ["--model", "tiny", "--device", "cpu", "--dtype", "float32", "--time-scale", "0"]


def fifo_fed(tmp_path: Path, data: bytes, name: str = "fifo") -> Path:
    """A FIFO a thread writes `data` into (as `yes ... > fifo &` would, but ending), for one reader."""
    path = tmp_path / name
    os.mkfifo(path)

    def feed() -> None:
        try:
            with open(path, "wb") as f:
                f.write(data)
        except BrokenPipeError:  # the reader stopped at its cap
            pass

    threading.Thread(target=feed, daemon=True).start()
    return path


def test_a_fifo_that_never_stops_is_refused_at_the_workload_cap(tmp_path, monkeypatch):
    monkeypatch.setattr(workload, "MAX_WORKLOAD_BYTES", 1 << 20)
    path = fifo_fed(tmp_path, LINE * ((3 << 20) // len(LINE)))  # three times the cap
    started = time.monotonic()
    with pytest.raises(WorkloadError) as err:
        read_workload_file(path, 512)
    assert str(err.value) == f"{path}: more than 1 MiB, the most batchtop reads from a workload file"
    assert time.monotonic() - started < 5


def test_a_file_over_the_cap_is_refused_from_its_size_and_a_gzip_bomb_once_it_inflates_past_it(tmp_path, monkeypatch):
    monkeypatch.setattr(workload, "MAX_WORKLOAD_BYTES", 1 << 20)
    big = tmp_path / "big.jsonl"
    big.write_bytes(LINE * ((3 << 19) // len(LINE) + 1))
    with pytest.raises(WorkloadError, match=r"big.jsonl: 1.5 MiB, larger than 1 MiB, the most batchtop reads from a "
                                            r"workload file"):
        read_workload_file(big, 512)
    bomb = tmp_path / "bomb.jsonl.gz"
    bomb.write_bytes(gzip.compress(LINE * ((4 << 20) // len(LINE))))  # a few KB that inflate to 4 MiB
    assert bomb.stat().st_size < 1 << 16
    with pytest.raises(WorkloadError, match="bomb.jsonl.gz: more than 1 MiB once gunzipped, the most batchtop reads"):
        read_workload_file(bomb, 512)


def test_gzip_workloads_work_by_the_suffix_under_gz_and_a_cut_one_is_named(tmp_path):
    rows = [{"id": f"r{i}", "prompt_len": 4 + i, "max_tokens": 2} for i in range(3)]
    jsonl = tmp_path / "w.jsonl.gz"
    jsonl.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode()))
    csv = tmp_path / "t.csv.gz"
    csv.write_bytes(gzip.compress(b"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,7,3\n"
                                  b"2023-11-16 18:15:46.5,9,2\n"))
    out = tmp_path / "m.json"
    result = CliRunner().invoke(main, ["--headless", *TINY, "--workload", str(jsonl), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["requests"]["completed"] == 3
    assert [(r.prompt_len, r.max_tokens) for r in read_workload_file(csv, 512)] == [(7, 3), (9, 2)]
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(jsonl.read_bytes()[:-12])
    with pytest.raises(WorkloadError, match=r"cut.jsonl.gz: not a readable gzip file \(Compressed file ended"):
        read_workload_file(cut, 512)


def test_a_calibration_fifo_and_a_trace_line_without_end_are_refused_at_their_caps(tmp_path, monkeypatch):
    path = fifo_fed(tmp_path, b'{"compute_efficiency": 1,' * (1 << 16), "calibration")  # 1.6 MiB of it
    with pytest.raises(ConfigError, match="more than 1 MiB, the most batchtop reads from a calibration file"):
        load_calibration(str(path))
    monkeypatch.setattr(trace_module, "MAX_LINE_BYTES", 1 << 20)
    path = fifo_fed(tmp_path, b"x" * (3 << 20), "trace")  # no newline, ever
    with pytest.raises(TraceError, match=r"trace:1: a line longer than 1 MiB, the most batchtop reads as one trace "
                                         r"event"):
        read_trace(str(path))


def test_a_symlink_loop_or_a_dangling_symlink_says_so(tmp_path):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    dangling = tmp_path / "dangling.jsonl"
    dangling.symlink_to(tmp_path / "gone.jsonl")
    loop_words = "a symlink loop (it leads back to itself)"
    with pytest.raises(WorkloadError, match=re.escape(f"loop: {loop_words}, not a workload file")):
        read_workload_file(loop, 512)
    with pytest.raises(WorkloadError, match=re.escape(f"a symlink to {tmp_path}/gone.jsonl, which does not exist: "
                                                      "no such workload file")):
        read_workload_file(dangling, 512)
    with pytest.raises(ConfigError, match=re.escape(f"{loop_words}, not a calibration file")):
        load_calibration(str(loop))
    with pytest.raises(TraceError, match=re.escape(f"{loop_words}, not a trace file")):
        read_trace(str(loop))
    with pytest.raises(WorkloadError, match=re.escape(f"{loop_words}, not a script file")):
        load_script(str(loop))
    for args in (["--headless", *TINY, "--workload", "synthetic", "--num-requests", "1", "-o", str(loop)],
                 ["export-checkpoint", str(loop), "--model", "tiny"]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2 and f"{loop}: {loop_words}" in result.output, result.output


def test_export_checkpoint_to_an_empty_path_says_the_path_is_empty():
    result = CliRunner().invoke(main, ["export-checkpoint", "", "--model", "tiny"])
    assert result.exit_code == 2 and "DIR: the path is empty: name the directory to create" in result.output, \
        result.output


# -- finding 11: a lone surrogate, in the file or written by the chat template -------------------------

@pytest.fixture(scope="module")
def bpe():
    return bpe_tokenizer()


def chat_tokenizer(bpe, template: str) -> Tokenizer:
    return Tokenizer(bpe, chat_template=template, chat_template_origin="m/tokenizer_config.json")


def test_a_template_that_writes_a_lone_surrogate_is_named_with_the_line(bpe, tmp_path):
    path = tmp_path / "w.jsonl"
    path.write_text(json.dumps({"id": "ok", "prompt": "Hello", "max_tokens": 2}) + "\n"
                    + json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}) + "\n")
    tok = chat_tokenizer(bpe, "{{ '\\ud800' }}{% for m in messages %}{{ m['content'] }}{% endfor %}")
    with pytest.raises(WorkloadError) as err:
        read_workload_file(path, 512, tok)
    assert str(err.value) == (f"{path}:2: messages: the model's chat template (m/tokenizer_config.json) wrote a lone "
                              "surrogate (U+D800, not a character) at character 0 into the prompt")


@pytest.mark.parametrize("line, message", [
    ({"prompt": "a\ud800b", "max_tokens": 2},
     "prompt must be Unicode text: it holds a lone surrogate (U+D800, not a character) at character 1"),
    ({"messages": [{"role": "user", "content": "ok"}, {"role": "user", "content": "\udfff"}], "max_tokens": 2},
     "messages[1].content must be Unicode text: it holds a lone surrogate (U+DFFF, not a character) at character 0"),
])
def test_a_lone_surrogate_in_a_workload_line_is_named_with_its_field(bpe, tmp_path, line, message):
    path = tmp_path / "w.jsonl"
    path.write_text(json.dumps(line) + "\n")  # json.dumps writes "\ud800" as the escape JSON allows
    with pytest.raises(WorkloadError) as err:
        read_workload_file(path, 512, chat_tokenizer(bpe, "{% for m in messages %}{{ m['content'] }}{% endfor %}"))
    assert str(err.value) == f"{path}:1: {message}"
