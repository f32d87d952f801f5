"""Shared low-level helpers of the text readers: read bytes, find bad rows by line, coerce numbers.

The common path is vectorised: a file is read into memory once, newline and separator
positions are found with numpy, and the field count of every line comes from a
``searchsorted`` over those positions, so malformed lines are found (and named by their
1-based line number) before pandas parses the clean remainder with its C engine.
"""

from __future__ import annotations

import codecs
import csv
import gzip
import io
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from recsys.data.raw import DataError, IndexUnit, ReadReport

__all__ = [
    "NA_TOKENS", "Lines", "check_parsed", "drop_lines", "int_strings", "is_gzip", "parse_numbers", "parse_table", "read_bytes",
    "scan_lines", "sep_name", "to_float",
]

_GZIP_MAGIC = b"\x1f\x8b"
_CHUNK = 1 << 24

#: text that means "missing" in a (non-integer) numeric column, compared case-insensitively
NA_TOKENS = frozenset({"", "nan", "-nan", "na", "n/a", "null", "none"})

_SEP_NAMES = {"\t": "tab", ",": "comma", " ": "space", ";": "semicolon", "|": "pipe"}


def sep_name(sep: str) -> str:
    """A readable name of a one-character separator ("tab", "comma", ...)."""
    return _SEP_NAMES.get(sep, repr(sep))


def is_gzip(path: str | Path) -> bool:
    """Whether ``path`` starts with gzip's magic bytes."""
    with open(path, "rb") as fh:
        return fh.read(2) == _GZIP_MAGIC


def read_bytes(path: Path, max_lines: int | None = None) -> bytes:
    """The content of ``path`` (gzip detected by its magic bytes), optionally its first lines.

    Args:
        path: file to read.
        max_lines: when set, only the first ``max_lines`` lines are returned (read in chunks,
            so a huge file is not read to the end).

    Returns:
        The raw bytes.

    Raises:
        DataError: a truncated or damaged gzip file.
    """
    if not is_gzip(path):
        return _read(open(path, "rb"), max_lines)
    try:
        return _read(gzip.open(path, "rb"), max_lines)
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:  # a truncated download, a damaged file
        raise DataError(f"{path}: not a readable gzip file ({e})") from e


def _read(fh: io.BufferedIOBase, max_lines: int | None) -> bytes:
    with fh:
        if max_lines is None:
            return fh.read()
        if max_lines <= 0:
            return b""
        parts: list[bytes] = []
        seen = 0
        while True:
            chunk = fh.read(_CHUNK)
            if not chunk:
                break
            n = chunk.count(b"\n")
            if seen + n >= max_lines:
                cut = -1
                for _ in range(max_lines - seen):
                    cut = chunk.index(b"\n", cut + 1)
                parts.append(chunk[: cut + 1])
                break
            parts.append(chunk)
            seen += n
        return b"".join(parts)


@dataclass
class Lines:
    """The clean part of a text file.

    Attributes:
        data: the file content with the bad lines removed (the header, if any, is kept).
        lines: 1-based source line number of every remaining data record, in order.
        header: the header fields when the file has a header row, else None.
        rest: with ``scan_lines(..., more=True)``, the trailing lines of a quoted record still
            open at the end of the block (not in ``data``; the caller prepends them to the next
            block); else empty.
    """

    data: bytes
    lines: np.ndarray
    header: list[str] | None = None
    rest: bytes = b""


