"""`batchtop attach` to a batchtop serve: the engine's own panels from its step stream, read-only, at the
server's step, ending (and saying so) when the server stops."""

from __future__ import annotations

import threading
import time

from batchtop.core_engine.attach.engine_stream import EngineStream
from batchtop.core_engine.attach.setup import AttachOptions, AttachSetup
from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.run.live_session import Session
from batchtop.core_engine.serve.app import create_app
from batchtop.core_engine.serve.exporter import VllmMetrics
from batchtop.core_engine.serve.hub import RequestHub
from batchtop.core_engine.serve.prompts import ServedModel
from batchtop.core_engine.serve.server import Server, bind_socket
from batchtop.core_engine.serve.step_stream import StepPublisher
from batchtop.tui.app import BatchtopApp
from batchtop.tui.cli.attach_engine_stream import open_engine_stream
from batchtop.tui.sources.stream import StreamSource
from batchtop.tui.widgets.engine.slots import SlotsPanel
from batchtop.tui.widgets.engine.waiting import WaitingPanel
from tests.conftest import tiny_config
from tests.tui.test_dashboard import PEAKS, WORKLOAD, TickClock, panel_text, status, wait_for


def stepped_server() -> tuple[Session, Server]:
    """A served engine the test steps by hand (no engine thread), so Pilot goes idle between steps."""
    config = tiny_config(max_num_seqs=4)
    engine = Engine(config, clock=TickClock())
    session = Session(engine, list(WORKLOAD))
    engine.load_workload(session.workload)
    hub = RequestHub(engine, wake=lambda: None)
    metrics = VllmMetrics(config, "tiny")
    steps = StepPublisher({"config": config.as_dict(), "device": {"kind": "cpu", "name": "test-cpu"},
                           "peaks": PEAKS.as_dict()}, initial=engine.snapshot())
    session.listeners += [metrics, hub, steps]
    server = Server(create_app(ServedModel("tiny", config), hub, metrics, steps=steps), hub,
                    bind_socket("127.0.0.1", 0), quiet=True)
    server.start_in_thread()
    return session, server


def running_ids(session: Session) -> list[str]:
    return [s.request_id for s in session.engine.latest.slots if s.request_id is not None]


async def test_the_viewer_draws_the_servers_slots_at_its_step_refuses_engine_keys_and_ends_with_the_server():
    session, server = stepped_server()
    try:
        for _ in range(3):
            session.step()  # the viewer joins mid-run
        stream = open_engine_stream(AttachSetup([server.url + "/metrics"], AttachOptions(), None, None, ""))
        assert isinstance(stream, EngineStream)
        app = BatchtopApp(StreamSource(stream))
        async with app.run_test(size=(140, 36)) as pilot:
            await wait_for(pilot, lambda: "step 3 " in status(app) and "live stream of" in status(app))
            assert all(rid in panel_text(app, SlotsPanel) for rid in running_ids(session))
            assert "q9" in panel_text(app, WaitingPanel)  # the queue, with its reason, from the keyframe
            for _ in range(2):
                session.step()
            await wait_for(pilot, lambda: f"step {session.engine.counters.steps} " in status(app))
            assert all(rid in panel_text(app, SlotsPanel) for rid in running_ids(session))
            mode = session.engine.config.mode
            await pilot.press("s")  # read-only: the engine is not the viewer's to change
            assert app.source.act("toggle_mode").startswith("read-only")
            assert session.engine.config.mode == mode and session.engine.apply_pending() is False
            server.shutdown()
            await wait_for(pilot, lambda: "ended: the server shut down" in status(app))
            assert app.source.done.wait(5)
    finally:
        server.shutdown()
        server.join()


def test_metrics_only_and_a_server_without_a_stream_keep_the_metrics_panels():
    _, server = stepped_server()
    try:
        only = AttachSetup([server.url + "/metrics"], AttachOptions(metrics_only=True), None, None, "")
        assert open_engine_stream(only) is None
    finally:
        server.shutdown()
        server.join()
    nobody = AttachSetup(["http://127.0.0.1:9/metrics"], AttachOptions(), None, None, "")
    assert open_engine_stream(nobody) is None


def test_quitting_the_viewer_ends_its_read_at_once_even_while_the_server_is_quiet():
    _, server = stepped_server()
    try:
        stream = EngineStream(server.url)
        stream.open()
        source = StreamSource(stream)
        worker = threading.Thread(target=source.run, args=(lambda: False,), daemon=True)
        worker.start()
        deadline = time.monotonic() + 5
        while source.frame.snapshot is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert source.frame.snapshot is not None and source.frame.state == "running"
        began = time.monotonic()
        source.stop()
        assert source.done.wait(2) and time.monotonic() - began < 1.0
        assert source.ended is None  # the viewer left; the stream did not end
    finally:
        server.shutdown()
        server.join()
