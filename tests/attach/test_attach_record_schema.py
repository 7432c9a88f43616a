"""A damaged or hand-edited attach recording: `batchtop replay` exits 2 naming the line and the field
(headless and on screen), never a TypeError or IndexError from deep inside a replay."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from batchtop.core_engine.attach.record.record import AttachRecorder, attach_header
from batchtop.core_engine.attach.server_point import ModelEstimate
from batchtop.core_engine.attach.scrape.scrape import DOWN, ScrapeResult
from batchtop.core_engine.config import preset
from batchtop.core_engine.perf.device_peaks import datasheet_peaks
from batchtop.tui.app import BatchtopApp
from batchtop.tui.cli import main
from tests.support.attach_helpers import VLLM_T0, VLLM_T2, live, vllm_sample

URLS = ["http://a:8000/metrics", "http://b:8000/metrics"]


def recording(path: Path) -> list[dict]:
    """A good recording of two replicas over two ticks (line 1 the header, 2-5 the scrapes)."""
    estimate = ModelEstimate(preset("tiny"), "bfloat16")
    rec = AttachRecorder(str(path), attach_header(URLS, 1.0, 30.0, 8, estimate, datasheet_peaks("H100").as_dict())
                         | {"peaks_note": "h100"})
    for tick, (t, capture) in enumerate(((0.0, VLLM_T0), (1.0, VLLM_T2)), start=1):
        rec.tick(tick, t, [live(vllm_sample(capture, t)), ScrapeResult(DOWN, "refused", None, 0.001)])
    rec.close(1.0)
    return [json.loads(line) for line in path.read_text().splitlines()]


def edit(path: Path, line: int, change: Callable[[dict], None]) -> None:
    events = recording(path)
    change(events[line - 1])
    path.write_text("".join(json.dumps(e) + "\n" for e in events))


def sample_field(name: str, value: object) -> Callable[[dict], None]:
    return lambda e: e["sample"].__setitem__(name, value)


CASES = [
    (4, sample_field("running", "many"), "4: scrape event: field sample.running must be a number, got 'many'"),
    (1, lambda e: e.__setitem__("urls", []), "1: header: field urls must list at least one URL, got []"),
    (1, lambda e: e.pop("urls"), "1: header: field urls is missing"),
    (1, lambda e: e.__setitem__("urls", "http://a"), "1: header: field urls must be a list"),
    (1, lambda e: e.__setitem__("interval_s", "fast"), "1: header: field interval_s must be a number > 0"),
    (1, lambda e: e.__setitem__("window_s", 0), "1: header: field window_s must be a number > 0, got 0"),
    (1, lambda e: e.__setitem__("max_num_seqs", -3), "1: header: field max_num_seqs must be an integer"),
    (1, lambda e: e["estimate"]["model"].__setitem__("hidden_size", "big"),
     "1: header: field estimate.model.hidden_size must be an integer"),
    (1, lambda e: e["estimate"].__setitem__("dtype", "int3"), "1: header: field estimate.dtype must be one of"),
    (1, lambda e: e["estimate"]["model"].__setitem__("num_key_value_heads", 3),
     "1: header: field estimate.model is not a model's dims"),
    (1, lambda e: e["peaks"].pop("peak_flops"), "1: header: field peaks.peak_flops is missing"),
    (1, lambda e: e["peaks"].__setitem__("peak_bytes_per_s", -1), "1: header: field peaks.peak_bytes_per_s must be"),
    (3, lambda e: e.__setitem__("replica", 5), "3: scrape event: field replica 5 is not one of the header's 2 urls"),
    (3, lambda e: e.__setitem__("replica", "b"), "3: scrape event: field replica must be an integer"),
    (2, lambda e: e.__setitem__("status", "FINE"), "2: scrape event: field status must be one of LIVE"),
    (2, lambda e: e.pop("status"), "2: scrape event: field status is missing"),
    (3, lambda e: e.__setitem__("reason", 7), "3: scrape event: field reason must be a string"),
    (2, lambda e: e.__setitem__("latency_s", -1), "2: scrape event: field latency_s must be a number >= 0"),
    (2, lambda e: e.__setitem__("tick", 1.5), "2: scrape event: field tick must be an integer"),
    (2, lambda e: e.__setitem__("sample", None), "2: scrape event: field sample is missing: a LIVE scrape has one"),
    (2, lambda e: e.__setitem__("sample", [1, 2]), "2: scrape event: field sample must be an object"),
    (2, lambda e: e["sample"].pop("flavour"), "2: scrape event: field sample.flavour is missing"),
    (2, sample_field("flavour", "ollama"), "2: scrape event: field sample.flavour must be one of"),
    (2, sample_field("t", -1), "2: scrape event: field sample.t must be a number >= 0"),
    (2, sample_field("counters", {"prompt_tokens": "lots"}),
     "2: scrape event: field sample.counters.prompt_tokens must be a number"),
    (2, sample_field("waiting_by_reason", [1]), "2: scrape event: field sample.waiting_by_reason must be an object"),
    (2, sample_field("num_gpu_blocks", "8192"), "2: scrape event: field sample.num_gpu_blocks must be an integer"),
    (2, sample_field("num_gpu_blocks", 10**400), "2: scrape event: field sample.num_gpu_blocks must be an integer"),
    (2, sample_field("model_name", 3), "2: scrape event: field sample.model_name must be a string"),
    (2, sample_field("slots", [{"id": 0, "processing": "yes"}]),
     "2: scrape event: field sample.slots[0].processing must be true or false"),
    (2, sample_field("slots", [{"id": 0, "processing": True, "owner": "me"}]),
     "2: scrape event: field sample.slots[0].owner is not a field of a slot"),
    (2, sample_field("token_budget", "8192"), "2: scrape event: field sample.token_budget must be an integer"),
    (2, lambda e: e["sample"]["histograms"]["ttft"]["counts"].pop(),
     "2: scrape event: field sample.histograms.ttft.counts has 22 entries for 23 bounds"),
    (2, lambda e: e["sample"]["histograms"]["ttft"].__setitem__("le", ["x"] * 23),
     "2: scrape event: field sample.histograms.ttft.le[0] must be a number or \"+Inf\""),
    (2, lambda e: e["sample"]["histograms"]["ttft"].pop("sum"), "2: scrape event: field sample.histograms.ttft.sum is missing"),
]


@pytest.mark.parametrize("line,change,message", CASES, ids=[c[2][:60] for c in CASES])
def test_a_bad_field_in_an_attach_recording_exits_2_naming_line_and_field(tmp_path, line, change, message):
    path = tmp_path / "attach.jsonl"
    edit(path, line, change)
    result = CliRunner().invoke(main, ["replay", str(path), "--headless", "-o", str(tmp_path / "r.json")])
    assert result.exit_code == 2, result.output
    where, what = message.split(": ", 1)
    assert f"Error: {path}:{where}: " in result.output and what in result.output, result.output
    assert "Traceback" not in result.output and not (tmp_path / "r.json").exists()


def test_the_dashboard_replay_refuses_it_the_same_way(tmp_path, monkeypatch):
    path = tmp_path / "attach.jsonl"
    edit(path, 4, sample_field("running", "many"))
    monkeypatch.setattr(BatchtopApp, "run", lambda self: pytest.fail("the app opened on a bad recording"))
    result = CliRunner().invoke(main, ["replay", str(path)])
    assert result.exit_code == 2
    assert f"{path}:4: scrape event: field sample.running must be a number, got 'many'" in result.output


def test_a_good_recording_still_replays(tmp_path):
    path = tmp_path / "attach.jsonl"
    recording(path)
    result = CliRunner().invoke(main, ["replay", str(path), "--headless", "-o", str(tmp_path / "r.json")])
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["ticks"] == 2 and doc["replicas"][0]["running"] == 8 and doc["replicas"][1]["status"] == DOWN


def test_a_replay_speed_that_is_not_a_number_is_refused_and_never_spins(tmp_path):
    import math
    import threading

    from batchtop.core_engine.attach.watch import sleep_until

    path = tmp_path / "attach.jsonl"
    recording(path)
    for value in ("nan", "inf"):
        result = CliRunner().invoke(main, ["replay", str(path), "--speed", value])
        assert result.exit_code == 2 and "--speed" in result.output, result.output
    # the wait between recorded scrapes returns on a NaN deadline instead of busy-looping forever
    waited = threading.Thread(target=sleep_until, args=(math.nan, lambda: False, threading.Event()), daemon=True)
    waited.start()
    waited.join(5.0)
    assert not waited.is_alive()
