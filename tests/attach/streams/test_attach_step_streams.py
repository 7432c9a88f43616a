"""A real vLLM CPU 0.32.0 server's step log and KV events (tests/data/vllm-0.32-cpu-step-streams), fed
to the attach monitor tick by tick as a live watch would: every logged step reaches the timeline with
its own rows, the prefix cache holds what was stored and not removed, a recording replays the same, and
the verdict reads the steps."""

from __future__ import annotations

import pytest

from batchtop.core_engine.attach.monitor import Monitor
from batchtop.core_engine.attach.record.record import (AttachRecorder, attach_header, monitor_for,
                                                       recorded_stream_ticks, recorded_ticks)
from batchtop.core_engine.attach.report import attach_report
from batchtop.core_engine.attach.server_point import ModelEstimate
from batchtop.core_engine.attach.streams.served_model import served_tokenizer
from batchtop.core_engine.attach.streams.step_point import StepPricer
from batchtop.core_engine.attach.streams.stream_state import StreamState
from batchtop.core_engine.attach.streams.stream_tick import StreamTick
from batchtop.core_engine.config import PRESETS
from batchtop.core_engine.model.smollm2 import smollm2_file
from batchtop.core_engine.trace.trace import TraceError, read_trace
from tests.support.scripted_vllm import ScriptedVllm, Tick
from tests.support.attach_helpers import live
from batchtop.core_engine.attach.scrape.sample import parse_exposition
from tests.support.vllm_step_streams import URL, cached_after, capture_ticks, iteration_lines, kv_messages_unix

SMOLLM2_DIMS = PRESETS["cpu-demo"]  # dims only price the steps here; the capture's own model is SmolLM2


def watch(monitor: Monitor):
    frame = monitor.frame()
    for tick in capture_ticks():
        frame = monitor.feed(tick.results, tick.t, tick.streams)
    return frame


def test_every_logged_step_reaches_the_timeline_with_its_own_rows():
    monitor = Monitor([URL], streams=StreamState(log=True, kv=False))
    frame = watch(monitor)
    steps = frame.streams.steps
    assert steps.total == len(iteration_lines()) == 828 and steps.unparsed == 0 and steps.missed == 0
    shown = [s.step for s in steps.steps]
    expected = [line.split("Iteration(")[1] for line in iteration_lines()][-len(shown):]
    assert [f"{s.iteration}): {s.prefill_rows} context requests, {s.prefill_tokens} context tokens, {s.decode_rows} "
            f"generation requests, {s.decode_tokens} generation tokens" for s in shown] == \
        [e.split(", iteration")[0] for e in expected]


def test_the_prefix_cache_holds_what_was_stored_and_not_removed_and_the_shared_system_prompt_on_top():
    state = StreamState(log=False, kv=True)
    state.decode = served_tokenizer("smollm2") if smollm2_file() is not None else None
    frame = watch(Monitor([URL], streams=state))
    prefix = frame.streams.prefix
    assert prefix.cached_blocks == cached_after(frames for _, frames in kv_messages_unix()) == 108
    assert prefix.block_size == 32 and prefix.shared and prefix.malformed == 0
    top = prefix.top[0]
    assert top.continuations >= 2 and top.tokens >= 320  # the system prompt spans ten 32-token blocks
    if state.decode is not None:
        assert "You are assistant number 0. Follow the house style guide for team 0" in top.text


def test_the_roofline_places_each_step_from_its_own_tokens_and_time():
    pricer = StepPricer(ModelEstimate(SMOLLM2_DIMS, "bfloat16"))
    frame = watch(Monitor([URL], streams=StreamState(log=True, kv=False, pricer=pricer)))
    timed = [s for s in frame.streams.steps.steps if s.point is not None]
    assert len(timed) == len(frame.streams.steps.steps)
    decode_1 = [s for s in timed if s.step.decode_rows == 1 and not s.step.prefill_tokens]
    decode_4 = [s for s in timed if s.step.decode_rows == 4 and not s.step.prefill_tokens]
    assert decode_1 and decode_4
    assert min(s.point.intensity for s in decode_4) > 3 * max(s.point.intensity for s in decode_1)  # batching


