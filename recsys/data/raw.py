"""What every reader returns: a column frame indexed by source line, its schema and a report."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from recsys.data.schema import Schema, SchemaError

__all__ = ["DataError", "IndexUnit", "RawData", "ReadReport", "check_labels", "data_dir", "resolve_data_path"]

#: what a frame's index counts in error messages: source ``line`` numbers or ``row`` numbers
IndexUnit = Literal["line", "row"]

#: environment variable naming the folder that holds the real datasets
DATA_DIR_ENV = "SALIENCE_DATA_DIR"


class DataError(ValueError):
    """Raw data is malformed; the message names the file and line (or column)."""


@dataclass
class ReadReport:
    """What a reader saw: rows read, rows skipped (with their line numbers), notes.

    ``rows_read + rows_skipped`` is the number of data lines (records) in the source. A bad
    quoted CSV record that spans several lines counts, and lists, each of its lines. See
    ``docs/bad-input.md``.
    """

    source: str
    rows_read: int = 0
    rows_skipped: int = 0
    skipped_lines: list[int] = field(default_factory=list)  # first 1000 skipped line numbers
    notes: dict[str, Any] = field(default_factory=dict)
    #: physical lines (Parquet: rows) read so far, and bytes of the file consumed / in all: kept
    #: up to date while a file is read in chunks (for pooled line numbers and progress)
    lines: int = 0
    bytes_read: int = 0
    bytes_total: int = 0

    def skip(self, lines: list[int] | np.ndarray) -> None:
        lines = [int(x) for x in lines]
        self.rows_skipped += len(lines)
        room = 1000 - len(self.skipped_lines)
        if room > 0:
            self.skipped_lines.extend(lines[:room])

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "rows_read": self.rows_read,
            "rows_skipped": self.rows_skipped,
            "skipped_lines": self.skipped_lines[:50],
            **self.notes,
        }


@dataclass
class RawData:
    """A raw dataset as columns.

    ``frame`` has one column per schema feature (D float columns for a vector feature, named
    by :attr:`FeatureSpec.columns <recsys.data.schema.FeatureSpec.columns>`) plus the label
    column (int 0/1). Its index is the 1-based line number in the source file, so later checks
    can name the offending line. Sparse cells are strings (missing = empty string);
    multi-categorical cells are strings of ids joined by the feature's separator; dense cells
    are floats (NaN = missing).
    """

    frame: pd.DataFrame
    schema: Schema
    report: ReadReport

    def __post_init__(self) -> None:
        missing = [c for c in [*self.schema.columns, self.schema.label] if c not in self.frame.columns]
        if missing:
            raise SchemaError(
                f"{self.report.source}: columns {missing} are not in the data; "
                f"available columns: {list(self.frame.columns)}"
            )
        if len(self.frame) == 0:
            raise DataError(f"{self.report.source}: the dataset is empty (no data rows)")

    def __len__(self) -> int:
        return len(self.frame)

    @property
    def labels(self) -> np.ndarray:
        return self.frame[self.schema.label].to_numpy(dtype=np.float32)

    def select(self, names: list[str]) -> RawData:
        """Keep only the features ``names`` (the label stays)."""
        schema = self.schema.select(names)
        return RawData(self.frame[[*schema.columns, schema.label]], schema, self.report)

    def column(self, name: str) -> pd.Series | pd.DataFrame:
        """The cells of feature ``name``: a column, or a vector feature's N x D frame."""
        spec = self.schema[name]
        return self.frame[list(spec.columns)] if spec.is_vector else self.frame[name]


def check_labels(labels: pd.Series, source: str, unit: IndexUnit = "line") -> pd.Series:
    """Return labels as int8 in {0, 1}; raise naming the first bad line (or ``unit``) otherwise."""
    if pd.api.types.is_string_dtype(labels.dtype) and labels.dtype != object:  # fast path: text "0"/"1"
        try:
            values = pc.cast(pa.array(labels, from_pandas=True), pa.int8()).to_numpy(zero_copy_only=False)
            if ((values == 0) | (values == 1)).all():
                return pd.Series(values.astype(np.int8), index=labels.index, name=labels.name)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError, ValueError):
            pass
    numeric = pd.to_numeric(labels, errors="coerce")
    bad = ~numeric.isin([0, 1])
    if bad.any():
        line = labels.index[np.argmax(bad.to_numpy())]
        value = labels.loc[line]
        where = f"{source}:{line}" if unit == "line" else f"{source}: {unit} {line}"
        raise DataError(
            f"{where}: label {value.item() if isinstance(value, np.generic) else value!r} is outside {{0, 1}} "
            f"({int(bad.sum())} bad label(s) in all)"
        )
    return numeric.astype(np.int8)


def data_dir() -> Path | None:
    """``$SALIENCE_DATA_DIR`` as an absolute path (None when unset or empty).

    A relative value is made absolute here, against the working directory at the time it is
    read, so a path built from it stays valid after the process changes directory.
    """
    root = os.environ.get(DATA_DIR_ENV)
    return Path(root).absolute() if root else None


def resolve_data_path(path: str | os.PathLike[str] | None, default: str) -> Path:
    """Resolve a dataset path.

    ``path`` wins when it exists; a relative path (or ``default`` when ``path`` is None) is
    otherwise looked up under ``$SALIENCE_DATA_DIR``. Raises ``FileNotFoundError`` naming
    every place that was tried.
    """
    tried: list[Path] = []
    candidate = Path(path) if path is not None else Path(default)
    if path is not None:
        tried.append(candidate)
        if candidate.exists():
            return candidate
    root = data_dir()
    if root is not None and not candidate.is_absolute():
        under = root / candidate
        tried.append(under)
        if under.exists():
            return under
    # only a relative path is looked up under the data folder: an absolute one is the user's own file
    hint = "" if root or candidate.is_absolute() else f" (a relative path is also looked up under {DATA_DIR_ENV}, which is not set)"
    raise FileNotFoundError(f"path not found: {', '.join(map(str, tried)) or candidate}{hint}")
