"""`batchtop web`: the dashboard in browsers through textual-serve, which runs one app process per tab.

The socket is bound before anything is served (a taken port or a bad --host exits 2 at once, naming the
option), and the command each tab will run is parsed here first: a tab whose command line is wrong would
show only a blank page. Nothing here imports Textual; the tabs' processes do.
"""

from __future__ import annotations

import asyncio
import ipaddress
import shlex
import signal
import socket
import sys
from typing import Any

import click

from batchtop.core_engine.errors import ConfigError
from batchtop.core_engine.run.stop import stopped

SCREENS = (None, "attach", "replay")  # the commands that open a dashboard: the only ones a tab can show
NO_SCREEN_FLAGS = ("-h", "--help", "--version")  # they print and exit, so a tab would show nothing
SHUTDOWN_S = 3.0  # on Ctrl-C / SIGTERM: how long open tabs get to end their processes before they are cancelled


def tab_command(args: tuple[str, ...]) -> str:
    """textual-serve runs a shell command line; this interpreter's own batchtop, so a venv need not be active."""
    return shlex.join([sys.executable, "-m", "batchtop.tui", *args])


def shown(args: tuple[str, ...]) -> str:
    """The tab's command line as a user would type it, for the messages."""
    return shlex.join(("batchtop", *args))


def check_args(main: click.Group, args: tuple[str, ...]) -> None:
    """Parse `-- ARGS` with `main` (the group the tab runs), so a typo exits 2 here instead of blanking every tab."""
    if bad := next((a for a in args if a in NO_SCREEN_FLAGS), None):
        raise ConfigError("-- ARGS", f"{bad} opens no screen; a tab runs `batchtop ARGS`, the dashboard")
    try:
        root = click.Context(main, info_name="batchtop")
        rest = click.Command.parse_args(main, root, list(args))  # the group's options; the rest is a command
        name = None
        if rest:
            name, command, sub_args = main.resolve_command(root, rest)
            if name not in SCREENS:
                hint = ("run it once beside `batchtop web` and give the tabs `-- attach URL`" if name == "serve"
                        else "a tab runs the dashboard, `attach URL ...` or `replay TRACE`")
                raise ConfigError("-- ARGS", f"`batchtop {name}` opens no dashboard in a tab: {hint}")
            sub = command.make_context(name, sub_args, parent=root)
            if sub.params.get("headless"):
                raise ConfigError("-- ARGS", "--headless opens no screen for a tab")
        if root.params.get("headless"):
            raise ConfigError("-- ARGS", "--headless opens no screen for a tab")
    except click.ClickException as exc:
        raise ConfigError("-- ARGS", f"`{shown(args)}`: {exc.format_message()}") from None


def is_loopback(host: str) -> bool:
    """Every address the name resolves to is loopback (localhost, 127.0.0.0/8, ::1)."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return False
    return all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)


def url_of(sock: socket.socket, host: str) -> str:
    """The URL to open: the bound port (0 picks one), IPv6 bracketed, an any-address shown as loopback."""
    port = sock.getsockname()[1]
    shown = "127.0.0.1" if host in ("", "0.0.0.0") else "[::1]" if host == "::" else host
    return f"http://[{shown}]:{port}/" if ":" in shown and not shown.startswith("[") else f"http://{shown}:{port}/"


def make_server(command: str, host: str, port: int) -> Any:
    """textual-serve's Server, answering each page with the address the browser used (a tab reached as
    127.0.0.1, localhost or the machine's name opens its websocket to the same place), logging to stderr."""
    from aiohttp import web
    from rich.console import Console
    from textual_serve.server import Server

    class WebServer(Server):
        """No banner on stdout (stderr gets the URL line), and no fixed public URL."""

        async def on_startup(self, app: web.Application) -> None:
            """The URL was printed when the socket was bound; textual-serve's logo is left out."""

        async def handle_index(self, request: web.Request) -> web.Response:
            """The page's websocket URL comes from public_url, read synchronously before any await."""
            self.public_url = f"{request.scheme}://{request.host}"
            return await super().handle_index(request)

    server = WebServer(command, host=host, port=port, title="batchtop")
    server.console = Console(stderr=True)
    return server


async def _serve(server: Any, sock: socket.socket) -> int:
    """aiohttp on the bound socket until SIGINT / SIGTERM (returned), then each open tab's process is told
    to quit."""
    from aiohttp import web
    app = await server._make_app()
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=SHUTDOWN_S)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    caught: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, lambda s=sig: caught.done() or caught.set_result(s))
    try:
        return await caught
    finally:
        await runner.cleanup()


def _say(text: str) -> None:
    """batchtop's notes go to stderr with its name, as every command's do."""
    click.echo(f"batchtop: {text}", err=True)


def run_web(main: click.Group, host: str, port: int, args: tuple[str, ...]) -> None:
    """Bind, say the URL (and the exposure, off loopback), serve until Ctrl-C."""
    from batchtop.core_engine.serve.server import bind_socket
    from batchtop.tui.cli.options import bad_input_exits
    with bad_input_exits():
        check_args(main, args)
        sock = bind_socket(host, port)
    command = tab_command(args)
    url = url_of(sock, host)
    if not is_loopback(host):
        _say(f"warning: --host {host} is not loopback: anyone who reaches this machine on port "
             f"{sock.getsockname()[1]} gets the dashboard and its keys, and every tab they open runs "
             f"`{shown(args)}` here")
    _say(f"serving `{shown(args)}` to browsers at {url} (one process per tab; Ctrl-C stops)")
    server = make_server(command, host, sock.getsockname()[1])
    server.initialize_logging()
    if asyncio.run(_serve(server, sock)) == signal.SIGTERM:
        stopped(signal.SIGTERM)  # 143, as every batchtop command; SIGINT is a server stopped on purpose: 0
