"""One engine, many viewers (issue 54's goal): two browser tabs of `batchtop web -- attach URL` and one
terminal viewer (the stream source `batchtop attach URL` runs) watch one `batchtop serve`; requests are
sent once all three watch, and when the engine is idle again all three show its step number."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import httpx
import pytest

from batchtop.core_engine.attach.engine_stream import EngineStream
from batchtop.tui.sources.stream import StreamSource
from tests.web.test_web_browser import (CHROMIUM, CHROMIUM_ARGS, DRAW_MS, KEY_MS, batchtop_web, expose_terminal,
                                        free_port, wait_for_screen)

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    CHROMIUM is None, reason="no Chromium here (Debian: apt-get install -y chromium); .ci/run installs it")]
UP_S = 60.0


def serve(port: int) -> subprocess.Popen:
    env = {**os.environ, "BATCHTOP_CPU_KERNEL": "0"}
    proc = subprocess.Popen([sys.executable, "-m", "batchtop.tui", "serve", "--headless", "--model", "tiny",
                             "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + UP_S
    while True:
        assert proc.poll() is None, "batchtop serve exited"
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "batchtop serve did not come up"
        time.sleep(0.3)


def engine_steps(url: str) -> int:
    """The server's own step count, once nothing runs or waits (vLLM's names: /metrics)."""
    deadline = time.monotonic() + UP_S
    while True:
        text = httpx.get(url + "/metrics", timeout=5).text
        values = {line.split("{")[0].split(" ")[0]: float(line.rsplit(" ", 1)[1])
                  for line in text.splitlines() if line and not line.startswith("#")}
        if values.get("vllm:num_requests_running") == 0 and values.get("vllm:num_requests_waiting") == 0:
            return int(values["vllm:iteration_tokens_total_count"])
        assert time.monotonic() < deadline, "the server never went idle"
        time.sleep(0.3)


def test_two_tabs_and_a_terminal_show_the_same_step_as_the_engine():
    sync_api = pytest.importorskip("playwright.sync_api", reason="no playwright driver (pip install -e '.[dev]')")
    port = free_port()
    server = serve(port)
    url = f"http://127.0.0.1:{port}"
    stream = EngineStream(url)
    stream.open()
    terminal = StreamSource(stream)
    reader = threading.Thread(target=terminal.run, args=(lambda: False,), daemon=True)
    reader.start()
    try:
        with batchtop_web("attach", url) as (_, web_url), sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, timeout=30_000)
            try:
                tabs = []
                for _ in range(2):
                    page = browser.new_page(viewport={"width": 1600, "height": 1000})
                    page.route("**/static/js/textual.js", expose_terminal)
                    page.goto(web_url, timeout=KEY_MS)
                    tabs.append(page)
                for page in tabs:
                    wait_for_screen(page, "live stream of", DRAW_MS)
                for i in range(6):
                    httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": [1 + i, 2, 3],
                                                              "max_tokens": 6 + i}, timeout=60).raise_for_status()
                steps = engine_steps(url)
                assert steps > 6
                for page in tabs:
                    wait_for_screen(page, rf"step {steps} ", KEY_MS)
                deadline = time.monotonic() + KEY_MS / 1000
                while (terminal._builder.last is None or terminal._builder.last.step < steps) \
                        and time.monotonic() < deadline:
                    time.sleep(0.1)
                assert terminal._builder.last.step == steps
            finally:
                browser.close()
    finally:
        terminal.stop()
        server.terminate()
        server.wait(30)
