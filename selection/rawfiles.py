"""Raw data files for model-free screening (``salience quality FILE...``).

Criteo TSV and Frappe libFM files go through their readers; a CSV/TSV/Parquet file goes
through :class:`~recsys.data.readers.TabularReader` when a schema file is given, and is
otherwise read with every non-label column as a categorical (the label may be binary,
multi-class or numeric: OutRank decides what it accepts).

:func:`iter_raw_chunks` yields the same rows in chunks of about ``rows`` rows (the readers'
``iter_chunks``; a schema-less CSV/TSV through pandas' chunked reader, a Parquet file by record
batches), which the streaming quality report and OutRank read in bounded memory.
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


def read_raw_file(path: str | Path, fmt: str | None = None, label: str = "label", schema: str | None = None) -> RawData:
    """One raw file as :class:`RawData` (see the module docstring for how the format is chosen)."""
    resolved = resolve_data_path(str(path), str(path))
    fmt = fmt or _format_of(resolved)
    if fmt == "criteo":
        from recsys.data.readers import CriteoReader

        return CriteoReader(path=str(resolved)).read()
    if fmt == "frappe":
        from recsys.data.readers import FrappeReader

        return FrappeReader(path=str(resolved.parent), filenames=[resolved.name]).read()
    if schema is not None:
        from recsys.data.readers import TabularReader

        return TabularReader(str(resolved), schema, format=fmt).read()
    if fmt == "parquet":
        frame = pd.read_parquet(resolved)
        frame.index = pd.RangeIndex(1, len(frame) + 1)
    else:
        frame = pd.read_csv(resolved, sep="\t" if fmt == "tsv" else ",", dtype=str, keep_default_na=False)
        frame.index = pd.RangeIndex(2, len(frame) + 2)  # line numbers: the header is line 1
    if len(frame) == 0:
        _check_label_column(frame, label, resolved)
        raise DataError(f"{resolved}: no data rows")
    return _schemaless(frame, label, resolved, ReadReport(source=str(resolved), rows_read=len(frame)))


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
    path: str | Path, fmt: str | None = None, label: str = "label", schema: str | None = None, rows: int | None = None
) -> Iterator[RawData]:
    """The rows of :func:`read_raw_file` in order, as chunks of about ``rows`` rows (None: sized
    by bytes, :mod:`recsys.data.chunking`; a schema-less file by its number of columns).

    Criteo, Frappe and schema files go through the readers' ``iter_chunks`` (Frappe files are
    small and come as one chunk); a schema-less CSV/TSV is read with pandas' chunked reader
    (index: line numbers, the header is line 1), a schema-less Parquet file by record batches
    (index: row numbers from 1). All chunks of a file share one ``report``.
    """
    resolved = resolve_data_path(str(path), str(path))
    fmt = fmt or _format_of(resolved)
    if fmt == "criteo":
        from recsys.data.readers import CriteoReader

        yield from CriteoReader(path=str(resolved)).iter_chunks(rows)
        return
    if fmt == "frappe":
        from recsys.data.readers import FrappeReader

        yield from FrappeReader(path=str(resolved.parent), filenames=[resolved.name]).iter_chunks(rows)
        return
    if schema is not None:
        from recsys.data.readers import TabularReader

        yield from TabularReader(str(resolved), schema, format=fmt).iter_chunks(rows)
        return
    report = ReadReport(source=str(resolved))
    sep = "\t" if fmt == "tsv" else ","
    if fmt == "parquet":
        import pyarrow.parquet as pq

        file = pq.ParquetFile(resolved, pre_buffer=False)
        rows = rows or _rows_for_columns(len(file.schema_arrow.names))
        frames: Iterator[pd.DataFrame] = (b.to_pandas() for b in file.iter_batches(batch_size=rows))
        first = 1
    else:
        rows = rows or _rows_for_columns(len(pd.read_csv(resolved, sep=sep, dtype=str, nrows=0).columns))
        frames = pd.read_csv(resolved, sep=sep, dtype=str, keep_default_na=False, chunksize=rows)
        first = 2
    for frame in frames:
        if not len(frame):
            continue
        frame.index = pd.RangeIndex(first, first + len(frame))
        first += len(frame)
        report.rows_read += len(frame)
        yield _schemaless(frame, label, resolved, report)
    if report.rows_read == 0:
        raise DataError(f"{resolved}: no data rows")


def _rows_for_columns(columns: int) -> int:
    """Rows per chunk of a schema-less file of ``columns`` text columns, sized by bytes."""
    from recsys.data.chunking import CHUNK_BYTES, MAX_CHUNK_ROWS, rows_within

    return rows_within(CHUNK_BYTES, 24 * columns, MAX_CHUNK_ROWS)


def raw_chunk_source(
    path: str | Path, fmt: str | None = None, label: str = "label", schema: str | None = None, rows: int | None = None
) -> Callable[[], Iterator[RawData]]:
    """A function returning a fresh :func:`iter_raw_chunks` iterator (one per pass over the file),
    whose next chunk is parsed by a background thread while the caller works on this one."""
    from recsys.data.prepare_stream import prefetch

    return lambda: prefetch(iter_raw_chunks(path, fmt, label, schema, rows))


def read_raw_files(
    paths: Sequence[str | Path], fmt: str | None = None, label: str = "label", schema: str | None = None
) -> list[RawData]:
    """:func:`read_raw_file` for each path."""
    return [read_raw_file(p, fmt, label, schema) for p in paths]
