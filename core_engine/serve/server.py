"""uvicorn around the app, on a socket bound before the model loads (a taken port fails at once).

Shutdown, whatever asks for it (SIGINT, SIGTERM, the dashboard quitting, the engine dying): stop
listening, refuse new requests with 503, give in-flight ones `grace_s` to finish, end the rest with an
error, then let uvicorn close the connections.

Idle connections: uvicorn closes one KEEP_ALIVE_S after its last answer; a connection that has opened
(or sent the first bytes of its next request) and not finished its request's headers within
head_timeout_s is closed here. A body that does not arrive in time is the app's 408 (limits.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import threading
import time

import uvicorn

from batchtop.core_engine.errors import ConfigError
from batchtop.core_engine.serve.hub import RequestHub

KEEP_ALIVE_S = 5  # uvicorn's default, said out loud
HEAD_TIMEOUT_S = 10.0


def bind_socket(host: str, port: int) -> socket.socket:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ConfigError("host", f"cannot resolve {host!r}: {exc.strerror}") from None
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        # listening now, not when uvicorn starts: a client that connects as soon as the URL is printed
        # waits in the backlog instead of being refused
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise ConfigError("port", f"cannot listen on {host}:{port}: {exc.strerror}") from None
    return sock


class _Uvicorn(uvicorn.Server):
    """uvicorn with our shutdown: signals start the drain instead of closing at once."""

    def __init__(self, config: uvicorn.Config, owner: Server, head_timeout_s: float) -> None:
        super().__init__(config)
        self.owner = owner
        self.head_timeout_s = head_timeout_s

    async def serve(self, sockets=None) -> None:
        self.owner.bind_loop(asyncio.get_running_loop())
        watch = asyncio.get_running_loop().create_task(self._close_slow_heads())
        try:
            await super().serve(sockets)
        finally:
            watch.cancel()

    async def _close_slow_heads(self) -> None:
        """A connection that waits for its request's head (not uvicorn's keep-alive wait, which has its
        own timer) for longer than head_timeout_s is closed: a client that opens and says nothing, or
        sends its headers a byte at a time, holds a socket only that long."""
        waiting_since: dict[object, float] = {}
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(min(1.0, self.head_timeout_s / 4))
            now = loop.time()
            connections = set(self.server_state.connections)
            for connection in list(waiting_since):
                if connection not in connections or not _awaits_head(connection):
                    del waiting_since[connection]
            for connection in connections:
                if not _awaits_head(connection):
                    continue
                since = waiting_since.setdefault(connection, now)
                if now - since >= self.head_timeout_s:
                    connection.transport.close()
                    del waiting_since[connection]

    @contextlib.contextmanager
    def capture_signals(self):
        if threading.current_thread() is not threading.main_thread():
            yield  # the dashboard's server thread: the app's quit stops it
            return
        previous = {sig: signal.signal(sig, self.owner.on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _awaits_head(connection) -> bool:
    """Between requests (or before the first) with no keep-alive timer running: reading a request head."""
    cycle = getattr(connection, "cycle", None)
    transport = getattr(connection, "transport", None)
    return ((cycle is None or cycle.response_complete) and transport is not None and not transport.is_closing()
            and getattr(connection, "timeout_keep_alive_task", None) is None)


class Server:
    def __init__(self, app, hub: RequestHub, sock: socket.socket, *, grace_s: float = 5.0,
                 quiet: bool = False, head_timeout_s: float = HEAD_TIMEOUT_S) -> None:
        self.hub = hub
        self.sock = sock
        self.grace_s = grace_s
        host, port = sock.getsockname()[:2]
        self.url = f"http://{f'[{host}]' if ':' in host else host}:{port}"
        quiet_logs = {"log_config": None} if quiet else {}
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on",
                                timeout_keep_alive=KEEP_ALIVE_S, timeout_graceful_shutdown=grace_s + 5,
                                **quiet_logs)
        if quiet:  # under the dashboard nothing may write to the terminal
            silent = logging.getLogger("uvicorn")
            silent.propagate = False
            if not silent.handlers:
                silent.addHandler(logging.NullHandler())
        self._uvicorn = _Uvicorn(config, self, head_timeout_s)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._shutting_down = False
        self._drain_task: asyncio.Task | None = None
        self._thread: threading.Thread | None = None
        self.signal: int | None = None  # the signal that stopped the server, if one did
        self.stopped = threading.Event()

    def run(self) -> None:
        """Serve on this (the main) thread until a signal or shutdown() stops it."""
        try:
            self._uvicorn.run(sockets=[self.sock])  # uvloop and httptools when installed, as uvicorn picks
        finally:
            self.stopped.set()

    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def start_in_thread(self, ready_timeout_s: float = 10.0) -> None:
        """Serve on a thread of its own (beside the dashboard, or in tests); returns once it answers."""
        self._thread = threading.Thread(target=self.run, name="batchtop-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + ready_timeout_s
        while not self._uvicorn.started and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)

    def on_signal(self, sig: int, _frame) -> None:
        if self._shutting_down:  # a second Ctrl-C: stop waiting for in-flight requests
            self._uvicorn.force_exit = self._uvicorn.should_exit = True
            return
        self.signal = sig
        self.shutdown()

    def shutdown(self) -> None:
        """Thread-safe and idempotent: start the drain; the server stops once it is done."""
        if self._shutting_down:
            return
        self._shutting_down = True
        if self._loop is None:  # not serving yet: nothing to drain
            self._uvicorn.should_exit = True
            return
        with contextlib.suppress(RuntimeError):  # the loop has already closed
            self._loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        self._drain_task = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        try:
            # stop accepting connections at once; a signal while uvicorn starts comes before it has any
            # listener (reading .servers then raised, and the server never stopped)
            for listener in getattr(self._uvicorn, "servers", ()):
                listener.close()
            await self.hub.drain(self.grace_s)
        finally:
            self._uvicorn.should_exit = True

    def join(self, timeout_s: float = 30.0) -> None:
        if self._thread is not None:
            self._thread.join(timeout_s)
