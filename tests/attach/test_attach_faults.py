"""A replica that stalls, answers 500 or garbage, is unreachable or restarts shows STALE / BAD / DOWN /
a reset with its reason, and the other replicas stay live; nothing crashes, no rate goes negative."""

from __future__ import annotations

import json
import socket
import time

from click.testing import CliRunner

from batchtop.core_engine.attach.monitor import Monitor
from batchtop.core_engine.attach.scrape.poller import LivePoller
from batchtop.core_engine.attach.scrape.scrape import BAD, DOWN, LIVE, STALE
from batchtop.tui.cli import main
from tests.support.attach_helpers import VLLM_T0, VLLM_T2, FlakyMetrics, flaky_server, restarted


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
            # the good replica moves on each time (once through a restart: a new process start time)
            good_texts = [VLLM_T2.read_text(), restarted(VLLM_T0.read_text(), 2e9), restarted(VLLM_T2.read_text(), 2e9)]
            for mode, status, reason in (("stall", STALE, "no answer within 0.6 s"), ("error", BAD, "HTTP 500"),
                                         ("garbage", BAD, "not Prometheus text")):
                bad.mode = mode
                good.text = good_texts.pop(0)
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
            state.text = restarted(VLLM_T0.read_text(), 2e9)  # every counter lower: the server started again
            s = poll(poller, monitor).replicas[0]
            assert s.resets == 1 and s.status == LIVE
            assert s.rates == {} and s.latency == {} and s.point is None
            state.text = restarted(VLLM_T2.read_text(), 2e9)
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
             (["attach", "http://[::1", "--headless", "--duration", "1"], "URL"),  # was a ValueError traceback
             (["attach", "http://[notip]:80", "--headless", "--duration", "1"], "URL"),
             (["attach", "http://x:1", "--device", "tpu9", "--headless", "--duration", "1"], "--device"),
             (["attach", "http://x:1", "--duration", "1"], "--duration"),
             (["attach", "http://x:1", "--headless", "--duration", "1", "--model", "./nope"], "--model"),
             (["attach", "http://x:1", "x:1/metrics", "--headless", "--duration", "1"], "URL")]
    # inf and nan are refused by name before any scrape (nan slipped through every range check)
    for option in ("--interval", "--timeout", "--window", "--duration"):
        for value in ("nan", "inf", "-inf"):
            cases.append((["attach", "http://x:1", "--headless", "--duration", "1", option, value], option))
    for args, option in cases:
        result = runner.invoke(main, args)
        assert result.exit_code == 2, (args, result.output)
        assert option in result.output and "Traceback" not in result.output, (args, result.output)


def test_a_watch_whose_recording_fails_still_writes_what_it_saw(tmp_path, monkeypatch):
    """--record's disk filling up mid-watch: exit 1 naming the error, the JSON of the ticks before it."""
    import errno

    from batchtop.core_engine.attach.record.record import AttachRecorder

    real_tick, calls = AttachRecorder.tick, []

    def tick(self, *args):
        calls.append(args)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_tick(self, *args)

    monkeypatch.setattr(AttachRecorder, "tick", tick)
    out = tmp_path / "attach.json"
    with flaky_server(FlakyMetrics(VLLM_T0.read_text())) as url:
        result = CliRunner().invoke(main, ["attach", url, "--headless", "--duration", "5", "--interval", "0.2",
                                           "--device", "h100", "--record", str(tmp_path / "rec.jsonl"),
                                           "-o", str(out)])
    assert result.exit_code == 1, result.output
    assert "error: OSError: [Errno 28] No space left on device" in result.output
    doc = json.loads(out.read_text())
    assert doc["complete"] is False and doc["ticks"] == 2 and doc["error"].startswith("OSError")
    assert doc["replicas"][0]["running"] == 8


async def test_a_crash_in_the_dashboards_feed_is_shown_not_frozen(monkeypatch):
    from batchtop.core_engine.attach.monitor import Monitor as LiveMonitor
    from batchtop.tui.app import BatchtopApp
    from batchtop.tui.sources.attach import AttachSource
    from batchtop.tui.cli.attach import AttachOptions, prepare
    from tests.tui.test_attach_app import wait_for

    def broken(self, results, t, *streams):
        raise RuntimeError("a bug in the monitor")

    monkeypatch.setattr(LiveMonitor, "feed", broken)
    with flaky_server(FlakyMetrics(VLLM_T0.read_text())) as url:
        setup = prepare((url,), AttachOptions(interval=0.3, device="h100"))
        app = BatchtopApp(AttachSource(setup))
        async with app.run_test(size=(140, 44)) as pilot:
            await wait_for(pilot, lambda: app.source_error is not None)
            await pilot.pause(0.1)
            assert "stopped: RuntimeError: a bug in the monitor" in str(app.query_one("#status").render())
            await pilot.press("q")
