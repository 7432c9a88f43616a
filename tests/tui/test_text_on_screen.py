"""Text on screen: slot cells end with their request's words, a selected slot opens its request's prompt
and output streaming, traces keep text only when asked, and a replay shows what was recorded."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.sched.request import Request, SamplingParams
from batchtop.core_engine.model.hf_config import read_model_config
from batchtop.core_engine.model.tokenizer import TextStream, Tokenizer
from batchtop.core_engine.run.live_session import Session
from batchtop.core_engine.engine.detokenizer import TextDecoder
from batchtop.core_engine.trace.trace import read_trace
from batchtop.tui.app import BatchtopApp
from batchtop.tui.sources.live import EngineSource
from batchtop.tui.cli import main
from batchtop.tui.sources.replay import ReplaySource
from batchtop.tui.screens.request_detail import NO_TOKENIZER, NOT_RECORDED, RequestScreen
from batchtop.tui.widgets.engine.slots import SlotsPanel
from tests.conftest import tiny_config
from tests.support.hf_checkpoints import SENTENCES
from tests.tui.test_dashboard import PEAKS, TickClock, make_app, screen_text, step, wait_for

pytest.importorskip("transformers")

WIDE = (170, 40)  # room for text in the slot cells


def text_requests(tok: Tokenizer, max_tokens: int = 12) -> list[Request]:
    return [Request(f"t{i}", tuple(tok.encode(text)), max_tokens, sampling=SamplingParams(ignore_eos=True))
            for i, text in enumerate(SENTENCES)]


def text_app(model_dir) -> tuple[BatchtopApp, Tokenizer]:
    tok = Tokenizer.from_dir(model_dir)
    config = tiny_config(model=read_model_config(model_dir), max_num_seqs=4)
    engine = Engine(config, clock=TickClock())
    requests = text_requests(tok)
    session = Session(engine, requests, text=TextDecoder(tok))
    source = EngineSource(engine, requests, start_paused=True, session=session, peaks=PEAKS, device_label="test-cpu")
    return BatchtopApp(source), tok


def shown_output(app: BatchtopApp, tok: Tokenizer, index: int) -> str:
    """Request t{index}'s output text in the newest frame, checked against the engine's own tokens
    decoded in one go (the stream holds back only a character still cut in two)."""
    text = app.source.frame.texts[index].output
    seq = app.source.engine._live.get(f"t{index}")
    if seq is not None:
        assert tok.decode(seq.token_ids[seq.prompt_len:]).startswith(text)
    return text


def detail_text(app) -> str:
    """The detail view's header and body ('' until it has mounted)."""
    screen = app.screen
    if not isinstance(screen, RequestScreen) or not screen.is_mounted:
        return ""
    return str(screen.query_one("#request-head").render()) + "\n" + str(screen.query_one("#request-text").render())


async def test_slot_cells_end_with_the_decoded_output(hf_checkpoints):
    app, tok = text_app(hf_checkpoints["qwen3"])
    async with app.run_test(size=WIDE) as pilot:
        await step(pilot, 6)
        output = shown_output(app, tok, 1)  # a random model's words: bytes of all sorts
        printable = "".join(c for c in output.replace("\n", "⏎") if c.isprintable())
        assert len(printable) >= 4
        assert printable[-8:] in screen_text(app)


async def test_enter_on_a_selected_slot_streams_its_prompt_and_output(hf_checkpoints):
    app, tok = text_app(hf_checkpoints["llama"])
    async with app.run_test(size=WIDE) as pilot:
        await step(pilot, 3)
        await pilot.press("down")  # the first press selects slot 0; down moves to slot 1
        await pilot.press("down")
        slot = app.query_one(SlotsPanel).selected_slot()
        assert slot.slot == 1 and slot.request_id == "t1"
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, RequestScreen))
        await wait_for(pilot, lambda: shown_output(app, tok, 1) in detail_text(app))
        first = detail_text(app)
        assert SENTENCES[1] in first and "slot 1 · decode" in first
        app.pop_screen()
        await step(pilot, 3)  # more tokens: the view streams them
        await pilot.press("enter")
        await wait_for(pilot, lambda: shown_output(app, tok, 1) in detail_text(app))
        assert len(detail_text(app)) > len(first)
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, RequestScreen))


async def test_a_click_on_a_slot_opens_its_request_and_it_stays_after_finishing(hf_checkpoints):
    app, tok = text_app(hf_checkpoints["qwen2"])
    async with app.run_test(size=WIDE) as pilot:
        await step(pilot, 2)
        await pilot.click(SlotsPanel, offset=(3, 3))  # border + padding, then the third row: slot 2
        await wait_for(pilot, lambda: isinstance(app.screen, RequestScreen))
        assert app.screen.request_id == "t2"
        output_so_far = shown_output(app, tok, 2)
        app.pop_screen()
        app.source.act("toggle_pause")  # run to the end: t2 finishes and leaves its slot
        await wait_for(pilot, lambda: app.source.frame.state == "finished")
        app.push_screen(RequestScreen(2, "t2"))
        await wait_for(pilot, lambda: "done: no longer in a slot" in detail_text(app))
        assert output_so_far in detail_text(app) and SENTENCES[2] in detail_text(app)


