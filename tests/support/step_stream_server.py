"""A stand-in for a vLLM server with its side streams, on 127.0.0.1, made of the real 0.32.0 capture:
/metrics answers the captured scrapes one after another, a log file gets the captured iteration lines
appended, and a ZMQ PUB socket (with a replay ROUTER beside it, as vLLM binds) sends the captured
KV-event messages, each at a given rate. For the attach end-to-end test and bench/attach_stream_cpu.py."""

from __future__ import annotations

import itertools
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import zmq

from tests.support.local_http import Answering, local_server
from tests.support.vllm_step_streams import iteration_lines, kv_messages_unix, scrapes_unix


@dataclass
class StepStreamServer:
    url: str
    log_path: Path
    kv_endpoint: str
    replay_endpoint: str
    lines_written: list[str] = field(default_factory=list)
    messages_sent: list[tuple[bytes, ...]] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)
    writer: threading.Thread | None = None

    def start(self) -> None:
        """Begin writing and sending, start_after_s from now (the watch starts and subscribes meanwhile)."""
        self.writer.start()


def metrics_handler(bodies: list[str]) -> type[Answering]:
    """/metrics answering the given expositions one after another, then the last one again."""
    served = itertools.count()

    class Metrics(Answering):
        def do_GET(self) -> None:
            body = bodies[min(next(served), len(bodies) - 1)]
            self.answer(200, body.encode())

    return Metrics


@contextmanager
def step_stream_server(tmp: Path, *, lines_per_s: float = 100.0, messages_per_s: float = 100.0,
                       start_after_s: float = 0.8, seconds: float = 2.0) -> Iterator[StepStreamServer]:
    """Once started, writes and sends from start_after_s on for `seconds`, cycling through the capture
    with fresh sequence numbers."""
    bodies = [body for _, body in scrapes_unix()[10:40]]  # while the load runs
    log_path = tmp / "vllm.log"
    log_path.write_text("(APIServer pid=1) INFO starting\n")
    context = zmq.Context()
    pub, router = context.socket(zmq.PUB), context.socket(zmq.ROUTER)
    for sock in (pub, router):
        sock.setsockopt(zmq.LINGER, 0)
    pub_port, replay_port = pub.bind_to_random_port("tcp://127.0.0.1"), router.bind_to_random_port("tcp://127.0.0.1")
    with local_server(metrics_handler(bodies)) as url:
        server = StepStreamServer(url, log_path, f"tcp://127.0.0.1:{pub_port}", f"tcp://127.0.0.1:{replay_port}")
        stop = threading.Event()

        def write() -> None:
            if stop.wait(start_after_s):
                return
            lines, messages = itertools.cycle(iteration_lines()), itertools.cycle(kv_messages_unix())
            start, seq = time.monotonic(), 0
            with open(log_path, "a", buffering=1) as log:
                while not stop.is_set() and (now := time.monotonic() - start) < seconds:
                    while len(server.lines_written) < now * lines_per_s:
                        line = next(lines)
                        log.write(line + "\n")
                        server.lines_written.append(line)
                    while len(server.messages_sent) < now * messages_per_s:
                        topic, _, payload = next(messages)[1]
                        frames = (topic, struct.pack(">q", seq), payload)
                        pub.send_multipart(frames)
                        server.messages_sent.append(frames)
                        seq += 1
                    stop.wait(0.005)
            server.done.set()

        server.writer = threading.Thread(target=write, daemon=True)
        try:
            yield server
        finally:
            stop.set()
            if server.writer.is_alive():
                server.writer.join(2.0)
            pub.close()
            router.close()
            context.term()
