"""A replica that drips its answer (one byte at a time, each read quicker than the timeout, the whole
never ending) or hangs where no socket timeout reaches costs only its own row: it is STALE within the
timeout, the healthy replica is scraped as usual, a headless run keeps its --duration, and SIGTERM /
Ctrl-C end it at once with the JSON written (exit 143 / 130), on screen the healthy replica shows."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time

from click.testing import CliRunner

from batchtop.core_engine.attach.scrape.poller import SLACK_S, LivePoller
from batchtop.core_engine.attach.scrape.scrape import LIVE, STALE
from batchtop.tui.app import BatchtopApp
from batchtop.tui.sources.attach import AttachSource
from batchtop.tui.cli import main
from batchtop.tui.cli.attach import AttachOptions, prepare
from batchtop.tui.widgets.attach.replicas import AttachReplicasPanel
from tests.support.attach_helpers import VLLM_T0, FlakyMetrics, drip_server, flaky_server
from tests.tui.test_attach_app import wait_for

HUNG = 30.0  # far below the hours the drips would take, far above any scrape on a busy host


def polls_within(poller: LivePoller, count: int) -> list:
    """`count` polls, or an AssertionError after HUNG seconds instead of a test that never ends."""
    out: list = []

    def run() -> None:
        for _ in range(count):
            out.extend(poller.poll()[0])

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(HUNG)
    assert not worker.is_alive(), "a poll never returned"
    return out


def test_a_dripping_replica_is_stale_within_the_timeout_and_the_others_are_scraped():
    with flaky_server(FlakyMetrics(VLLM_T0.read_text())) as good, drip_server("body") as body, \
            drip_server("headers") as headers:
        poller = LivePoller([good, body, headers], interval_s=1.0, timeout_s=0.5)
        try:
            start = time.monotonic()
            results = polls_within(poller, 2)
            took = time.monotonic() - start
        finally:
            poller.close()
    assert [r.status for r in results] == [LIVE, STALE, STALE] * 2
    assert results[1].reason == "answer not finished within 0.5 s"  # its headers came, its body never ends
    assert results[2].reason == "no answer within 0.5 s"
    assert results[0].sample.running == 8
    assert took < 2 * (0.5 + SLACK_S) + 5.0  # not the hours the drips would take


def test_a_scrape_stuck_where_no_timeout_reaches_costs_only_its_replica():
    """A DNS lookup ignores socket timeouts: the poller stops waiting at the deadline all the same,
    and says, while the stuck scrape lasts, that it has not ended."""
    release = threading.Event()
    with flaky_server(FlakyMetrics(VLLM_T0.read_text())) as good:
        poller = LivePoller([good, "http://127.0.0.1:9"], interval_s=1.0, timeout_s=0.3)
        poller.scrapers[1].scrape = lambda: release.wait()  # blocks until the test lets it go
        try:
            first, second = polls_within(poller, 1), polls_within(poller, 1)
        finally:
            release.set()
            poller.close()
    assert [r.status for r in first] == [LIVE, STALE] and first[1].reason == "no answer within 0.3 s"
    assert [r.status for r in second] == [LIVE, STALE] and "has not ended" in second[1].reason


def start_attach(urls: list[str], out) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "batchtop.tui", "attach", *urls, "--headless", "--duration", "60",
                             "--interval", "0.5", "--device", "h100", "-o", str(out)], stderr=subprocess.PIPE, text=True)
    assert "attaching to" in proc.stderr.readline()
    return proc


def check_doc(doc: dict) -> None:
    good, drip = doc["replicas"]
    assert good["status"] == LIVE and good["running"] == 8 and good["health"] == {LIVE: doc["ticks"]}
    assert drip["status"] == STALE and drip["reason"] == "answer not finished within 0.4 s"


def test_headless_attach_keeps_its_duration_beside_a_dripping_replica(tmp_path):
    out = tmp_path / "attach.json"
    with flaky_server(FlakyMetrics(VLLM_T0.read_text())) as good, drip_server("body") as drip:
        result: list = []
        run = threading.Thread(target=lambda: result.append(CliRunner().invoke(main, [
            "attach", good, drip, "--headless", "--duration", "2", "--interval", "0.5", "--device", "h100",
            "-o", str(out)])), daemon=True)
        run.start()
        run.join(HUNG)
        assert not run.is_alive(), "the run never ended"
    assert result[0].exit_code == 0, result[0].output
    doc = json.loads(out.read_text())
    assert doc["complete"] is True and doc["ticks"] == 5  # t = 0, 0.5, ..., 2.0
    assert 2.0 <= doc["duration_s"] <= 2.0 + 0.4 + SLACK_S + 1.0  # the last tick's timeout, 0.8 x --interval
    check_doc(doc)


def test_sigterm_and_ctrl_c_end_a_headless_watch_at_once_while_a_replica_drips(tmp_path):
    with flaky_server(FlakyMetrics(VLLM_T0.read_text())) as good, drip_server("body") as drip:
        runs = {sig: start_attach([good, drip], tmp_path / f"{sig.name}.json") for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            time.sleep(1.6)  # a few ticks in: a dripping scrape is in flight whenever the signal lands
            for sig, proc in runs.items():
                proc.send_signal(sig)
            codes = [proc.wait(timeout=HUNG) for proc in runs.values()]
        finally:
            for proc in runs.values():
                if proc.poll() is None:
                    proc.kill()
    assert codes == [143, 130]
    for sig in runs:
        doc = json.loads((tmp_path / f"{sig.name}.json").read_text())
        assert doc["complete"] is False and doc["ticks"] >= 2
        check_doc(doc)


async def test_the_dashboard_shows_the_healthy_replica_beside_a_dripping_one():
    with flaky_server(FlakyMetrics(VLLM_T0.read_text())) as good, drip_server("body") as drip:
        setup = prepare((good, drip), AttachOptions(interval=0.5, device="h100"))
        app = BatchtopApp(AttachSource(setup))
        async with app.run_test(size=(150, 44)) as pilot:
            await wait_for(pilot, lambda: app.source.frame is not None and app.source.frame.tick >= 2)
            await pilot.pause(0.2)
            assert [s.status for s in app.source.frame.replicas] == [LIVE, STALE]
            rows = app.query_one(AttachReplicasPanel).render().plain
            assert "answer not finished within 0.4 s" in rows
            assert app.source.frame.replicas[0].running == 8
            await pilot.press("q")
