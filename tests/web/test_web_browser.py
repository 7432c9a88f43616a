"""The dashboard in a real browser: `batchtop web` serves it, headless Chromium (Debian's package, driven
by playwright without any browser download) opens the page, and the keys a user presses there change
the engine: `s` turns continuous batching static, `]` doubles the Slots panel's slot count.

xterm.js draws on a canvas, so the page's DOM holds no text: the test exposes the page's own xterm.js
Terminal (one assignment added to textual-serve's script as it is served) and reads its screen buffer,
the cells the canvas draws. Every wait has a timeout; the whole test takes about 15 s here.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

CHROMIUM = next((p for p in ("/usr/bin/chromium", shutil.which("chromium") or "") if p and os.access(p, os.X_OK)),
                None)
pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    CHROMIUM is None, reason="no Chromium here (Debian: apt-get install -y chromium); .ci/run installs it")]

# the flags this closed network needs: without the background-networking ones Chromium's own
# connections are refused and slow its start
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
HOOK = "this.terminal.open(e)"  # textual-serve 1.1's textual.js, where it opens its xterm.js Terminal
SERVE_S = 30.0  # the server's URL line
DRAW_MS = 40_000  # the first dashboard frame (a tab starts a whole batchtop, model and roofs included)
KEY_MS = 15_000  # one key's effect on screen
EXIT_S = 15.0  # the server and its tabs' processes, after SIGINT
SCREEN_JS = """() => { const t = window.__batchtopTerminal; if (!t) return ''; const b = t.buffer.active;
    const rows = []; for (let i = 0; i < t.rows; i++) { const l = b.getLine(b.viewportY + i);
    rows.push(l ? l.translateToString(true) : ''); } return rows.join('\\n'); }"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def descendants(pid: int) -> set[int]:
    """Every live process below pid (the tabs' shells and batchtops), read from /proc."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


@contextmanager
def batchtop_web(*args: str) -> Iterator[tuple[subprocess.Popen, str]]:
    """`batchtop web --port FREE -- ARGS` running, and the URL it printed; SIGKILLed if it outlives the test."""
    env = {**os.environ, "BATCHTOP_CPU_KERNEL": "0"}  # no C++ build beside the test on 2 cores
    proc = subprocess.Popen([sys.executable, "-m", "batchtop.tui", "web", "--port", str(free_port()), "--", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + SERVE_S
        while not (url := next((m[1] for line in lines if (m := re.search(r"at (http://\S+)", line))), None)):
            assert proc.poll() is None, f"batchtop web exited {proc.returncode}: {''.join(lines)}"
            assert time.monotonic() < deadline, f"no URL within {SERVE_S} s: {''.join(lines)}"
            time.sleep(0.1)
        yield proc, url
    finally:
        for pid in {proc.pid, *descendants(proc.pid)} if proc.poll() is None else ():
            with _gone():
                os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=EXIT_S)


@contextmanager
def _gone() -> Iterator[None]:
    try:
        yield
    except ProcessLookupError:
        pass


def expose_terminal(route) -> None:
    """Serve textual.js with its Terminal also kept on window, so the test can read what it draws."""
    response = route.fetch()
    script = response.text()
    assert HOOK in script, "textual-serve's textual.js changed: update HOOK to where it opens its Terminal"
    route.fulfill(response=response, body=script.replace(HOOK, f"window.__batchtopTerminal=this.terminal,{HOOK}", 1))


def wait_for_screen(page, pattern: str, timeout_ms: int) -> str:
    """The screen once a line matches pattern; on timeout the failure shows what the screen held."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    try:
        page.wait_for_function(f"new RegExp({pattern!r}).test(({SCREEN_JS})())", timeout=timeout_ms, polling=200)
    except PlaywrightTimeout:
        pytest.fail(f"the screen never showed /{pattern}/ in {timeout_ms} ms; it shows:\n{page.evaluate(SCREEN_JS)}")
    return page.evaluate(SCREEN_JS)


def test_keys_pressed_in_the_browser_change_the_engine():
    sync_api = pytest.importorskip("playwright.sync_api", reason="no playwright driver (pip install -e '.[dev]')")
    with batchtop_web("--model", "tiny", "--num-requests", "8", "--max-num-seqs", "4") as (proc, url):
        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, timeout=30_000)
            try:
                page = browser.new_page(viewport={"width": 1600, "height": 1000})  # room for every panel
                page.set_default_timeout(KEY_MS)
                page.route("**/static/js/textual.js", expose_terminal)
                page.goto(url, timeout=KEY_MS)
                before = wait_for_screen(page, r"Slots \d+/4 busy", DRAW_MS)  # the first step is drawn
                assert "mode=continuous" in before and "max_num_seqs=4" in before
                page.click("#terminal")  # xterm.js takes keys through its focused textarea
                page.keyboard.press("s")
                wait_for_screen(page, r"mode=static", KEY_MS)
                page.keyboard.press("]")
                after = wait_for_screen(page, r"Slots \d+/8 busy", KEY_MS)
                assert "mode=static" in after and "max_num_seqs=8" in after
                tabs = descendants(proc.pid)
                assert tabs, "the open tab runs no process of its own"
                proc.send_signal(signal.SIGINT)  # with the tab still open: the server ends its process too
                assert proc.wait(timeout=EXIT_S) == 0
                deadline = time.monotonic() + EXIT_S
                while tabs & descendants_alive(tabs) and time.monotonic() < deadline:
                    time.sleep(0.2)
                assert not descendants_alive(tabs), "a tab's process outlived batchtop web"
            finally:
                browser.close()


def descendants_alive(pids: set[int]) -> set[int]:
    """The ones of pids still running (a zombie is not)."""
    alive = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            alive.add(pid)
    return alive
