"""The real vLLM CPU 0.32.0 capture in tests/data/vllm-0.32-cpu-step-streams/ (its README says how it was
made) laid on one clock, as a live `attach --vllm-log --kv-events` watch would have seen it: one tick per
/metrics scrape, each with the iteration lines logged and the KV-event messages received since the last.

The log's own timestamps have one-second resolution; a second's lines are spread evenly through it."""

from __future__ import annotations

import base64
import datetime
import functools
import gzip
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import msgpack

from batchtop.core_engine.attach.scrape.sample import parse_exposition
from batchtop.core_engine.attach.scrape.scrape import ScrapeResult
from batchtop.core_engine.attach.streams.stream_tick import KVMessage, StreamTick
from tests.support.attach_helpers import live

CAPTURE = Path(__file__).resolve().parent.parent / "data" / "vllm-0.32-cpu-step-streams"
LOG_TIME = re.compile(r"INFO (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d) ")
YEAR = 2026
URL = "http://127.0.0.1:8137/metrics"


def iteration_lines() -> list[str]:
    return (CAPTURE / "iteration_lines.log").read_text(encoding="utf-8").splitlines()


def kv_messages_unix() -> list[tuple[float, tuple[bytes, ...]]]:
    out = []
    for line in (CAPTURE / "kv_events.jsonl").read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        out.append((record["recv_unix"], tuple(base64.b64decode(f) for f in record["frames_b64"])))
    return out


def scrapes_unix() -> list[tuple[float, str]]:
    text = gzip.decompress((CAPTURE / "metrics-scrapes.prom.gz").read_bytes()).decode("utf-8")
    out = []
    for chunk in text.split("# scrape_unix ")[1:]:
        stamp, _, body = chunk.partition("\n")
        out.append((float(stamp), body))
    return out


def _line_times(lines: list[str]) -> list[float]:
    seconds = []
    for line in lines:
        mo, day, h, m, s = map(int, LOG_TIME.search(line).groups())
        seconds.append(datetime.datetime(YEAR, mo, day, h, m, s, tzinfo=datetime.timezone.utc).timestamp())
    out = []
    for i, second in enumerate(seconds):
        same = [j for j, s in enumerate(seconds) if s == second]
        out.append(second + (same.index(i) + 0.5) / len(same))
    return out


@dataclass(frozen=True)
class CaptureTick:
    t: float
    results: list[ScrapeResult]  # shared between the tests that read the capture: never changed
    streams: StreamTick


@functools.cache
def capture_ticks() -> tuple[CaptureTick, ...]:
    """The capture as the watch's ticks, t = 0 at the first scrape (parsed once per test process)."""
    return tuple(_ticks())


def _ticks() -> Iterator[CaptureTick]:
    scrapes = scrapes_unix()
    t0 = scrapes[0][0]
    lines = iteration_lines()
    timed_lines = sorted(zip(_line_times(lines), lines))
    kv = kv_messages_unix()
    last = float("-inf")
    for stamp, body in scrapes:
        tick_lines = tuple((round(u - t0, 6), line) for u, line in timed_lines if last < u <= stamp)
        tick_kv = tuple(KVMessage(round(u - t0, 6), frames) for u, frames in kv if last < u <= stamp)
        yield CaptureTick(round(stamp - t0, 6), [live(parse_exposition(body, round(stamp - t0, 6)))],
                          StreamTick(tick_lines, tick_kv))
        last = stamp


def cached_after(messages) -> int:
    """The blocks a publisher's messages leave cached (stored minus removed), read with msgpack alone,
    not batchtop's decoder: what the prefix cache's count is checked against."""
    cached: set = set()
    for frames in messages:
        for event in msgpack.unpackb(frames[2], raw=False, strict_map_key=False)[1]:
            if event["type"] == "BlockStored":
                cached.update(event["block_hashes"])
            elif event["type"] == "BlockRemoved":
                cached.difference_update(event["block_hashes"])
    return len(cached)
