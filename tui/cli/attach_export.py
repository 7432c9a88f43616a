"""--export-workload at the end of an attach watch (live or replayed): the workload written where the
user asked, or one line saying why there is none."""

from __future__ import annotations

import os

from batchtop.core_engine.attach.monitor import Monitor
from batchtop.core_engine.attach.record.workload_export import ExportError, build_workload
from batchtop.core_engine.output_files import STDOUT, OutputError, write_text
from batchtop.tui.cli.headless import note


def export_workload(monitor: Monitor, path: str) -> bool:
    """Write the workload; False (after saying why) when the watch holds none or the write failed."""
    try:
        workload = build_workload([w.session for w in monitor.windows], monitor.urls, monitor.frame().main.flavour)
        write_text(workload.text(), path)
    except ExportError as exc:
        note(f"--export-workload: {exc}; nothing written to {path}")
        return False
    except OutputError as exc:
        note(f"--export-workload: {exc}")
        return False
    # a regular file can be read back; /dev/null, a FIFO or stdout cannot: no command to try on them
    again = f": try batchtop compare --simulate h100 --workload {path}" if path != STDOUT and os.path.isfile(path) else ""
    note(f"wrote {len(workload.lines)} requests to {path} ({workload.rate:.2f}/s, prompt mean "
         f"{workload.prompt_mean:.0f}, output mean {workload.output_mean:.0f} tokens){again}")
    return True
