"""`batchtop serve`: the engine behind an OpenAI-compatible HTTP server, with or without the dashboard."""

from __future__ import annotations

import dataclasses
import signal
import socket
import sys

from batchtop.core_engine.errors import ConfigError
from batchtop.core_engine.perf.device_peaks import DevicePeaks
from batchtop.core_engine.model.sources import sampling_defaults
from batchtop.core_engine.perf.telemetry import TelemetrySampler
from batchtop.core_engine.serve.app import create_app
from batchtop.core_engine.serve.engine_thread import EngineThread
from batchtop.core_engine.serve.exporter import VllmMetrics
from batchtop.core_engine.serve.hub import RequestHub
from batchtop.core_engine.serve.prompt_text import start_chat
from batchtop.core_engine.serve.prompts import ServedModel
from batchtop.core_engine.serve.server import Server, bind_socket
from batchtop.core_engine.serve.status_log import StatusLog
from batchtop.core_engine.serve.step_stream import StepPublisher
from batchtop.core_engine.run.live_session import Session
from batchtop.core_engine.torch_thread import call_in_thread
from batchtop.tui.cli.headless import build_engine, load_peaks, note
from batchtop.tui.cli.options import EXIT_ENGINE_FAILURE, bad_input_exits
from batchtop.tui.cli.run_setup import Setup, build_setup, workload_info

EXIT_SIGTERM = 128 + signal.SIGTERM


@dataclasses.dataclass(frozen=True)
class ServeOptions:
    host: str
    port: int
    api_key: str | None
    served_model_name: str | None
    max_waiting: int | None
    shutdown_grace: float
    headless: bool
    theme: str


def served_name(model_option: str, served_model_name: str | None, resolved: str) -> str:
    """vLLM's rule: --served-model-name, else the --model argument exactly as given (auto: the model
    it resolved to, which vLLM has no word for)."""
    if served_model_name:
        return served_model_name
    return resolved if model_option == "auto" else model_option


def run_serve(opts: dict, serve: ServeOptions) -> None:
    with bad_input_exits():
        setup = build_setup(opts, clients_only=opts["workload_path"] is None)  # requests come from clients
        if setup.simulation is not None:
            raise ConfigError("--simulate", "a server answers real clients in real time; simulate with the "
                                            "dashboard, --headless or compare")
        sock = bind_socket(serve.host, serve.port)  # before the model loads: a taken port fails at once
        chat = start_chat(setup.tokenizer)  # a chat template that does not parse fails now, by its file
    try:
        engine, peaks = call_in_thread(lambda: (build_engine(setup), load_peaks(setup)))
        with bad_input_exits():
            session = setup.open_session(engine, peaks, show_text=not serve.headless)  # the dashboard shows text
        # a full disk under --record must not take the server down: the recording stops, serving goes on
        session.on_record_failure = lambda exc: note(f"warning: {exc}; serving goes on unrecorded")
        model = ServedModel(served_name(opts["model"], serve.served_model_name, setup.config.model.name),
                            setup.config, setup.tokenizer, defaults=sampling_defaults(setup.config.model.checkpoint),
                            chat=chat)
        metrics = VllmMetrics(setup.config, model.name)
        steps = StepPublisher(setup.trace_header(peaks), initial=engine.snapshot())  # GET /batchtop/steps
        session.listeners += [metrics, steps]
        if serve.headless:
            code = _headless(session, model, metrics, steps, sock, serve)
        else:
            code = _dashboard(session, model, metrics, steps, sock, serve, peaks, setup)
    finally:
        if chat is not None:
            chat.close()
    sys.exit(code)


def _headless(session: Session, model: ServedModel, metrics: VllmMetrics, steps: StepPublisher,
              sock: socket.socket, serve: ServeOptions) -> int:
    loop = EngineThread(session)
    hub = RequestHub(session.engine, wake=loop.wake, max_waiting=serve.max_waiting)
    session.listeners.append(hub)
    server = Server(create_app(model, hub, metrics, api_key=serve.api_key, steps=steps), hub, sock,
                    grace_s=serve.shutdown_grace)
    loop.on_exit = server.shutdown  # the engine died (or a script quit): answer what is in flight, then stop
    status = StatusLog(session.engine, hub, note)
    # From the moment it says it serves, Ctrl-C and SIGTERM are the server's (a clean shutdown): with
    # the CLI's handlers still in, a Ctrl-C before uvicorn took the signals exited 130 mid-start
    previous = {sig: signal.signal(sig, server.on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        loop.start()
        status.start()
        note(f"serving {model.name} on {server.url} (/v1/completions, /v1/chat/completions, /v1/models, /health, "
             f"/metrics, /batchtop/steps); Ctrl-C stops")
        server.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    status.stop()
    loop.stop()
    if session.recorder is not None:
        note(session.recorder.outcome())
    if loop.error is not None:
        note(f"engine failure: {loop.error}")
        return EXIT_ENGINE_FAILURE
    return EXIT_SIGTERM if server.signal == signal.SIGTERM else 0


def _dashboard(session: Session, model: ServedModel, metrics: VllmMetrics, steps: StepPublisher, sock: socket.socket,
               serve: ServeOptions, peaks: DevicePeaks, setup: Setup) -> int:
    from batchtop.tui.app import BatchtopApp  # Textual loads only here, never on the headless path
    from batchtop.tui.sources.live import EngineSource

    config = session.engine.config
    source = EngineSource(session.engine, session=session, peaks=peaks, telemetry=TelemetrySampler(config.device),
                          workload=workload_info(setup.spec, setup.requests) if setup.requests else None,
                          serving_url="(starting)")
    hub = RequestHub(session.engine, wake=source.wake, max_waiting=serve.max_waiting)
    session.listeners.append(hub)
    server = Server(create_app(model, hub, metrics, api_key=serve.api_key, steps=steps), hub, sock,
                    grace_s=serve.shutdown_grace, quiet=True)
    session.on_record_failure = lambda exc: source.notify("info", f"{exc}; serving goes on unrecorded")
    server.start_in_thread()
    source.serving_url = server.url
    code = BatchtopApp(source, theme=serve.theme).run()
    server.shutdown()  # the engine thread has stopped and ended what was in flight
    server.join()
    return code or 0
