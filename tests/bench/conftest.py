"""bench/'s scripts import their siblings by bare name (they run as `python bench/x.py`): the tests
import them the same way."""

import sys
from pathlib import Path

BENCH = str(Path(__file__).resolve().parents[2] / "bench")
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)