def _line_bounds(arr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start offsets and end offsets (position of the '\\n' or EOF) of every physical line."""
    ends = np.flatnonzero(arr == 10)
    if arr.size and arr[-1] != 10:
        ends = np.append(ends, arr.size)
    starts = np.empty_like(ends)
    if ends.size:
        starts[0] = 0
        starts[1:] = ends[:-1] + 1
    return starts, ends


def drop_lines(data: bytes, keep: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> bytes:
    """``data`` without the physical lines where ``keep`` is False (vectorised byte mask)."""
    if keep.all():
        return data
    arr = np.frombuffer(data, dtype=np.uint8)
    sizes = np.minimum(ends + 1, arr.size) - starts  # line bytes including its '\n'
    mask = np.repeat(keep, sizes)
    return arr[mask].tobytes()


def _default_message(sep: str) -> Callable[[int, int], str]:
    def message(expected: int, found: int) -> str:
        return f"expected {expected} {sep_name(sep)}-separated fields, found {found}"

    return message


#: field counts that mark a line (record) bad for a reason other than its number of fields
_STRAY_CR, _BAD_TEXT, _BAD_QUOTE, _UNCLOSED = -1, -2, -3, -4
#: bytes decoded at a time when checking the text encoding
_DECODE_BLOCK = 1 << 24


def _line_of(ends: np.ndarray, pos: np.ndarray | int) -> np.ndarray:
    """0-based physical line index of byte offsets ``pos``."""
    return np.searchsorted(ends, pos, side="left")


def _stray_cr_lines(arr: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """0-based indices of the lines holding a carriage return that does not end the line.

    A lone ``\\r`` is a line break to pyarrow (and to old Mac files) but not to the line scan,
    so such a line would be split differently by the two; a ``\\r`` right before ``\\n`` or at
    the end of the file is an ordinary line ending.
    """
    cr = np.flatnonzero(arr[:-1] == 13) if arr.size else np.zeros(0, np.int64)
    cr = cr[arr[cr + 1] != 10]
    return np.unique(_line_of(ends, cr))


def _bad_text_lines(data: bytes, arr: np.ndarray, ends: np.ndarray, encoding: str) -> np.ndarray:
    """0-based indices of the lines that are not valid ``encoding`` text.

    Pure-ASCII content and single-byte encodings (where every byte decodes) are not checked;
    otherwise the text is decoded in blocks that end at a line end (bounded memory), and after
    each error the check resumes on the next line.
    """
    if codecs.lookup(encoding).name in ("latin-1", "iso8859-1") or not (arr >= 0x80).any():
        return np.zeros(0, np.int64)
    bad: list[int] = []
    view = memoryview(data)
    pos, n = 0, len(data)
    while pos < n:
        stop = min(pos + _DECODE_BLOCK, n)
        if stop < n:  # end the block at a line end (no multi-byte character straddles it)
            cut = data.rfind(b"\n", pos, stop)
            stop = cut + 1 if cut >= pos else (data.find(b"\n", stop) + 1 or n)
        try:
            str(view[pos:stop], encoding)
            pos = stop
        except UnicodeDecodeError as e:
            line = int(_line_of(ends, pos + e.start))
            bad.append(line)
            pos = int(ends[line]) + 1
    return np.asarray(bad, dtype=np.int64)


def scan_lines(
    data: bytes,
    *,
    source: str,
    sep: str,
    expected: int | None,
    report: ReadReport,
    skip_bad_rows: bool = False,
    header: bool = False,
    quoted: bool = False,
    encoding: str = "utf-8",
    message: Callable[[int, int], str] | None = None,
    first_line: int = 1,
    part: bool = False,
    more: bool = False,
) -> Lines:
    """Check the field count of every line; raise on the first bad one or drop and count them.

    Bad rows are: a wrong field count, a blank line, a line that is not valid ``encoding`` text,
    and a line with a stray carriage return (a ``\\r`` not followed by ``\\n``, outside quotes).
    Without ``quoted`` a field count is the number of ``sep`` bytes plus one (no per-line
    Python); with ``quoted`` (CSV with ``"``-quoted fields that may hold separators or newlines)
    records are counted with :mod:`csv` in strict mode, one Python step a record, and malformed
    quoting (text after a closing quote, a quote left open at the end of the file) is bad too.
    A bad quoted record that spans several lines (typically a stray ``"`` that opens a field
    running on) drops, and counts, every one of its lines.

    Args:
        data: file content.
        source: file name used in error messages.
        sep: one-character field separator.
        expected: fields per row; None takes the header's field count (needs ``header``).
        report: receives skipped line numbers.
        skip_bad_rows: drop bad rows (and count them in ``report``) instead of raising.
        header: line 1 is a header row.
        quoted: fields may be quoted (``"``), see above.
        encoding: text encoding (header decoding and ``quoted`` mode).
        message: ``(expected, found) -> str`` describing a wrong field count.
        first_line: source line number of the first line of ``data`` (a block of a file read
            in blocks, see :mod:`recsys.data.readers.blocks`); line numbers in messages, the
            report and the result count from it.
        part: ``data`` is one block of a longer file: an empty block, or one without good rows,
            is no error (the caller checks the whole file).
        more: more blocks follow: with ``quoted``, a record whose quoted field is still open at
            the end of ``data`` (it continues in the next block) is not flagged but returned in
            :attr:`Lines.rest`.

    Returns:
        The clean content and the line number of every remaining data record.

    Raises:
        ValueError: ``sep`` is not one ASCII character other than ``"``, ``\\r`` and ``\\n``.
        DataError: empty file, missing or bad header, a runaway quoted field, or (without
            ``skip_bad_rows``) a bad row; the message names ``source`` and the line.
    """
    if len(sep) != 1 or not sep.isascii() or sep in '"\r\n':
        raise ValueError(f"sep must be one ASCII character other than '\"', '\\r' and '\\n', got {sep!r}")
    message = message or _default_message(sep)
    if not part and (not data or data.isspace()):
        raise DataError(f"{source}: the file is empty")
    arr = np.frombuffer(data, dtype=np.uint8)
    starts, ends = _line_bounds(arr)
    bad_text = _bad_text_lines(data, arr, ends, encoding)
    header_fields: list[str] | None = None
    rest = b""

    if quoted:
        text = data.decode(encoding, errors="replace") if bad_text.size else data.decode(encoding)
        rec_start, rec_end, counts = _quoted_records(text, sep, source)
        if more and counts.size and counts[-1] == _UNCLOSED:  # the record continues in the next block
            kept = int(rec_start[-1]) - 1  # lines before the open record
            cut = int(starts[kept])
            data, rest, arr = data[:cut], data[cut:], arr[:cut]
            rec_start, rec_end, counts = rec_start[:-1], rec_end[:-1], counts[:-1]
            starts, ends, bad_text = starts[:kept], ends[:kept], bad_text[bad_text < kept]
        # a record holding an undecodable line is bad as a whole
        hit = np.searchsorted(rec_start, bad_text + 1, side="right") - 1
        counts[hit[(hit >= 0) & (rec_end[np.maximum(hit, 0)] >= bad_text + 1)]] = _BAD_TEXT
    else:
        sep_pos = np.flatnonzero(arr == ord(sep))
        before = np.searchsorted(sep_pos, ends)
        counts = np.diff(before, prepend=0) + 1
        rec_start = rec_end = np.arange(1, ends.size + 1, dtype=np.int64)
        # a line holding nothing (or only '\r') is blank: no fields at all
        content = ends - starts
        has_cr = (content > 0) & (arr[np.maximum(ends - 1, 0)] == 13)
        counts = np.where(content - has_cr == 0, 0, counts)
        counts[_stray_cr_lines(arr, ends)] = _STRAY_CR
        counts[bad_text] = _BAD_TEXT

    def explain(i: int) -> str:
        found = int(counts[i])
        what = {
            0: "empty line", _STRAY_CR: "stray carriage return (\\r) inside the line",
            _BAD_TEXT: f"not valid {encoding} text", _BAD_QUOTE: "text after a closing quote (malformed quoting)",
            _UNCLOSED: "a quoted field is not closed before the end of the file",
        }.get(found) or message(expected or 0, found)
        if rec_end[i] > rec_start[i]:
            a, b = rec_start[i] + first_line - 1, rec_end[i] + first_line - 1
            what += f" (a quoted field runs from line {a} to line {b}: a stray '\"'?)"
        return what

    if header:
        if rec_start.size == 0 or counts[0] == 0:
            raise DataError(f"{source}:{first_line}: expected a header row, found an empty line")
        if counts[0] < 0:
            raise DataError(f"{source}:{first_line}: bad header row: {explain(0)}")
        first = data[starts[0] : ends[rec_end[0] - 1]].decode(encoding).rstrip("\r")
        header_fields = next(csv.reader([first], delimiter=sep)) if quoted else first.split(sep)
        if expected is None:
            expected = len(header_fields)
        rec_start, rec_end, counts = rec_start[1:], rec_end[1:], counts[1:]
    if expected is None:
        raise ValueError("scan_lines needs expected or header=True")

    bad = counts != expected
    shift = first_line - 1  # block line index -> source line number
    if bad.any():
        bad_idx = np.flatnonzero(bad)
        if not skip_bad_rows:
            i = bad_idx[0]
            scope = "in this block" if part else "in all"
            raise DataError(
                f"{source}:{rec_start[i] + shift}: {explain(i)} ({bad_idx.size} bad row(s) {scope}; "
                "skip_bad_rows=True drops them)"
            )
        # every physical line of a bad record is dropped and counted
        span = rec_end[bad_idx] - rec_start[bad_idx] + 1
        dropped = np.repeat(rec_start[bad_idx] - np.cumsum(span) + span, span) + np.arange(int(span.sum()))
        report.skip(dropped + shift)
        keep = np.ones(ends.size, dtype=bool)
        keep[dropped - 1] = False
        data = drop_lines(data, keep, starts, ends)
    lines = rec_start[~bad] + shift
    if lines.size == 0 and not part:
        detail = f" ({int(bad.sum())} bad row(s) skipped)" if bad.any() else ""
        raise DataError(f"{source}: no data rows{detail}")
    return Lines(data=data, lines=lines.astype(np.int64), header=header_fields, rest=rest)


def _quoted_records(text: str, sep: str, source: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(first line, last line, field count) of every CSV record, quotes honoured.

    Lines are split at ``\\n`` only, as in the line scan. A record :mod:`csv` (strict) rejects
    gets a negative count: ``_STRAY_CR`` (a ``\\r`` outside quotes), ``_UNCLOSED`` (a quote open
    at the end of the file) or ``_BAD_QUOTE`` (text after a closing quote). A quoted field that
    grows past :mod:`csv`'s field size limit (a stray quote running on) is a :class:`DataError`.
    """
    reader = csv.reader(io.StringIO(text, newline="\n"), delimiter=sep, strict=True)
    first, last, counts = [], [], []
    prev = 0
    while True:
        try:
            row = next(reader)
            count = len(row)
        except StopIteration:
            break
        except csv.Error as e:
            why = str(e)
            if "field larger than field limit" in why:
                raise DataError(f"{source}:{prev + 1}: {why} (a stray '\"' opening a field that runs on?)") from e
            count = _STRAY_CR if "new-line character" in why else _UNCLOSED if "end of data" in why else _BAD_QUOTE
        first.append(prev + 1)
        last.append(reader.line_num)
        counts.append(count)
        prev = reader.line_num
    as_arr = lambda v: np.asarray(v, dtype=np.int64)  # noqa: E731
    return as_arr(first), as_arr(last), as_arr(counts)


def parse_table(
    data: bytes,
    *,
    source: str,
    sep: str,
    names: list[str],
    header: bool = False,
    quoted: bool = False,
    encoding: str = "utf-8",
    include: list[str] | None = None,
) -> pd.DataFrame:
    """Parse checked text (see :func:`scan_lines`) into string columns with pyarrow's CSV reader.

    Args:
        data: the clean content.
        source: file name used in error messages.
        sep: one-character field separator.
        names: the column names (for a file with a header: the header's fields).
        header: skip line 1.
        quoted: honour ``"`` quoting (fields may hold separators and newlines).
        encoding: text encoding.
        include: columns to keep (default all).

    Returns:
        A frame of ``str`` columns with a default index (missing = ``""``).
    """
    keep = include if include is not None else names
    try:
        table = read_arrow_csv(data, sep, names, header, quoted, encoding, keep)
    except (pa.ArrowInvalid, UnicodeDecodeError) as e:
        raise DataError(f"{source}: cannot parse as {sep_name(sep)}-separated text ({encoding}): {e}") from e
    return table.to_pandas()


def read_arrow_csv(
    data: bytes | bytearray, sep: str, names: list[str], header: bool, quoted: bool, encoding: str, keep: list[str],
    types: dict[str, pa.DataType] | None = None,
) -> pa.Table:
    """pyarrow's CSV reader on ``data``: ``keep`` as strings, or as ``types`` (where only the
    empty cell is null). Strings are parsed as ``large_string``, the type pandas' ``str`` columns
    hold (a ``string`` column would be cast in ``to_pandas``)."""
    return pacsv.read_csv(
        pa.BufferReader(pa.py_buffer(data)),
        read_options=pacsv.ReadOptions(column_names=names, skip_rows=1 if header else 0, encoding=encoding),
        parse_options=pacsv.ParseOptions(
            delimiter=sep, quote_char='"' if quoted else False, double_quote=quoted, escape_char=False,
            newlines_in_values=quoted, ignore_empty_lines=True,
        ),
        convert_options=pacsv.ConvertOptions(
            column_types={n: pa.large_string() for n in keep} | (types or {}), include_columns=keep,
            strings_can_be_null=False, quoted_strings_can_be_null=False, null_values=[""],
        ),
    )


def int_strings(values: np.ndarray, index: pd.Index | None = None) -> pd.Series:
    """Integers as a ``str`` Series (a vectorised pyarrow cast, much faster than ``astype(str)``)."""
    arr = pc.cast(pa.array(np.asarray(values, dtype=np.int64)), pa.string())
    out = arr.to_pandas()
    if index is not None:
        out.index = index
    return out


def check_parsed(frame: pd.DataFrame, lines: np.ndarray, source: str) -> pd.DataFrame:
    """Index ``frame`` by ``lines``; raise if pandas saw a different number of records."""
    if len(frame) != len(lines):
        raise DataError(
            f"{source}: parsed {len(frame)} rows but the line scan found {len(lines)}; the file "
            "likely holds stray carriage returns or quote characters"
        )
    frame.index = pd.Index(lines, name="line")
    return frame


def parse_numbers(cells: pd.Series, integer: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Parse a text (or numeric) column into float64; return (values, bad mask).

    Missing (NaN in the result, not bad) is the empty string / a null, or with
    ``integer=False`` also a token of :data:`NA_TOKENS`. ``inf``/``-inf`` pass through unless
    ``integer``, where a value must be a finite whole number. A pyarrow cast parses clean
    columns; a column it rejects is re-parsed with :func:`pandas.to_numeric` to find the bad
    cells.
    """
    if pd.api.types.is_bool_dtype(cells.dtype):
        cells = cells.astype(object)
    if pd.api.types.is_numeric_dtype(cells.dtype):
        x = cells.to_numpy(dtype=np.float64, na_value=np.nan)
        bad = np.isinf(x) | (np.isfinite(x) & (x != np.round(x))) if integer else np.zeros(len(x), dtype=bool)
        return x, bad
    try:
        arr = pa.array(cells, from_pandas=True)
        if not pa.types.is_string(arr.type) and not pa.types.is_large_string(arr.type):
            raise pa.ArrowInvalid("not a string column")
        arr = pc.if_else(pc.equal(arr, ""), pa.scalar(None, arr.type), arr)
        if integer and pc.any(pc.match_substring_regex(arr, "^0[xX]")).as_py():
            raise pa.ArrowInvalid("hexadecimal")  # pyarrow's int cast takes "0x10"; the fallback does not
        parsed = pc.cast(arr, pa.int64()) if integer else pc.cast(arr, pa.float64())
        x = pc.cast(parsed, pa.float64()).to_numpy(zero_copy_only=False)
        return np.asarray(x, dtype=np.float64), np.zeros(len(x), dtype=bool)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError):
        pass
    x = pd.to_numeric(cells, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    nan = np.isnan(x)
    bad = np.zeros(len(x), dtype=bool)
    if nan.any():
        sub = cells[nan].astype(object)
        text = sub.where(sub.notna(), "").astype(str).str.strip()
        ok = text.eq("") if integer else text.str.lower().isin(NA_TOKENS)
        bad[nan] = ~ok.to_numpy(dtype=bool)
    if integer:
        fin = np.isfinite(x)
        bad |= np.isinf(x) | (fin & (x != np.round(np.where(fin, x, 0.0))))
    return x, bad


def _with_columns(frame: pd.DataFrame, columns: dict[str, np.ndarray]) -> pd.DataFrame:
    """``frame`` with ``columns`` replaced: one frame built at once (assigning thousands of
    columns one by one splits the frame's blocks each time)."""
    if not columns:
        return frame
    if len(columns) < 64:
        return frame.assign(**columns)
    return pd.DataFrame({c: columns[c] if c in columns else frame[c] for c in frame.columns}, index=frame.index)


def to_float(
    frame: pd.DataFrame,
    columns: Iterable[str],
    *,
    source: str,
    report: ReadReport,
    skip_bad_rows: bool = False,
    integer: bool = False,
    unit: IndexUnit = "line",
    allow_empty: bool = False,
) -> pd.DataFrame:
    """Convert text columns to float64 (NaN = missing); raise on or drop rows with bad numbers.

    See :func:`parse_numbers` for what counts as missing and as bad.

    Args:
        frame: indexed by source line (or row) number.
        columns: columns to convert.
        source: file name used in error messages.
        report: receives skipped line numbers.
        skip_bad_rows: drop rows with a bad value instead of raising.
        integer: require whole numbers.
        unit: what the index counts ("line" or "row"), for messages.
        allow_empty: return an empty frame when every row was dropped (one block of a file
            read in blocks) instead of raising.

    Returns:
        The frame with those columns as float64 (bad rows dropped when skipping).

    Raises:
        DataError: naming source, line and column of the first bad value.
    """
    converted: dict[str, np.ndarray] = {}
    bad_any = np.zeros(len(frame), dtype=bool)
    first_bad: tuple[int, str, str] | None = None
    for col in columns:
        if not integer and frame[col].dtype == np.float64:  # already numbers (Parquet): nothing to parse
            continue
        x, bad = parse_numbers(frame[col], integer=integer)
        if bad.any():
            pos = int(np.argmax(bad))
            if first_bad is None or pos < first_bad[0]:
                first_bad = (pos, col, str(frame[col].iloc[pos]))
            bad_any |= bad
        converted[col] = x
    out = _with_columns(frame, converted)
    if not bad_any.any():
        return out
    if not skip_bad_rows:
        assert first_bad is not None
        pos, col, value = first_bad
        kind = "an integer" if integer else "a number"
        where = f"{source}:{frame.index[pos]}" if unit == "line" else f"{source}: {unit} {frame.index[pos]}"
        raise DataError(
            f"{where}: column {col!r}: {value!r} is not {kind} "
            f"({int(bad_any.sum())} bad {unit}(s) in all; skip_bad_rows=True drops them)"
        )
    report.skip(frame.index[bad_any].to_numpy())
    out = out[~bad_any]
    if len(out) == 0 and not allow_empty:
        raise DataError(f"{source}: no data rows left after skipping {int(bad_any.sum())} bad {unit}(s)")
    return out
