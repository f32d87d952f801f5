"""Text files read in blocks of whole lines, each block parsed into a frame indexed by source line.

A file (plain or gzip, detected per file by its magic bytes) is read ``rows`` lines at a time
(about: a block ends at the last line end within a byte budget estimated from the line length
seen so far), so memory is bounded by the block size, not the file size. Each block goes
through the same checks as a whole file (:func:`~recsys.data.readers.lines.scan_lines`,
:func:`~recsys.data.readers.lines.parse_table`), shifted by the block's first line number,
so every error and every skipped row names the file and its line in that file.

A clean block (no quote character, no carriage return other than in ``\\r\\n``, valid UTF-8, and
as many parsed rows as lines) is parsed by pyarrow's CSV reader directly; any other block takes
the checking path, which finds, names or skips the bad lines exactly as for a whole file.

Quoted CSV records that hold line breaks may cross a block boundary: the open record is carried
over to the next block (``scan_lines(..., more=True)`` returns it in ``Lines.rest``), so a
record is never split. A quote left open to the end of the file is still an error.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import zlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import pandas as pd
import pyarrow as pa

from recsys.data.raw import DataError, RawData, ReadReport
from recsys.data.readers.lines import check_parsed, is_gzip, parse_table, read_arrow_csv, scan_lines
from recsys.data.readers.spans import Span
from recsys.data.readers.text_scan import TextCounts, text_counts

__all__ = ["DEFAULT_CHUNK_ROWS", "LineBlocks", "Text", "check_file_done", "join_spans", "parse_block", "pool"]

#: a block of lines: bytes, or the bytearray the reader filled (cut in place, never copied)
Text = bytes | bytearray

#: rows per chunk of the callers that still count in rows (readers size theirs by bytes,
#: :mod:`recsys.data.streaming.chunking`)
DEFAULT_CHUNK_ROWS = 262_144
_PROBE = 1 << 16
#: smallest block read (bytes); tests lower it to get many blocks from small files
MIN_BLOCK = 1 << 12


class LineBlocks:
    """The lines of one file in blocks: iterate ``(block, first_line, last)``.

    Args:
        path: the file (gzip detected by its first two bytes).
        rows: lines per block (about); None reads the whole file (or its first ``max_lines``
            lines) as one block.
        max_lines: stop after this many lines (the rest of the file is never read).
        span: read only the lines in these bytes of a plain file, numbered from its
            ``first_line`` (:mod:`recsys.data.readers.spans`).

    Attributes:
        lines: physical lines handed out so far (net of lines given back with :meth:`unread`;
            with a span, plus the lines before it: the number of the last line handed out).
        bytes_read: bytes of the file (compressed, for gzip) consumed so far.
        bytes_total: the file's size on disk.
        counts: the :class:`~recsys.data.readers.text_scan.TextCounts` of the block last handed
            out (its line ends, carriage returns, ASCII), for the parser to reuse.
    """

    def __init__(self, path: Path, rows: int | None, max_lines: int | None = None, span: Span | None = None) -> None:
        if rows is not None and rows < 1:
            raise ValueError(f"rows must be >= 1 or None, got {rows}")
        if span is not None and max_lines is not None:
            raise ValueError("max_lines counts from the file's first line: it cannot be combined with a span")
        self.path = Path(path)
        self.rows = rows
        self.max_lines = max_lines
        self.span = span
        self.lines = 0 if span is None else span.first_line - 1
        self.bytes_read = 0
        self.bytes_total = self.path.stat().st_size
        self._carry: Text = b""
        self._given_back = 0
        self._text_bytes = 0
        self._raw: BinaryIO | None = None
        self.counts: TextCounts | None = None

    def unread(self, tail: Text) -> None:
        """Give back the end of the last block (whole lines); the next block starts with it and
        holds more lines after it."""
        self._carry = tail + self._carry
        self.lines -= tail.count(b"\n")
        self._given_back = len(tail)

    def _room(self, n: int) -> int:
        """``n`` bytes to read (-1: to the end), no further than the span's end."""
        if self.span is None:
            return n
        assert self._raw is not None
        left = max(self.span.end - self._raw.tell(), 0)
        return left if n < 0 else min(n, left)

    @contextmanager
    def _gzip_errors(self) -> Iterator[None]:
        """A truncated download or a damaged gzip file, as a DataError that names the file."""
        try:
            yield
        except (EOFError, gzip.BadGzipFile, zlib.error) as e:
            raise DataError(f"{self.path}: not a readable gzip file ({e})") from e

    def _read(self, fh: io.BufferedIOBase, n: int) -> bytes:
        n = self._room(n)
        with self._gzip_errors():
            data = fh.read() if n < 0 else fh.read(n)
        assert self._raw is not None
        self.bytes_read = self._raw.tell()
        self._text_bytes += len(data)
        return data

    def __iter__(self) -> Iterator[tuple[Text, int, bool]]:
        with open(self.path, "rb") as raw:
            self._raw = raw
            gz = is_gzip(self.path)
            if gz and self.span is not None and (self.span.start, self.span.end) != (0, self.bytes_total):
                raise ValueError(f"{self.path}: a gzip file cannot be read from a byte span")
            raw.seek(0 if self.span is None else self.span.start)
            fh: io.BufferedIOBase = gzip.GzipFile(fileobj=raw, mode="rb") if gz else raw
            try:
                yield from (self._whole(fh) if self.rows is None else self._blocks(fh, self.rows))
            finally:
                if gz:
                    fh.close()

    def _whole(self, fh: io.BufferedIOBase) -> Iterator[tuple[Text, int, bool]]:
        data: Text
        if self.max_lines is None:
            data = self._read(fh, -1)
        else:  # read on only until max_lines lines are in
            parts, seen = [], 0
            while seen < self.max_lines and (piece := self._read(fh, 1 << 24)):
                parts.append(piece)
                seen += piece.count(b"\n")
            data = _first_lines(b"".join(parts), self.max_lines)
        first = self.lines + 1
        self.counts = text_counts(data)
        self.lines += self.counts.newlines
        yield data, first, True

    def _blocks(self, fh: io.BufferedIOBase, rows: int) -> Iterator[tuple[Text, int, bool]]:
        # a block is one bytearray: the carried lines, then the file read into it; the block is cut
        # from it in place, so its megabytes are copied once (from the file), never concatenated
        self._carry = self._read(fh, _PROBE)
        eof = len(self._carry) < _PROBE
        budget = max(int(rows * len(self._carry) / max(self._carry.count(b"\n"), 1)), MIN_BLOCK)
        while True:
            if not eof and len(self._carry) < max(budget, self._given_back + 1):
                want = max(budget - len(self._carry), MIN_BLOCK)
                got = self._read_after(fh, want)
                eof = got < want
            buf, floor = self._carry, self._given_back
            if eof and not buf:
                return
            limit = max(budget, floor + 1)
            if len(buf) > limit:  # end the block at the last line end within the budget
                cut = buf.rfind(b"\n", floor, limit) + 1 or buf.find(b"\n", limit) + 1
            else:
                cut = len(buf) if eof else buf.rfind(b"\n", floor) + 1
            if cut <= floor:  # no line end past what was given back (or one very long line)
                if not eof:
                    budget = 2 * max(budget, len(buf))
                    continue
                cut = len(buf)
            self._given_back = 0
            block, self._carry = _cut(buf, cut)
            last = eof and not self._carry
            self.counts = text_counts(block)
            if self.max_lines is not None and self.lines + self.counts.newlines >= self.max_lines:
                block = _first_lines(block, self.max_lines - self.lines)
                self.counts, last = text_counts(block), True
            first = self.lines + 1
            self.lines += self.counts.newlines
            yield block, first, last
            if last:
                return
            per_line = (self._text_bytes - len(self._carry)) / max(self.lines, 1)
            budget = max(int(rows * per_line), MIN_BLOCK)

    def _read_after(self, fh: io.BufferedIOBase, n: int) -> int:
        """Read up to ``n`` bytes after the carried ones, into one buffer with them (``_carry``
        becomes that bytearray); the bytes read."""
        have = len(self._carry)
        room = self._room(n)
        buf = bytearray(have + room)
        buf[:have] = self._carry
        with self._gzip_errors():
            got = fh.readinto(memoryview(buf)[have:]) or 0 if room else 0
        assert self._raw is not None
        self.bytes_read = self._raw.tell()
        self._text_bytes += got
        del buf[have + got:]
        self._carry = buf
        return got


