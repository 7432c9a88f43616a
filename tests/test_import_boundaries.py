"""Import rules: the engine and kernels load no UI library, the headless path loads no Textual, and
everything is imported under the one `batchtop.` root (never as a bare `core_engine` or `tui`)."""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import batchtop.core_engine as core_engine
import batchtop.core_engine.serve as serving
import batchtop.gpu_kernels as gpu_kernels

ROOT = Path(__file__).resolve().parent.parent
TOP_LEVEL_PACKAGES = ("core_engine", "gpu_kernels", "tui", "themes")


def all_modules(package) -> list[str]:
    return [package.__name__] + [m.name for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")]


def loaded_after_importing(modules: list[str], forbidden: tuple[str, ...]) -> list[str]:
    code = (f"import sys\nfor m in {modules!r}: __import__(m)\n"
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {forbidden!r}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    return eval(out.stdout)


def test_engine_and_kernels_import_neither_textual_nor_rich():
    modules = all_modules(core_engine) + all_modules(gpu_kernels)
    assert "batchtop.core_engine.sched.static" in modules
    assert "batchtop.core_engine.engine.engine" in modules
    assert loaded_after_importing(modules, ("textual", "rich")) == []


def test_model_directories_load_without_transformers():
    """transformers is a test and benchmark peer only: checkpoints and tokenizers load through
    safetensors and tokenizers."""
    modules = all_modules(core_engine) + ["batchtop.tui.cli.headless", "batchtop.tui.cli.export"]
    assert "batchtop.core_engine.model.checkpoint" in modules and "batchtop.core_engine.model.tokenizer" in modules
    assert loaded_after_importing(modules, ("transformers",)) == []


def test_the_headless_command_path_never_imports_textual():
    modules = ["batchtop.tui", "batchtop.tui.cli", "batchtop.tui.cli.headless",
               "batchtop.tui.cli.compare", "batchtop.tui.cli.options"]
    assert loaded_after_importing(modules, ("textual",)) == []


def test_the_headless_server_path_never_imports_textual():
    modules = ["batchtop.tui.cli", "batchtop.tui.cli.serve", *all_modules(serving)]
    assert "batchtop.core_engine.serve.app" in modules
    assert loaded_after_importing(modules, ("textual",)) == []


def bare_imports(path: Path) -> list[str]:
    """`import tui` / `from core_engine.x import y`: names that only resolve from a source checkout."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        found += [f"{path.relative_to(ROOT)}:{node.lineno}: {n}" for n in names
                  if n.split(".")[0] in TOP_LEVEL_PACKAGES]
    return found


def test_nothing_imports_the_top_level_folders_by_their_bare_names():
    files = [p for folder in (*TOP_LEVEL_PACKAGES, "tests", "bench", "examples")
             for p in (ROOT / folder).rglob("*.py")]
    assert len(files) > 50
    assert [hit for p in files for hit in bare_imports(p)] == []


def test_the_headless_attach_path_never_imports_textual():
    import batchtop.core_engine.attach as attach
    modules = ["batchtop.tui.cli", "batchtop.tui.cli.attach", "batchtop.tui.cli.attach_replay",
               "batchtop.tui.cli.replay", *all_modules(attach)]
    assert "batchtop.core_engine.attach.scrape" in modules
    assert loaded_after_importing(modules, ("textual",)) == []
