"""Criteo Display Advertising Challenge (Kaggle) raw TSV: ``label I1..I13 C1..C26``."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pandas as pd
import pyarrow as pa

from recsys.data.raw import RawData, ReadReport, check_labels, resolve_data_path
from recsys.data.readers.base import Reader, check_columns
from recsys.data.readers.blocks import Text, parse_block, pool, text_frames
from recsys.data.readers.lines import to_float
from recsys.data.readers.spans import Span
from recsys.data.readers.text_scan import TextCounts
from recsys.data.schema import DenseTransform, FeatureKind, FeatureSpec, Schema

__all__ = ["CRITEO_DENSE", "CRITEO_SPARSE", "CriteoReader"]

CRITEO_DENSE = [f"I{i}" for i in range(1, 14)]
CRITEO_SPARSE = [f"C{i}" for i in range(1, 27)]
COLUMNS = ["label", *CRITEO_DENSE, *CRITEO_SPARSE]
_INT_TYPES = {name: pa.int64() for name in CRITEO_DENSE}
_DEFAULT = "criteo-kaggle-head10k/train_head10k.txt.gz"
#: file names tried, in order, when ``path`` is a folder
_FOLDER_CANDIDATES = ("train.txt", "train.txt.gz", "train_head10k.txt.gz", "train_head10k.txt")


class CriteoReader(Reader):
    """Reads the raw Criteo Kaggle ``train.txt`` layout (plain or gzip), one file or several.

    Every line is ``label<TAB>I1..I13<TAB>C1..C26`` (40 fields, empty = missing). ``I*`` become
    dense features with the ``log1p`` transform, ``C*`` categorical features (8-hex-digit
    strings, missing = ``""``). The frame index is the 1-based line number. Several files (the
    Criteo 1TB day files, say; gzip and plain may be mixed) are read one after another: in
    :meth:`read` line numbers are pooled as in ``FrappeReader`` (``report.notes["files"]``),
    in :meth:`iter_chunks` each chunk comes from one file, indexed by its own lines, with that
    file's report.

    Args:
        path: the file, or a folder holding ``train.txt[.gz]`` / ``train_head10k.txt.gz``, or
            a list of files; relative paths are also looked up under ``$SALIENCE_DATA_DIR``.
            Default: the 10,000-row head shipped in the shared data folder.
        nrows: read only the first ``nrows`` lines of each file.
        skip_bad_rows: drop rows with a wrong field count or a non-integer ``I*`` value
            (counted in the report) instead of raising.
        embedding_dim: embedding width of every categorical feature.
        min_count: vocabulary threshold of every categorical feature.
        hash_size: when set, categorical features are hashed into this many buckets.
        span: ``(start, end, first_line)``: read only the lines in bytes ``[start, end)`` of the
            one plain file, numbered from ``first_line`` (set by :meth:`~recsys.data.readers.base.Reader.with_span`
            for a worker's share of a large file, :mod:`recsys.data.readers.spans`). A span
            whose every line is skipped yields no chunk: :meth:`read_reports` has its report.
    """

    name = "criteo"

    def __init__(
        self,
        path: str | list[str] | None = None,
        nrows: int | None = None,
        skip_bad_rows: bool = False,
        embedding_dim: int = 16,
        min_count: int = 1,
        hash_size: int | None = None,
        span: tuple[int, int, int] | None = None,
    ) -> None:
        self.path = path
        self.nrows = nrows
        self.skip_bad_rows = skip_bad_rows
        self.embedding_dim = embedding_dim
        self.min_count = min_count
        self.hash_size = hash_size
        self.span = None if span is None else tuple(int(x) for x in span)
        self._reports: list[ReadReport] = []

    def read_reports(self) -> list[ReadReport]:
        return list(self._reports)

    def source_file(self) -> Path:
        """The (first) file that will be read (``path`` resolved, a folder resolved to its data file)."""
        return self.source_files()[0]

    def source_files(self) -> list[Path]:
        """The files that will be read, in order."""
        paths = self.path if isinstance(self.path, (list, tuple)) else [self.path]
        if not paths:
            raise ValueError("CriteoReader: path is an empty list")
        return [self._resolve(p) for p in paths]

    def _resolve(self, path: str | None) -> Path:
        found = resolve_data_path(path, _DEFAULT)
        if found.is_dir():
            for name in _FOLDER_CANDIDATES:
                if (found / name).is_file():
                    return found / name
            raise FileNotFoundError(
                f"no Criteo file in folder {found}: looked for {list(_FOLDER_CANDIDATES)}; "
                f"it holds {sorted(p.name for p in found.iterdir())}"
            )
        return found

    def files(self) -> list[Path]:
        return self.source_files()

    def build_schema(self) -> Schema:
        """The Criteo schema built from this reader's options."""
        dense = [FeatureSpec(n, FeatureKind.DENSE, transform=DenseTransform.LOG1P) for n in CRITEO_DENSE]
        sparse = [
            FeatureSpec(
                n, FeatureKind.CATEGORICAL, embedding_dim=self.embedding_dim, min_count=self.min_count,
                hash_size=self.hash_size,
            )
            for n in CRITEO_SPARSE
        ]
        return Schema(features=(*dense, *sparse), label="label", name=self.name)

    def read(self) -> RawData:
        return pool(self._chunks(None, ()))

    def schema_hint(self) -> Schema:
        return self.build_schema()

    def iter_chunks(self, rows: int | None = None, *, columns: Sequence[str] = ()) -> Iterator[RawData]:
        return self._chunks(self.default_chunk_rows() if rows is None else rows, columns)

    def _chunks(self, rows: int | None, columns: Sequence[str]) -> Iterator[RawData]:
        if self.nrows is not None and self.nrows < 1:
            raise ValueError(f"nrows must be >= 1 or None, got {self.nrows}")
        check_columns(columns, COLUMNS, self.name)
        schema = self.build_schema()
        span = None if self.span is None else Span(*self.span)
        if span is not None and (len(self.source_files()) != 1 or self.nrows is not None):
            raise ValueError("CriteoReader: a span reads part of one file; give one path and no nrows")
        self._reports = []
        for path in self.source_files():
            source = str(path)
            report = ReadReport(source=source)
            self._reports.append(report)

            def parse(block: Text, first: int, whole: bool, more: bool,
                      counts: TextCounts | None) -> tuple[pd.DataFrame | None, bytes]:
                # I* as integers straight from the CSV parser, unless a "0x" could be read as hex
                # (which the checks below refuse); any other bad cell sends the block to the checks
                types = None if b"x" in block or b"X" in block else _INT_TYPES
                frame, _, rest = parse_block(
                    block, source=source, sep="\t", names=COLUMNS, expected=len(COLUMNS), report=report,  # noqa: B023
                    skip_bad_rows=self.skip_bad_rows, first_line=first, whole=whole, more=more, types=types,
                    counts=counts,
                )
                return frame, rest

            for frame in text_frames(path, report, rows, parse, max_lines=self.nrows, span=span):
                frame = to_float(
                    frame, CRITEO_DENSE, source=source, report=report, skip_bad_rows=self.skip_bad_rows,
                    integer=True, allow_empty=rows is not None,
                )
                if not len(frame):
                    continue
                frame["label"] = check_labels(frame["label"], source)
                report.rows_read += len(frame)
                yield RawData(frame=frame, schema=schema, report=report)