def _cut(buf: Text, at: int) -> tuple[Text, bytes]:
    """``(buf[:at], buf[at:])``; a bytearray is cut in place (only its tail is copied)."""
    if not isinstance(buf, bytearray):
        return buf[:at], buf[at:]
    rest = bytes(buf[at:])
    del buf[at:]
    return buf, rest


def _first_lines(block: Text, n: int) -> Text:
    """The first ``n`` lines of ``block``."""
    if n <= 0:
        return b""
    ends = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 10)
    return block if ends.size < n else block[: int(ends[n - 1]) + 1]


def parse_block(
    block: Text,
    *,
    source: str,
    sep: str,
    names: list[str] | None,
    expected: int | None,
    report: ReadReport,
    skip_bad_rows: bool,
    first_line: int,
    whole: bool,
    more: bool,
    quoted: bool = False,
    include: list[str] | None = None,
    message: Callable[[int, int], str] | None = None,
    encoding: str = "utf-8",
    on_header: Callable[[list[str]], list[str]] | None = None,
    types: dict[str, pa.DataType] | None = None,
    counts: TextCounts | None = None,
) -> tuple[pd.DataFrame | None, list[str] | None, bytes]:
    """One block of lines as a frame of ``str`` columns indexed by source line number.

    Args:
        block: whole lines of the file, starting at line ``first_line``.
        names: column names; None for the block holding the header line (``first_line`` 1).
        expected: fields per row (None: the header's count).
        whole: the block is the whole file (the file-level emptiness checks apply here).
        more: more blocks follow (an open quoted record is handed back, see module doc).
        quoted: the format allows ``"``-quoted fields (CSV/TSV with a header); a block that
            holds a ``"`` is then scanned in quoted mode.
        include: columns to keep (default all).
        on_header: maps the header fields to the column names to use (and may raise when a
            needed column is missing); default: the fields as they are.
        types: Arrow types of columns the clean-block path parses directly (an empty cell is
            null, any other cell the type rejects sends the block to the checking path, where
            the column stays text for the caller's own checks and messages).
        counts: ``block``'s text counts when the caller has them (:attr:`LineBlocks.counts`);
            None: counted here.

    Returns:
        ``(frame or None when the block has no good row, column names from the header (None
        without a header), rest)`` where ``rest`` are lines to prepend to the next block.
    """
    header = names is None
    in_quotes = quoted and b'"' in block
    if header or in_quotes:
        counts = None
    elif counts is None:
        counts = text_counts(block)
    if counts is not None and _clean(block, counts, encoding):
        n_lines = counts.newlines + (0 if block.endswith(b"\n") or not block else 1)
        assert names is not None
        try:
            table = read_arrow_csv(block, sep, names, False, False, encoding, include or names, types)
        except (pa.ArrowInvalid, UnicodeDecodeError):
            table = None
        if table is not None and table.num_rows == n_lines and n_lines:
            frame = table.to_pandas()
            frame.index = pd.Index(np.arange(first_line, first_line + n_lines, dtype=np.int64), name="line")
            return frame, None, b""
    if isinstance(block, bytearray):  # the checking path works on bytes (the clean path reads either)
        block = bytes(block)
    scanned = scan_lines(
        block, source=source, sep=sep, expected=expected, report=report, skip_bad_rows=skip_bad_rows,
        header=header, quoted=in_quotes, encoding=encoding, message=message, first_line=first_line,
        part=not whole, more=more and in_quotes,
    )
    cols = names
    if header:
        assert scanned.header is not None
        cols = on_header(scanned.header) if on_header is not None else scanned.header
    assert cols is not None
    if scanned.lines.size == 0:
        return None, cols if header else None, scanned.rest
    frame = parse_table(
        scanned.data, source=source, sep=sep, names=cols, header=header, quoted=in_quotes, encoding=encoding,
        include=include,
    )
    return check_parsed(frame, scanned.lines, source), cols if header else None, scanned.rest


