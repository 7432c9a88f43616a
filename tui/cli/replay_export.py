"""`batchtop replay T --export FILE`: draw the recording into a shareable file, say what was written."""

from __future__ import annotations

import os
import sys
import time

from batchtop.core_engine.output_files import OutputError, write_text
from batchtop.tui.cli.headless import note
from batchtop.tui.cli.options import EXIT_ENGINE_FAILURE, fail
from batchtop.tui.export.options import ExportPlan
from batchtop.tui.export.stepped_replay import SteppedReplay

def run_replay_export(source: SteppedReplay, plan: ExportPlan, theme: str) -> None:
    from batchtop.tui.export.run import ExportStopped, export_recording  # Textual loads only here
    start = time.monotonic()
    try:
        text, num_frames = export_recording(source, plan, theme)
    except ExportStopped as exc:
        note(f"export stopped before its last frame: {plan.path} was not written")
        sys.exit(exc.code)
    try:
        write_text(text, plan.path)
    except OutputError as exc:  # a disk that filled while drawing, a reader that went away
        fail(str(exc), EXIT_ENGINE_FAILURE)
    size = len(text.encode("utf-8"))
    where = os.path.abspath(plan.path)
    pace = f" at {plan.speed:g}x" if plan.speed != 1 else ""
    note(f"wrote {where}: {num_frames} frames, {source.duration / plan.speed:.1f}s long ({source.duration:.1f}s "
         f"of the recording{pace}), {size / 1e6:.2f} MB, in {time.monotonic() - start:.1f}s")
    sys.exit(0)
