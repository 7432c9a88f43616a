"""Error types that map onto the CLI's exit codes (2 = bad input, 1 = engine failure)."""

from __future__ import annotations


class BadInput(ValueError):
    """Anything the user handed us that cannot be used; the message names the option, file or line."""


class ConfigError(BadInput):
    """An engine or model setting is invalid. `field` names it as the engine does (max_num_seqs, model,
    a config.json key); the CLI shows its flag instead (tui/cli/flags.py)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class WorkloadError(BadInput):
    """A workload file (or one line of it) is invalid."""

    def __init__(self, path: str, message: str, line: int | None = None) -> None:
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {message}")
        self.path = path
        self.line = line


class InvalidRequest(ValueError):
    """A request refused at submit time; the engine keeps serving the others."""


class UnservableRequest(InvalidRequest):
    """A request that can never fit (KV pool or max_model_len): rejected up front, never queued."""