def _clean(block: Text, counts: TextCounts, encoding: str) -> bool:
    """No stray carriage return and valid text: pyarrow parses it as the line scan would."""
    cr = counts.carriage_returns
    return (cr == 0 or cr == counts.crlf) and (counts.ascii or _decodes(block, encoding))


def _decodes(block: Text, encoding: str) -> bool:
    try:
        block.decode(encoding)
        return True
    except UnicodeDecodeError:
        return False


def check_file_done(report: ReadReport, source: str, nonblank: bool) -> None:
    """Raise the whole-file errors of a file read in blocks: empty, or no good row."""
    if not nonblank:
        raise DataError(f"{source}: the file is empty")
    if report.rows_read == 0:
        detail = f" ({report.rows_skipped} bad row(s) skipped)" if report.rows_skipped else ""
        raise DataError(f"{source}: no data rows{detail}")


def pool(chunks: Iterable[RawData]) -> RawData:
    """Chunks of one or more files (in file order) as one RawData.

    One file: its frame (indexed by line) and its report. Several: the frames one after
    another with the line index of file ``k`` shifted by the lines of files ``0..k-1`` and a
    report whose ``notes["files"]`` lists, per file, its path, ``offset``, ``lines``, ``rows``,
    ``rows_skipped`` and ``skipped_lines`` (see :func:`recsys.data.readers.frappe.locate`).
    """
    frames: dict[int, list[pd.DataFrame]] = {}
    reports: dict[int, ReadReport] = {}
    schema = None
    for chunk in chunks:
        key = id(chunk.report)
        reports.setdefault(key, chunk.report)
        frames.setdefault(key, []).append(chunk.frame)
        schema = chunk.schema
    if schema is None:
        raise DataError("no data rows")
    parts = [(reports[k], pd.concat(v) if len(v) > 1 else v[0]) for k, v in frames.items()]
    if len(parts) == 1:
        report, frame = parts[0]
        return RawData(frame, schema, report)
    merged = merge_reports([r for r, _ in parts])
    offsets = {f["file"]: f["offset"] for f in merged.notes["files"]}
    shifted = []
    for report, frame in parts:
        frame = frame.copy(deep=False)
        frame.index = pd.Index(frame.index.to_numpy() + offsets[report.source], name=frame.index.name)
        shifted.append(frame)
    return RawData(pd.concat(shifted), schema, merged)


