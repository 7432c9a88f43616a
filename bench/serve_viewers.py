"""The engine's step time with three step-stream viewers attached vs none, on one `batchtop serve` engine.

    python bench/serve_viewers.py [--model cpu-demo|tiny] [--rounds 20] [--seconds 2] [--viewers 3]

One in-process server (the engine thread, the HTTP server and GET /batchtop/steps, as `batchtop serve
--headless` runs them) kept busy by a long workload. Rounds alternate: --seconds with no viewer, then
--seconds with --viewers viewer processes attached (each reads the stream and folds every step into
frames as `batchtop attach` does, without drawing; the processes start once, before the first round,
and attach and detach on command, so their start-up is in no timed window). Short, many rounds: a
shared machine's load comes and goes in bursts of seconds, and the median of per-round ratios sees
through them. The step time is the engine's own (each snapshot's
step_time_s), of full-batch decode steps only, so every round compares the same kind of step. Prints
each round's medians, the median of the per-round ratios and the pooled ratio, the stream's own
engine-thread time per step (encoding once and fanning out, measured around its listener: the part of
the ratio the stream itself causes, steady where a shared machine's load is not), and the steps the
server dropped for viewers. Goal: within 5% (ratio <= 1.05). Viewer processes share the machine's
cores with the engine: on a 2-core box that is contention the ratio shows too.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import threading
import time

from batchtop.core_engine.config import EngineConfig, preset
from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.engine.snapshot import StepSnapshot
from batchtop.core_engine.run.live_session import Session
from batchtop.core_engine.sched.request import Request
from batchtop.core_engine.serve.app import create_app
from batchtop.core_engine.serve.engine_thread import EngineThread
from batchtop.core_engine.serve.exporter import VllmMetrics
from batchtop.core_engine.serve.hub import RequestHub
from batchtop.core_engine.serve.prompts import ServedModel
from batchtop.core_engine.serve.server import Server, bind_socket
from batchtop.core_engine.serve.step_stream import StepPublisher
from batchtop.core_engine.torch_thread import call_in_thread


class StepTimes:
    """A session listener: (wall time, step_time_s) of every full-batch decode step."""

    def __init__(self, batch: int) -> None:
        self.batch = batch
        self.samples: list[tuple[float, float]] = []

    def observe(self, snap: StepSnapshot) -> None:
        if snap.is_step and snap.num_prefill_tokens == 0 and snap.num_seqs == self.batch:
            self.samples.append((time.monotonic(), snap.step_time_s))

    def closed(self, reason: str, error: str | None) -> None:
        pass

    def between(self, start: float, end: float) -> list[float]:
        return [s for t, s in self.samples if start <= t < end]


class Timed:
    """The step stream's listener, with the engine thread's CPU time it takes per step (encode + fan-out):
    CPU time, not wall time, so a thread preempted by the machine's other work does not count."""

    def __init__(self, inner: StepPublisher) -> None:
        self.inner = inner
        self.samples: list[tuple[float, float]] = []  # (wall time, CPU seconds in observe)

    def observe(self, snap: StepSnapshot) -> None:
        began = time.thread_time()
        self.inner.observe(snap)
        self.samples.append((time.monotonic(), time.thread_time() - began))

    def closed(self, reason: str, error: str | None) -> None:
        self.inner.closed(reason, error)

    def between(self, start: float, end: float) -> list[float]:
        return [s for t, s in self.samples if start <= t < end]


def viewer(url: str) -> None:
    """A viewer process, attached while its parent says "on" (stdin) and detached at "off": the stream
    decoded and folded into frames at the dashboard's 10 Hz, as `batchtop attach` does, without drawing."""
    from batchtop.core_engine.attach.engine_stream import EngineStream
    from batchtop.core_engine.run.frame import FrameBuilder

    def watch(stream: EngineStream) -> None:
        builder, last = FrameBuilder(), 0.0
        for item in stream.items():
            if item.end is not None:
                return
            if item.snapshot is not None:
                builder.observe(item.snapshot)
                if time.monotonic() - last >= 0.1:
                    builder.sample_rate()
                    builder.frame("running")
                    last = time.monotonic()

    print("ready", flush=True)
    stream, reader = None, None
    for line in sys.stdin:
        if line.strip() == "on":
            stream = EngineStream(url)
            stream.open()  # subscribed once the header is here
            reader = threading.Thread(target=watch, args=(stream,), daemon=True)
            reader.start()
        elif stream is not None:
            stream.interrupt()
            reader.join(5)
            stream.close()
            stream = None
        print(line.strip(), flush=True)


