"""A large text file cut into byte spans of whole lines, read by separate workers.

A span ``[start, end)`` holds the lines whose first byte lies in it: :func:`byte_spans` cuts a
plain (not gzip) file every ``span_bytes`` bytes and moves each cut to the next line start, so
the spans of a file hold every line once, in order. :func:`count_lines` counts a span's line ends
(one compiled pass, :func:`~recsys.data.readers.text_scan.text_counts`); their running sum gives
each span its first line number, so a reader of the span (``Reader.with_span``) numbers its rows,
errors and skipped lines as the whole file does::

    cuts = byte_spans(path, 128 << 20)               # [(0, 134217791), (134217791, ...), ...]
    lines = [count_lines(path, a, b) for a, b in cuts]  # one task per span, in parallel
    first = 1 + np.cumsum([0, *lines[:-1]])           # line numbers of the spans' first lines
    reader.with_span(*cuts[k], int(first[k]))         # reads span k

Only formats whose records are single lines can be cut (no quoted line breaks: Criteo's TSV).
"""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO, NamedTuple

from recsys.data.readers.lines import is_gzip
from recsys.data.readers.text_scan import text_counts

__all__ = ["SPAN_BYTES", "Span", "byte_spans", "count_lines"]

#: bytes per span of a large plain file (a worker's share; about 500k Criteo rows)
SPAN_BYTES = 128 << 20

_READ = 16 << 20


class Span(NamedTuple):
    """Bytes ``[start, end)`` of a file (whole lines) and the line number of its first line."""

    start: int
    end: int
    first_line: int


def byte_spans(path: str | Path, span_bytes: int) -> list[tuple[int, int]]:
    """``path`` cut into spans of about ``span_bytes`` bytes at line starts (one span for a
    gzip file or one of at most ``span_bytes``; none for an empty file)."""
    if span_bytes < 1:
        raise ValueError(f"span_bytes must be >= 1, got {span_bytes}")
    size = Path(path).stat().st_size
    if size == 0:
        return []
    if size <= span_bytes or is_gzip(path):
        return [(0, size)]
    cuts = [0]
    with open(path, "rb") as fh:
        for at in range(span_bytes, size, span_bytes):
            start = _line_start(fh, max(at, cuts[-1]), size)
            if start > cuts[-1] and start < size:
                cuts.append(start)
    cuts.append(size)
    return list(zip(cuts[:-1], cuts[1:]))


def _line_start(fh: BinaryIO, at: int, size: int) -> int:
    """The first line start at or after byte ``at`` (``size`` when none)."""
    fh.seek(at - 1)
    pos = at - 1
    while pos < size:
        piece = fh.read(1 << 16)
        if not piece:
            break
        end = piece.find(b"\n")
        if end >= 0:
            return pos + end + 1
        pos += len(piece)
    return size


def count_lines(path: str | Path, start: int, end: int) -> int:
    """Lines that start in bytes ``[start, end)`` of a plain file cut by :func:`byte_spans` (its
    line ends; a last line without one counts too)."""
    n, last = 0, b"\n"
    with open(path, "rb") as fh:
        fh.seek(start)
        left = end - start
        while left > 0:
            piece = fh.read(min(_READ, left))
            if not piece:
                break
            n += text_counts(piece).newlines
            last = piece[-1:]
            left -= len(piece)
    return n + (0 if last == b"\n" else 1)
