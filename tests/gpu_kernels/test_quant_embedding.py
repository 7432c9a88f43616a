"""quant_embedding looks a step's token rows up in a GGUF block matrix in one op: the bits
quant_blocks.dequantize gives them, rounded to the model's dtype, and a clear error for an id past the table."""

from __future__ import annotations

import pytest
import torch

from batchtop.core_engine.model.quant_blocks import dequantize
from batchtop.core_engine.model.quant_linear import QuantEmbedding
from batchtop.gpu_kernels import quant_kernels
from tests.gpu_kernels.quant_helpers import block_matrix

pytestmark = pytest.mark.skipif(not quant_kernels.embeds("Q8_0", torch.bfloat16),
                                reason="needs batchtop's CPU kernels with quant_embedding")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("type_name", quant_kernels.EMBEDDED)
def test_rows_are_the_dequantized_rows_bitwise(type_name, dtype):
    blocks = block_matrix(type_name, 300, 576, seed=3)
    ids = torch.tensor([0, 299, 17, 17, 150])
    got = quant_kernels.quant_embedding(blocks, ids, type_name, dtype)
    want = dequantize(blocks.index_select(0, ids), type_name).to(dtype)
    assert got.dtype == dtype and torch.equal(got, want)
    assert not torch.equal(got[0], got[1])


def test_the_embedding_module_takes_the_op_and_keeps_the_ids_shape():
    blocks = block_matrix("Q8_0", 64, 256, seed=4)
    embedding = QuantEmbedding(torch.nn.Parameter(blocks, requires_grad=False), "Q8_0", 256, torch.bfloat16)
    ids = torch.tensor([[3, 9], [63, 0]])
    got = embedding(ids)
    assert got.shape == (2, 2, 256)
    assert torch.equal(got.reshape(4, 256), dequantize(blocks.index_select(0, ids.reshape(-1)), "Q8_0").bfloat16())


def test_an_id_past_the_table_is_refused_by_name():
    blocks = block_matrix("Q4_1", 8, 64)
    with pytest.raises(RuntimeError, match="id 8 is outside"):
        quant_kernels.quant_embedding(blocks, torch.tensor([1, 8]), "Q4_1", torch.bfloat16)
