"""The server's side of the chat-template process (template_worker.py): start it, render through it
against a deadline, and kill and replace it when a render will not end.

render() blocks its caller (the server calls it on a thread of its own, never on the event loop) and
renders one conversation at a time. The template is compiled when the process starts, so a template
that does not parse is refused when the server starts, naming the file it came from.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import threading
import time

from batchtop.core_engine.errors import BadInput
from batchtop.core_engine.model.chat_template import PromptTooLong, TemplateBroken, TemplateRefused

RENDER_SECONDS = 2.0  # real templates render in milliseconds
KILL_MARGIN_S = 1.0  # past the worker's own timer: a render stuck in one C call is killed
MEMORY_BYTES = 1 << 30  # what a render may allocate
START_SECONDS = 30.0
WORKER = "batchtop.core_engine.model.template_worker"


class _Died(Exception):
    pass


class TemplateProcess:
    def __init__(self, source: str, variables: dict[str, str], origin: str, *, seconds: float = RENDER_SECONDS,
                 memory_bytes: int = MEMORY_BYTES) -> None:
        self.origin = origin  # the file the template came from, for a syntax error
        self.seconds = seconds
        self._setup = json.dumps({"source": source, "variables": variables, "seconds": seconds,
                                  "memory_bytes": memory_bytes}).encode() + b"\n"
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._buffer = b""
        self.restarts = 0  # processes killed or lost and replaced (a runaway template, a crash)

    def start(self) -> None:
        """Start the process and compile the template; BadInput names the file when it does not parse."""
        with self._lock:
            self._spawn()

    def render(self, messages: list[dict[str, str]], max_bytes: int, add_generation_prompt: bool = True) -> str:
        """The prompt text; raises PromptTooLong, TemplateRefused or TemplateBroken."""
        request = json.dumps({"messages": messages, "add_generation_prompt": add_generation_prompt,
                              "max_bytes": max_bytes}).encode() + b"\n"
        with self._lock:
            if self._proc is None:
                self._spawn()
            try:
                answer = self._ask(request, time.monotonic() + self.seconds + KILL_MARGIN_S)
            except TimeoutError:
                self._kill()
                self.restarts += 1
                raise TemplateBroken(f"the chat template ran past {self.seconds:g} s (its process was "
                                     f"killed and replaced)") from None
            except _Died as exc:
                self._kill()
                self.restarts += 1
                raise TemplateBroken(f"the chat template's process died ({exc}); it is replaced") from None
        if "text" in answer:
            return answer["text"]
        if "refused" in answer:
            raise (PromptTooLong if answer.get("too_long") else TemplateRefused)(answer["refused"])
        raise TemplateBroken(answer.get("broken", f"unexpected answer {answer!r}"))

    def close(self) -> None:
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is not None:
            proc.stdin.close()  # the process ends at the end of its input
            try:
                proc.wait(1.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            proc.stdout.close()

    # -- under the lock -------------------------------------------------------------------------------
    def _spawn(self) -> None:
        self._buffer = b""
        # -I, with this process's own sys.path: the worker imports the jinja2 and batchtop the server
        # does, however they are installed, and nothing from the environment or the working directory
        boot = f"import sys; sys.path[:] = {sys.path!r}; from {WORKER} import main; main()"
        self._proc = subprocess.Popen([sys.executable, "-I", "-c", boot], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0,
                                      start_new_session=True)  # the terminal's Ctrl-C is not for it
        try:
            answer = self._ask(self._setup, time.monotonic() + START_SECONDS)
        except (TimeoutError, _Died) as exc:
            self._kill()
            raise TemplateBroken(f"the chat template's process did not start ({exc or 'timed out'})") from None
        if "syntax" in answer:
            self._kill()
            raise BadInput(f"{self.origin}: the chat template does not parse: {answer['syntax']}")

    def _ask(self, line: bytes, deadline: float) -> dict:
        proc = self._proc
        try:
            proc.stdin.write(line)
        except (BrokenPipeError, OSError):
            raise _Died(self._exit_status()) from None
        fd = proc.stdout.fileno()
        chunks = [self._buffer]
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while b"\n" not in chunks[-1]:
                left = deadline - time.monotonic()
                if left <= 0 or not selector.select(left):
                    self._buffer = b"".join(chunks)
                    raise TimeoutError
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    raise _Died(self._exit_status())
                chunks.append(chunk)
        line, _, self._buffer = b"".join(chunks).partition(b"\n")
        return json.loads(line)

    def _exit_status(self) -> str:
        try:
            code = self._proc.wait(1.0)
        except subprocess.TimeoutExpired:
            return "it stopped answering"
        return f"killed by signal {-code}" if code < 0 else f"exit {code}"

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        proc.kill()
        proc.wait()
        for pipe in (proc.stdin, proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass
