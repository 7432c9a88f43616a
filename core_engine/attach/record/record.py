"""`batchtop attach --record FILE`: every scrape of every replica into a batchtop.trace file whose
header says `"source": "attach"`, with the side streams' step lines and KV-event messages
(stream_events.py), and back: a replay feeds the recorded scrapes and streams to a Monitor, so it
recomputes every rate, percentile, logged step and cached prefix exactly as the live session did.

Lines are written whole and flushed per tick (gzip when the name ends in .gz, sync-flushed so a
reader sees every complete line), fsynced on close; reading goes through the trace reader.
"""

from __future__ import annotations

from collections.abc import Iterator

from batchtop.core_engine.attach.monitor import Monitor
from batchtop.core_engine.attach.record.record_schema import check_attach_header, check_scrape, check_stream_event
from batchtop.core_engine.attach.record.stream_events import (KV, LOG_LINE, kv_event, kv_message, log_line,
                                                              log_line_event)
from batchtop.core_engine.attach.server_point import ModelEstimate
from batchtop.core_engine.attach.scrape.sample import ReplicaSample
from batchtop.core_engine.attach.scrape.scrape import ScrapeResult
from batchtop.core_engine.attach.streams.served_model import served_tokenizer
from batchtop.core_engine.attach.streams.step_point import StepPricer
from batchtop.core_engine.attach.streams.stream_state import StreamState
from batchtop.core_engine.attach.streams.stream_tick import NOTHING, StreamTick
from batchtop.core_engine.config import ModelConfig
from batchtop.core_engine.trace.trace import Trace
from batchtop.core_engine.trace.writer import TraceWriter

SOURCE = "attach"


class AttachRecorder:
    def __init__(self, path: str, header: dict) -> None:
        self.path = path
        self._writer = TraceWriter(path, {"source": SOURCE, **header})

    def tick(self, tick: int, t: float, results: list[ScrapeResult], streams: StreamTick = NOTHING) -> None:
        """The tick's scrapes and what the side streams delivered since the last, in the order of their
        times (a line read while the scrape ran comes after it): the file's t never goes back."""
        events = [(line_t, log_line_event(tick, line)) for line_t, line in streams.lines]
        events += [(message.t, kv_event(tick, message)) for message in streams.kv]
        events += [(t, {"type": "scrape", "tick": tick, "replica": replica, "status": r.status, "reason": r.reason,
                        "latency_s": round(r.latency_s, 6),
                        "sample": r.sample.as_dict() if r.sample is not None else None})
                   for replica, r in enumerate(results)]
        for event_t, event in sorted(events, key=lambda e: e[0]):
            self._writer.write(event, t=event_t)
        self._writer.flush()

    def close(self, t: float, reason: str = "finished") -> None:
        self._writer.close({"reason": reason}, t=t)


def attach_header(urls: list[str], interval_s: float, window_s: float, max_num_seqs: int | None,
                  estimate: ModelEstimate | None, peaks: dict | None, streams: dict | None = None) -> dict:
    """streams: which side streams the watch read ({"log": ..., "kv_events": ..., "model_params": ...})."""
    header = {"urls": urls, "interval_s": interval_s, "window_s": window_s, "max_num_seqs": max_num_seqs,
              "estimate": None if estimate is None else {"model": estimate.model.as_dict(), "dtype": estimate.dtype},
              "peaks": peaks}
    return header | ({"streams": streams} if streams else {})


def header_estimate(header: dict) -> ModelEstimate | None:
    data = header.get("estimate")
    return None if not data else ModelEstimate(ModelConfig.from_dict(data["model"]), data["dtype"])


def monitor_for(trace: Trace) -> Monitor:
    """A fresh Monitor set up as the recorded session's was: same replicas, window, ceiling, estimate;
    TraceError naming the field when the header cannot give them."""
    check_attach_header(trace)
    header = trace.header
    estimate = header_estimate(header)
    return Monitor(list(header["urls"]), window_s=float(header.get("window_s") or 30.0),
                   max_num_seqs=header.get("max_num_seqs"), estimate=estimate,
                   streams=recorded_streams(header.get("streams"), estimate))


def recorded_streams(streams: dict | None, estimate: ModelEstimate | None) -> StreamState | None:
    """The stream state the recorded watch had: a step log, a prefix cache, or neither (older traces)."""
    if not streams:
        return None
    dtype = estimate.dtype if estimate is not None else "bfloat16"
    state = StreamState(log=bool(streams.get("log")), kv=bool(streams.get("kv_events")),
                        pricer=StepPricer(estimate, streams.get("model_params"), dtype))
    if state.prefix is not None:  # the watch's --model, where this machine has it too
        state.decode = served_tokenizer(streams.get("tokenizer"))
    return state


def recorded_ticks(trace: Trace) -> Iterator[tuple[float, list[ScrapeResult]]]:
    """(t, one result per replica) for every recorded tick, in order (the scrapes alone)."""
    for t, results, _ in recorded_stream_ticks(trace):
        yield t, results


def recorded_stream_ticks(trace: Trace) -> Iterator[tuple[float, list[ScrapeResult], StreamTick]]:
    """(t, one result per replica, what the side streams delivered) for every recorded tick, in order; a
    tick cut short by a crash is skipped, and an event that cannot be replayed is refused, naming its
    line and field."""
    check_attach_header(trace)
    num = len(trace.header["urls"])
    tick, t, results, lines, kv = None, 0.0, [None] * num, [], []
    for index, event in enumerate(trace.events):
        kind = event.get("type")
        if kind not in ("scrape", LOG_LINE, KV):
            continue
        if kind == "scrape":
            check_scrape(trace, index, num)
        else:
            check_stream_event(trace, index)
        if event.get("tick") != tick:
            if tick is not None and all(r is not None for r in results):
                yield t, results, StreamTick(tuple(lines), tuple(kv))
            tick, results, lines, kv = event.get("tick"), [None] * num, [], []
        if kind == LOG_LINE:
            lines.append(log_line(event))
        elif kind == KV:
            kv.append(kv_message(event))
        else:
            sample = ReplicaSample.from_dict(event["sample"]) if event.get("sample") is not None else None
            results[event["replica"]] = ScrapeResult(event["status"], event.get("reason"), sample,
                                                     float(event.get("latency_s", 0)))
            t = float(event["t"])
    if tick is not None and all(r is not None for r in results):
        yield t, results, StreamTick(tuple(lines), tuple(kv))
