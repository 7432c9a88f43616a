"""bench/activation_rounding.py rounds a linear's input as llama.cpp's 8-bit blocks would give it back, and
refuses a results file without llama.cpp's greedy tokens with exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

import activation_rounding as bench

SCRIPT = Path(bench.__file__)


def test_each_block_of_32_comes_back_on_its_own_8_bit_grid():
    x = torch.randn(3, 64, dtype=torch.float32)
    x[1, 32:] = 0  # an all-zero block stays zero (no division by a zero scale)
    (y,) = bench.round_like_q8(None, (x,))
    assert y.shape == x.shape and torch.equal(y[1, 32:], torch.zeros(32))
    for row, block in ((0, slice(0, 32)), (2, slice(32, 64))):
        scale = x[row, block].abs().max() / 127
        steps = y[row, block] / scale
        assert torch.allclose(steps, steps.round(), atol=1e-4) and steps.abs().max() <= 127 + 1e-4
        assert (y[row, block] - x[row, block]).abs().max() <= scale / 2 + 1e-6  # round to nearest
    assert not torch.equal(y, x)


def test_a_results_file_without_llama_cpp_tokens_is_refused_naming_it(tmp_path):
    saved = tmp_path / "slots.json"
    saved.write_text('{"runs": {}}')
    done = subprocess.run([sys.executable, str(SCRIPT), str(saved)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and f"{saved}: no llama.cpp greedy tokens" in done.stderr