def join_spans(reports: list[ReadReport]) -> list[ReadReport]:
    """The reports of the spans of one file (consecutive, same ``source``, line numbers already
    the file's) joined into the file's report; other reports as they are."""
    out: list[ReadReport] = []
    for r in reports:
        if out and out[-1].source == r.source:
            whole = out[-1]
            whole.rows_read += r.rows_read
            whole.skip(r.skipped_lines)
            whole.rows_skipped += r.rows_skipped - len(r.skipped_lines)  # beyond the listed ones
            whole.lines = max(whole.lines, r.lines)
            whole.bytes_read = max(whole.bytes_read, r.bytes_read)
            whole.bytes_total = max(whole.bytes_total, r.bytes_total)
            whole.notes = {**r.notes, **whole.notes}
        else:
            out.append(dataclasses.replace(r, skipped_lines=list(r.skipped_lines), notes=dict(r.notes)))
    return out


def merge_reports(reports: list[ReadReport]) -> ReadReport:
    """The reports of several files as one, lines pooled as in :func:`pool`."""
    if len(reports) == 1:
        return reports[0]
    paths = [Path(r.source) for r in reports]
    parent = {p.parent for p in paths}
    out = ReadReport(source=str(paths[0].parent) if len(parent) == 1 else ", ".join(map(str, paths)))
    files: list[dict[str, Any]] = []
    offset = 0
    for r in reports:
        out.skip([x + offset for x in r.skipped_lines])
        out.rows_skipped += r.rows_skipped - len(r.skipped_lines)  # beyond the first 1000
        out.rows_read += r.rows_read
        files.append(
            {"file": r.source, "offset": offset, "lines": r.lines, "rows": r.rows_read,
             "rows_skipped": r.rows_skipped, "skipped_lines": r.skipped_lines[:50]}
        )
        offset += r.lines
    out.notes = {k: v for k, v in reports[0].notes.items() if all(x.notes.get(k) == v for x in reports)}
    out.notes["files"] = files
    return out