class Viewers:
    """Viewer processes started once (their imports outside every timed window), attached on demand."""

    def __init__(self, url: str, n: int) -> None:
        self.procs = [subprocess.Popen([sys.executable, __file__, "--viewer", url], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, text=True) for _ in range(n)]
        self._all("ready")

    def _all(self, word: str) -> None:
        for proc in self.procs:
            if proc.stdout.readline().strip() != word:
                raise SystemExit(f"a viewer did not answer {word!r}")

    def say(self, word: str) -> None:
        for proc in self.procs:
            proc.stdin.write(word + "\n")
            proc.stdin.flush()
        self._all(word)

    def close(self) -> None:
        for proc in self.procs:
            proc.terminate()
            proc.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="cpu-demo")
    parser.add_argument("--max-num-seqs", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--viewers", type=int, default=3)
    parser.add_argument("--viewer", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.viewer is not None:
        viewer(args.viewer)
        return
    config = EngineConfig(model=preset(args.model), dtype="bfloat16" if args.model != "tiny" else "float32",
                          max_num_seqs=args.max_num_seqs, max_num_batched_tokens=256, seed=0)
    engine = call_in_thread(lambda: Engine(config))
    vocab = config.model.vocab_size
    # four requests a second, 240 tokens each: the batch stays full, the queue short next to 5000 at once
    workload = [Request(f"r{i}", tuple((i * 7 + j) % vocab for j in range(16)), 240, arrival_s=i / 4)
                for i in range(4 * 3600)]
    session = Session(engine, workload)
    times = StepTimes(args.max_num_seqs)
    thread = EngineThread(session)
    hub = RequestHub(engine, wake=thread.wake)
    metrics = VllmMetrics(config, args.model)
    steps = StepPublisher({"config": config.as_dict(), "device": {"kind": config.device, "name": config.device},
                           "peaks": None}, initial=engine.snapshot())
    timed = Timed(steps)
    session.listeners += [metrics, hub, timed, times]
    server = Server(create_app(ServedModel(args.model, config), hub, metrics, steps=steps), hub,
                    bind_socket("127.0.0.1", 0), quiet=True)
    server.start_in_thread()
    thread.start()
    time.sleep(args.seconds / 2)  # warm-up: the first steps, the allocator, the CPU kernels
    rows: list[tuple[float, float, int, int]] = []
    costs: list[float] = []  # the stream's engine-thread seconds per step, with viewers
    pooled: dict[str, list[float]] = {"none": [], "viewers": []}
    viewers = Viewers(server.url, args.viewers)
    try:
        for r in range(args.rounds):
            while steps.num_subscribers:  # the last round's viewers have left the server too
                time.sleep(0.01)
            start = time.monotonic()
            time.sleep(args.seconds)
            alone = times.between(start, time.monotonic())
            viewers.say("on")
            start = time.monotonic()
            time.sleep(args.seconds)
            watched = times.between(start, time.monotonic())
            costs += timed.between(start, time.monotonic())
            subscribed = steps.num_subscribers
            viewers.say("off")
            if not alone or not watched:
                continue
            pooled["none"] += alone
            pooled["viewers"] += watched
            rows.append((statistics.median(alone), statistics.median(watched), len(alone), len(watched)))
            print(f"round {r + 1}: none {rows[-1][0] * 1e3:.2f} ms ({len(alone)} steps) · {subscribed} viewers "
                  f"{rows[-1][1] * 1e3:.2f} ms ({len(watched)} steps) · ratio {rows[-1][1] / rows[-1][0]:.3f}",
                  flush=True)
    finally:
        viewers.close()
        server.shutdown()
        server.join()
        thread.stop()
    per_round = statistics.median(w / a for a, w, _, _ in rows)
    whole = statistics.median(pooled["viewers"]) / statistics.median(pooled["none"])
    cost = statistics.median(costs)
    print(f"the stream's own work on the engine thread with {args.viewers} viewers: median {cost * 1e6:.0f} us "
          f"of CPU a step ({cost / statistics.median(pooled['none']) * 100:.2f}% of a step without viewers)")
    print(f"{args.model}, batch {args.max_num_seqs}, {args.viewers} viewers: step time ratio (viewers / none) "
          f"median of rounds {per_round:.3f}, pooled {whole:.3f}; dropped for viewers: {steps.num_dropped} steps; "
          f"goal <= 1.05: {'met' if per_round <= 1.05 else 'NOT met'}")


if __name__ == "__main__":
    main()
