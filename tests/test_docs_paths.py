"""Every file of this repository that README.md and docs/ name is there: a moved test or module
breaks the command a reader copies (the golden-screenshot update command did, once)."""

import itertools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOP = ("tests", "core_engine", "gpu_kernels", "tui", "themes", "bench", "examples", "docs")
PATH = re.compile(r"(?<![\w/.-])((?:%s)/[\w./{},*-]*\w)" % "|".join(TOP))
OTHER_PROJECT = re.compile(r"(TGI|vLLM|SGLang|llama\.cpp)'s own `$")  # a path in another project's tree


def expand(path: str) -> list[str]:
    """tests/attach/test_{a,b}.py -> the two paths."""
    parts = re.split(r"\{([^{}]*)\}", path)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def named_paths() -> dict[str, str]:
    found = {}
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = page.read_text(encoding="utf-8")
        for match in PATH.finditer(text):
            if OTHER_PROJECT.search(text[max(0, match.start() - 40):match.start()]):
                continue
            for path in expand(match.group(1).rstrip(".")):
                found.setdefault(path, page.name)
    return found


def test_the_pages_name_paths_at_all():
    assert len(named_paths()) > 20


def test_every_path_the_docs_name_exists():
    missing = {p: page for p, page in named_paths().items()
               if "*" not in p and not (ROOT / p).exists() and not p.startswith("docs/recordings/")}
    assert missing == {}
