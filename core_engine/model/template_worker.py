"""The process a server renders its chat template in (template_process.py starts it).

A template is code from a downloaded model directory. Whatever it does, it does here, in a process
that imports only jinja2, with an address-space limit (an allocation past it is a MemoryError, not a
machine out of memory) and a timer that interrupts a render past its seconds; a render that even the
timer cannot stop (one long C call) is killed by the server (template_process.py).

One JSON line in, one JSON line out, over stdin and stdout. The first line is the template, its
variables and the bounds ({"source", "variables", "seconds", "memory_bytes"}), answered {"ready": true}
or {"syntax": message}. Each later line is one render ({"messages", "add_generation_prompt",
"max_bytes"}), answered {"text"}, {"refused", "too_long"} or {"broken"}. End of input ends the process.
"""

from __future__ import annotations

import json
import resource
import signal
import sys
from typing import Any

from jinja2 import TemplateSyntaxError

from batchtop.core_engine.model.chat_template import (PromptTooLong, TemplateBroken, TemplateRefused,
                                                      compile_template, render)
from batchtop.core_engine.proc_info import kib_field


class _Deadline(BaseException):
    """Raised by the timer inside the render; a BaseException, so no `except Exception` swallows it."""


def _on_alarm(_signum, _frame) -> None:
    raise _Deadline


def limit_memory(budget: int) -> None:
    """What the interpreter already maps, plus `budget` bytes for renders."""
    now = kib_field("/proc/self/status", "VmSize")
    if now is not None:
        resource.setrlimit(resource.RLIMIT_AS, (now + budget, now + budget))


def render_one(template, variables: dict[str, Any], request: dict, seconds: float) -> dict:
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        text = render(template, {**variables, "messages": request["messages"],
                                 "add_generation_prompt": request["add_generation_prompt"]}, request["max_bytes"])
        return {"text": text}
    except PromptTooLong as exc:
        return {"refused": str(exc), "too_long": True}
    except TemplateRefused as exc:
        return {"refused": str(exc), "too_long": False}
    except TemplateBroken as exc:
        return {"broken": str(exc)}
    except _Deadline:
        return {"broken": f"the chat template ran past {seconds:g} s"}
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def reply(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")  # ASCII: a lone surrogate travels escaped
    sys.stdout.flush()


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the server's; it ends this process itself
    signal.signal(signal.SIGALRM, _on_alarm)
    setup = json.loads(sys.stdin.readline() or "null")
    if setup is None:
        return
    limit_memory(setup["memory_bytes"])
    signal.setitimer(signal.ITIMER_REAL, setup["seconds"])
    try:
        template = compile_template(setup["source"])
    except TemplateSyntaxError as exc:
        reply({"syntax": f"line {exc.lineno}: {exc.message}"})
        return
    except (Exception, MemoryError, _Deadline) as exc:  # a template too big or too deep to compile
        reply({"syntax": "too large or too deeply nested to compile" if not isinstance(exc, Exception) or
               isinstance(exc, (MemoryError, RecursionError)) else f"{type(exc).__name__}: {exc}"})
        return
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    reply({"ready": True})
    for line in sys.stdin:
        try:
            answer = render_one(template, setup["variables"], json.loads(line), setup["seconds"])
        except _Deadline:  # the timer went off between the render's end and its reset
            answer = {"broken": f"the chat template ran past {setup['seconds']:g} s"}
        except MemoryError:
            answer = {"broken": "the chat template ran out of memory"}
        reply(answer)


if __name__ == "__main__":
    main()
