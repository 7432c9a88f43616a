"""A GGUF file's metadata is believed only where the tensors agree and the numbers can run (issue 41):
sizes held against the tensors before anything is built from them, RoPE base and norm epsilon finite
and in range (as config.json's are), a tokenizer whose tokens and merges agree, and chat-template
errors that name the GGUF key the template came from."""

from __future__ import annotations

import math
import tracemalloc

import pytest
from click.testing import CliRunner

from batchtop.core_engine.errors import BadInput
from batchtop.core_engine.model.gguf_file import read_header
from batchtop.core_engine.model.gguf_tokenizer import gguf_tokenizer
from batchtop.core_engine.model.sources import read_gguf_config
from batchtop.tui.cli import main
from tests.support.deadline import returns_within
from tests.support.gguf_files import Q, plain_llama, write_gguf

pytest.importorskip("transformers")


def gguf_with(tmp_path, extra, kind: str = "gpt2"):
    """The test model's GGUF file (2 layers, width 64, 4 heads of 16, 2 KV heads) with `extra` applied
    to its writer (a key set again replaces the first)."""
    path = tmp_path / "m.gguf"
    write_gguf(path, plain_llama(), "llama", Q.Q8_0, kind, extra=extra)
    return path


def refusal_within_2s(path) -> tuple[str, int]:
    """read_gguf_config's refusal and the peak memory traced while it was reached."""
    def attempt():
        try:
            read_gguf_config(path)
        except BadInput as exc:
            return str(exc)
        return "accepted"
    tracemalloc.start()
    try:
        return returns_within(2.0, attempt), tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def key_length(value: int, u64: bool = False):
    def extra(w):
        add = w.add_uint64 if u64 else w.add_uint32
        add("llama.attention.key_length", value)
        add("llama.rope.dimension_count", value)  # so the partial-rotary check does not stop it first
    return extra


def without_key_length(w):
    del w.kv_data[0]["llama.attention.key_length"], w.kv_data[0]["llama.rope.dimension_count"]


SIZES = {  # the writer's change: what the refusal says after "FILE: "
    "block_count 10^6": (lambda w: w.add_uint32("llama.block_count", 10**6),
                         "llama.block_count is 1,000,000, but the file has tensors for 2 layers (none for blk.2)"),
    "block_count 1": (lambda w: w.add_uint32("llama.block_count", 1),
                      "unexpected tensor blk.1.attn_q.weight: llama.block_count is 1"),
    "key_length 2^31": (key_length(2**31),
                        "llama.attention.head_count 4 x head size 2,147,483,648 (llama.attention.key_length) = "
                        "8,589,934,592, but tensor blk.0.attn_q.weight has 64 rows"),
    "key_length 2^40": (key_length(2**40, u64=True),
                        "llama.attention.head_count 4 x head size 1,099,511,627,776 (llama.attention.key_length) = "
                        "4,398,046,511,104, but tensor blk.0.attn_q.weight has 64 rows"),
    "head_count_kv 3": (lambda w: w.add_uint32("llama.attention.head_count_kv", 3),
                        "llama.attention.head_count_kv 3 x head size 16 (llama.attention.key_length) = 48, but tensor "
                        "blk.0.attn_k.weight has 32 rows"),
    "embedding_length 2^31": (lambda w: w.add_uint32("llama.embedding_length", 2**31),
                              "llama.embedding_length is 2,147,483,648, but tensor token_embd.weight has rows of 64"),
    "embedding_length 2^31 and no key_length": (
        lambda w: (without_key_length(w), w.add_uint32("llama.embedding_length", 2**31)),
        "llama.embedding_length is 2,147,483,648, but tensor token_embd.weight has rows of 64"),
    "head_count 2^31 and no key_length": (
        lambda w: (without_key_length(w), w.add_uint32("llama.attention.head_count", 2**31)),
        "llama.attention.head_count 2,147,483,648 x head size 1 (llama.embedding_length / "
        "llama.attention.head_count) = 2,147,483,648, but tensor blk.0.attn_q.weight has 64 rows"),
    "feed_forward_length 2^31": (lambda w: w.add_uint32("llama.feed_forward_length", 2**31),
                                 "llama.feed_forward_length is 2,147,483,648, but tensor blk.0.ffn_up.weight has 96 "
                                 "rows"),
    "block_count 0": (lambda w: w.add_uint32("llama.block_count", 0), "llama.block_count must be >= 1, got 0"),
}


@pytest.mark.parametrize("case", SIZES)
def test_sizes_the_tensors_contradict_are_refused_before_anything_is_built(tmp_path, case):
    change, message = SIZES[case]
    path = gguf_with(tmp_path, change)
    got, peak = refusal_within_2s(path)
    assert got == f"{path}: {message}"
    assert peak < 16 << 20, f"{peak:,} bytes traced"  # no rotary table, no model on the meta device


