"""Fetching one replica's /metrics, with every way it can fail turned into a status and a reason.

LIVE: a parsed sample. DOWN: nothing answered (refused, unresolvable, reset). STALE: no whole answer
within the timeout, which is shorter than the interval. BAD: it answered, but with an HTTP error or
text no server attach knows would send. What the server is comes from the answer, never the URL:
Prometheus text names it (servers/detect.py), JSON is TensorRT-LLM's iteration stats (trtllm_stats.py),
and a server whose record says it answers /slots (llama.cpp) gets one more request, for them, within
the same deadline.

The timeout is one wall-clock deadline for the whole scrape (connect, request, status line, headers,
body): every socket call waits only for what is left of it, so a server that drips its answer a byte
at a time (each read quick, the whole never ending) is cut off when the time is up. What no socket
timeout reaches (a DNS lookup, a TLS read) is bounded by the poller instead (poller.py), which never
waits for a replica past the deadline.

The standard library's http.client, not httpx: importing httpx loads rich, which the engine side
never imports (a test checks it).
"""

from __future__ import annotations

import dataclasses
import http.client
import math
import socket
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from batchtop.core_engine.attach.scrape.answer import MAX_BYTES, decoded_body, redirected
from batchtop.core_engine.attach.scrape.llamacpp_slots import DISABLED_NOTE, parse_slots, slots_url
from batchtop.core_engine.attach.scrape.sample import BadExposition, ReplicaSample, parse_exposition
from batchtop.core_engine.attach.scrape.trtllm_stats import TrtllmCounters, looks_like_json
from batchtop.core_engine.attach.servers import family
from batchtop.core_engine.errors import ConfigError

LIVE, DOWN, STALE, BAD = "LIVE", "DOWN", "STALE", "BAD"


def metrics_url(url: str) -> str:
    """The server's base URL with /metrics appended when it is not already there."""
    text = url if "://" in url else f"http://{url}"
    try:
        parts = urlsplit(text)
    except ValueError as exc:  # an unclosed [ of an IPv6 host, a bracketed name that is not an address
        raise ConfigError("URL", f"{url!r} is not a URL ({exc})") from None
    try:
        parts.port
    except ValueError:
        raise ConfigError("URL", f"{url!r} has a bad port") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError("URL", f"{url!r} is not an http(s) URL of a server (e.g. http://host:8000)")
    path = parts.path.rstrip("/")
    if not path.endswith("/metrics"):
        path += "/metrics"
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def is_loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    return host in ("localhost", "::1") or host.startswith("127.")


@dataclass(frozen=True, slots=True)
class ScrapeResult:
    status: str
    reason: str | None
    sample: ReplicaSample | None
    latency_s: float


