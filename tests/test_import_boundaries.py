"""core_engine and gpu_kernels never load a UI library; the headless CLI path never loads Textual."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import core_engine
import gpu_kernels

ROOT = Path(__file__).resolve().parent.parent


def all_modules(package) -> list[str]:
    return [package.__name__] + [m.name for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")]


def loaded_after_importing(modules: list[str], forbidden: tuple[str, ...]) -> list[str]:
    code = (f"import sys\nfor m in {modules!r}: __import__(m)\n"
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {forbidden!r}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    return eval(out.stdout)


def test_engine_and_kernels_import_neither_textual_nor_rich():
    modules = all_modules(core_engine) + all_modules(gpu_kernels)
    assert "core_engine.scheduler.static" in modules and "core_engine.engine" in modules
    assert loaded_after_importing(modules, ("textual", "rich")) == []


def test_the_headless_command_path_never_imports_textual():
    modules = ["tui", "tui.cli", "tui.headless_cmd", "tui.compare_cmd", "tui.options"]
    assert loaded_after_importing(modules, ("textual",)) == []
