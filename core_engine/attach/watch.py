"""The one attach watch loop, which `batchtop attach --headless` and the dashboard's source both drive:
every --interval, poll every replica, drain the side streams (--vllm-log, --kv-events) -> the monitor
takes them in -> the recording gets them -> the caller's callback gets the frame; until --duration is reached (headless), the caller cancels it
(the dashboard), or an exception ends it. The poller is closed and the recording ends saying how
("finished", "interrupted" by Ctrl-C or SIGTERM, or "error") whatever ends it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from batchtop.core_engine.attach.monitor import AttachFrame, Monitor
from batchtop.core_engine.attach.scrape.poller import LivePoller
from batchtop.core_engine.attach.setup import AttachSetup
from batchtop.core_engine.attach.streams.stream_tick import NOTHING
from batchtop.core_engine.attach.streams.taps import StreamTaps

WAKE_S = 0.05  # a wait looks at `cancelled` at least this often


def sleep_until(deadline: float, cancelled: Callable[[], bool], wake: threading.Event) -> None:
    """Wait until time.monotonic() reaches the deadline, or until cancelled; `wake` cuts a wait short."""
    while not cancelled():
        left = deadline - time.monotonic()
        if not left > 0:  # NaN too: a wait that never ends would spin, not sleep
            return
        wake.wait(min(left, WAKE_S))
        wake.clear()


class AttachWatch:
    def __init__(self, setup: AttachSetup, monitor: Monitor | None = None) -> None:
        self.setup = setup
        self.monitor = monitor if monitor is not None else setup.monitor()
        self.frame: AttachFrame = self.monitor.frame()  # the newest, even when the tick's recording failed
        self.complete = False  # --duration was reached
        self.close_error: OSError | None = None  # the recording's close failed while another error ended it

    def run(self, on_frame: Callable[[AttachFrame], None] = lambda frame: None, *,
            cancelled: Callable[[], bool] = lambda: False, wake: threading.Event | None = None) -> None:
        opts = self.setup.opts
        wake = wake if wake is not None else threading.Event()
        poller = LivePoller(self.setup.urls, opts.interval, opts.timeout_s)
        recorder = self.setup.recorder()
        taps: StreamTaps | None = None
        ended = "error"
        try:
            taps = StreamTaps(opts.streams, poller.t0) if opts.streams else None
            while not cancelled():
                results, t = poller.poll()
                streams = taps.drain() if taps is not None else NOTHING
                self.frame = self.monitor.feed(results, t, streams, taps.status() if taps is not None else None)
                if recorder is not None:
                    recorder.tick(self.frame.tick, t, results, streams)
                on_frame(self.frame)
                if opts.duration is not None and t >= opts.duration:
                    self.complete = True
                    break
                next_t = self.frame.tick * opts.interval  # on the poller's clock: ticks do not drift
                if opts.duration is not None:
                    next_t = min(next_t, opts.duration)
                sleep_until(poller.t0 + next_t, cancelled, wake)
            ended = "finished"
        except KeyboardInterrupt:
            ended = "interrupted"
            raise
        finally:
            poller.close()
            if taps is not None:
                taps.close()
            if recorder is not None:
                self._close(recorder, ended)

    def _close(self, recorder, ended: str) -> None:
        try:
            recorder.close(self.frame.t, ended)
        except OSError as exc:
            if ended == "finished":
                raise
            self.close_error = exc  # the error that ended the watch is the one to raise
