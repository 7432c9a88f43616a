"""GGUF files (llama.cpp's format) load into batchtop's model with the weights transformers holds and the
tokenizer transformers rebuilds from the same metadata; bad files exit 2 naming what is wrong."""

from __future__ import annotations

import pytest
import torch

from batchtop.core_engine.worker.model_runner import ModelRunner
from batchtop.core_engine.errors import BadInput
from batchtop.core_engine.model.gguf_file import read_header
from batchtop.core_engine.model.gguf_tokenizer import gguf_tokenizer
from batchtop.core_engine.model.sources import read_gguf_config
from tests.conftest import tiny_config
from tests.support.gguf_files import Q, plain_llama, write_gguf
from tests.support.hf_checkpoints import SENTENCES, hf_model, tokenizer
from tests.model.test_checkpoint_parity import PROMPT, paged_logits

transformers = pytest.importorskip("transformers")

CASES = {  # name: (transformers model, GGUF architecture, weight type, tokenizer kind)
    "llama-tied-q4_1": (lambda: plain_llama(tied=True), "llama", Q.Q4_1, "gpt2"),
    "mistral-as-llama-q8_0": (lambda: hf_model("mistral"), "llama", Q.Q8_0, "llama"),
    "qwen2-biases-f16": (lambda: hf_model("qwen2"), "qwen2", Q.F16, "gpt2"),
    "qwen3-qk-norm-q8_0": (lambda: hf_model("qwen3"), "qwen3", Q.Q8_0, "gpt2"),
}


def load(path):
    return ModelRunner(tiny_config(model=read_gguf_config(path)))


@pytest.mark.parametrize("case", CASES)
def test_logits_equal_transformers_on_the_weights_the_file_holds(tmp_path, case):
    build, arch, quant, kind = CASES[case]
    path = tmp_path / f"{case}.gguf"
    hf = write_gguf(path, build(), arch, quant, kind)
    runner = load(path)
    assert runner.config.model.quantization == quant.name
    with torch.no_grad():
        want = hf(torch.tensor([PROMPT])).logits[0]
    torch.testing.assert_close(paged_logits(runner, PROMPT), want, rtol=1e-4, atol=1e-4)


def test_without_undoing_the_qk_permutation_the_logits_would_differ(tmp_path, monkeypatch):
    """The parity above depends on the row order being put back."""
    path = tmp_path / "llama.gguf"
    hf = write_gguf(path, plain_llama(), "llama", Q.F16)
    monkeypatch.setattr("batchtop.core_engine.model.gguf_weights.unpermute_rope", lambda rows, heads: rows)
    with torch.no_grad():
        want = hf(torch.tensor([PROMPT])).logits[0]
    assert (paged_logits(load(path), PROMPT) - want).abs().max() > 1e-2


def test_the_config_is_what_transformers_holds(tmp_path):
    path = tmp_path / "qwen3.gguf"
    hf = write_gguf(path, hf_model("qwen3"), "qwen3", Q.F16)
    config = read_gguf_config(path)
    assert config.architecture == "Qwen3ForCausalLM" and config.qk_norm and config.head_dim == 32
    assert config.num_params() == sum(p.numel() for p in hf.parameters())
    assert config.rms_norm_eps == 1e-6  # the float32 in the file, read back as the decimal it was written from


def hf_gguf_tokenizer(path):
    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_the_tokenizer_encodes_as_transformers_rebuilds_it_from_the_same_metadata(tmp_path, kind):
    path = tmp_path / f"{kind}.gguf"
    write_gguf(path, plain_llama(), "llama", Q.F16, kind)
    ours, theirs = gguf_tokenizer(read_header(path)), hf_gguf_tokenizer(path)
    texts = SENTENCES + ["  two  spaces and\nnew lines\n", "digits 12345 and ümlauts"]
    for text in texts:
        assert ours.encode(text) == theirs(text)["input_ids"], text
        assert ours.decode(ours.encode(text)) == theirs.decode(theirs(text)["input_ids"], skip_special_tokens=True)
    messages = [{"role": "user", "content": SENTENCES[0]}]
    want = theirs.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    assert ours.encode_chat(messages) == list(want["input_ids"] if hasattr(want, "keys") else want)


