"""What a /metrics answer's HTTP wrapping says before its text is read: a redirect names where the
server sent attach (attach does not follow it: the user gives that URL), and a compressed body is
decompressed when Content-Encoding says so, within the same size cap as a plain one, or named for what
it is when it does not (a gzip body without the header is no "garbage")."""

from __future__ import annotations

import zlib
from urllib.parse import urljoin

from batchtop.core_engine.attach.scrape.sample import BadExposition

MAX_BYTES = 16 << 20  # a /metrics page far past any real one is not read whole, compressed or not
GZIP_MAGIC = b"\x1f\x8b"
SHOWN = 120  # characters of a Location shown


def _printable(text: str) -> str:
    text = "".join(c if c.isprintable() else "?" for c in text)
    return text if len(text) <= SHOWN else text[:SHOWN - 3] + "..."


def redirected(url: str, status: int, location: str | None) -> str:
    if not location:
        return f"HTTP {status} redirect without a Location: attach does not follow redirects"
    return f"HTTP {status} redirect to {_printable(urljoin(url, location))}: give that URL"


def _inflate(body: bytes, wbits: int, what: str) -> bytes:
    inflater = zlib.decompressobj(wbits)
    try:
        out = inflater.decompress(body, MAX_BYTES + 1)
    except zlib.error as exc:
        raise BadExposition(f"Content-Encoding: {what}, but the body does not decompress ({exc})") from None
    if len(out) > MAX_BYTES or inflater.unconsumed_tail:
        raise BadExposition(f"{what} body over {MAX_BYTES >> 20} MiB once decompressed")
    return out


def decoded_body(body: bytes, encoding: str | None) -> bytes:
    """The body as text bytes; BadExposition says why it cannot be."""
    coding = (encoding or "").strip().lower()
    if coding in ("gzip", "x-gzip"):
        return _inflate(body, 16 + zlib.MAX_WBITS, "gzip")
    if coding == "deflate":  # zlib-wrapped, as the standard says; some servers send it raw
        return _inflate(body, zlib.MAX_WBITS if body[:1] == b"\x78" else -zlib.MAX_WBITS, "deflate")
    if coding not in ("", "identity"):
        raise BadExposition(f"Content-Encoding: {_printable(coding)}: attach reads plain, gzip or deflate bodies")
    if body.startswith(GZIP_MAGIC):
        raise BadExposition("a gzip-compressed body without Content-Encoding: gzip (a proxy that compresses it?): "
                            "serve /metrics as plain text, or say the encoding")
    return body
