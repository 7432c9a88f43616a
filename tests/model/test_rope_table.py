"""The CPU's RoPE table gives every position the cos and signed sin rows rope_cos_sin computes for it, bit
for bit, and grows when a step reaches past it."""

from __future__ import annotations

import pytest
import torch

from batchtop.core_engine.model.llama import RopeTable, rope_cos_sin


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("head_dim,theta", [(64, 10000.0), (128, 500000.0)])
def test_rows_are_rope_cos_sin_bitwise_and_the_table_grows(head_dim, theta, dtype):
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    table = RopeTable(inv_freq, dtype)
    for positions in (torch.tensor([0]), torch.tensor([5, 1, 200, 200]), torch.arange(250, 700, 3),
                      torch.tensor([4095, 9000])):
        cos, sin = table(positions)
        want_cos, want_sin = rope_cos_sin(positions, inv_freq, dtype)
        assert torch.equal(cos, want_cos) and torch.equal(sin, want_sin)
        assert table.cos.shape[0] > int(positions.max())
    assert table.cos.shape[0] == 16384  # doubled to cover position 9000