async def test_without_a_tokenizer_the_detail_view_says_so():
    app = make_app()
    async with app.run_test(size=(120, 36)) as pilot:
        await step(pilot)
        await pilot.press("enter")  # nothing selected yet
        assert not isinstance(app.screen, RequestScreen)
        await pilot.press("down", "enter")
        await wait_for(pilot, lambda: isinstance(app.screen, RequestScreen))
        assert NO_TOKENIZER in detail_text(app) and "slot 0 · " in detail_text(app)


def test_each_token_is_decoded_once_and_the_text_is_the_whole_decode(hf_checkpoints, monkeypatch):
    """Incremental: one push per generated token, never a re-decode of the whole sequence."""
    tok = Tokenizer.from_dir(hf_checkpoints["qwen3"])
    pushes = []
    push = TextStream.push
    monkeypatch.setattr(TextStream, "push", lambda self, token: pushes.append(token) or push(self, token))
    engine = Engine(tiny_config(model=read_model_config(hf_checkpoints["qwen3"]), max_num_seqs=3))
    decoder = TextDecoder(tok)
    texts: dict[int, list[str]] = {}
    requests = text_requests(tok, max_tokens=9)
    engine.load_workload(requests)
    outputs = {}
    while not engine.is_done():
        snap = engine.step()
        delta = decoder.update(engine.scheduler.running, snap)
        for index, text in delta.outputs:
            texts.setdefault(index, []).append(text)
        outputs.update({f.index: f.output_token_ids for f in snap.finished})
    assert len(pushes) == sum(len(ids) for ids in outputs.values()) == 9 * len(requests)
    for index, ids in outputs.items():
        assert "".join(texts[index]) == tok.decode(ids)


def record(model_dir, trace, *extra):
    return CliRunner().invoke(main, ["--headless", "--model", str(model_dir), "--device", "cpu", "--dtype",
                                     "float32", "--num-requests", "3", "--time-scale", "0", "--record", str(trace),
                                     *extra])


def test_traces_hold_text_and_output_ids_only_with_record_text(hf_checkpoints, tmp_path):
    model_dir = hf_checkpoints["qwen3"]
    workload = tmp_path / "w.jsonl"
    workload.write_text("\n".join(json.dumps({"id": f"t{i}", "prompt": t, "max_tokens": 6})
                                  for i, t in enumerate(SENTENCES)))
    plain, texted = tmp_path / "plain.jsonl", tmp_path / "text.jsonl"
    assert record(model_dir, plain, "--workload", str(workload)).exit_code == 0
    assert record(model_dir, texted, "--workload", str(workload), "--record-text").exit_code == 0
    raw = plain.read_text()
    assert SENTENCES[0] not in raw and '"type":"text"' not in raw and "output_token_ids" not in raw
    trace = read_trace(str(texted))
    assert trace.header["text"] is True
    prompts = {i: t for e in trace.events if e["type"] == "text" for i, t in e["prompts"]}
    outputs = {}
    for e in trace.events:
        if e["type"] == "text":
            for i, t in e["outputs"]:
                outputs[i] = outputs.get(i, "") + t
    tok = Tokenizer.from_dir(model_dir)
    finished = {e["index"]: e["output_token_ids"] for e in trace.events if e["type"] == "finish"}
    assert sorted(prompts.values()) == sorted(SENTENCES[:3])
    assert outputs == {i: tok.decode(ids) for i, ids in finished.items()}


def test_record_text_needs_record():
    result = CliRunner().invoke(main, ["--headless", "--model", "tiny", "--record-text"])
    assert result.exit_code == 2 and "--record-text" in result.output and "--record FILE" in result.output


async def test_replay_shows_the_recorded_text(hf_checkpoints, tmp_path):
    model_dir, trace_path = hf_checkpoints["qwen2"], tmp_path / "t.jsonl"
    assert record(model_dir, trace_path, "--record-text").exit_code == 0
    live = {}
    for e in read_trace(str(trace_path)).events:
        if e["type"] == "text":
            for i, t in e["outputs"]:
                live[i] = live.get(i, "") + t
    trace = read_trace(str(trace_path))
    app = BatchtopApp(ReplaySource(trace, start_paused=True))
    async with app.run_test(size=WIDE) as pilot:
        await pilot.press("n", "n")
        await wait_for(pilot, lambda: app.source.frame.snapshot is not None and app.source.frame.texts)
        await pilot.press("down", "enter")
        await wait_for(pilot, lambda: isinstance(app.screen, RequestScreen))
        index = app.screen.index
        app.pop_screen()
        await pilot.press("G")  # to the end of the recording
        await wait_for(pilot, lambda: app.source.frame.metrics.completed == 3)
        assert app.source.frame.texts[index].output == live[index]

    plain = tmp_path / "plain.jsonl"
    assert record(model_dir, plain).exit_code == 0
    app = BatchtopApp(ReplaySource(read_trace(str(plain)), start_paused=True))
    async with app.run_test(size=WIDE) as pilot:
        await pilot.press("n")
        await wait_for(pilot, lambda: app.source.frame.snapshot is not None)
        await pilot.press("down", "enter")
        await wait_for(pilot, lambda: isinstance(app.screen, RequestScreen))
        assert NOT_RECORDED in detail_text(app)
