"""`batchtop attach --record FILE`: every scrape of every replica into a batchtop.trace file whose
header says `"source": "attach"`, and back: a replay feeds the recorded scrapes to a Monitor, so it
recomputes every rate, percentile and roofline point exactly as the live session did.

Lines are written whole and flushed per tick (gzip when the name ends in .gz, sync-flushed so a
reader sees every complete line), fsynced on close; reading goes through the trace reader.
"""

from __future__ import annotations

from collections.abc import Iterator

from batchtop.core_engine.attach.monitor import Monitor
from batchtop.core_engine.attach.record.record_schema import check_attach_header, check_scrape
from batchtop.core_engine.attach.server_point import ModelEstimate
from batchtop.core_engine.attach.scrape.sample import ReplicaSample
from batchtop.core_engine.attach.scrape.scrape import ScrapeResult
from batchtop.core_engine.config import ModelConfig
from batchtop.core_engine.trace.trace import Trace
from batchtop.core_engine.trace.writer import TraceWriter

SOURCE = "attach"


class AttachRecorder:
    def __init__(self, path: str, header: dict) -> None:
        self.path = path
        self._writer = TraceWriter(path, {"source": SOURCE, **header})

    def tick(self, tick: int, t: float, results: list[ScrapeResult]) -> None:
        for replica, r in enumerate(results):
            self._writer.write({"type": "scrape", "tick": tick, "replica": replica, "status": r.status,
                                "reason": r.reason, "latency_s": round(r.latency_s, 6),
                                "sample": r.sample.as_dict() if r.sample is not None else None}, t=t)
        self._writer.flush()

    def close(self, t: float, reason: str = "finished") -> None:
        self._writer.close({"reason": reason}, t=t)


def attach_header(urls: list[str], interval_s: float, window_s: float, max_num_seqs: int | None,
                  estimate: ModelEstimate | None, peaks: dict | None) -> dict:
    return {"urls": urls, "interval_s": interval_s, "window_s": window_s, "max_num_seqs": max_num_seqs,
            "estimate": None if estimate is None else {"model": estimate.model.as_dict(), "dtype": estimate.dtype},
            "peaks": peaks}


def header_estimate(header: dict) -> ModelEstimate | None:
    data = header.get("estimate")
    return None if not data else ModelEstimate(ModelConfig.from_dict(data["model"]), data["dtype"])


def monitor_for(trace: Trace) -> Monitor:
    """A fresh Monitor set up as the recorded session's was: same replicas, window, ceiling, estimate;
    TraceError naming the field when the header cannot give them."""
    check_attach_header(trace)
    header = trace.header
    return Monitor(list(header["urls"]), window_s=float(header.get("window_s") or 30.0),
                   max_num_seqs=header.get("max_num_seqs"), estimate=header_estimate(header))


def recorded_ticks(trace: Trace) -> Iterator[tuple[float, list[ScrapeResult]]]:
    """(t, one result per replica) for every recorded tick, in order; a tick cut short by a crash is
    skipped, and an event that cannot be replayed is refused, naming its line and field."""
    check_attach_header(trace)
    num = len(trace.header["urls"])
    tick, t, results = None, 0.0, [None] * num
    for index, event in enumerate(trace.events):
        if event.get("type") != "scrape":
            continue
        check_scrape(trace, index, num)
        replica = event["replica"]
        sample = ReplicaSample.from_dict(event["sample"]) if event.get("sample") is not None else None
        result = ScrapeResult(event["status"], event.get("reason"), sample, float(event.get("latency_s", 0)))
        if event.get("tick") != tick:
            if tick is not None and all(r is not None for r in results):
                yield t, results
            tick, t, results = event.get("tick"), float(event["t"]), [None] * num
        results[replica] = result
    if tick is not None and all(r is not None for r in results):
        yield t, results
