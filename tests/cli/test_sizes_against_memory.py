"""Every size a user can give is checked against memory before anything is allocated (issue 41,
finding 12): --block-size 1e9 and --max-num-batched-tokens 1e12 were allocator tracebacks asking for
32 TB; now exit 2 naming the option, what it would need and what there is."""

from __future__ import annotations

from dataclasses import replace

import pytest
from click.testing import CliRunner

from batchtop.core_engine.config import preset
from batchtop.core_engine.worker.memory_need import check_memory, memory_need
from batchtop.core_engine.errors import ConfigError
from batchtop.core_engine.run.resolve import GIB, resolve_config
from batchtop.core_engine.simulate.simulated_devices import simulated_device
from batchtop.core_engine.worker.model_runner import ModelRunner
from batchtop.tui.cli import main
from tests.conftest import tiny_config

TINY = ["--headless", "--model", "tiny", "--workload", "synthetic", "--num-requests", "1"]


@pytest.mark.parametrize("args, message", [
    (["--block-size", "1000000000"],
     "--block-size: 1,000,000,000 tokens a block (max_model_len is 4,096): the KV pool (512 blocks and one scratch "
     "block, 1,000,000,000 tokens each) needs 119.44 TiB, beside 0.27 MiB of weights"),
    (["--max-num-batched-tokens", "1000000000000"],
     "--max-num-batched-tokens: 1,000,000,000,000 tokens a step need 1,426.09 TiB of inputs and activations"),
    (["--simulate", "h100", "--max-num-batched-tokens", "1000000000000"], "the simulated GPU has 80.00 GiB available"),
    (["--simulate", "h100", "--block-size", "1000000000"],
     "--block-size: 1,000,000,000 tokens a block need 238.42 GiB each; 0.9 of 80 GiB leaves 69.97 GiB for KV blocks"),
])
def test_a_size_no_memory_holds_is_exit_2_naming_the_option_before_anything_is_built(args, message, monkeypatch):
    monkeypatch.setattr(ModelRunner, "__init__", lambda *a, **k: pytest.fail("the engine was built"))
    result = CliRunner().invoke(main, [*TINY, *args])
    assert result.exit_code == 2 and message in result.output, result.output
    assert "Traceback" not in result.output


def test_the_option_named_is_the_one_asking_for_the_most():
    config = tiny_config(max_num_seqs=4, max_num_batched_tokens=64, block_size=16, num_kv_blocks=1_000_000)
    need = memory_need(config)
    assert need.kv_pool == 2 * 2 * 1_000_001 * 16 * 32 * 4  # K and V, 2 layers, the scratch block, kv_dim 32, fp32
    with pytest.raises(ConfigError) as err:
        check_memory(config, GIB, "the machine has")
    assert err.value.field == "num_kv_blocks" and err.value.message.startswith("1,000,000 blocks: the KV pool")
    assert err.value.message.endswith("the machine has 1.00 GiB available")
    big_model = replace(preset("tiny"), hidden_size=8192, intermediate_size=32768, num_attention_heads=64,
                        num_key_value_heads=8, vocab_size=128_000, num_hidden_layers=80)
    with pytest.raises(ConfigError) as err:
        check_memory(tiny_config(model=big_model), 16 * GIB)
    assert err.value.field == "model" and "parameters need" in err.value.message
    with pytest.raises(ConfigError) as err:
        check_memory(tiny_config(max_num_seqs=4096, max_num_batched_tokens=4096, model=replace(preset("tiny"),
                                 vocab_size=10_000_000)), 16 * GIB)
    assert err.value.field == "max_num_seqs" and "4,096 slots need" in err.value.message
    check_memory(config, need.total)  # exactly enough is enough


def test_the_default_setups_still_fit():
    resolve_config(model="tiny", device="cpu")
    for device in ("h200", "h100", "l4"):
        resolve_config(simulate=simulated_device(device))  # a pool sized from memory leaves room for a step
    resolve_config(simulate=simulated_device("h200"), model="gpu-8b", max_num_batched_tokens=65536)
