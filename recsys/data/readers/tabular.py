"""Any CSV/TSV (with a header row) or Parquet file described by a schema file: no code needed."""

from __future__ import annotations

import unicodedata
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from recsys.data.raw import DataError, IndexUnit, RawData, ReadReport, check_labels, resolve_data_path
from recsys.data.readers.base import Reader
from recsys.data.readers.blocks import header_text_frames, pool
from recsys.data.readers.lines import to_float
from recsys.data.schema import Schema, SchemaError

__all__ = ["TabularReader"]

_FORMATS = ("csv", "tsv", "parquet")
#: Arrow types a Parquet dense or label column may have
_NUMBERS_OR_TEXT = (
    pa.types.is_integer, pa.types.is_floating, pa.types.is_decimal, pa.types.is_boolean, pa.types.is_string,
    pa.types.is_large_string, pa.types.is_null,
)


class TabularReader(Reader):
    """Reads CSV/TSV files with a header row, or Parquet files, as the schema file describes.

    Columns are matched by name (extra columns are ignored): exactly, else after trimming
    whitespace and a byte-order mark and NFC normalisation; a needed column named twice in the
    header is a ``SchemaError``. Sparse cells stay strings (missing = ``""``; a
    multi-categorical cell holds ids joined by the feature's separator, a Parquet list column
    is joined with it); dense cells become floats (empty, ``nan``, ``NA``, ``null`` -> NaN;
    ``inf`` passes through for the encoder to fill and count). A ``vector`` feature of width D
    is D columns named by its prefix (``emb_0`` .. ``emb_31``), or in a Parquet file one list
    column named after the feature whose every non-null cell holds D numbers (a null cell is D
    missing values); either way the frame holds its D prefixed float columns. A Parquet sparse
    column must hold scalars or lists of scalars, a dense or label column numbers, booleans or text. The
    frame index is the 1-based line number in the text file (the header is line 1, so data
    starts at 2), or the 1-based row number in a Parquet file. See ``docs/bad-input.md``.

    Several files (each with its own header; gzip and plain may be mixed) are read one after
    another: :meth:`read` pools their line numbers as ``FrappeReader`` does
    (``report.notes["files"]``); :meth:`iter_chunks` streams them (text in blocks of lines,
    Parquet by record batches), each chunk indexed by the lines of its own file.

    Args:
        path: data file (``.csv``, ``.tsv``, ``.parquet``, optionally ``.gz`` for text), or a
            list of them; a relative path is also looked up under ``$SALIENCE_DATA_DIR``.
        schema: schema file (JSON or YAML, see :meth:`Schema.load`); ``name`` in it names the
            dataset.
        format: ``csv``, ``tsv`` or ``parquet``; None infers it from the file name
            (``.parquet``/``.pq`` -> parquet, ``.tsv`` -> tsv, otherwise csv).
        skip_bad_rows: drop rows with a wrong field count or non-numeric dense text (counted
            in the report) instead of raising.
        sep: field separator of a CSV (one character); ``tsv`` always uses a tab.
    """

    def __init__(
        self,
        path: str | list[str],
        schema: str,
        format: str | None = None,  # noqa: A002 - the natural config key
        skip_bad_rows: bool = False,
        sep: str = ",",
    ) -> None:
        self.path = path
        self.schema = schema
        self.format = format
        self.skip_bad_rows = skip_bad_rows
        self.sep = sep

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.load_schema().name

    def data_file(self) -> Path:
        """The (first) data file."""
        return self.data_files()[0]

    def data_files(self) -> list[Path]:
        """The data files, in order."""
        paths = self.path if isinstance(self.path, (list, tuple)) else [self.path]
        if not paths:
            raise ValueError("TabularReader: path is an empty list")
        return [resolve_data_path(p, p) for p in paths]

    def schema_file(self) -> Path:
        return resolve_data_path(self.schema, self.schema)

    def files(self) -> list[Path]:
        return [*self.data_files(), self.schema_file()]

    def load_schema(self) -> Schema:
        """The schema read from the schema file."""
        return Schema.load(self.schema_file())

    def resolved_format(self, path: Path) -> str:
        """The file format: ``format`` if set, else inferred from the file name."""
        fmt = self.format
        if fmt is None:
            suffixes = [s.lower() for s in path.suffixes if s.lower() != ".gz"]
            last = suffixes[-1] if suffixes else ""
            fmt = {".parquet": "parquet", ".pq": "parquet", ".tsv": "tsv"}.get(last, "csv")
        fmt = fmt.lower()
        if fmt not in _FORMATS:
            raise ValueError(f"TabularReader: format must be one of {list(_FORMATS)} or None, got {self.format!r}")
        return fmt

    def read(self) -> RawData:
        return pool(self._chunks(None, ()))

    def read_with_columns(self, columns: Sequence[str]) -> RawData:
        return pool(self._chunks(None, columns))

    def schema_hint(self) -> Schema:
        return self.load_schema()

    def iter_chunks(self, rows: int | None = None, *, columns: Sequence[str] = ()) -> Iterator[RawData]:
        return self._chunks(self.default_chunk_rows() if rows is None else rows, columns)

    def _chunks(self, rows: int | None, columns: Sequence[str]) -> Iterator[RawData]:
        schema = self.load_schema()
        paths = self.data_files()
        for path in paths:
            if path.is_dir():
                raise FileNotFoundError(f"TabularReader: path {path} is a folder; name the data file")
        for path in paths:
            source = str(path)
            report = ReadReport(source=source)
            fmt = self.resolved_format(path)
            report.notes["format"] = fmt
            unit: IndexUnit = "row" if fmt == "parquet" else "line"
            frames = (
                self._parquet_frames(path, schema, rows, columns, report) if fmt == "parquet"
                else self._text_frames(path, schema, "\t" if fmt == "tsv" else self.sep, rows, columns, report)
            )
            for frame in frames:
                frame = to_float(
                    frame, schema.dense_columns, source=source, report=report, skip_bad_rows=self.skip_bad_rows,
                    unit=unit, allow_empty=rows is not None,
                )
                if not len(frame):
                    continue
                frame[schema.label] = check_labels(frame[schema.label], source, unit)
                report.rows_read += len(frame)
                yield RawData(frame=frame, schema=schema, report=report)

    # -- formats ---------------------------------------------------------------------------
    @staticmethod
    def _needed(schema: Schema, columns: Sequence[str] = (), lists: Sequence[str] = ()) -> list[str]:
        """The file's columns to read: every feature's raw columns (a vector named in ``lists``,
        held as one list column, by its name), the label, then the extra ``columns``."""
        needed = [c for f in schema.features for c in ((f.name,) if f.name in lists else f.columns)]
        needed.append(schema.label)
        return needed + [c for c in columns if c not in needed]

    def _check_columns(self, schema: Schema, available: list[str], source: str, columns: Sequence[str] = (),
                       lists: Sequence[str] = ()) -> None:
        missing = [c for c in self._needed(schema, columns, lists) if c not in available]
        if missing:
            vectors = [f for f in schema.vectors if f.name not in lists and any(c in missing for c in f.columns)]
            hint = "".join(
                f"; vector {f.name!r} needs columns {f.columns[0]!r}..{f.columns[-1]!r} (its prefix)"
                + (" or, in a Parquet file, one list column of that name" if not lists else "")
                for f in vectors[:3]
            )
            missing = [c for c in missing if not any(c in f.columns for f in vectors)] + [f.name for f in vectors]
            raise SchemaError(
                f"{source}: columns {missing} named in schema {self.schema_file()} are not in the data{hint}; "
                f"available columns: {_shown(available)}"
            )

    def _text_frames(
        self, path: Path, schema: Schema, sep: str, rows: int | None, columns: Sequence[str], report: ReadReport
    ) -> Iterator[pd.DataFrame]:
        source = str(path)
        needed = self._needed(schema, columns)

        def on_header(fields: list[str]) -> list[str]:
            header = _match_header(fields, needed)
            self._check_columns(schema, header, source, columns)
            dupes = sorted({c for c in needed if header.count(c) > 1})
            if dupes:
                raise SchemaError(f"{source}:1: the header names columns {dupes} more than once; rename them")
            return header

        yield from header_text_frames(path, report, rows, sep=sep, skip_bad_rows=self.skip_bad_rows,
                                      on_header=on_header, include=needed)

    def _parquet_frames(
        self, path: Path, schema: Schema, rows: int | None, columns: Sequence[str], report: ReadReport
    ) -> Iterator[pd.DataFrame]:
        import pyarrow.parquet as pq

        source = str(path)
        try:
            file = pq.ParquetFile(path, pre_buffer=False)  # column chunks read as decoded, not a whole row group ahead
            available = list(file.schema_arrow.names)
        except Exception as e:  # pyarrow raises several types for a non-parquet file
            raise DataError(f"{source}: not a readable Parquet file ({e})") from e
        lists = [f.name for f in schema.vectors if f.name in available and f.columns[0] not in available]
        self._check_columns(schema, available, source, columns, lists)
        needed = self._needed(schema, columns, lists)
        report.bytes_total = path.stat().st_size
        total = file.metadata.num_rows
        if total == 0:
            raise DataError(f"{source}: the dataset is empty (no data rows)")
        batches = [file.read(columns=needed)] if rows is None else file.iter_batches(batch_size=rows, columns=needed)
        start = 0
        for batch in batches:
            table = batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
            frame = self._parquet_frame(table, schema, columns, lists, source, start)
            start += table.num_rows
            report.lines = start
            report.bytes_read = int(report.bytes_total * start / total)
            yield frame

    def _parquet_frame(self, table: pa.Table, schema: Schema, columns: Sequence[str], lists: Sequence[str], source: str,
                       start: int) -> pd.DataFrame:
        cols: dict[str, Any] = {}
        raw = set(schema.columns)
        for name in self._needed(schema, columns, lists):
            arr, sparse = table[name], name in schema.sparse_names
            if name in lists:  # a vector held as one list column: its D prefixed columns
                spec = schema[name]
                cols.update(zip(spec.columns, _vector_columns(arr, spec.width, source, name, start)))
                continue
            if name not in raw and name != schema.label:  # an extra column: as it is
                cols[name] = arr.to_pandas()
                continue
            try:
                if sparse:
                    cols[name] = _id_strings(arr, schema[name].separator).to_pandas().astype(str)
                else:
                    cols[name] = _numeric_or_text(arr).to_pandas()
            except (pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
                what = "scalars or lists of scalars" if sparse else "numbers, booleans or text"
                raise SchemaError(f"{source}: column {name!r} has type {arr.type}; it must hold {what}") from e
            except pa.ArrowInvalid as e:  # binary that is not UTF-8
                row = _first_bad_utf8(arr)
                where = f"{source}: row {row + start}: column {name!r}" if row else f"{source}: column {name!r}"
                raise DataError(f"{where}: cannot be read as text ({e})") from e
        frame = pd.DataFrame(cols)
        frame.index = pd.RangeIndex(start + 1, start + len(frame) + 1, name="row")
        return frame


def _shown(columns: list[str], limit: int = 40) -> str:
    """A column list for a message: whole up to ``limit`` names, else its head and its size."""
    if len(columns) <= limit:
        return str(columns)
    return f"{columns[:limit]} ... ({len(columns)} columns)"


def _vector_columns(arr: pa.ChunkedArray, dim: int, source: str, name: str, start: int) -> list[np.ndarray]:
    """A Parquet list column of a vector feature as ``dim`` float64 columns (a null cell: NaN).

    Raises:
        SchemaError: the column does not hold lists of numbers.
        DataError: a cell holds another number of values than ``dim``, naming its row.
    """
    t = arr.type
    if not (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)) or not (
            pa.types.is_integer(t.value_type) or pa.types.is_floating(t.value_type)):
        raise SchemaError(f"{source}: column {name!r} has type {t}; a vector feature needs lists of numbers")
    lists = arr.combine_chunks()
    n = len(lists)
    lengths = pc.fill_null(pc.list_value_length(lists), dim).to_numpy(zero_copy_only=False)
    if n and (lengths != dim).any():
        row = int(np.argmax(lengths != dim))
        raise DataError(f"{source}: row {start + row + 1}: column {name!r} holds {int(lengths[row])} values; the vector "
                        f"feature has dim {dim} ({int((lengths != dim).sum())} such row(s))")
    flat = pc.cast(pc.list_flatten(lists), pa.float64()).to_numpy(zero_copy_only=False)  # null cells hold no values
    valid = ~lists.is_null().to_numpy(zero_copy_only=False)
    values = np.full((n, dim), np.nan)
    values[valid] = flat.reshape(-1, dim)
    return [values[:, i] for i in range(dim)]


