"""Raw data files for model-free screening (``salience quality FILE...``).

Criteo TSV and Frappe libFM files go through their readers; a CSV/TSV/Parquet file goes
through :class:`~recsys.data.readers.TabularReader` when a schema file is given, and is
otherwise read with every non-label column as a categorical (the label may be binary,
multi-class or numeric: OutRank decides what it accepts).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from recsys.data.raw import DataError, RawData, ReadReport, resolve_data_path
from recsys.data.schema import FeatureKind, FeatureSpec, Schema, SchemaError

__all__ = ["read_raw_file", "read_raw_files"]


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
    if label not in frame.columns:
        raise SchemaError(f"{resolved}: label column {label!r} not found; columns: {list(frame.columns)} (use --label)")
    if len(frame) == 0:
        raise DataError(f"{resolved}: no data rows")
    numeric = pd.to_numeric(frame[label], errors="coerce")
    if numeric.isna().any():
        line = int(frame.index[numeric.isna().to_numpy().argmax()])
        raise DataError(f"{resolved}:{line}: label {frame[label].loc[line]!r} in column {label!r} is not a number")
    frame[label] = numeric
    features = tuple(FeatureSpec(c, FeatureKind.CATEGORICAL) for c in frame.columns if c != label)
    schema_obj = Schema(features, label=label, name=resolved.name.split(".")[0])
    return RawData(frame, schema_obj, ReadReport(source=str(resolved), rows_read=len(frame)))


def read_raw_files(
    paths: Sequence[str | Path], fmt: str | None = None, label: str = "label", schema: str | None = None
) -> list[RawData]:
    """:func:`read_raw_file` for each path."""
    return [read_raw_file(p, fmt, label, schema) for p in paths]
