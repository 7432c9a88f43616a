"""What a /metrics answer's HTTP wrapping says: a redirect names where it points (before: "an empty
exposition"), a gzip body the server did not label is named as such (before: "not Prometheus text
(garbage...)"), and one it labels with Content-Encoding is read."""

from __future__ import annotations

import gzip
import zlib

import pytest

from batchtop.core_engine.attach.scrape.answer import MAX_BYTES
from batchtop.core_engine.attach.scrape.scrape import BAD, LIVE, Scraper
from tests.support.attach_helpers import VLLM_T0
from tests.support.local_http import Answering, local_server

TEXT = VLLM_T0.read_bytes()


def serving(status: int, body: bytes, **headers: str):
    class Handler(Answering):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name.replace("_", "-"), value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return local_server(Handler)


def scrape(status: int, body: bytes, **headers: str):
    with serving(status, body, **headers) as url:
        scraper = Scraper(url, timeout_s=5.0)
        try:
            return url, scraper.scrape()
        finally:
            scraper.close()


@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_a_redirect_names_where_it_points(status):
    url, result = scrape(status, b"", Location="/v2/metrics")
    assert result.status == BAD and result.reason == f"HTTP {status} redirect to {url}/v2/metrics: give that URL"
    _, result = scrape(302, b"", Location="https://elsewhere:9000/metrics")
    assert result.reason == "HTTP 302 redirect to https://elsewhere:9000/metrics: give that URL"
    _, result = scrape(302, b"")
    assert result.reason == "HTTP 302 redirect without a Location: attach does not follow redirects"


def test_an_unlabelled_gzip_body_is_named_and_a_labelled_one_is_read():
    _, result = scrape(200, gzip.compress(TEXT), Content_Type="text/plain")
    assert result.status == BAD and result.reason.startswith(
        "a gzip-compressed body without Content-Encoding: gzip (a proxy that compresses it?)")
    for encoding, body in (("gzip", gzip.compress(TEXT)), ("deflate", zlib.compress(TEXT)),
                           ("deflate", zlib.compress(TEXT)[2:-4])):  # raw deflate, as some servers send it
        _, result = scrape(200, body, Content_Encoding=encoding)
        assert result.status == LIVE and result.sample.running == 8, (encoding, result.reason)


def test_a_body_that_does_not_decompress_or_grows_past_the_cap_or_an_unknown_encoding_is_bad():
    _, result = scrape(200, b"\x1f\x8bnot really gzip", Content_Encoding="gzip")
    assert result.status == BAD and result.reason.startswith("Content-Encoding: gzip, but the body does not decompress")
    _, result = scrape(200, gzip.compress(b"#" * (MAX_BYTES + 1)), Content_Encoding="gzip")  # 16 KiB on the wire
    assert result.status == BAD and result.reason == "gzip body over 16 MiB once decompressed"
    _, result = scrape(200, TEXT, Content_Encoding="br")
    assert result.status == BAD and result.reason == "Content-Encoding: br: attach reads plain, gzip or deflate bodies"
