"""One server under two spellings (a name and its address, a port with a leading 0, a path or a query,
an IPv4-mapped IPv6 address) is refused before the first scrape, exit 2 naming both: its numbers would
count twice in the aggregate. Servers that differ in address or port are watched side by side."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from batchtop.core_engine.attach.scrape.identity import refuse_duplicates
from batchtop.core_engine.attach.scrape.scrape import metrics_url
from batchtop.core_engine.errors import ConfigError
from batchtop.tui.cli import main
from tests.support.attach_helpers import VLLM_T0, FlakyMetrics, flaky_server


@pytest.mark.parametrize("other", ["http://localhost:{port}", "http://127.0.0.1:0{port}",
                                   "http://127.0.0.1:{port}/metrics?x=1", "http://[::ffff:127.0.0.1]:{port}",
                                   "localhost:{port}/", "HTTP://127.0.0.1:{port}/v1/metrics"])
def test_one_server_under_two_spellings_is_refused_naming_both(other, tmp_path):
    with flaky_server(FlakyMetrics(VLLM_T0.read_text())) as url:
        port = url.rsplit(":", 1)[1]
        spelled = other.format(port=port)
        result = CliRunner().invoke(main, ["attach", url, spelled, "--headless", "--duration", "0.5",
                                           "--interval", "0.5", "--device", "h100", "-o", str(tmp_path / "a.json")])
    assert result.exit_code == 2, result.output
    assert f"URL: {url} and {spelled} are one server (127.0.0.1:{port}): its numbers would count twice" \
        in result.output
    assert not (tmp_path / "a.json").exists()  # refused before the first scrape


def test_two_servers_are_watched_and_summed_once_each(tmp_path):
    out = tmp_path / "a.json"
    with flaky_server(FlakyMetrics(VLLM_T0.read_text())) as a, flaky_server(FlakyMetrics(VLLM_T0.read_text())) as b:
        result = CliRunner().invoke(main, ["attach", a, b.replace("127.0.0.1", "localhost"), "--headless",
                                           "--duration", "0.5", "--interval", "0.5", "--device", "h100",
                                           "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["aggregate"]["running"] == 16  # 8 each


def test_the_same_address_on_another_port_or_another_address_on_the_same_port_is_another_server():
    urls = ["http://127.0.0.1:8000", "http://127.0.0.1:8001", "http://127.0.0.2:8000", "http://[::1]:8000"]
    refuse_duplicates(urls, [metrics_url(u) for u in urls])  # no error
    with pytest.raises(ConfigError, match=r"http://127.0.0.1 and http://127.0.0.1:80/ are one server \(127.0.0.1:80\)"):
        urls = ["http://127.0.0.1", "http://127.0.0.1:80/"]  # the scheme's default port, spelled or not
        refuse_duplicates(urls, [metrics_url(u) for u in urls])


def test_names_that_do_not_resolve_stand_for_themselves_and_a_stuck_resolver_costs_little(monkeypatch):
    import threading
    import time

    from batchtop.core_engine.attach.scrape import identity
    stuck = threading.Event()
    monkeypatch.setattr(identity.socket, "getaddrinfo", lambda *a, **k: stuck.wait(30) and [])
    monkeypatch.setattr(identity, "RESOLVE_S", 0.2)
    urls = ["http://gpu-a:8000", "http://gpu-b:8000"]
    started = time.monotonic()
    refuse_duplicates(urls, [metrics_url(u) for u in urls])  # two names, two servers
    assert time.monotonic() - started < 1.0
    with pytest.raises(ConfigError, match="http://gpu-a:8000 and http://GPU-A.:8000/x are one server"):
        urls = ["http://gpu-a:8000", "http://GPU-A.:8000/x"]
        refuse_duplicates(urls, [metrics_url(u) for u in urls])
    stuck.set()
