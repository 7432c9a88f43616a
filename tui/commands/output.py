"""Writing result documents: JSON to a file or stdout, never half-written."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from batchtop.core_engine.errors import ConfigError


def check_writable(path: str | None, option: str = "--output") -> None:
    """Fail before the run, not after it, when the output cannot be written."""
    if path is None or path == "-":
        return
    parent = Path(path).resolve().parent
    if not parent.is_dir():
        raise ConfigError(option, f"directory {parent} does not exist")
    if Path(path).is_dir():
        raise ConfigError(option, f"{path} is a directory")
    if not os.access(parent, os.W_OK):
        raise ConfigError(option, f"directory {parent} is not writable")


def write_json(doc: dict, path: str | None) -> None:
    text = json.dumps(doc, indent=2, sort_keys=False) + "\n"
    if path is None or path == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    tmp = Path(path).with_name(Path(path).name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
