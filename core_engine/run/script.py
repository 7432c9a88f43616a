"""Scripted demos: timed actions against a running engine, so a demo can be recorded again and again.

A script is a JSON (or, with PyYAML installed, YAML) list of actions, or {"actions": [...]}:
    {"at": 0,  "mode": "static", "max_num_seqs": 8, "caption": "static batching: watch the bubbles"}
    {"at": 20, "mode": "continuous"}
    {"at": 60, "burst": 100}
    {"at": 80, "quit": true}
`at` is seconds since the run started. Every other key is optional; several may share one action.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from batchtop.core_engine.engine import control
from batchtop.core_engine.config import MODES
from batchtop.core_engine.config import MAX_NUM_SEQS_LIMIT
from batchtop.core_engine.errors import WorkloadError
from batchtop.core_engine.text_files import NotText, input_problem, parse_json, read_text_file
from batchtop.core_engine.workload.raw import MAX_ARRIVAL_S

ACTION_KEYS = {"at", "mode", "max_num_seqs", "burst", "caption", "quit"}


@dataclass(frozen=True, slots=True)
class ScriptAction:
    at: float
    mode: str | None = None
    max_num_seqs: int | None = None
    burst: int | None = None
    caption: str | None = None
    quit: bool = False

    def commands(self) -> list[control.Command]:
        """The engine commands this action sends (bursts are built by the driver from its workload)."""
        out: list[control.Command] = []
        if self.mode is not None:
            out.append(control.SetMode(self.mode))
        if self.max_num_seqs is not None:
            out.append(control.SetMaxNumSeqs(self.max_num_seqs))
        return out


def load_script(path: str, bundled_dir: Path | None = None) -> list[ScriptAction]:
    """Read and validate a script; a bare name like 'teaching' also finds a bundled demo."""
    p = Path(path)
    if not p.exists() and bundled_dir is not None and (bundled_dir / f"{path}.json").is_file():
        p = bundled_dir / f"{path}.json"
    problem = input_problem(p, "script file")  # anything else is read once as a stream (a FIFO, <(...))
    if problem is not None:
        raise WorkloadError(path, problem)
    try:
        text = read_text_file(p)
    except NotText as exc:
        raise WorkloadError(path, exc.message, exc.line) from None
    if p.suffix.lower() in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise WorkloadError(path, "YAML scripts need PyYAML (pip install pyyaml); or write the script as JSON") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise WorkloadError(path, f"not YAML: {exc}") from None
    else:
        try:
            data = parse_json(text)
        except NotText as exc:
            raise WorkloadError(path, exc.message, exc.line) from None
    if isinstance(data, dict):
        data = data.get("actions")
    if not isinstance(data, list) or not data:
        raise WorkloadError(path, "a script is a non-empty list of actions (or {\"actions\": [...]})")
    actions = [_action(path, i, item) for i, item in enumerate(data, 1)]
    return sorted(actions, key=lambda a: a.at)


def _action(path: str, number: int, item: object) -> ScriptAction:
    def bad(message: str) -> WorkloadError:
        return WorkloadError(path, f"action {number}: {message}")

    if not isinstance(item, dict):
        raise bad("must be an object with an 'at' time")
    unknown = set(item) - ACTION_KEYS
    if unknown:
        raise bad(f"unknown key(s) {', '.join(sorted(unknown))} (known: {', '.join(sorted(ACTION_KEYS))})")
    at = item.get("at")
    if not isinstance(at, (int, float)) or isinstance(at, bool) or not math.isfinite(at) or at < 0:
        raise bad(f"'at' must be seconds >= 0, got {at!r}")
    if at > MAX_ARRIVAL_S:  # as a workload's arrivals: no run waits that long for it
        raise bad(f"'at' must be at most {MAX_ARRIVAL_S:g} seconds, got {at!r}")
    mode = item.get("mode")
    if mode is not None and mode not in MODES:
        raise bad(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    for key, limit in (("max_num_seqs", MAX_NUM_SEQS_LIMIT), ("burst", 100_000)):
        value = item.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= limit):
            raise bad(f"{key} must be an integer in 1..{limit}, got {value!r}")
    caption = item.get("caption")
    if caption is not None and not isinstance(caption, str):
        raise bad("caption must be text")
    return ScriptAction(float(at), mode, item.get("max_num_seqs"), item.get("burst"), caption,
                        bool(item.get("quit", False)))


class ScriptPlayer:
    """Hands out the actions whose time has come, once each, in order."""

    def __init__(self, actions: list[ScriptAction]) -> None:
        self.actions = actions
        self._next = 0

    def due(self, now: float) -> list[ScriptAction]:
        start = self._next
        while self._next < len(self.actions) and self.actions[self._next].at <= now:
            self._next += 1
        return self.actions[start:self._next]

    def next_at(self) -> float | None:
        return self.actions[self._next].at if self._next < len(self.actions) else None
