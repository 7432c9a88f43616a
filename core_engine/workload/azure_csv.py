"""Azure LLM inference trace CSVs (TIMESTAMP, ContextTokens, GeneratedTokens) as a workload.

Arrivals count from the first row's timestamp. Columns past the three are ignored with one warning
per file; a row missing a value, or with more values than the header has columns, is an error
naming its line and the column.
"""

from __future__ import annotations

import csv
import io
from datetime import datetime

from batchtop.core_engine.errors import WorkloadError
from batchtop.core_engine.workload.jsonl import MAX_LENGTH
from batchtop.core_engine.workload.raw import RawRequest, Warn

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
EXTRA = "\x00extra"  # DictReader's key for values past the header's columns


def read_azure_csv(path: str, text: str, warn: Warn) -> list[RawRequest]:
    out: list[RawRequest] = []
    reader = csv.DictReader(io.StringIO(text, newline=""), restkey=EXTRA)
    try:
        header = [name.strip() for name in reader.fieldnames or []]
        reader.fieldnames = header
        missing = [c for c in AZURE_COLUMNS if c not in header]
        if missing:
            raise WorkloadError(path, f"not an Azure trace CSV: missing column(s) {', '.join(missing)} (the "
                                      f"header must name {', '.join(AZURE_COLUMNS)})", 1)
        extra = [c for c in header if c not in AZURE_COLUMNS]
        if extra:
            warn(f"{path}:1: ignoring column(s) {', '.join(extra)} (an Azure trace has {', '.join(AZURE_COLUMNS)})")
        t0 = None
        for row in reader:
            lineno = reader.line_num
            t, prompt_len, output_len = _row(path, row, len(header), lineno)
            t0 = t if t0 is None else t0
            out.append(RawRequest(f"az{len(out)}", prompt_len, output_len, max(0.0, t - t0)))
    except csv.Error as exc:  # an unclosed quote, a field over the csv module's size limit
        raise WorkloadError(path, f"not CSV ({exc})", reader.line_num) from None
    if not out:
        raise WorkloadError(path, "no requests in trace")
    return sorted(out, key=lambda r: r.arrival_s)


def _row(path: str, row: dict, num_columns: int, lineno: int) -> tuple[float, int, int]:
    if EXTRA in row:
        raise WorkloadError(path, f"bad row: it has {num_columns + len(row[EXTRA])} values, the header names "
                                  f"{num_columns} columns", lineno)
    short = [c for c in AZURE_COLUMNS if row.get(c) is None]
    if short:
        present = sum(v is not None for v in row.values())
        raise WorkloadError(path, f"bad row: missing {', '.join(short)} (the row has {present} of {num_columns} values)",
                            lineno)
    try:
        t = parse_timestamp(row["TIMESTAMP"])
    except ValueError:
        raise WorkloadError(path, f"bad row: TIMESTAMP {_show(row['TIMESTAMP'])} is not a time like "
                                  "2023-11-16 18:15:46.6805900", lineno) from None
    lengths = []
    for column in AZURE_COLUMNS[1:]:
        try:
            value = int(row[column])
        except ValueError:
            raise WorkloadError(path, f"bad row: {column} {_show(row[column])} is not an integer", lineno) from None
        if not 1 <= value <= MAX_LENGTH:
            raise WorkloadError(path, f"bad row: {column} must be in 1..2**63-1, got {_show(row[column])}", lineno)
        lengths.append(value)
    return t, lengths[0], lengths[1]


def _show(value: str) -> str:
    return repr(value) if len(value) <= 40 else repr(value[:40]) + f"... ({len(value)} characters)"


def parse_timestamp(text: str) -> float:
    """'2023-11-16 18:15:46.6805900' -> seconds; tolerates more than 6 fractional digits."""
    whole, _, frac = text.strip().partition(".")
    base = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S").timestamp()
    if frac and not frac.isdigit():
        raise ValueError(f"bad fraction {frac!r}")
    return base + (float("0." + frac) if frac else 0.0)
