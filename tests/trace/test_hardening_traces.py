"""Damaged and hand-edited traces, replayed as a user replays them: damage in the middle of a gzip
stream is corruption (exit 2), only a cut at the very end is truncation; a header or event with a
missing or wrongly typed field exits 2 naming line and field, in every command that reads traces;
unknown event types are skipped with one warning."""

from __future__ import annotations

import gzip
import json

import pytest
from click.testing import CliRunner

from batchtop.tui.cli import main
from tests.support.exits import assert_exit_2

TINY = ["--model", "tiny", "--device", "cpu", "--dtype", "float32"]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> dict:
    """One small headless run recorded as plain JSON Lines and as gzip, with its metrics."""
    tmp = tmp_path_factory.mktemp("recorded")
    out = {}
    for name in ("run.jsonl", "run.jsonl.gz"):
        trace, metrics = tmp / name, tmp / f"{name}.json"
        result = CliRunner().invoke(main, ["--headless", *TINY, "--num-requests", "24", "--time-scale", "0",
                                           "--num-kv-blocks", "24", "--record", str(trace), "-o", str(metrics)])
        assert result.exit_code == 0, result.output
        out[name] = (trace.read_bytes(), json.loads(metrics.read_text()))
    return out


def replay(path, *args: str):
    return CliRunner().invoke(main, ["replay", str(path), *args])


def events_of(recorded: dict) -> list[dict]:
    return [json.loads(line) for line in recorded["run.jsonl"][0].decode().splitlines()]


def write_events(path, events: list[dict]) -> None:
    path.write_text("".join(json.dumps(e) + "\n" for e in events), encoding="utf-8")


# -- 9: gzip damage vs truncation -------------------------------------------------------------------

@pytest.mark.parametrize("where", [0.3, 0.5, 0.7])
def test_flipped_bytes_in_the_middle_of_a_gzip_trace_are_corruption(tmp_path, recorded, where):
    data = bytearray(recorded["run.jsonl.gz"][0])
    middle = int(len(data) * where)
    for i in range(middle, middle + 8):
        data[i] ^= 0xFF
    damaged = tmp_path / "damaged.jsonl.gz"
    damaged.write_bytes(bytes(data))
    result = replay(damaged, "--headless")
    assert_exit_2(result, str(damaged))
    assert "gzip stream damaged" in result.output or "corrupt line" in result.output
    assert "truncated" not in result.output


def test_a_wrong_checksum_at_the_end_of_a_gzip_trace_is_corruption(tmp_path, recorded):
    data = bytearray(recorded["run.jsonl.gz"][0])
    data[-6] ^= 0x01  # inside the CRC32 of the trailer: every line inflates, the check fails
    damaged = tmp_path / "crc.jsonl.gz"
    damaged.write_bytes(bytes(data))
    assert_exit_2(replay(damaged, "--headless"), "gzip stream damaged")


def test_only_a_cut_at_the_very_end_of_a_gzip_trace_is_truncation(tmp_path, recorded):
    data = recorded["run.jsonl.gz"][0]
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(data[:-40])
    result = replay(cut, "--headless")
    assert result.exit_code == 0, result.output
    assert "did not close cleanly" in result.stderr and json.loads(result.stdout)["complete"] is False
    two = tmp_path / "two.jsonl.gz"  # two gzip members (cat a.gz b.gz) are one stream, as gzip reads them
    plain = recorded["run.jsonl"][0]
    split = plain.index(b"\n", len(plain) // 2) + 1
    two.write_bytes(gzip.compress(plain[:split]) + gzip.compress(plain[split:]))
    result = replay(two, "--headless")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["steps"] == recorded["run.jsonl"][1]["steps"]


def test_bytes_that_are_not_utf8_in_the_middle_of_a_trace_are_a_corrupt_line(tmp_path, recorded):
    lines = recorded["run.jsonl"][0].split(b"\n")
    index = next(i for i, line in enumerate(lines) if b'"type":"step"' in line)
    lines[index] = lines[index].replace(b'"type":"step"', b'"type":"st\xffp"')
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"\n".join(lines))
    assert_exit_2(replay(bad, "--headless"), f"{bad}:{index + 1}: corrupt line (not UTF-8 text")


def test_nan_or_infinity_in_a_trace_is_a_corrupt_line(tmp_path, recorded):
    lines = recorded["run.jsonl"][0].decode().split("\n")
    index = next(i for i, line in enumerate(lines) if '"type":"step"' in line)
    event = json.loads(lines[index])
    lines[index] = json.dumps({**event, "times": [float("nan"), 0, 0, 0]})
    bad = tmp_path / "nan.jsonl"
    bad.write_text("\n".join(lines))
    assert_exit_2(replay(bad, "--headless"), f"{bad}:{index + 1}: corrupt line", "NaN")


