"""vLLM's iteration lines (a real 0.32.0 capture) and SGLang's batch lines parse into steps; lines of
other wordings are told apart and counted; the follower reads a file as tail -F would and a pipe, with
memory bounded by a 1 MB line."""

from __future__ import annotations

import os
import re
import time

import pytest

from batchtop.core_engine.attach.streams.iteration_log import NotAStep, is_step_line, parse_step
from batchtop.core_engine.attach.streams.log_follower import LogFollower
from batchtop.core_engine.attach.streams.step_log import StepLog
from tests.support.vllm_step_streams import iteration_lines

LINE = ("(APIServer pid=1) INFO 12-07 23:20:07 [loggers.py:199] Engine 000: Iteration({n}): {cr} context requests, "
        "{ct} context tokens, {gr} generation requests, {gt} generation tokens, iteration elapsed time: {ms} ms, "
        "CPU KV cache usage: 2.5%")


def numbers(line: str) -> list[float]:
    """The line's numbers read independently of the parser: Iteration(N) then the six figures."""
    tail = line.split("Iteration(", 1)[1]
    return [float(x) for x in re.findall(r"[0-9]+(?:\.[0-9]+)?", tail)]


def test_every_real_vllm_iteration_line_parses_to_its_own_numbers():
    lines = iteration_lines()
    assert len(lines) == 828
    for line in lines:
        step = parse_step(line)
        n, cr, ct, gr, gt, ms, kv = numbers(line)
        assert (step.iteration, step.prefill_rows, step.prefill_tokens, step.decode_rows, step.decode_tokens) == \
            (n, cr, ct, gr, gt)
        assert step.elapsed_s == pytest.approx(ms / 1000) and step.kv_usage == pytest.approx(kv / 100)
        assert step.source == "vllm" and step.engine == 0 and not step.sampled
    assert sum(parse_step(x).prefill_rows for x in lines) == 72  # the capture's 72 requests, one prefill each


def test_sglang_prefill_and_decode_lines_are_steps_and_decode_lines_are_samples():
    prefill = parse_step("[2026-12-07 10:00:00 TP0] Prefill batch. #new-seq: 2, #new-token: 730, #cached-token: 320, "
                         "token usage: 0.05, #running-req: 6, #queue-req: 3, ")
    assert (prefill.prefill_rows, prefill.prefill_tokens, prefill.cached_tokens, prefill.waiting) == (2, 730, 320, 3)
    assert prefill.elapsed_s is None and not prefill.sampled
    decode = parse_step("[2026-12-07 10:00:01 TP0] Decode batch. #running-req: 8, #token: 3000, token usage: 0.10, "
                        "cuda graph: True, gen throughput (token/s): 412.50, #queue-req: 0, ")
    assert (decode.decode_rows, decode.decode_tokens, decode.waiting, decode.sampled) == (8, 8, 0, True)


def test_other_lines_are_not_steps_and_another_wording_is_told_apart():
    assert parse_step('INFO:     127.0.0.1:5 - "GET /metrics HTTP/1.1" 200 OK') is None
    assert not is_step_line("INFO 12-07 [loggers.py] Avg prompt throughput: 12.0 tokens/s")
    with pytest.raises(NotAStep):
        parse_step("Engine 000: Iteration(7): 3 prefill requests, 12 prefill tokens")  # a later wording, say
    log = StepLog()
    for line in ["Engine 000: Iteration(7): garbled", LINE.format(n=1, cr=1, ct=9, gr=0, gt=0, ms=5.0), "hello"]:
        log.add(1.0, line)
    assert (log.total, log.unparsed) == (1, 1)


def test_skipped_iteration_numbers_are_counted_as_missed_lines():
    log = StepLog()
    for n in (0, 1, 2, 5, 6):
        log.add(float(n), LINE.format(n=n, cr=0, ct=0, gr=4, gt=4, ms=10.0))
    assert (log.total, log.missed) == (5, 2)
    view = log.view(6.0)
    assert view.steps_per_s == pytest.approx(3 / 5.0)  # the last five seconds hold the steps at t = 2, 5 and 6
    log.add(7.0, LINE.format(n=0, cr=1, ct=10, gr=0, gt=0, ms=10.0))  # a restarted server counts from 0 again
    assert log.missed == 2


def wait_until(condition, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_the_follower_reads_what_is_appended_and_follows_rotation_and_truncation(tmp_path):
    path = tmp_path / "vllm.log"
    path.write_text(LINE.format(n=0, cr=1, ct=9, gr=0, gt=0, ms=5.0) + "\n")  # before the watch: not read
    follower = LogFollower(str(path)).start()
    got = []
    try:
        time.sleep(0.1)
        with open(path, "a") as f:
            f.write('INFO "GET /metrics" 200\n' + LINE.format(n=1, cr=0, ct=0, gr=1, gt=1, ms=5.0) + "\n")
        wait_until(lambda: got.extend(follower.drain()) or len(got) == 1)
        os.rename(path, tmp_path / "vllm.log.1")  # rotated, as logrotate does
        path.write_text(LINE.format(n=2, cr=0, ct=0, gr=2, gt=2, ms=5.0) + "\n")
        wait_until(lambda: got.extend(follower.drain()) or len(got) == 2)
        path.write_text("")  # truncated (copytruncate), then written again
        wait_until(lambda: follower.counts().reopened == 2)
        path.write_text(LINE.format(n=3, cr=0, ct=0, gr=3, gt=3, ms=5.0) + "\n")
        wait_until(lambda: got.extend(follower.drain()) or len(got) == 3)
    finally:
        follower.close()
    assert [parse_step(r.text).iteration for r in got] == [1, 2, 3]
    counts = follower.counts()
    assert counts.other_lines == 1 and counts.reopened == 2 and counts.ended is None


def test_a_pipe_with_a_1mb_line_keeps_memory_bounded_and_says_when_it_closed():
    read, write = os.pipe()
    follower = LogFollower("-", fd=read).start()
    try:
        with os.fdopen(write, "wb") as w:
            w.write(b"x" * (1 << 20) + b"\n")
            w.write(LINE.format(n=4, cr=0, ct=0, gr=1, gt=1, ms=5.0).encode() + b"\n")
            w.write(b"Engine 000: Iteration(5): " + b"9" * (1 << 20) + b"\n")  # a 1 MB line that claims to be a step
            w.write(LINE.format(n=6, cr=0, ct=0, gr=1, gt=1, ms=5.0).encode())  # the last, without its newline
        wait_until(lambda: follower.counts().ended is not None)
        lines = follower.drain()
    finally:
        follower.close()
        os.close(read)
    assert [parse_step(r.text).iteration for r in lines] == [4, 6]
    counts = follower.counts()
    assert counts.long_lines == 2 and counts.ended == "the log's pipe closed"
    assert max(len(r.text) for r in lines) < 1000