def _match_header(header: list[str], needed: list[str]) -> list[str]:
    """Header fields as the schema spells them.

    A field matches a needed column exactly or, failing that, after dropping a byte-order mark
    and surrounding whitespace and NFC-normalising both (``"é"`` typed as ``e`` + a combining
    accent matches ``"é"``); other fields are kept as they are.
    """
    def key(name: str) -> str:
        return unicodedata.normalize("NFC", name.lstrip("\ufeff").strip())

    wanted = {key(n): n for n in needed}
    exact = set(needed)
    return [h if h in exact else wanted.get(key(h), key(h)) for h in header]


def _numeric_or_text(arr: pa.ChunkedArray) -> pa.ChunkedArray:
    """A dense or label column as numbers, booleans or text (binary decoded as UTF-8); any other
    type (timestamps, lists, structs) raises ``ArrowNotImplementedError``."""
    t = arr.type
    if pa.types.is_dictionary(t):
        arr, t = arr.cast(t.value_type), t.value_type
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return arr.cast(pa.string())
    if not any(is_kind(t) for is_kind in _NUMBERS_OR_TEXT):
        raise pa.ArrowNotImplementedError(f"unsupported type {t}")
    return arr


def _first_bad_utf8(arr: pa.ChunkedArray) -> int:
    """1-based row of the first cell (list item included) that is not valid UTF-8 (0 if none)."""
    for row, cell in enumerate(arr.to_pylist(), start=1):
        for item in cell if isinstance(cell, list) else [cell]:
            if isinstance(item, bytes):
                try:
                    item.decode("utf-8")
                except UnicodeDecodeError:
                    return row
    return 0