#: ``parse(block, first_line, whole, more, counts) -> (frame or None, rest)``: one block of a text
#: file, with its text counts (:attr:`LineBlocks.counts`)
BlockParser = Callable[[Text, int, bool, bool, TextCounts | None], tuple[pd.DataFrame | None, bytes]]


def text_frames(
    path: Path, report: ReadReport, rows: int | None, parse: BlockParser, max_lines: int | None = None,
    span: Span | None = None,
) -> Iterator[pd.DataFrame]:
    """The frames of one text file read in blocks (see :class:`LineBlocks`), parsed by ``parse``.

    The caller post-processes each frame (numbers, labels) and adds its rows to
    ``report.rows_read`` before asking for the next; after the last block the whole-file errors
    (an empty file, no good row) are raised here, not for a ``span`` of the file (whose reader's
    caller checks the spans together). ``report.lines``/``bytes_read``/``bytes_total`` follow the
    reading.
    """
    blocks = LineBlocks(path, rows, max_lines, span)
    report.bytes_total = blocks.bytes_total
    whole = rows is None and span is None
    nonblank = False
    for block, first, last in blocks:
        nonblank = nonblank or not (block.isspace() or not block)
        if not nonblank:  # only blank lines so far: decide once a line with content (or the end) comes
            if last:
                if span is not None:
                    return
                raise DataError(f"{path}: the file is empty")
            blocks.unread(block)
            continue
        frame, rest = parse(block, first, whole, not last, blocks.counts)
        if rest:
            blocks.unread(rest)
        report.lines, report.bytes_read = blocks.lines, blocks.bytes_read
        if frame is not None and len(frame):
            yield frame
    if span is None:
        check_file_done(report, str(path), nonblank)


def header_text_frames(
    path: Path, report: ReadReport, rows: int | None, *, sep: str, skip_bad_rows: bool,
    on_header: Callable[[list[str]], list[str]], include: list[str] | None = None,
) -> Iterator[pd.DataFrame]:
    """:func:`text_frames` of a CSV/TSV whose first line names the columns: ``on_header`` maps
    (and checks) the header fields, every later row must have as many fields, ``"``-quoting is
    allowed; ``include`` keeps only those columns (default all). Frames of ``str`` columns indexed
    by line number (the header is line 1)."""
    names: list[str] | None = None

    def parse(block: Text, first: int, whole: bool, more: bool, counts: TextCounts | None) -> tuple[pd.DataFrame | None, bytes]:
        nonlocal names
        frame, header, rest = parse_block(
            block, source=str(path), sep=sep, names=names, expected=None if names is None else len(names),
            report=report, skip_bad_rows=skip_bad_rows, first_line=first, whole=whole, more=more,
            quoted=True, include=include, on_header=on_header, counts=counts,
        )
        if header is not None:
            names = header
        return frame, rest

    yield from text_frames(path, report, rows, parse)