def _reason(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 90 else text[:87] + "..."


class _Timeout(Exception):
    pass


class _DeadlineSocket(socket.socket):
    """A socket whose every blocking call waits only until `deadline` (time.monotonic seconds)."""

    deadline = math.inf

    def _arm(self) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise _Timeout
        self.settimeout(left)

    def recv_into(self, buffer, nbytes: int = 0, flags: int = 0) -> int:  # what http.client's reads call
        self._arm()
        return super().recv_into(buffer, nbytes, flags)

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        self._arm()
        return super().recv(bufsize, flags)

    def sendall(self, data, flags: int = 0) -> None:
        self._arm()
        super().sendall(data, flags)


class _DeadlineConnection(http.client.HTTPConnection):
    """Plain HTTP over a _DeadlineSocket; the connect itself waits only for what is left."""

    deadline = math.inf

    def connect(self) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise _Timeout
        raw = socket.create_connection((self.host, self.port), left, self.source_address)
        sock = _DeadlineSocket(raw.family, raw.type, raw.proto, fileno=raw.detach())
        sock.deadline = self.deadline
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock


class Scraper:
    """One keep-alive connection per replica, opened again after any failure; the clock stamps samples."""

    def __init__(self, url: str, timeout_s: float, clock=time.monotonic) -> None:
        self.url = metrics_url(url)
        parts = urlsplit(self.url)
        self._https = parts.scheme == "https"
        self._host, self._port = parts.hostname, parts.port
        self._path = parts.path + (f"?{parts.query}" if parts.query else "")
        self.timeout_s = timeout_s
        self._clock = clock
        self._conn: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()  # abort() comes from the poller's thread
        self._aborted = False
        self._answering = False  # the status line came: a timeout now means the body is still dripping
        self._trtllm = TrtllmCounters()  # trtllm-serve hands each iteration once: its sums live here

    def _connection(self, deadline: float) -> http.client.HTTPConnection:
        with self._lock:
            if self._aborted:  # the poller gave up on the last scrape: never reuse its connection
                self._aborted = False
                self._close_locked()
            if self._conn is None:
                if self._https:  # TLS reads are bounded per call here, and as a whole by the poller
                    self._conn = http.client.HTTPSConnection(self._host, self._port, timeout=self.timeout_s)
                else:
                    self._conn = _DeadlineConnection(self._host, self._port)
            conn = self._conn
        if isinstance(conn, _DeadlineConnection):
            conn.deadline = deadline
            if isinstance(conn.sock, _DeadlineSocket):
                conn.sock.deadline = deadline
        return conn

    def _fetch(self, deadline: float, path: str | None = None) -> tuple[int, str, bytes]:
        conn = self._connection(deadline)
        conn.request("GET", path or self._path, headers={"Accept": "text/plain;version=0.0.4"})
        response = conn.getresponse()
        self._answering = True
        body = response.read(MAX_BYTES + 1)
        if len(body) > MAX_BYTES:
            raise BadExposition(f"answer over {MAX_BYTES >> 20} MiB")
        if response.will_close or not response.isclosed():
            self.close()  # the next scrape opens a fresh connection rather than reuse a half-read one
        if time.monotonic() > deadline:  # an HTTPS drip: each read was quick, the whole was not
            raise _Timeout
        if 300 <= response.status < 400:
            raise BadExposition(redirected(self.url, response.status, response.getheader("Location")))
        return response.status, response.reason, decoded_body(body, response.getheader("Content-Encoding"))

    def scrape(self) -> ScrapeResult:
        t0 = self._clock()
        self._answering = False
        deadline = time.monotonic() + self.timeout_s
        try:
            status, reason, body = self._fetch(deadline)
        except (TimeoutError, socket.timeout, _Timeout):
            self.close()
            what = "answer not finished" if self._answering else "no answer"
            return ScrapeResult(STALE, f"{what} within {self.timeout_s:g} s", None, self._clock() - t0)
        except BadExposition as exc:
            self.close()
            return ScrapeResult(BAD, str(exc), None, self._clock() - t0)
        except (http.client.HTTPException, OSError) as exc:
            self.close()
            bad_http = isinstance(exc, http.client.HTTPException) and not isinstance(exc, ConnectionError)
            return ScrapeResult(BAD if bad_http else DOWN, ("not HTTP: " if bad_http else "") + _reason(exc),
                                None, self._clock() - t0)
        t = self._clock()
        if status >= 400:
            return ScrapeResult(BAD, f"HTTP {status} {reason}".strip(), None, t - t0)
        text = body.decode("utf-8", errors="replace")
        try:
            sample = self._trtllm.sample(text, t) if looks_like_json(text) else parse_exposition(text, t)
        except BadExposition as exc:
            return ScrapeResult(BAD, str(exc), None, t - t0)
        if (server := family(sample.flavour)) is not None and server.slots_endpoint:
            sample = self._with_slots(sample, deadline)
        return ScrapeResult(LIVE, None, sample, self._clock() - t0)

    def _with_slots(self, sample: ReplicaSample, deadline: float) -> ReplicaSample:
        """llama.cpp's /metrics and its /slots (the slot ceiling and each slot's state)."""
        note = None
        try:
            status, _, body = self._fetch(deadline, slots_url(self._path))
            slots, note = parse_slots(body) if status < 400 else (None, DISABLED_NOTE if status in (404, 501)
                                                                 else f"/slots answered HTTP {status}")
        except (TimeoutError, _Timeout):
            self.close()
            slots, note = None, "/slots: no answer in time"
        except (BadExposition, http.client.HTTPException, OSError) as exc:
            self.close()
            slots, note = None, f"/slots: {_reason(exc)}"
        if slots is None:
            return dataclasses.replace(sample, note=note)
        return dataclasses.replace(sample, slots=slots, max_num_seqs=len(slots), ceiling_from="/slots")

    def abort(self) -> None:
        """From another thread: end the scrape in flight now (its blocked read returns), and make the
        next scrape open a fresh connection."""
        with self._lock:
            self._aborted = True
            sock = self._conn.sock if self._conn is not None else None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        with self._lock:
            self._close_locked()

    def _close_locked(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
