"""Criteo Display Advertising Challenge (Kaggle) raw TSV: ``label I1..I13 C1..C26``."""

from __future__ import annotations

from pathlib import Path

from recsys.data.raw import RawData, ReadReport, check_labels, resolve_data_path
from recsys.data.readers._lines import check_parsed, parse_table, read_bytes, scan_lines, to_float
from recsys.data.readers.base import Reader
from recsys.data.schema import DenseTransform, FeatureKind, FeatureSpec, Schema

__all__ = ["CRITEO_DENSE", "CRITEO_SPARSE", "CriteoReader"]

CRITEO_DENSE = [f"I{i}" for i in range(1, 14)]
CRITEO_SPARSE = [f"C{i}" for i in range(1, 27)]
_COLUMNS = ["label", *CRITEO_DENSE, *CRITEO_SPARSE]
_DEFAULT = "criteo-kaggle-head10k/train_head10k.txt.gz"
#: file names tried, in order, when ``path`` is a folder
_FOLDER_CANDIDATES = ("train.txt", "train.txt.gz", "train_head10k.txt.gz", "train_head10k.txt")


class CriteoReader(Reader):
    """Reads the raw Criteo Kaggle ``train.txt`` layout (plain or gzip).

    Every line is ``label<TAB>I1..I13<TAB>C1..C26`` (40 fields, empty = missing). ``I*`` become
    dense features with the ``log1p`` transform, ``C*`` categorical features (8-hex-digit
    strings, missing = ``""``). The frame index is the 1-based line number.

    Args:
        path: the file, or a folder holding ``train.txt[.gz]`` / ``train_head10k.txt.gz``;
            relative paths are also looked up under ``$SALIENCE_DATA_DIR``. Default: the
            10,000-row head shipped in the shared data folder.
        nrows: read only the first ``nrows`` lines of the file.
        skip_bad_rows: drop rows with a wrong field count or a non-integer ``I*`` value
            (counted in the report) instead of raising.
        embedding_dim: embedding width of every categorical feature.
        min_count: vocabulary threshold of every categorical feature.
        hash_size: when set, categorical features are hashed into this many buckets.
    """

    name = "criteo"

    def __init__(
        self,
        path: str | None = None,
        nrows: int | None = None,
        skip_bad_rows: bool = False,
        embedding_dim: int = 16,
        min_count: int = 1,
        hash_size: int | None = None,
    ) -> None:
        self.path = path
        self.nrows = nrows
        self.skip_bad_rows = skip_bad_rows
        self.embedding_dim = embedding_dim
        self.min_count = min_count
        self.hash_size = hash_size

    def source_file(self) -> Path:
        """The file that will be read (``path`` resolved, a folder resolved to its data file)."""
        found = resolve_data_path(self.path, _DEFAULT)
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
        return [self.source_file()]

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
        if self.nrows is not None and self.nrows < 1:
            raise ValueError(f"nrows must be >= 1 or None, got {self.nrows}")
        path = self.source_file()
        source = str(path)
        report = ReadReport(source=source)
        scanned = scan_lines(
            read_bytes(path, self.nrows),
            source=source,
            sep="\t",
            expected=len(_COLUMNS),
            report=report,
            skip_bad_rows=self.skip_bad_rows,
        )
        frame = parse_table(scanned.data, source=source, sep="\t", names=_COLUMNS)
        del scanned.data
        frame = check_parsed(frame, scanned.lines, source)
        frame = to_float(
            frame, CRITEO_DENSE, source=source, report=report, skip_bad_rows=self.skip_bad_rows, integer=True
        )
        frame["label"] = check_labels(frame["label"], source)
        report.rows_read = len(frame)
        return RawData(frame=frame, schema=self.build_schema(), report=report)
