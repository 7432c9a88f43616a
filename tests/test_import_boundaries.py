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
    assert "batchtop.core_engine.attach.scrape.scrape" in modules
    assert loaded_after_importing(modules, ("textual",)) == []


def module_graph() -> dict[str, set[str]]:
    """Every batchtop module and the batchtop modules it imports, wherever in the file the import sits
    (TYPE_CHECKING blocks too: a cycle there is one refactor away from a real one)."""
    names: dict[str, Path] = {}
    for top in TOP_LEVEL_PACKAGES:
        for path in (ROOT / top).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            names["batchtop." + ".".join(parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        graph[name] = {t for t in targets if t in names and t != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt]
            if nxt not in state and (found := visit(nxt, path + [nxt])):
                return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start, [start])):
            return found
    return None


def sub_package(module: str) -> str:
    """batchtop.core_engine.engine.engine -> batchtop.core_engine.engine (a package is its own); the
    widgets folders go one level deeper. Modules at a top-level package's root belong to it."""
    parts = module.split(".")
    depth = 4 if parts[1:3] == ["tui", "widgets"] else 3
    candidate = ".".join(parts[:depth])
    path = ROOT.joinpath(*candidate.split(".")[1:])
    return candidate if path.is_dir() else ".".join(parts[:depth - 1])


def test_no_module_imports_itself_back_through_a_cycle():
    assert find_cycle(module_graph()) is None


def test_the_sub_packages_of_core_engine_and_of_tui_depend_one_way():
    """The program's entry point (tui/__main__.py) depends on everything and is left out."""
    modules = {m: deps for m, deps in module_graph().items() if not m.endswith(".__main__")}
    packages: dict[str, set[str]] = {}
    for module, deps in modules.items():
        packages.setdefault(sub_package(module), set()).update(sub_package(d) for d in deps)
    for package, deps in packages.items():
        deps.discard(package)
    assert "batchtop.core_engine.sched" in packages and "batchtop.tui.widgets.engine" in packages
    assert find_cycle(packages) is None


def test_only_the_run_loop_and_the_measurement_probes_step_an_engine():
    """One loop drives every front end; pacing and calibration probes step engines of their own."""
    allowed = {"core_engine/run/loop.py", "core_engine/run/live_session.py",  # the loop, and the Session it steps
               "tui/sources/in_flight.py",  # that Session as the dashboard's loop steps it, timed for the status line
               "core_engine/run/trace_player.py",  # a recording's player: no engine behind it
               "core_engine/run/arrival_pacing.py", "core_engine/perf/decode_sweep.py"}  # measurement probes
    callers = set()
    for top in ("core_engine", "tui"):
        for path in (ROOT / top).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "step"
                        and not (isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "_stream")):
                    callers.add(path.relative_to(ROOT).as_posix())
    assert "core_engine/run/loop.py" in callers
    assert callers <= allowed, f"engine.step() outside the run loop: {sorted(callers - allowed)}"


def test_there_is_one_textual_app():
    apps = []
    for path in (ROOT / "tui").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                bases = {b.id if isinstance(b, ast.Name) else b.value.id if isinstance(b, ast.Subscript)
                         and isinstance(b.value, ast.Name) else None for b in node.bases}
                if "App" in bases:
                    apps.append(f"{path.relative_to(ROOT)}:{node.name}")
    assert apps == ["tui/app.py:BatchtopApp"]


def test_building_a_model_and_stepping_it_loads_neither_torch_dynamo_nor_sympy():
    """Both are torch's compiler stack, about 2.5 s of import a start pays for nothing: building the
    model on the meta device once pulled them in (nn.Embedding's normal_ init, Module.to_empty)."""
    code = ("import sys\nfrom batchtop.core_engine.config import EngineConfig, preset\n"
            "from batchtop.core_engine.engine.engine import Engine\n"
            "from batchtop.core_engine.sched.request import Request\n"
            "engine = Engine(EngineConfig(model=preset('tiny'), dtype='float32', max_num_seqs=2, seed=0))\n"
            "engine.load_workload([Request('a', (1, 2, 3), 4), Request('b', (4, 5), 3)])\n"
            "while not engine.is_done(): engine.step()\n"
            "print(sorted(m for m in sys.modules if m == 'sympy' or m.startswith(('torch._dynamo', 'sympy.'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert eval(out.stdout) == []
