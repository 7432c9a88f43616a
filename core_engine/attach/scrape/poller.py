"""Scraping every replica at once, each on its own thread, within one deadline per tick.

The poller waits for the replicas' answers until the tick's deadline (the timeout and a little slack)
and not a moment longer: a replica still answering then is STALE for this tick and its scrape is cut
off (its socket shut down), so one slow, stuck or dripping replica costs only its own row. A scrape
stuck where nothing can cut it (a DNS lookup) keeps its thread busy; that replica stays STALE, saying
so, until the thread is free, and the others are scraped as usual.

The threads are daemons and nothing ever joins them: Ctrl-C or SIGTERM in the thread that polls ends
the watch at once, whatever a replica is doing (a thread pool's workers are joined at exit, so one
stuck read held the whole process).
"""

from __future__ import annotations

import threading
import time

from batchtop.core_engine.attach.scrape.scrape import BAD, STALE, ScrapeResult, Scraper

SLACK_S = 0.1  # past the timeout, for the scraping thread to hand its answer over on a busy host


class _ReplicaThread:
    """One replica's scrapes, one at a time, on a daemon thread; `result` is set when `done` is."""

    def __init__(self, scraper: Scraper, index: int) -> None:
        self.scraper = scraper
        self.result: ScrapeResult | None = None
        self.done = threading.Event()
        self.done.set()  # idle
        self.busy_since = 0.0
        self._go = threading.Event()
        self._stopped = False
        threading.Thread(target=self._loop, name=f"batchtop-attach-{index}", daemon=True).start()

    def start(self) -> bool:
        """Begin a scrape; False while the previous one has not ended."""
        if not self.done.is_set():
            return False
        self.result = None
        self.done.clear()
        self.busy_since = time.monotonic()
        self._go.set()
        return True

    def _loop(self) -> None:
        while True:
            self._go.wait()
            self._go.clear()
            if self._stopped:
                self.scraper.close()
                return
            try:
                result = self.scraper.scrape()
            except Exception as exc:  # a bug must cost this replica one scrape, never its thread
                result = ScrapeResult(BAD, f"scrape failed: {type(exc).__name__}: {exc}"[:90], None, 0.0)
            self.result = result
            self.done.set()

    def stop(self) -> None:
        self._stopped = True
        self.scraper.abort()
        self._go.set()


class LivePoller:
    """Scrapes every replica at once; poll() returns within the timeout (plus SLACK_S) whatever they do."""

    def __init__(self, urls: list[str], interval_s: float, timeout_s: float | None = None,
                 clock=time.monotonic) -> None:
        self.interval_s = interval_s
        self.timeout_s = timeout_s if timeout_s is not None else 0.8 * interval_s
        self.clock = clock
        self.t0 = clock()
        self.scrapers = [Scraper(u, self.timeout_s, clock=lambda: clock() - self.t0) for u in urls]
        self._threads = [_ReplicaThread(s, i) for i, s in enumerate(self.scrapers)]

    def poll(self) -> tuple[list[ScrapeResult], float]:
        start = time.monotonic()
        deadline = start + self.timeout_s + SLACK_S
        started = [t.start() for t in self._threads]
        results = []
        for thread, fresh in zip(self._threads, started):
            if not fresh:
                results.append(ScrapeResult(STALE, f"its scrape of {start - thread.busy_since:.0f} s ago has not "
                                                   "ended", None, 0.0))
                continue
            # a wait with a timeout: a signal in this thread interrupts it
            if thread.done.wait(max(0.0, deadline - time.monotonic())) and thread.result is not None:
                results.append(thread.result)
                continue
            thread.scraper.abort()
            results.append(ScrapeResult(STALE, f"no answer within {self.timeout_s:g} s", None,
                                        time.monotonic() - start))
        return results, round(self.clock() - self.t0, 6)  # as a recording stores it: replays match

    def close(self) -> None:
        """Never waits: a replica's thread ends when its scrape does, or with the process."""
        for thread in self._threads:
            thread.stop()
