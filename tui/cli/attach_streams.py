"""attach's side-stream options checked before the first scrape: --vllm-log names a readable file or
- (a pipe), --kv-events and --kv-replay are ZMQ endpoints; each failure names its option (exit 2)."""

from __future__ import annotations

import dataclasses
import os
import stat

from batchtop.core_engine.attach.setup import AttachOptions
from batchtop.core_engine.attach.streams.kv_endpoints import default_replay_endpoint, parse_endpoint
from batchtop.core_engine.attach.streams.log_follower import STDIN
from batchtop.core_engine.errors import ConfigError


def _log(path: str | None) -> int | None:
    """The log file's size now (its steps are read from here: the roofs are measured before the watch
    starts), None for a pipe or no log; ConfigError for a path that is no readable file."""
    if path is None or path == STDIN:
        return None
    try:
        info = os.stat(path)
    except OSError as exc:
        raise ConfigError("--vllm-log", f"{path}: {exc.strerror}") from None
    if stat.S_ISDIR(info.st_mode):
        raise ConfigError("--vllm-log", f"{path} is a directory, not the server's log file")
    if not os.access(path, os.R_OK):
        raise ConfigError("--vllm-log", f"{path} is not readable")
    return info.st_size if stat.S_ISREG(info.st_mode) else None


def _endpoint(option: str, text: str | None) -> str | None:
    if text is None:
        return None
    try:
        return parse_endpoint(text)
    except ValueError as exc:
        raise ConfigError(option, str(exc)) from None


def check_streams(opts: AttachOptions) -> AttachOptions:
    """The options with the endpoints normalised and the replay endpoint defaulted; ConfigError naming
    the option that is wrong."""
    log_from = _log(opts.vllm_log)
    kv = _endpoint("--kv-events", opts.kv_events)
    replay = _endpoint("--kv-replay", opts.kv_replay)
    if replay is not None and kv is None:
        raise ConfigError("--kv-replay", "only with --kv-events")
    if kv is not None and replay is None and kv.startswith("tcp://"):
        try:
            replay = default_replay_endpoint(kv)
        except ValueError:  # port 65535 has no next port: no replay unless --kv-replay says where
            replay = None
    return dataclasses.replace(opts, kv_events=kv, kv_replay=replay, vllm_log_from=log_from)


def terminal_for_keys(opts: AttachOptions) -> AttachOptions:
    """With --vllm-log - the log comes on standard input, where the dashboard reads its keys: the pipe moves
    to another descriptor for the log's reader and standard input becomes the terminal (as `less` does)."""
    if opts.vllm_log != STDIN or opts.headless:
        return opts
    try:
        tty = os.open("/dev/tty", os.O_RDONLY)
    except OSError:
        raise ConfigError("--vllm-log", "- with the dashboard needs a terminal for its keys (none here): "
                                        "use --headless, or a log file") from None
    pipe = os.dup(0)
    os.dup2(tty, 0)
    os.close(tty)
    return dataclasses.replace(opts, vllm_log_fd=pipe)
