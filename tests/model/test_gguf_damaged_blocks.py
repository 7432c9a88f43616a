"""A GGUF file whose blocks are damaged (issue 52, round 4, item 4 and "still to try"): Inf or NaN block
scales, a NaN in a float tensor, data cut short, rows that are not whole blocks, a tied model without its
embedding: exit 2 naming the tensor, run quantized or dequantized, never a run of NaN logits; denormal
scales are numbers like any other: the kernels compute them as the reference does."""

from __future__ import annotations

from unittest import mock

import gguf
import numpy as np
import pytest
import torch
from click.testing import CliRunner

from batchtop.core_engine.model.gguf_file import read_header
from batchtop.gpu_kernels import quant_kernels
from batchtop.tui.cli import main
from tests.gpu_kernels.quant_helpers import block_matrix, dequantized, reference_and_bound
from tests.model.gguf_bytes import U32, header, llama_keys, tensor, with_data
from tests.support.exits import assert_exit_2
from tests.support.gguf_files import Q, plain_llama, write_gguf

WEIGHTS = ("quantized", "dequantized")
BLOCK = {"Q8_0": 34, "Q4_1": 20}  # bytes a block; the fp16 scale d at byte 0, Q4_1's min m at byte 2


def headless(path, weights: str):
    return CliRunner().invoke(main, ["--headless", "--device", "cpu", "--model", str(path), "--weights", weights,
                                     "--num-requests", "2", "--time-scale", "0"])


@pytest.fixture(scope="module")
def q4_1_file(tmp_path_factory):
    """Q4_1 linears, a Q8_0 embedding (tied), F32 norms."""
    path = tmp_path_factory.mktemp("q4_1") / "m.gguf"
    write_gguf(path, plain_llama(tied=True), "llama", Q.Q4_1)
    return path


def damaged(source, target, name: str, at: int, value: float, blocks: slice = slice(None)) -> None:
    """A copy of `source` whose tensor `name` holds fp16 `value` at byte `at` of the chosen blocks."""
    info = read_header(source).tensors[name]
    data = np.frombuffer(source.read_bytes(), dtype=np.uint8).copy()
    table = data[info.offset:info.offset + info.nbytes].reshape(-1, BLOCK[info.type_name])
    table[blocks, at:at + 2] = np.frombuffer(np.float16(value).tobytes(), dtype=np.uint8)
    target.write_bytes(data.tobytes())


@pytest.mark.parametrize("weights", WEIGHTS)
@pytest.mark.parametrize("name, at, value, blocks, says", [
    ("token_embd.weight", 0, np.inf, slice(None),
     "(Q8_0) has non-finite block scales: 640 of its 640 blocks (the first, block 0, holds inf)"),
    ("blk.1.ffn_down.weight", 2, np.nan, slice(7, 8),  # one Q4_1 min
     "(Q4_1) has non-finite block scales: 1 of its 192 blocks (the first, block 7, holds nan)"),
    ("blk.0.attn_q.weight", 0, -np.inf, slice(3, None, 5),
     "(Q4_1) has non-finite block scales: 25 of its 128 blocks (the first, block 3, holds -inf)"),
])
def test_non_finite_block_scales_exit_2_naming_the_tensor(q4_1_file, tmp_path, weights, name, at, value, blocks,
                                                          says):
    path = tmp_path / "bad.gguf"
    damaged(q4_1_file, path, name, at, value, blocks)
    assert_exit_2(headless(path, weights), f"{path}: tensor {name} {says}")


@pytest.mark.parametrize("weights", WEIGHTS)
def test_a_nan_in_a_float_tensor_exits_2_naming_it(q4_1_file, tmp_path, weights):
    info = read_header(q4_1_file).tensors["output_norm.weight"]
    data = bytearray(q4_1_file.read_bytes())
    data[info.offset + 4 * 5:info.offset + 4 * 6] = np.float32(np.nan).tobytes()
    path = tmp_path / "nan.gguf"
    path.write_bytes(bytes(data))
    assert_exit_2(headless(path, weights), f"{path}: tensor output_norm.weight (F32) has non-finite values: 1 of its "
                                           "64 values (the first, value 5, holds nan)")


@pytest.mark.parametrize("weights", WEIGHTS)
def test_a_file_cut_inside_a_tensors_data_exits_2_naming_the_tensor(q4_1_file, tmp_path, weights):
    info = read_header(q4_1_file).tensors["blk.0.attn_k.weight"]
    path = tmp_path / "cut.gguf"
    path.write_bytes(q4_1_file.read_bytes()[:info.offset + info.nbytes // 2])
    assert_exit_2(headless(path, weights), f"{path}: truncated: tensor")


@pytest.mark.parametrize("weights", WEIGHTS)
def test_rows_that_are_not_whole_blocks_exit_2_naming_the_tensor(tmp_path, weights):
    path = tmp_path / "rows.gguf"
    path.write_bytes(with_data(header(llama_keys(embedding_length=(U32, 48)),
                                      [tensor("token_embd.weight", [48, 320], int(Q.Q8_0))]), bytes(320 * 34 * 2)))
    assert_exit_2(headless(path, weights), f"{path}: tensor 'token_embd.weight' has rows of 48 values, not a whole "
                                           "number of Q8_0 blocks of 32")


@pytest.mark.parametrize("weights", WEIGHTS)
def test_a_tied_model_without_its_embedding_exits_2_naming_it(tmp_path, weights):
    add = gguf.GGUFWriter.add_tensor
    path = tmp_path / "no_embd.gguf"
    with mock.patch.object(gguf.GGUFWriter, "add_tensor",
                           lambda w, name, *a, **k: None if name == "token_embd.weight" else add(w, name, *a, **k)):
        write_gguf(path, plain_llama(tied=True), "llama", Q.Q8_0)
    assert_exit_2(headless(path, weights), f"{path}: tensor token_embd.weight is missing")


@pytest.mark.skipif(not quant_kernels.usable("Q8_0"), reason="needs batchtop's CPU kernels built with linear_quant")
@pytest.mark.parametrize("type_name", ["Q8_0", "Q4_1"])
def test_denormal_block_scales_are_computed_as_the_reference_computes_them(type_name):
    """fp16 scales below 2^-14 (subnormal): a kernel that flushed them to zero would answer 0."""
    n, k = 24, 256
    blocks = block_matrix(type_name, n, k).numpy().reshape(n, k // 32, BLOCK[type_name]).copy()
    rng = np.random.default_rng(1)
    for at in (0, 2) if type_name == "Q4_1" else (0,):  # Q4_1's min too, or it alone would set the weights
        tiny = rng.uniform(2.0 ** -24, 2.0 ** -15, blocks.shape[:2]) * rng.choice([-1, 1], blocks.shape[:2])
        blocks[..., at:at + 2] = tiny.astype(np.float16)[..., None].view(np.uint8)
    blocks = torch.from_numpy(blocks.reshape(n, -1))
    w = dequantized(blocks, type_name)
    assert np.all(np.abs(w).max(axis=1) < 2.0 ** -7) and np.all(np.abs(w).max(axis=1) > 0)  # 127 steps at most
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    with torch.inference_mode():
        got = quant_kernels.linear_quant(x, blocks, type_name, None, n).double().numpy()
    ref, bound = reference_and_bound(x, w)
    assert np.all(np.abs(got - ref) <= bound), np.max(np.abs(got - ref) / bound)
    assert np.linalg.norm(got - ref) < 0.02 * np.linalg.norm(ref)
