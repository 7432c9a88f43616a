"""A real session: `batchtop attach --record` of vLLM 0.32's CPU server under load, beside vLLM's own
log lines from the same run. Replayed, attach's numbers agree with vLLM's within one interval."""

from __future__ import annotations

import datetime as dt
import re

import pytest

from batchtop.core_engine.attach.record.record import monitor_for, recorded_ticks
from batchtop.core_engine.trace.trace import read_trace
from tests.support.attach_helpers import DATA

LOG_LINE = re.compile(r"INFO (\d\d-\d\d) (\d\d:\d\d:\d\d).*Avg generation throughput: ([\d.]+) tokens/s, "
                      r"Running: (\d+) reqs, Waiting: (\d+) reqs, CPU KV cache usage: ([\d.]+)%")


def test_replayed_attach_agrees_with_vllms_own_log_lines():
    trace = read_trace(str(DATA / "attach-vllm-0.32-cpu.jsonl.gz"))
    start = dt.datetime.fromisoformat(trace.header["start_time"])
    monitor = monitor_for(trace)
    frames = [(start + dt.timedelta(seconds=t), monitor.feed(results, t)) for t, results in recorded_ticks(trace)]
    assert len(frames) == 51 and all(f.replicas[0].flavour == "vllm" for _, f in frames)
    compared = 0
    for line in (DATA / "vllm-0.32-cpu-attach.log").read_text().splitlines():
        m = LOG_LINE.search(line)
        year = start.year
        when = dt.datetime.strptime(f"{year}-{m[1]} {m[2]}", "%Y-%m-%d %H:%M:%S").replace(tzinfo=dt.timezone.utc)
        # the log stamps whole seconds: the first scrape after it, and the one 10 s (vLLM's interval) before
        after = next(f for w, f in frames if w >= when)
        before = next(f for w, f in frames if w >= when - dt.timedelta(seconds=10))
        s = after.replicas[0]
        assert (s.running, s.waiting) == (int(m[4]), int(m[5]))
        assert 100 * s.kv_usage == pytest.approx(float(m[6]), abs=0.05)
        gen = sum(h.gen_tok_s * (h.t - p.t) for p, h in zip(after.history, after.history[1:]) if h.t > before.t)
        assert gen / (after.t - before.t) == pytest.approx(float(m[3]), rel=0.03)
        compared += 1
    assert compared == 4
    last = frames[-1][1].replicas[0]
    assert last.point.source == "measured" and last.max_num_seqs == 16  # from --max-num-seqs, recorded
