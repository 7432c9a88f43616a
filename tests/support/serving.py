"""An in-process `batchtop serve` on an ephemeral loopback port, for the serve tests."""

from __future__ import annotations

import codecs
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

from batchtop.core_engine.config import EngineConfig
from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.sched.request import Request
from batchtop.core_engine.model.template_process import TemplateProcess
from batchtop.core_engine.serve.app import create_app
from batchtop.core_engine.serve.engine_thread import EngineThread
from batchtop.core_engine.serve.exporter import VllmMetrics
from batchtop.core_engine.serve.hub import RequestHub
from batchtop.core_engine.serve.prompt_text import start_chat
from batchtop.core_engine.serve.prompts import ServedModel
from batchtop.core_engine.serve.server import Server, bind_socket
from batchtop.core_engine.serve.step_stream import QUEUE_STEPS, StepPublisher
from batchtop.core_engine.serve.text import TextCodec
from batchtop.core_engine.run.live_session import Session
from batchtop.core_engine.trace.trace import Recorder
from tests.conftest import tiny_config


@dataclass
class Running:
    url: str
    engine: Engine
    hub: RequestHub
    loop: EngineThread
    metrics: VllmMetrics
    stopped: threading.Event  # set once the HTTP server has shut down
    chat: TemplateProcess | None = None  # the chat template's process
    steps: StepPublisher | None = None  # the step stream at /batchtop/steps

    def get(self, path: str, **kwargs) -> httpx.Response:
        return httpx.get(self.url + path, timeout=10, **kwargs)

    def post(self, path: str, **kwargs) -> httpx.Response:
        return httpx.post(self.url + path, timeout=10, **kwargs)

    def scrape(self) -> dict[str, float]:
        """/metrics parsed by prometheus_client's own parser: {sample name{labels}: value}."""
        text = self.get("/metrics").text
        return {_key(s.name, s.labels): s.value for family in text_string_to_metric_families(text)
                for s in family.samples}


BYTE_TEMPLATE = ("{% for m in messages %}{% if m.role not in ['system', 'user', 'assistant'] %}"
                 "{{ raise_exception('roles must be system, user or assistant') }}{% endif %}"
                 "<{{ m.role }}>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")


class ByteCodec:
    """A tokenizer for the random presets: one token per UTF-8 byte (ids 0-255 of the tiny preset's 512),
    a toy chat template, EOS 256. It drives the server's text path: prompts, chat, stop strings."""

    eos_token_ids = (256,)
    chat_template_origin = "tests/serving.py"

    def __init__(self, chat_template: str | None = BYTE_TEMPLATE) -> None:
        self.chat_template = chat_template

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(text.encode())

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        """What the server's render of the template tokenizes to."""
        return self.encode("".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>")

    def template_variables(self) -> dict[str, str]:
        return {}

    def max_text_bytes(self, tokens: int) -> int:
        return tokens

    def decoder(self) -> _ByteDecoder:
        return _ByteDecoder()

    def decode(self, token_ids: list[int]) -> str:
        return self.decoder().feed(token_ids)


class _ByteDecoder:
    def __init__(self) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token_ids) -> str:
        return self._utf8.decode(bytes(t % 256 for t in token_ids if t != 256))


def _key(name: str, labels: dict[str, str]) -> str:
    extra = {k: v for k, v in labels.items() if k not in ("model_name", "engine")}
    return name + ("{" + ",".join(f"{k}={v}" for k, v in sorted(extra.items())) + "}" if extra else "")


@contextmanager
def serving(config: EngineConfig | None = None, *, engine: Engine | None = None, codec: TextCodec | None = None,
            api_key: str | None = None, max_waiting: int | None = None, grace_s: float = 5.0,
            max_body_bytes: int | None = None, stop_on_engine_failure: bool = True,
            workload: list[Request] | None = None, body_timeout_s: float | None = None,
            head_timeout_s: float | None = None, chat_seconds: float = 2.0,
            recorder: Recorder | None = None, steps_queue: int | None = None) -> Iterator[Running]:
    """recorder: a trace under the session, with no failure policy (the CLI's serve sets one);
    steps_queue: each step-stream viewer's bound, in steps."""
    engine = engine or Engine(config or tiny_config(max_num_seqs=16, num_kv_blocks=1024))
    session = Session(engine, workload or [], recorder=recorder)
    chat = start_chat(codec, chat_seconds)
    model = ServedModel("tiny", engine.config, codec, chat=chat)
    metrics = VllmMetrics(engine.config, model.name)
    loop = EngineThread(session)
    hub = RequestHub(engine, wake=loop.wake, max_waiting=max_waiting)
    header = {"config": engine.config.as_dict(), "device": {"kind": "cpu", "name": "test-cpu"}, "peaks": None}
    steps = StepPublisher(header, initial=engine.snapshot(), max_steps=steps_queue or QUEUE_STEPS)
    session.listeners += [metrics, hub, steps]
    limits = {} if max_body_bytes is None else {"max_body_bytes": max_body_bytes}
    if body_timeout_s is not None:
        limits["body_timeout_s"] = body_timeout_s
    app = create_app(model, hub, metrics, api_key=api_key, steps=steps, **limits)
    heads = {} if head_timeout_s is None else {"head_timeout_s": head_timeout_s}
    server = Server(app, hub, bind_socket("127.0.0.1", 0), grace_s=grace_s, quiet=True, **heads)
    if stop_on_engine_failure:  # as the headless command does
        loop.on_exit = server.shutdown
    loop.start()
    server.start_in_thread()
    try:
        yield Running(server.url, engine, hub, loop, metrics, server.stopped, chat, steps)
    finally:
        server.shutdown()
        server.join()
        loop.stop()
        if chat is not None:
            chat.close()


def wait_idle(server: Running, timeout_s: float = 20.0) -> None:
    """Until nothing is in flight and every KV block is free again."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        snap = server.engine.latest
        if (server.hub.num_in_flight == 0 and server.engine.is_done() and snap is not None
                and server.engine.allocator.num_used_blocks == 0):
            return
        time.sleep(0.02)
    raise AssertionError(f"not idle: {server.hub.num_in_flight} in flight, {server.engine.latest}")
