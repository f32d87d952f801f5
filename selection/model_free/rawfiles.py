"""Raw data files for model-free screening (``salience quality FILE...``).

Criteo TSV and Frappe libFM files go through their readers; a CSV/TSV/Parquet file goes
through :class:`~recsys.data.readers.TabularReader` when a schema file is given, and is
otherwise read with every non-label column as a categorical (the label may be binary,
multi-class or numeric: OutRank decides what it accepts).

:func:`iter_raw_chunks` yields the same rows in chunks of about ``rows`` rows (the readers'
``iter_chunks``; a schema-less CSV/TSV through the same block reader as
:class:`~recsys.data.readers.TabularReader`, with its bad-row handling: a row with the wrong
number of fields names its file and line, or with ``skip_bad_rows`` is dropped and counted; a
Parquet file by record batches), which the streaming quality report and OutRank read in bounded
memory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pandas as pd

from recsys.data.raw import DataError, RawData, ReadReport, resolve_data_path
from recsys.data.schema import FeatureKind, FeatureSpec, Schema, SchemaError

__all__ = ["iter_raw_chunks", "raw_chunk_source", "read_raw_file", "read_raw_files"]


def _format_of(path: Path) -> str:
    name = path.name.lower().removesuffix(".gz")
    if name.endswith((".parquet", ".pq")):
        return "parquet"
    if name.endswith(".libfm"):
        return "frappe"
    if name.endswith(".tsv"):
        return "tsv"
    if name.endswith(".txt"):
        return "criteo"
    return "csv"


def read_raw_file(
    path: str | Path, fmt: str | None = None, label: str = "label", schema: str | None = None, skip_bad_rows: bool = False
) -> RawData:
    """One raw file as :class:`RawData` (see the module docstring for how the format is chosen)."""
    resolved = resolve_data_path(str(path), str(path))
    fmt = fmt or _format_of(resolved)
    if fmt == "criteo":
        from recsys.data.readers import CriteoReader

        return CriteoReader(path=str(resolved), skip_bad_rows=skip_bad_rows).read()
    if fmt == "frappe":
        from recsys.data.readers import FrappeReader

        return FrappeReader(path=str(resolved.parent), filenames=[resolved.name]).read()
    if schema is not None:
        from recsys.data.readers import TabularReader

        return TabularReader(str(resolved), schema, format=fmt, skip_bad_rows=skip_bad_rows).read()
    report = ReadReport(source=str(resolved))
    if fmt == "parquet":
        frame = pd.read_parquet(resolved)
        frame.index = pd.RangeIndex(1, len(frame) + 1)
        report.rows_read = len(frame)
    else:
        frames = []
        for part in _text_frames(resolved, "\t" if fmt == "tsv" else ",", label, None, report, skip_bad_rows):
            report.rows_read += len(part)  # the reader's end-of-file checks read it
            frames.append(part)
        frame = pd.concat(frames) if len(frames) > 1 else frames[0]
    if len(frame) == 0:
        _check_label_column(frame, label, resolved)
        raise DataError(f"{resolved}: no data rows")
    return _schemaless(frame, label, resolved, report)


def _text_frames(
    path: Path, sep: str, label: str, rows: int | None, report: ReadReport, skip_bad_rows: bool
) -> Iterator[pd.DataFrame]:
    """A schema-less CSV/TSV with a header, in blocks of lines, by the readers' block parser:
    ``str`` columns indexed by line number (the header is line 1); a bad row names its line
    (or, with ``skip_bad_rows``, is dropped and counted in ``report``); an empty file, or one
    without a good row, is a :class:`DataError` after the last block."""
    from recsys.data.readers.blocks import header_text_frames

    def on_header(fields: list[str]) -> list[str]:
        header = [f.strip().lstrip("\ufeff") for f in fields]
        if label not in header:
            raise SchemaError(f"{path}:1: label column {label!r} not found; columns: {header} (use --label)")
        dupes = sorted({c for c in header if header.count(c) > 1})
        if dupes:
            raise SchemaError(f"{path}:1: the header names columns {dupes} more than once; rename them")
        return header

    yield from header_text_frames(path, report, rows, sep=sep, skip_bad_rows=skip_bad_rows, on_header=on_header)


def _check_label_column(frame: pd.DataFrame, label: str, path: Path) -> None:
    if label not in frame.columns:
        raise SchemaError(f"{path}: label column {label!r} not found; columns: {list(frame.columns)} (use --label)")


def _schemaless(frame: pd.DataFrame, label: str, path: Path, report: ReadReport) -> RawData:
    """A frame read without a schema as RawData: a numeric label, every other column categorical."""
    _check_label_column(frame, label, path)
    numeric = pd.to_numeric(frame[label], errors="coerce")
    if numeric.isna().any():
        line = int(frame.index[numeric.isna().to_numpy().argmax()])
        raise DataError(f"{path}:{line}: label {frame[label].loc[line]!r} in column {label!r} is not a number")
    frame[label] = numeric
    features = tuple(FeatureSpec(c, FeatureKind.CATEGORICAL) for c in frame.columns if c != label)
    schema_obj = Schema(features, label=label, name=path.name.split(".")[0])
    return RawData(frame, schema_obj, report)


def iter_raw_chunks(
    path: str | Path, fmt: str | None = None, label: str = "label", schema: str | None = None, rows: int | None = None,
    skip_bad_rows: bool = False,
) -> Iterator[RawData]:
    """The rows of :func:`read_raw_file` in order, as chunks of about ``rows`` rows (None: sized
    by bytes, :mod:`recsys.data.streaming.chunking`; a schema-less file by its number of columns).

    Criteo, Frappe and schema files go through the readers' ``iter_chunks`` (Frappe files are
    small and come as one chunk); a schema-less CSV/TSV through the readers' block parser
    (index: line numbers, the header is line 1; ``skip_bad_rows`` as in the readers), a
    schema-less Parquet file by record batches
    (index: row numbers from 1). All chunks of a file share one ``report``.
    """
    resolved = resolve_data_path(str(path), str(path))
    fmt = fmt or _format_of(resolved)
    if fmt == "criteo":
        from recsys.data.readers import CriteoReader

        yield from CriteoReader(path=str(resolved), skip_bad_rows=skip_bad_rows).iter_chunks(rows)
        return
    if fmt == "frappe":
        from recsys.data.readers import FrappeReader

        yield from FrappeReader(path=str(resolved.parent), filenames=[resolved.name]).iter_chunks(rows)
        return
    if schema is not None:
        from recsys.data.readers import TabularReader

        yield from TabularReader(str(resolved), schema, format=fmt, skip_bad_rows=skip_bad_rows).iter_chunks(rows)
        return
    report = ReadReport(source=str(resolved))
    sep = "\t" if fmt == "tsv" else ","
    if fmt == "parquet":
        import pyarrow.parquet as pq

        file = pq.ParquetFile(resolved, pre_buffer=False)
        rows = rows or _rows_for_columns(len(file.schema_arrow.names))
        frames: Iterator[pd.DataFrame] = (b.to_pandas() for b in file.iter_batches(batch_size=rows))
        first = 1
        for frame in frames:
            if not len(frame):
                continue
            frame.index = pd.RangeIndex(first, first + len(frame))
            first += len(frame)
            report.rows_read += len(frame)
            yield _schemaless(frame, label, resolved, report)
        if report.rows_read == 0:
            raise DataError(f"{resolved}: no data rows")
        return
    rows = rows or _rows_for_columns(_header_width(resolved, sep))
    for frame in _text_frames(resolved, sep, label, rows, report, skip_bad_rows):
        report.rows_read += len(frame)  # text_frames' own checks read it (no good row in the file)
        yield _schemaless(frame, label, resolved, report)


def _header_width(path: Path, sep: str) -> int:
    """Fields of the header line (1 for an empty file: its error comes from the reader)."""
    import gzip

    opener = gzip.open if path.name.lower().endswith(".gz") else open
    with opener(path, "rb") as f:
        line = f.readline()
    return max(1, line.count(sep.encode()) + 1)


def _rows_for_columns(columns: int) -> int:
    """Rows per chunk of a schema-less file of ``columns`` text columns, sized by bytes."""
    from recsys.data.streaming.chunking import CHUNK_BYTES, MAX_CHUNK_ROWS, rows_within

    return rows_within(CHUNK_BYTES, 24 * columns, MAX_CHUNK_ROWS)


def raw_chunk_source(
    path: str | Path, fmt: str | None = None, label: str = "label", schema: str | None = None, rows: int | None = None,
    skip_bad_rows: bool = False,
) -> Callable[[], Iterator[RawData]]:
    """A function returning a fresh :func:`iter_raw_chunks` iterator (one per pass over the file),
    whose next chunk is parsed by a background thread while the caller works on this one."""
    from recsys.data.streaming.prepare import prefetch

    return lambda: prefetch(iter_raw_chunks(path, fmt, label, schema, rows, skip_bad_rows))


def read_raw_files(
    paths: Sequence[str | Path], fmt: str | None = None, label: str = "label", schema: str | None = None,
    skip_bad_rows: bool = False,
) -> list[RawData]:
    """:func:`read_raw_file` for each path."""
    return [read_raw_file(p, fmt, label, schema, skip_bad_rows) for p in paths]
