"""The step's tail in one call (norm_head_quant): the final RMSNorm of the sampled rows and a GGUF lm_head
give bitwise what index_select, RMSNorm and QuantLinear give one by one, and a row past x is refused."""

from __future__ import annotations

import pytest
import torch

from batchtop.core_engine.model.llama import RMSNorm
from batchtop.core_engine.model.quant_linear import QuantLinear, norm_and_head
from batchtop.gpu_kernels import quant_kernels
from tests.gpu_kernels.quant_helpers import block_matrix

pytestmark = pytest.mark.skipif(not quant_kernels.usable("Q8_0") or not quant_kernels.usable("Q4_K"),
                                reason="needs batchtop's CPU kernels with linear_quant")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("type_name", ["Q8_0", "Q4_1", "Q4_K"])
def test_the_tail_is_the_three_ops_bitwise(type_name, dtype):
    torch.manual_seed(0)
    norm = RMSNorm(256, 1e-5)
    norm.weight.data = (1 + 0.1 * torch.randn(256)).to(dtype)
    head = QuantLinear(256, [(type_name, block_matrix(type_name, 160, 256, seed=5))])
    x = torch.randn(7, 256).to(dtype)
    rows = torch.tensor([6, 0, 3])
    with torch.inference_mode():
        want = head(norm(x.index_select(0, rows)))
        got = norm_and_head(norm, head, x, rows)
    assert got is not None and got.dtype == dtype and torch.equal(got, want)


def test_a_row_past_x_is_refused_by_name():
    norm = RMSNorm(256, 1e-5)
    head = QuantLinear(256, [("Q8_0", block_matrix("Q8_0", 32, 256))])
    with pytest.raises(RuntimeError, match="row 7 is outside x's 7 rows"):
        norm_and_head(norm, head, torch.randn(7, 256), torch.tensor([7]))