def _id_strings(arr: pa.ChunkedArray, separator: str) -> pa.ChunkedArray:
    """An Arrow column as id strings (vectorised): nulls -> "", whole floats without ".0",
    list cells joined by ``separator``. A list of lists, a struct or a map raises
    ``ArrowNotImplementedError``."""
    t = arr.type
    if pa.types.is_dictionary(t):
        arr = arr.cast(t.value_type)
        t = arr.type
    if pa.types.is_nested(t) and not (pa.types.is_list(t) or pa.types.is_large_list(t)):
        raise pa.ArrowNotImplementedError(f"unsupported type {t}")
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        if pa.types.is_nested(t.value_type):
            raise pa.ArrowNotImplementedError(f"unsupported type {t}")
        lists = arr.combine_chunks()
        values = _id_strings(pa.chunked_array([lists.flatten()], t.value_type), separator).combine_chunks()
        offsets = pc.subtract(lists.offsets, lists.offsets[0])
        rebuilt = type(lists).from_arrays(offsets, values, mask=lists.is_null())
        return pc.fill_null(pc.binary_join(rebuilt, separator), "")
    if pa.types.is_floating(t):
        x = arr.to_numpy()
        fin = np.isfinite(x)
        if (x[fin] == np.round(x[fin])).all():  # integer ids stored as float because of nulls
            arr = pa.chunked_array([pa.array(np.where(fin, x, 0).astype(np.int64), mask=~fin)])
    if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
        arr = arr.cast(pa.string())
    return pc.fill_null(arr, "")
