"""`batchtop replay T --export`: a recording made here, exported as asciinema plays it and as an
animated SVG a browser plays, both showing the dashboard's panels over the recording's own time."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest
from asciinema import asciicast
from asciinema.asciicast import events as asciicast_events
from click.testing import CliRunner

from batchtop.core_engine.run.trace_player import TracePlayer
from batchtop.core_engine.trace.trace import read_trace
from batchtop.tui.cli import main
from batchtop.tui.export.animated_svg import HOLD_S

TINY = ["--model", "tiny", "--device", "cpu", "--dtype", "float32"]
SVG_NS = "{http://www.w3.org/2000/svg}"
ESCAPE = re.compile(r"\x1b\[([0-9;?]*)([A-Za-z])")


@pytest.fixture(scope="module")
def recording(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("export") / "session.jsonl.gz"
    # arrivals spread over the first second (a fixed seed): the recording lasts ~1.5 s, whatever the CPU
    result = CliRunner().invoke(main, ["--headless", *TINY, "--workload", "synthetic", "--rate", "8",
                                       "--num-requests", "8", "--length-scale", "0.25", "--record", str(path),
                                       "-o", str(path.with_name("metrics.json"))])
    assert result.exit_code == 0, result.output
    return str(path)


def export(recording: str, out: str, *extra: str):
    return CliRunner().invoke(main, ["replay", recording, "--export", out, "--export-size", "120x40", *extra])


def play(events: list) -> list[str]:
    """The screen a terminal shows after every event, as lines: cursor moves, clears and text (colours dropped)."""
    screen = [[" "] * 120 for _ in range(40)]
    row = col = 0
    for _, _, data in events:
        pos = 0
        for match in ESCAPE.finditer(data):
            for char in data[pos:match.start()]:
                screen[row][col] = char
                col = min(col + 1, 119)
            params, command = match.groups()
            if command == "H":
                row, col = (int(p) - 1 for p in (params or "1;1").split(";"))
            elif command == "J":
                screen = [[" "] * 120 for _ in range(40)]
            pos = match.end()
        for char in data[pos:]:
            screen[row][col] = char
            col = min(col + 1, 119)
    return ["".join(line) for line in screen]


def test_the_cast_is_asciicast_v2_that_asciinema_reads_and_plays_the_dashboard(recording, tmp_path):
    out = tmp_path / "demo.cast"
    result = export(recording, str(out), "--export-fps", "10")
    assert result.exit_code == 0, result.output
    assert "wrote" in result.output and "frames" in result.output
    with asciicast.open_from_url(str(out)) as cast:  # what `asciinema play` and `asciinema cat` open
        header = cast.v2_header
        events = list(cast.events())
    assert header["version"] == 2 and (header["width"], header["height"]) == (120, 40)
    assert isinstance(header["timestamp"], int) and "session.jsonl.gz" in header["title"]
    assert len(events) > 3 and all(kind == "o" for _, kind, _ in events)
    assert all(delay >= 0 for delay, _, _ in asciicast_events.to_relative_time(events))
    player = TracePlayer(read_trace(recording))
    assert events[-1][0] == pytest.approx(player.duration, abs=0.01)  # the cast lasts as long as the recording
    final = "\n".join(play(events))
    for text in ("Slots", "KV blocks", "Waiting", "Roofline", f"step {player.num_steps}/{player.num_steps}"):
        assert text in final, text
    first = "\n".join(play(events[:1]))
    assert f"step 0/{player.num_steps}" in first and "Slots" in first


def test_the_svg_is_one_animated_image_of_the_panels_under_5_mb(recording, tmp_path):
    out = tmp_path / "demo.svg"
    result = export(recording, str(out), "--export-fps", "10", "--speed", "2")
    assert result.exit_code == 0, result.output
    assert out.stat().st_size < 5_000_000
    root = ET.parse(out).getroot()
    frames = root.findall(f".//{SVG_NS}g[@visibility='hidden']")
    assert len(frames) > 1
    animations = [g.find(f"{SVG_NS}animate") for g in frames]
    starts = [float(a.get("keyTimes").split(";")[1]) for a in animations]
    assert starts == sorted(starts) and 0 < starts[0] and starts[-1] < 1
    loop_s = float(animations[0].get("dur").removesuffix("s"))  # the recording at 2x, then the hold
    assert loop_s == pytest.approx(TracePlayer(read_trace(recording)).duration / 2 + HOLD_S, abs=0.01)
    text = "".join(t.text or "" for t in root.iter(f"{SVG_NS}text")).replace("\xa0", " ")
    for panel in ("Slots", "KV blocks", "Waiting", "Roofline", "Device", "REPLAY 2x"):
        assert panel in text, panel


@pytest.mark.parametrize("name, why", [("demo.gif", ".cast"), ("", ".cast")])
def test_an_export_name_that_is_neither_cast_nor_svg_exits_2_naming_the_option(recording, tmp_path, name, why):
    result = export(recording, str(tmp_path / name) if name else "")
    assert result.exit_code == 2 and "--export" in result.output and why in result.output, result.output


def test_an_export_onto_the_recording_or_a_directory_is_refused_before_drawing(recording, tmp_path):
    (tmp_path / "dir.svg").mkdir()
    (tmp_path / "link.cast").symlink_to(recording)  # writing it would replace the recording's contents
    for target, why in ((str(tmp_path / "dir.svg"), "directory"), (str(tmp_path / "link.cast"), "same file")):
        result = export(recording, target)
        assert result.exit_code == 2 and "--export" in result.output and why in result.output, result.output
    result = CliRunner().invoke(main, ["replay", recording, "--headless", "--export", str(tmp_path / "x.cast")])
    assert result.exit_code == 2 and "--export" in result.output
