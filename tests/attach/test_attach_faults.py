"""A replica that stalls, answers 500 or garbage, is unreachable or restarts shows STALE / BAD / DOWN /
a reset with its reason, and the other replicas stay live; nothing crashes, no rate goes negative."""

from __future__ import annotations

import json
import socket
import time

from click.testing import CliRunner

from batchtop.core_engine.attach.monitor import LivePoller, Monitor
from batchtop.core_engine.attach.scrape import BAD, DOWN, LIVE, STALE
from batchtop.tui.cli import main
from tests.support.attach_helpers import VLLM_T0, VLLM_T2, FlakyMetrics, flaky_server


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def poll(poller: LivePoller, monitor: Monitor):
    results, t = poller.poll()
    return monitor.feed(results, t)


def test_each_fault_marks_only_its_replica_with_the_reason():
    good, bad = FlakyMetrics(VLLM_T0.read_text()), FlakyMetrics(VLLM_T0.read_text())
    with flaky_server(good) as good_url, flaky_server(bad) as bad_url:
        urls = [good_url, bad_url, closed_port_url()]
        poller, monitor = LivePoller(urls, interval_s=1.0, timeout_s=0.6), Monitor(urls)
        try:
            frame = poll(poller, monitor)
            assert [s.status for s in frame.replicas] == [LIVE, LIVE, DOWN]
            assert "refused" in frame.replicas[2].reason.lower()
            for mode, status, reason in (("stall", STALE, "no answer within 0.6 s"), ("error", BAD, "HTTP 500"),
                                         ("garbage", BAD, "not Prometheus text")):
                bad.mode = mode
                good.text = VLLM_T2.read_text() if good.text == VLLM_T0.read_text() else VLLM_T0.read_text()
                t0 = time.monotonic()
                frame = poll(poller, monitor)
                assert time.monotonic() - t0 < 1.5  # a stalled replica costs its timeout, not its stall
                assert frame.replicas[1].status == status and reason in frame.replicas[1].reason
                assert frame.replicas[0].status == LIVE and frame.replicas[2].status == DOWN
                # the faulty replica keeps its last numbers on screen, but has no current rates
                assert frame.replicas[1].running == 8 and frame.replicas[1].rates == {}
                assert frame.aggregate.reason == "1 of 3 replicas live"
                assert frame.aggregate.running == 16  # the stale replica's last gauge still counts, marked
        finally:
            poller.close()


def test_a_restart_resets_that_replicas_rates_without_negative_numbers():
    state = FlakyMetrics(VLLM_T2.read_text())
    with flaky_server(state) as url:
        poller, monitor = LivePoller([url], interval_s=1.0, timeout_s=0.8), Monitor([url])
        try:
            poll(poller, monitor)
            state.text = VLLM_T0.read_text()  # every counter lower: the server started again
            s = poll(poller, monitor).replicas[0]
            assert s.resets == 1 and s.status == LIVE
            assert s.rates == {} and s.latency == {} and s.point is None
            state.text = VLLM_T2.read_text()
            s = poll(poller, monitor).replicas[0]
            assert s.rates["generation_tokens"] > 0 and all(v >= 0 for v in s.rates.values())
            assert s.latency["ttft"]["count"] == 8  # only what happened since the restart
        finally:
            poller.close()


def test_headless_attach_writes_the_json_with_every_replicas_health(tmp_path):
    good, bad = FlakyMetrics(VLLM_T0.read_text()), FlakyMetrics("")
    bad.mode = "error"
    out = tmp_path / "attach.json"
    with flaky_server(good) as good_url, flaky_server(bad) as bad_url:
        result = CliRunner().invoke(main, ["attach", good_url, bad_url, "--headless", "--duration", "1.0",
                                           "--interval", "0.5", "--device", "h100", "-o", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["schema"] == "batchtop.attach/1" and doc["complete"] is True and doc["ticks"] >= 2
    first, second = doc["replicas"]
    assert first["status"] == LIVE and first["flavour"] == "vllm" and first["health"] == {LIVE: doc["ticks"]}
    assert second["status"] == BAD and second["reason"].startswith("HTTP 500")
    assert doc["aggregate"]["running"] == 8
    assert doc["device"]["peaks"]["device_name"] == "H100"


def test_bad_options_exit_2_naming_the_option():
    runner = CliRunner()
    cases = [(["attach", "http://x:1", "--interval", "1", "--timeout", "2"], "--timeout"),
             (["attach", "http://x:1", "--headless"], "--duration"),
             (["attach", "ftp://x:1/", "--headless", "--duration", "1"], "URL"),
             (["attach", "http://x:1", "--device", "tpu9", "--headless", "--duration", "1"], "--device"),
             (["attach", "http://x:1", "--duration", "1"], "--duration"),
             (["attach", "http://x:1", "--headless", "--duration", "1", "--model", "./nope"], "--model")]
    for args, option in cases:
        result = runner.invoke(main, args)
        assert result.exit_code == 2, (args, result.output)
        assert option in result.output, (args, result.output)


def test_sigterm_ends_a_headless_watch_with_the_json_of_what_was_seen(tmp_path):
    import signal
    import subprocess
    import sys

    out = tmp_path / "attach.json"
    with flaky_server(FlakyMetrics(VLLM_T0.read_text())) as url:
        proc = subprocess.Popen([sys.executable, "-m", "batchtop.tui", "attach", url, "--headless", "--duration", "60",
                                 "--interval", "0.5", "--device", "h100", "-o", str(out)],
                                stderr=subprocess.PIPE, text=True)
        assert "attaching to" in proc.stderr.readline()
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 143
    doc = json.loads(out.read_text())
    assert doc["complete"] is False and doc["ticks"] >= 2 and doc["replicas"][0]["status"] == LIVE
