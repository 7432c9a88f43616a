"""What `serve` takes from the model, as vLLM does: the served name is the --model argument as given,
and a request that leaves temperature or top_p unset gets the model's generation_config.json value."""

from __future__ import annotations

import json

from batchtop.core_engine.model.sources import sampling_defaults
from batchtop.core_engine.serve.prompts import ServedModel, engine_request
from batchtop.core_engine.serve.protocol import CompletionBody
from batchtop.tui.cli.serve import served_name
from tests.conftest import tiny_config
from tests.support.gguf_files import Q, plain_llama, write_gguf


def sampling(body: dict, defaults: dict):
    model = ServedModel("m", tiny_config(), defaults=defaults)
    return engine_request("r", (1, 2, 3), CompletionBody(**body), 4, model).sampling


def test_unset_sampling_fields_take_the_models_defaults_and_set_ones_win():
    defaults = {"temperature": 0.6, "top_p": 0.9}
    s = sampling({"prompt": [1, 2, 3]}, defaults)
    assert (s.temperature, s.top_p) == (0.6, 0.9)
    s = sampling({"prompt": [1, 2, 3], "temperature": 0, "top_p": 1.0}, defaults)
    assert (s.temperature, s.top_p) == (0.0, 1.0)  # a client's explicit neutral values are kept
    s = sampling({"prompt": [1, 2, 3]}, {})
    assert (s.temperature, s.top_p) == (1.0, 1.0)  # OpenAI's defaults without a generation config


def test_defaults_come_from_generation_config_json_and_nonsense_is_ignored(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.2, "top_p": 0.95, "top_k": 50,
                                                                 "do_sample": True}))
    assert sampling_defaults(str(tmp_path)) == {"temperature": 0.2, "top_p": 0.95}
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.2, "top_p": 7}))
    assert sampling_defaults(str(tmp_path)) == {}
    assert sampling_defaults(None) == {}


def test_a_gguf_files_general_sampling_keys_are_its_defaults(tmp_path):
    path = tmp_path / "m.gguf"
    write_gguf(path, plain_llama(), "llama", Q.F16, extra=lambda w: (w.add_float32("general.sampling.temp", 0.5),
                                                                     w.add_float32("general.sampling.top_p", 0.75)))
    assert sampling_defaults(str(path)) == {"temperature": 0.5, "top_p": 0.75}


def test_the_served_name_is_the_model_argument_as_given():
    assert served_name("./models/Qwen3-0.6B", None, "Qwen3-0.6B") == "./models/Qwen3-0.6B"
    assert served_name("smollm2", None, "smollm2") == "smollm2"
    assert served_name("auto", None, "cpu-demo") == "cpu-demo"
    assert served_name("smollm2", "chat", "smollm2") == "chat"
