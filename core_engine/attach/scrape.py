"""Fetching one replica's /metrics, with every way it can fail turned into a status and a reason.

LIVE: a parsed sample. DOWN: nothing answered (refused, unresolvable, reset). STALE: no answer within
the timeout, which is shorter than the interval, so a slow replica never holds the others back. BAD:
it answered, but with an HTTP error or text that is not a vLLM / SGLang / batchtop exposition.

The standard library's http.client, not httpx: importing httpx loads rich, which the engine side
never imports (a test checks it).
"""

from __future__ import annotations

import http.client
import socket
import time
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from batchtop.core_engine.attach.sample import BadExposition, ReplicaSample, parse_exposition
from batchtop.core_engine.errors import ConfigError

LIVE, DOWN, STALE, BAD = "LIVE", "DOWN", "STALE", "BAD"
MAX_BYTES = 16 << 20  # a /metrics page far past any real one is not read whole


def metrics_url(url: str) -> str:
    """The server's base URL with /metrics appended when it is not already there."""
    text = url if "://" in url else f"http://{url}"
    parts = urlsplit(text)
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

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            self._conn = cls(self._host, self._port, timeout=self.timeout_s)
        return self._conn

    def _fetch(self, deadline: float) -> tuple[int, str, bytes]:
        conn = self._connection()
        conn.request("GET", self._path, headers={"Accept": "text/plain;version=0.0.4"})
        response = conn.getresponse()
        body = response.read(MAX_BYTES + 1)
        if len(body) > MAX_BYTES:
            raise BadExposition(f"answer over {MAX_BYTES >> 20} MiB")
        if response.will_close or not response.isclosed():
            self.close()  # the next scrape opens a fresh connection rather than reuse a half-read one
        if self._clock() > deadline:  # a slow drip: each read was quick, the whole was not
            raise _Timeout
        return response.status, response.reason, body

    def scrape(self) -> ScrapeResult:
        t0 = self._clock()
        try:
            status, reason, body = self._fetch(t0 + self.timeout_s)
        except (TimeoutError, socket.timeout, _Timeout):
            self.close()
            return ScrapeResult(STALE, f"no answer within {self.timeout_s:g} s", None, self._clock() - t0)
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
        try:
            sample = parse_exposition(body.decode("utf-8", errors="replace"), t)
        except BadExposition as exc:
            return ScrapeResult(BAD, str(exc), None, t - t0)
        return ScrapeResult(LIVE, None, sample, t - t0)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