# -- 10: missing or wrongly typed fields ------------------------------------------------------------

def header_without(events: list[dict], name: str) -> list[dict]:
    return [{k: v for k, v in events[0].items() if k != name}, *events[1:]]


def with_header(events: list[dict], **fields) -> list[dict]:
    return [{**events[0], **fields}, *events[1:]]


def first_of(events: list[dict], kind: str) -> int:
    return next(i for i, e in enumerate(events) if e["type"] == kind)


def edit_event(events: list[dict], kind: str, edit) -> tuple[list[dict], int]:
    i = first_of(events, kind)
    out = list(events)
    out[i] = edit(dict(events[i]))
    return out, i + 1


def drop(name: str):
    return lambda e: {k: v for k, v in e.items() if k != name}


def put(name: str, value):
    return lambda e: {**e, name: value}


@pytest.mark.parametrize("make,message", [
    (lambda ev: (header_without(ev, "config"), 1), "header: field config is missing"),
    (lambda ev: (with_header(ev, config="tiny"), 1), "header: field config must be an object"),
    (lambda ev: (with_header(ev, config={"mode": "static"}), 1), "header: field config.model is missing"),
    (lambda ev: (header_without(ev, "peaks"), 1), "header: field peaks is missing"),
    (lambda ev: (with_header(ev, peaks={**ev[0]["peaks"], "peak_flops": 0}), 1),
     "header: field peaks.peak_flops must be a number > 0"),
    (lambda ev: (with_header(ev, peaks={**ev[0]["peaks"], "peak_bytes_per_s": None}), 1),
     "header: field peaks.peak_bytes_per_s must be a number > 0"),
    (lambda ev: (with_header(ev, device="cpu"), 1), "header: field device must be an object"),
    (lambda ev: edit_event(ev, "step", put("seq", "7")), "field seq must be an integer"),
    (lambda ev: edit_event(ev, "arrival", put("t", "soon")), "field t must be a number"),
    (lambda ev: edit_event(ev, "step", drop("times")), "step event: field times is missing"),
    (lambda ev: edit_event(ev, "step", put("slots", "full")), "step event: field slots must be a list"),
    (lambda ev: edit_event(ev, "step", put("counters", [1, 2])), "step event: field counters must have 9 to 12 entries"),
    (lambda ev: edit_event(ev, "step", put("mode", "turbo")), "step event: field mode must be one of"),
    (lambda ev: edit_event(ev, "arrival", put("prompt_len", "12")), "arrival event: field prompt_len must be an integer"),
    (lambda ev: edit_event(ev, "finish", drop("finish_s")), "finish event: field finish_s is missing"),
    (lambda ev: edit_event(ev, "end", put("reason", 3)), "end event: field reason must be a string"),
])
def test_a_trace_field_missing_or_of_the_wrong_type_exits_2_naming_line_and_field(tmp_path, recorded, make,
                                                                                     message):
    events, line = make(events_of(recorded))
    bad = tmp_path / "bad.jsonl"
    write_events(bad, events)
    for args in (["--headless"], ["--headless", "-o", str(tmp_path / "m.json")]):
        assert_exit_2(replay(bad, *args), f"{bad}:{line}: ", message)


def test_an_inconsistent_event_exits_2_in_the_dashboard_replay_and_in_calibrate(tmp_path, recorded):
    events = events_of(recorded)
    i = first_of(events, "arrival")
    events = events[:i] + events[i + 1:]  # a step then names a request that never arrived
    bad = tmp_path / "bad.jsonl"
    write_events(bad, events)
    assert_exit_2(replay(bad, "--headless"), f"{bad}:", "has no arrival event")
    assert_exit_2(replay(bad), f"{bad}:", "has no arrival event")  # before any screen opens
    result = CliRunner().invoke(main, ["calibrate", "--from-trace", str(bad), "-o", str(tmp_path / "c.json")])
    assert_exit_2(result, f"{bad}:", "has no arrival event")
    no_peaks = tmp_path / "no_peaks.jsonl"
    write_events(no_peaks, with_header(events_of(recorded), peaks={"device_name": "x", "source": "y",
                                                                  "peak_flops": -1, "peak_bytes_per_s": 1}))
    result = CliRunner().invoke(main, ["calibrate", "--from-trace", str(no_peaks), "-o", str(tmp_path / "c.json")])
    assert_exit_2(result, f"{no_peaks}:1: header: field peaks.peak_flops must be a number > 0")


