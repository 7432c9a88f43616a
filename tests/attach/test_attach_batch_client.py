"""End to end: `batchtop serve --headless` (the tiny preset on the CPU, on a free port) driven by the
example clients, watched by `batchtop attach --headless`, each its own process: the batch client (each
batch awaited whole) reads "client (batches)", the in-flight client never does.

The output lengths (mean 320 tokens) make each batch of 8 last 5 scrapes or more (about a second on
this CPU), which the reading needs to tell a drain from the scrapes' graininess."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a server (6 s to start: the roofs), two watches of about 10 s each on 2 cores
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
HUNG = 60.0
INTERVAL = "0.05"


def watch(url: str, client: str, out: Path, *args: str) -> tuple[dict, str]:
    """attach headless from before the client's first request to just after its last answer."""
    attach = subprocess.Popen([sys.executable, "-m", "batchtop.tui", "attach", url, "--headless", "--duration", "120",
                               "--interval", INTERVAL, "--device", "h100", "-o", str(out)],
                              stderr=subprocess.PIPE, text=True)
    try:
        assert "attaching to" in attach.stderr.readline()
        sent = subprocess.run([sys.executable, str(EXAMPLES / client), "--url", url, *args],
                              capture_output=True, text=True, timeout=HUNG)
        assert sent.returncode == 0, sent.stderr
        time.sleep(0.3)  # a scrape or two after the last answer
        attach.send_signal(signal.SIGINT)
        _, err = attach.communicate(timeout=HUNG)
    finally:
        if attach.poll() is None:
            attach.kill()
    assert attach.returncode == 130, err
    return json.loads(out.read_text()), err


@pytest.fixture(scope="module")
def server_url(tmp_path_factory):
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    with log.open("w") as sink:
        # one torch thread, as the suite runs: tiny tensors on a shared 2-core host otherwise spend their
        # steps waiting for each other's threads (53 tok/s against 2900)
        serve = subprocess.Popen([sys.executable, "-m", "batchtop.tui", "serve", "--headless", "--model", "tiny",
                                  "--dtype", "float32", "--port", "0", "--max-num-seqs", "8",
                                  "--max-num-batched-tokens", "512"], stderr=sink, stdout=subprocess.DEVNULL,
                                 env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + HUNG
        while not (found := re.search(r"serving tiny on (http://\S+)", log.read_text())):
            assert serve.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        yield found.group(1)
        serve.send_signal(signal.SIGINT)
        assert serve.wait(timeout=HUNG) == 0, log.read_text()
    finally:
        if serve.poll() is None:
            serve.kill()


def test_the_batch_client_reads_as_batches(server_url, tmp_path):
    doc, err = watch(server_url, "batch_client.py", tmp_path / "batches.json", "--requests", "24", "--concurrency",
                     "8", "--output-mean", "320")
    verdict = doc["verdict"]
    assert verdict["bound"] == "client" and verdict["evidence"]["pattern"] == "barrier", verdict["line"]
    assert verdict["evidence"]["bursts"] == 3 and verdict["evidence"]["burst_size"] == 8
    assert "client (batches): 3 bursts of ~8 of 8 slots that drain before the next" in verdict["line"]
    assert "verdict: client (batches): 3 bursts of ~8" in err and "examples/in_flight_client.py" in err


def test_the_in_flight_client_never_reads_as_batches(server_url, tmp_path):
    doc, err = watch(server_url, "in_flight_client.py", tmp_path / "in_flight.json", "--requests", "24",
                     "--concurrency", "8", "--output-mean", "320")
    lines = [s["line"] for s in doc["verdict_history"]]
    assert not any("batches" in line for line in lines), lines
