"""Engine errors name the setting (max_num_seqs, model); the CLI shows the flag that sets it, read from
the running command's own parameters, so the two can never drift apart."""

from __future__ import annotations

import click

from batchtop.core_engine.errors import BadInput, ConfigError


def flag_for(field: str, ctx: click.Context | None) -> str:
    """--max-num-seqs for max_num_seqs on the command running now (or a parent); else the field itself
    (a config.json key, a file)."""
    while ctx is not None:
        for param in ctx.command.params:
            if isinstance(param, click.Option) and param.name == field:
                return max(param.opts, key=len)
        ctx = ctx.parent
    return field


def user_message(exc: BadInput) -> str:
    if isinstance(exc, ConfigError):
        return f"{flag_for(exc.field, click.get_current_context(silent=True))}: {exc.message}"
    return str(exc)
