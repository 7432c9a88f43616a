"""A regular (non-editable) install holds every package: the editable install CI uses hides a package
missing from pyproject's explicit list, and a user's `pip install .` then cannot start."""

from __future__ import annotations

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_folder_is_listed_for_the_wheel():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {name: Path(path) for name, path in setuptools["package-dir"].items()}
    on_disk = set()
    for name, folder in folders.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / folder).parts
            on_disk.add(".".join((name, *parts)))
    listed = set(setuptools["packages"])
    assert on_disk - listed == set(), "packages with an __init__.py that a wheel would leave out"
    for package in listed:
        root = next(n for n in folders if package == n or package.startswith(n + "."))
        rest = package[len(root):].lstrip(".").split(".") if package != root else []
        assert (ROOT / folders[root]).joinpath(*rest).is_dir(), f"{package} is listed but has no folder"


def test_the_cpu_kernel_source_ships_in_the_wheel():
    """The kernels are compiled on the user's machine from csrc/: a wheel without a file there falls
    back to the slower torch code everywhere."""
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    globs = data.get("batchtop.gpu_kernels", [])
    sources = [p for p in (ROOT / "gpu_kernels" / "csrc").iterdir() if p.is_file()]  # .cpp and the .h they include
    assert sources
    for source in sources:
        relative = source.relative_to(ROOT / "gpu_kernels")
        assert any(relative.match(g) for g in globs), f"{relative} is not in gpu_kernels' package-data"