def test_unknown_event_types_are_skipped_with_one_warning(tmp_path, recorded):
    events = events_of(recorded)
    seq = iter(range(10 ** 6))
    mixed = []
    for e in events:
        if e["type"] == "step" and e["step"] % 5 == 0:
            mixed.append({"seq": 0, "t": e["t"], "type": "gpu_sample", "util": 0.9})
        mixed.append(e)
    mixed = [{**e, "seq": next(seq)} for e in mixed]
    path = tmp_path / "newer.jsonl"
    write_events(path, mixed)
    result = replay(path, "--headless")
    assert result.exit_code == 0, result.output
    assert result.stderr.count("warning") == 1 and "skipped events of unknown type(s) gpu_sample" in result.stderr
    replayed = json.loads(result.stdout)
    original = recorded["run.jsonl"][1]
    assert {k: v for k, v in replayed.items() if k != "replayed_from"} == original


def renumbered(events: list[dict]) -> list[dict]:
    return [{**e, "seq": i} for i, e in enumerate(events)]


@pytest.mark.parametrize("make,message", [
    (lambda ev: edit_event(ev, "step", put("kv", [0, 10 ** 12])), "the block map covers 1000000000000 blocks"),
    (lambda ev: (renumbered(ev[:2] + [{"t": 0.0, "type": "control", "name": "caption", "value": 3}] + ev[2:]), 3),
     "control event caption: field value must be a string"),
])
def test_a_damaged_count_or_a_caption_that_is_no_text_exits_2_before_any_screen(tmp_path, recorded, make, message):
    events, line = make(events_of(recorded))
    bad = tmp_path / "bad.jsonl"
    write_events(bad, events)
    assert_exit_2(replay(bad, "--headless"), f"{bad}:", message)
    assert_exit_2(replay(bad), f"{bad}:", message)


def test_a_gzip_trace_from_a_fifo_replays(tmp_path, recorded):
    import os
    import threading
    fifo = tmp_path / "run.fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_bytes(recorded["run.jsonl.gz"][0]), daemon=True)
    writer.start()
    result = replay(fifo, "--headless")
    writer.join(10)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["steps"] == recorded["run.jsonl.gz"][1]["steps"]


# -- issue 29 round 2: numbers finite but past any real session (replay summed them to inf) --------

def _set(event: dict, field: str, index: int, value) -> dict:
    return {**event, field: [*event[field][:index], value, *event[field][index + 1:]]}


@pytest.mark.parametrize("field,index,value,says", ids=["times", "cost", "counters"], argvalues=[
    ("times", 0, 1e308, "field times [0] must be a number >= 0 and at most 1e+12, got 1e+308"),
    ("cost", 0, 1e308, "field cost [0] must be a number >= 0 and at most 1e+30, got 1e+308"),
    ("counters", 0, 10 ** 40, "field counters [0] must be an integer >= 0 and at most 9007199254740992, "
                              "got an integer of 41 digits"),
])
def test_a_step_number_past_any_real_session_exits_2_naming_line_and_field(tmp_path, recorded, field, index, value,
                                                                          says):
    events, line = edit_event(events_of(recorded), "step", lambda e: _set(e, field, index, value))
    bad = tmp_path / "bad.jsonl"
    write_events(bad, events)
    assert_exit_2(replay(bad, "--headless"), f"{bad}:{line}: step event: {says}")
    result = CliRunner().invoke(main, ["calibrate", "--from-trace", str(bad), "-o", str(tmp_path / "c.json")])
    assert_exit_2(result, f"{bad}:{line}: step event: {says}")  # was numpy's LinAlgError
    assert not (tmp_path / "c.json").exists()


def test_a_step_shorter_than_any_clock_measures_is_not_fitted(tmp_path, recorded):
    events, line = edit_event(events_of(recorded), "step", lambda e: _set(e, "times", 0, 1e-300))
    bad = tmp_path / "bad.jsonl"
    write_events(bad, events)
    assert replay(bad, "--headless").exit_code == 0  # a replay can show it
    result = CliRunner().invoke(main, ["calibrate", "--from-trace", str(bad), "-o", str(tmp_path / "c.json")])
    assert_exit_2(result, f"--from-trace: {bad}:{line}: step event: field times[0] 1e-300 s is shorter than any "
                          "clock measures a step")


def test_header_peaks_past_any_device_exit_2_naming_the_field(tmp_path, recorded):
    events = events_of(recorded)
    bad = tmp_path / "bad.jsonl"
    write_events(bad, with_header(events, peaks={**events[0]["peaks"], "peak_flops": 1e300}))
    assert_exit_2(replay(bad, "--headless"), f"{bad}:1: header: field peaks.peak_flops must be in 1000..1e+21")