def test_a_recording_replays_the_same_steps_and_cache_and_old_recordings_still_load(tmp_path):
    path = str(tmp_path / "vllm-streams.jsonl.gz")
    recorder = AttachRecorder(path, attach_header([URL], 1.0, 30.0, 8, None, None,
                                                  {"log": "-", "kv_events": "tcp://127.0.0.1:5557"}))
    live_monitor = Monitor([URL], max_num_seqs=8, streams=StreamState(log=True, kv=True))
    for i, tick in enumerate(capture_ticks(), start=1):
        live_frame = live_monitor.feed(tick.results, tick.t, tick.streams)
        recorder.tick(i, tick.t, tick.results, tick.streams)
    recorder.close(live_frame.t)
    trace = read_trace(path)
    replay = monitor_for(trace)
    for t, results, streams in recorded_stream_ticks(trace):
        frame = replay.feed(results, t, streams)
    assert frame.streams.steps.total == 828 and frame.streams.prefix == live_frame.streams.prefix
    assert [s.step for s in frame.streams.steps.steps] == [s.step for s in live_frame.streams.steps.steps]
    assert len(list(recorded_ticks(trace))) == 107  # the scrapes alone, as every older reader takes them
    doc = attach_report(replay, frame, interval_s=1.0, peaks=None, peaks_note="recorded", complete=True)
    assert doc["streams"]["step_log"]["steps"] == 828 and doc["streams"]["prefix_cache"]["cached_blocks"] == 108


def test_a_damaged_stream_line_is_refused_naming_its_line_and_field(tmp_path):
    path = tmp_path / "damaged.jsonl"
    recorder = AttachRecorder(str(path), attach_header([URL], 1.0, 30.0, None, None, None, {"log": "-"}))
    first = capture_ticks()[0]
    recorder.tick(1, first.t, first.results, StreamTick(((0.5, "Engine 000: Iteration(0): ..."),)))
    recorder.close(1.0)
    lines = path.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if '"type":"log_line"' in line)
    lines[at] = lines[at].replace('"line":', '"lien":')
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceError, match=rf"damaged.jsonl:{at + 1}: log_line event: field line is missing"):
        list(recorded_stream_ticks(read_trace(str(path))))


def vllm_line(n: int, prefill_rows: int, prefill_tokens: int, decode_rows: int) -> str:
    return (f"INFO [loggers.py:199] Engine 000: Iteration({n}): {prefill_rows} context requests, {prefill_tokens} "
            f"context tokens, {decode_rows} generation requests, {decode_rows} generation tokens, iteration "
            f"elapsed time: 80.00 ms, GPU KV cache usage: 40.0%")


def test_the_verdict_reads_a_token_budget_from_the_logged_steps():
    """Chunked prefill at a 2048-token budget: every step holds exactly 2048 tokens while prompts wait and
    half the slots are free. /metrics' histogram puts those in a wide bucket; the steps say it exactly."""
    server = ScriptedVllm()
    monitor = Monitor([URL], max_num_seqs=16, streams=StreamState(log=True, kv=False))
    n = 0
    for i in range(12):
        tick = Tick(running=8, waiting=20, kv=0.4)
        lines = []
        for _ in range(10):
            lines.append((i + 0.1 * len(lines), vllm_line(n, 2, 2040, 8)))
            n += 1
        frame = monitor.feed([live(parse_exposition(server.text(tick), float(i)))], float(i),
                             StreamTick(tuple(lines)))
    v = frame.verdict
    assert v.kind == "budget", v.line
    assert "logged steps hold 2048 tokens" in v.line
    assert v.evidence["step_log"]["at_max_share"] == 1.0 and v.evidence["step_log"]["idle_slot_share"] == 1.0
