"""`batchtop serve` with the dashboard: client requests fill the panels; the status line shows the URL."""

from __future__ import annotations

import threading

import httpx

from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.serve.app import create_app
from batchtop.core_engine.serve.exporter import VllmMetrics
from batchtop.core_engine.serve.hub import RequestHub
from batchtop.core_engine.serve.prompts import ServedModel
from batchtop.core_engine.serve.server import Server, bind_socket
from batchtop.core_engine.run.live_session import Session
from batchtop.tui.sources.live import EngineSource
from batchtop.tui.app import BatchtopApp
from batchtop.tui.widgets.engine.slots import SlotsPanel
from batchtop.tui.widgets.engine.waiting import WaitingPanel
from tests.conftest import tiny_config
from tests.tui.test_dashboard import PEAKS, TickClock, panel_text, screen_text, status, step, wait_for


def stream_tokens(url: str, max_tokens: int, into: list[int]) -> threading.Thread:
    def run() -> None:
        body = {"prompt": [3, 1, 4, 1, 5], "max_tokens": max_tokens, "stream": True}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30) as response:
            into.append(sum(line.count('"token_ids":[') for line in response.iter_lines() if line))

    thread = threading.Thread(target=run)
    thread.start()
    return thread


async def test_client_requests_wait_run_and_finish_in_the_panels_while_the_status_line_shows_the_url():
    config = tiny_config(max_num_seqs=4)
    engine = Engine(config, clock=TickClock())
    session = Session(engine, [])
    source = EngineSource(engine, session=session, start_paused=True, peaks=PEAKS, device_label="test-cpu",
                          serving_url="(starting)")
    hub = RequestHub(engine, wake=source.wake)
    metrics = VllmMetrics(config, "tiny")
    session.listeners += [metrics, hub]
    server = Server(create_app(ServedModel("tiny", config), hub, metrics), hub, bind_socket("127.0.0.1", 0),
                    quiet=True)
    server.start_in_thread()
    source.serving_url = server.url
    app = BatchtopApp(source)
    try:
        async with app.run_test(size=(140, 36)) as pilot:
            await wait_for(pilot, lambda: f"serving {server.url}" in status(app) and "paused" in status(app))
            counts: list[int] = []
            clients = [stream_tokens(server.url, 6, counts) for _ in range(6)]
            await wait_for(pilot, lambda: hub.num_waiting == 6)
            await step(pilot)  # four take the slots, two wait
            assert panel_text(app, SlotsPanel).count("cmpl-") == 4
            assert panel_text(app, WaitingPanel).count("cmpl-") == 2
            await pilot.press("space")
            await wait_for(pilot, lambda: len(counts) == 6 and app.source.frame.state == "idle")
            assert counts == [6] * 6
            assert "idle" in status(app) and "done 6/6" in screen_text(app)
            for client in clients:
                client.join()
    finally:
        server.shutdown()
        server.join()
