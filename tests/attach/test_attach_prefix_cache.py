"""attach reads a server's prefix-cache counters and shows their hit rate over the window."""

from __future__ import annotations

import dataclasses

from batchtop.core_engine.attach.monitor import Monitor
from batchtop.core_engine.attach.scrape.sample import parse_exposition
from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.sched.request import Request
from batchtop.core_engine.serve.exporter import VllmMetrics
from batchtop.tui.widgets.attach.metrics_strip import metrics_text
from tests.support.attach_helpers import VLLM_T0, VLLM_T2, live, sglang_text, vllm_sample
from tests.conftest import tiny_config


def test_vllms_counters_are_read_and_a_window_without_hits_says_zero():
    monitor = Monitor(["vllm"])
    monitor.feed([live(vllm_sample(VLLM_T0, 0.0))], 0.0)
    frame = monitor.feed([live(vllm_sample(VLLM_T2, 2.0))], 2.0)
    assert vllm_sample(VLLM_T2, 2.0).counters["prefix_queries"] == 768
    line = metrics_text(frame.replicas[0]).plain.splitlines()[-1]
    assert line == " prefix cache: hit 0% of 384 prompt tokens over 2s"  # the capture's random prompts share none


def test_a_batchtop_servers_hit_rate_is_what_its_engine_counted():
    config = tiny_config(max_num_seqs=4)
    exporter, engine = VllmMetrics(config, "tiny"), Engine(config)
    monitor = Monitor(["batchtop"])
    monitor.feed([live(parse_exposition(exporter.exposition().decode(), 0.0))], 0.0)
    engine.load_workload([Request(f"r{i}", tuple(range(1, 13)) + (50 + i,), 2) for i in range(4)])
    while not engine.is_done():
        exporter.observe(engine.step())
    frame = monitor.feed([live(parse_exposition(exporter.exposition().decode(), 4.0))], 4.0)
    c = engine.counters
    assert (c.prefix_queries, c.prefix_hits) == (4 * 13, 3 * 12)
    assert metrics_text(frame.replicas[0]).plain.endswith(f"prefix cache: hit {100 * 36 / 52:.0f}% of 52 prompt "
                                                          "tokens over 4s")


def test_a_server_without_the_counters_says_they_are_not_exposed():
    monitor = Monitor(["sglang"])
    for t in (0.0, 2.0):
        sample = parse_exposition(sglang_text(1, 0, 0.1, int(10 * t), int(20 * t), [0.1]), t)
        frame = monitor.feed([live(dataclasses.replace(sample))], t)
    assert "prefix cache: not exposed" in metrics_text(frame.replicas[0]).plain.splitlines()[-1]
