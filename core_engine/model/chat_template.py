"""A checkpoint's chat template, compiled and rendered under bounds: it comes with a downloaded model
directory, so it may be broken or hostile.

Here, in whatever process renders: Jinja's immutable sandbox (no private attributes, no changing a
list or dict), its ranges of at most 100,000 items, `*` and `**` refused before they build a value
over MAX_VALUE_BYTES, and the output counted as it is generated and cut past `max_bytes`. What bounds
the time and the memory a render takes is the process the server renders in (template_worker.py).

Failures come in two kinds: TemplateRefused when this conversation is what the template turns down
(its own raise_exception, a prompt too long to use), TemplateBroken when the template itself fails.
"""

from __future__ import annotations

from typing import Any

from jinja2 import Template, TemplateError, pass_eval_context
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment

MAX_VALUE_BYTES = 16 << 20  # one string or list a template builds with * (the prompt itself is bounded apart)
MAX_POWER_BITS = 1 << 16  # an integer ** that would be longer than this many bits


class TemplateRefused(ValueError):
    """The template turned this conversation down, or rendered it too long: the client's 400."""


class PromptTooLong(TemplateRefused):
    """The rendered prompt passed the byte bound it was rendered under."""


class TemplateBroken(RuntimeError):
    """The template failed on its own (a bug, a runaway, a crash): the server's 500."""


def _raise_exception(message: str) -> None:
    """Templates call raise_exception(...) to refuse a conversation they cannot render."""
    raise TemplateError(message)


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    """The immutable sandbox with `*` and `**` checked before they run."""

    intercepted_binops = frozenset({"*", "**"})

    def call_binop(self, context, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            _check_repeat(left, right)
        elif operator == "**":
            _check_power(left, right)
        return super().call_binop(context, operator, left, right)


def _check_repeat(left: Any, right: Any) -> None:
    for seq, times in ((left, right), (right, left)):
        if isinstance(seq, (str, list, tuple)) and isinstance(times, int):
            unit = len(seq.encode("utf-8", "surrogatepass")) if isinstance(seq, str) else len(seq) * 8
            if unit * times > MAX_VALUE_BYTES:
                raise TemplateBroken(f"the chat template repeats a {type(seq).__name__} of {len(seq)} items "
                                     f"{times} times, over the {MAX_VALUE_BYTES >> 20} MiB a value may have")


def _check_power(base: Any, exponent: Any) -> None:
    if isinstance(base, int) and isinstance(exponent, int) and abs(base) > 1:
        if exponent * abs(base).bit_length() > MAX_POWER_BITS:
            raise TemplateBroken(f"the chat template raises {base} to the power {exponent}: an integer of more "
                                 f"than {MAX_POWER_BITS} bits")


@pass_eval_context
def _at_render_time(_eval_ctx, value: Any) -> Any:
    """As a finalize that needs the render's context, it keeps Jinja from evaluating a constant
    output (`{{ '%999999999d' % 1 }}`, `{{ 'x' | center(10**9) }}`) while it compiles."""
    return value


def compile_template(source: str) -> Template:
    """Raises jinja2's TemplateSyntaxError (with its line) for a template that does not parse."""
    # optimized=False: nor does Jinja fold constant expressions anywhere else at compile time, outside
    # every bound a render has
    # loopcontrols: {% break %} and {% continue %}, which transformers allows templates too
    env = BoundedEnvironment(trim_blocks=True, lstrip_blocks=True, optimized=False, finalize=_at_render_time,
                             extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = _raise_exception
    return env.from_string(source)


def render(template: Template, variables: dict[str, Any], max_bytes: int) -> str:
    """The template's output, refused once it passes max_bytes of UTF-8 (counted as it is generated,
    so a runaway output is never held whole)."""
    pieces: list[str] = []
    size = 0
    try:
        for piece in template.generate(**variables):
            size += len(piece.encode("utf-8", "surrogatepass"))
            if size > max_bytes:
                raise PromptTooLong(f"the chat template renders this conversation to more than {max_bytes} "
                                      f"bytes of prompt")
            pieces.append(piece)
    except (TemplateRefused, TemplateBroken):
        raise
    except SecurityError as exc:  # the template reached for what the sandbox keeps from it
        raise TemplateBroken(f"the chat template was stopped by the sandbox: {exc}") from None
    except TemplateError as exc:  # raise_exception, a value the conversation lacks
        raise TemplateRefused(f"chat template: {exc}") from None
    except RecursionError:
        raise TemplateBroken("the chat template recursed too deeply") from None
    except MemoryError:
        raise TemplateBroken("the chat template ran out of memory") from None
    except Exception as exc:  # the template's own bug: range(10**8), 1/0, a wrong type ...
        raise TemplateBroken(f"the chat template failed: {type(exc).__name__}: {exc}") from None
    return "".join(pieces)