def test_the_byte_level_tokenizer_is_the_one_the_file_was_written_from(tmp_path):
    path = tmp_path / "gpt2.gguf"
    write_gguf(path, plain_llama(), "llama", Q.F16, "gpt2")
    ours, original = gguf_tokenizer(read_header(path)), tokenizer()
    for text in SENTENCES:
        assert ours.encode(text) == original.encode(text).ids


def test_generation_ends_at_every_end_of_turn_token(tmp_path):
    path = tmp_path / "chat.gguf"
    write_gguf(path, plain_llama(), "llama", Q.F16, "gpt2")
    tok = gguf_tokenizer(read_header(path))
    im_end = tok.tokenizer.token_to_id("<|im_end|>")
    assert set(tok.eos_token_ids) == {1, im_end}  # the metadata's EOS (</s>) and the template's end of turn
    assert read_gguf_config(path).eos_token_ids == tok.eos_token_ids
    assert "<|im_end|>" not in tok.decode(tok.encode_chat([{"role": "user", "content": "hi"}]))


# ---- bad files: exit 2 naming the file and what is wrong, before any weights load ----

def good_file(tmp_path):
    path = tmp_path / "good.gguf"
    write_gguf(path, plain_llama(), "llama", Q.Q8_0)
    return path


def test_a_truncated_file_names_the_tensor_that_runs_past_its_end(tmp_path):
    path = good_file(tmp_path)
    data = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:len(data) - 1000])
    with pytest.raises(BadInput, match=r"cut.gguf: truncated: tensor '[a-z_.0-9]+' ends at byte"):
        read_header(cut)
    head = tmp_path / "head.gguf"
    head.write_bytes(data[:200])  # inside the metadata
    with pytest.raises(BadInput, match=r"head.gguf: truncated or corrupt: the metadata: the key/value count at byte "
                                       r"24 claims 22 items \(at least 286 bytes\); 176 bytes remain in the file"):
        read_header(head)


def test_wrong_magic_names_the_file(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"PK\x03\x04" + b"\0" * 100)
    with pytest.raises(BadInput, match=r"model.gguf: not a GGUF file \(it starts with b'PK\\x03\\x04'"):
        read_header(path)


def test_an_unsupported_architecture_is_named_with_the_supported_list(tmp_path):
    path = tmp_path / "gemma.gguf"
    write_gguf(path, plain_llama(), "gemma", Q.F16)
    with pytest.raises(BadInput, match=r"gemma.gguf: architecture 'gemma' is not supported \(supported: llama, "
                                       r"qwen2, qwen3, seed_oss\)"):
        read_gguf_config(path)


def test_an_unsupported_tensor_type_names_tensor_and_type(tmp_path):
    from batchtop.core_engine.model.gguf_weights import check_tensors
    path = tmp_path / "iq.gguf"
    model = plain_llama()
    write_gguf(path, model, "llama", Q.Q4_0)
    # rewrite one tensor's type in place: IQ4_NL has Q4_0's block size and bytes, so the file stays consistent
    header = read_header(path)
    info = header.tensors["blk.1.ffn_up.weight"]
    data = bytearray(path.read_bytes())
    name = b"blk.1.ffn_up.weight"
    at = data.index(len(name).to_bytes(8, "little") + name) + 8 + len(name)
    dims = int.from_bytes(data[at:at + 4], "little")
    type_at = at + 4 + 8 * dims
    assert int.from_bytes(data[type_at:type_at + 4], "little") == Q.Q4_0
    data[type_at:type_at + 4] = int(Q.IQ4_NL).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    assert info.type_name == "Q4_0"
    with pytest.raises(BadInput, match=r"iq.gguf: tensor blk.1.ffn_up.weight has type IQ4_NL, which batchtop "
                                       r"cannot dequantize \(supported: F32, F16"):
        check_tensors(read_gguf_config(path))