NUMBERS = {
    "rope.freq_base NaN": ("rope.freq_base", math.nan, "must be a finite number, got nan"),
    "rope.freq_base inf": ("rope.freq_base", math.inf, "must be a finite number, got inf"),
    "rope.freq_base 0": ("rope.freq_base", 0.0, "must be > 0, got 0.0"),
    "rope.freq_base -5": ("rope.freq_base", -5.0, "must be > 0, got -5.0"),
    "epsilon NaN": ("attention.layer_norm_rms_epsilon", math.nan, "must be a finite number, got nan"),
    "epsilon -1": ("attention.layer_norm_rms_epsilon", -1.0, "must be >= 0, got -1.0"),
}


@pytest.mark.parametrize("case", NUMBERS)
def test_a_rope_base_or_epsilon_that_cannot_run_is_refused_as_config_json_refuses_it(tmp_path, case):
    key, value, message = NUMBERS[case]
    path = gguf_with(tmp_path, lambda w: w.add_float32(f"llama.{key}", value))
    with pytest.raises(BadInput) as caught:
        read_gguf_config(path)
    assert str(caught.value) == f"{path}: llama.{key} {message}"


def test_export_checkpoint_of_a_nan_rope_base_exits_2_and_writes_nothing(tmp_path):
    path = gguf_with(tmp_path, lambda w: w.add_float32("llama.rope.freq_base", math.nan))
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["export-checkpoint", "--model", str(path), str(out)])
    assert result.exit_code == 2 and f"{path}: llama.rope.freq_base must be a finite number, got nan" in result.output
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["m.gguf"]


def _tokens(w) -> list[str]:
    return list(w.kv_data[0]["tokenizer.ggml.tokens"].value)


def merge_out_of_vocabulary(w):
    w.add_token_merges(list(w.kv_data[0]["tokenizer.ggml.merges"].value) + ["zzqq xxyy"])


def repeated_token(w):
    tokens = _tokens(w)
    tokens[-1] = tokens[-2]
    w.add_token_list(tokens)


def empty_token(w):
    tokens = _tokens(w)
    tokens[-1] = ""
    w.add_token_list(tokens)


def nan_score(w):
    scores = list(w.kv_data[0]["tokenizer.ggml.scores"].value)
    scores[300] = math.nan
    w.add_token_scores(scores)


TOKENIZERS = {
    "a merge naming no token": (merge_out_of_vocabulary, "gpt2",
                                r"tokenizer\.ggml\.merges\[\d+\] 'zzqq xxyy' needs 'zzqq', which is not in "
                                r"tokenizer\.ggml\.tokens"),
    "a repeated token": (repeated_token, "gpt2",
                         r"tokenizer\.ggml\.tokens\[319\] '<\|pad_\d+\|>' repeats tokenizer\.ggml\.tokens\[318\]"),
    "an empty token": (empty_token, "llama", r"tokenizer\.ggml\.tokens\[319\] is an empty string"),
    "a NaN score": (nan_score, "llama", r"tokenizer\.ggml\.scores\[300\] must be a finite number, got nan"),
}


@pytest.mark.parametrize("case", TOKENIZERS)
def test_an_inconsistent_tokenizer_is_refused_naming_the_key(tmp_path, case):
    change, kind, message = TOKENIZERS[case]
    path = gguf_with(tmp_path, change, kind)
    with pytest.raises(BadInput, match=rf"^{path}: {message}$"):
        gguf_tokenizer(read_header(path))


def test_an_inconsistent_tokenizer_exits_2_in_headless_runs_and_export(tmp_path):
    path = gguf_with(tmp_path, merge_out_of_vocabulary)
    for args in (["--headless", "--device", "cpu", "--model", str(path), "--workload", "synthetic"],
                 ["export-checkpoint", "--model", str(path), str(tmp_path / "out")]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2, (args, result.output, result.exception)
        assert f"{path}: tokenizer.ggml.merges[" in result.output and "Traceback" not in result.output


def test_a_chat_template_error_names_the_gguf_key_it_came_from(tmp_path):
    path = gguf_with(tmp_path, lambda w: w.add_chat_template("{% for m in messages %}{{ m['content'] }"))
    tok = gguf_tokenizer(read_header(path))
    with pytest.raises(BadInput, match=rf"^{path}: tokenizer\.chat_template: the chat template does not parse: "
                                       r"line 1: unexpected '}'"):
        tok.encode_chat([{"role": "user", "content": "hi"}])
    without = gguf_with(tmp_path, lambda w: w.kv_data[0].pop("tokenizer.chat_template"))
    with pytest.raises(BadInput, match=rf"^this model has no chat_template \(none in {without}: "
                                       r"tokenizer\.chat_template\)$"):
        gguf_tokenizer(read_header(without)).encode_chat([{"role": "user", "content": "hi"}])
