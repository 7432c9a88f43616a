"""Persistent step inputs: no per-step tensor building, block-table rows sent only when they change."""

from __future__ import annotations

import torch

from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.worker.input_buffers import DecodeTables, StagedInputs
from batchtop.core_engine.sched.request import Request, SamplingParams
from tests.conftest import run_all, tiny_config


def test_decode_steps_build_no_tensor_from_lists(monkeypatch):
    engine = Engine(tiny_config(max_num_seqs=4, block_size=4))
    sampling = SamplingParams(temperature=0.9, top_p=0.8, seed=3)
    engine.load_workload([Request(f"r{i}", (1, 2, 3, 4, 5), 12, sampling=sampling if i % 2 else SamplingParams())
                          for i in range(4)])
    engine.step()  # the prefill
    built = []
    real = torch.tensor
    monkeypatch.setattr(torch, "tensor", lambda *a, **k: built.append(a) or real(*a, **k))
    for _ in range(6):
        snap = engine.step()
        assert snap.num_seqs == 4 and snap.num_prefill_tokens == 0
    assert built == []


def test_a_decode_row_sends_its_block_table_only_when_it_changes():
    engine = Engine(tiny_config(max_num_seqs=2, block_size=4))
    tables = engine.runner.decode_tables
    sent: list[int] = []
    stage = tables.stage_changes

    def counting(staged, rows):
        change = stage(staged, rows)
        sent.append(0 if change is None else change[0][1])
        return change

    tables.stage_changes = counting
    outputs, _, _ = run_all(engine, [Request("a", (1, 2, 3), 20), Request("b", (4, 5, 6, 7, 8), 20)])
    assert len(sent) >= 19  # one entry per step with decode rows
    # a row is sent when its sequence first decodes and then once per new 4-token block: not every step
    assert 2 <= sum(sent) <= 2 + 2 * (25 // 4 + 1)
    assert sum(sent) < len(sent)  # two rows, so resending every step would be 2 per step
    assert len(outputs["a"]) == len(outputs["b"]) == 20


def test_staged_inputs_grow_past_their_capacity_and_keep_what_was_staged():
    staged = StagedInputs(torch.device("cpu"), capacity=4)
    first = staged.put([7, 8, 9])
    floats = staged.put_floats([0.5, 0.25])
    rows = staged.put_rows([[1], [2, 3]], width=3, fill=-1)
    staged.commit()
    assert staged.view(first).tolist() == [7, 8, 9]
    assert staged.view_f32(floats).tolist() == [0.5, 0.25]
    assert staged.view(rows).view(2, 3).tolist() == [[1, -1, -1], [2, 3, -1]]


def test_the_persistent_table_holds_each_rows_latest_blocks():
    staged = StagedInputs(torch.device("cpu"))
    tables = DecodeTables(torch.device("cpu"), rows=1, width=4, fill=99)
    for step_tables in ([[3]], [[3, 5], [6]], [[6], [3, 5, 1]]):
        staged.begin()
        change = tables.stage_changes(staged, step_tables)
        staged.commit()
        tables.apply(staged, change)
        assert [tables.table[r, :len(t)].tolist() for r, t in enumerate(step_tables)] == step_tables
