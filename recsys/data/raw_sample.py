"""A seeded, bounded sample of one split's raw rows, read in chunks (never the whole file).

The model-free steps of the commands that train on a streamed data module (the leakage screen
of ``select``, ``OutRank.rank(recipe)``, the pipeline's quality stage) read raw training rows.
:func:`sample_raw_split` streams the reader's chunks, assigns them to splits as
:func:`~recsys.data.prepare_stream.prepare_shards` does (the same :class:`~recsys.data.splits.
RowSplitter`, or the split's own files) and keeps a uniform sample of at most ``rows`` rows of
the split (the rows with the smallest seeded random keys: bottom-k sampling, one pass, memory
about ``rows`` + one chunk), in file order; every row of the split when it has no more.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from recsys.data.prepare import apply_options, split_readers
from recsys.data.raw import DataError, RawData, ReadReport
from recsys.data.readers._stream import DEFAULT_CHUNK_ROWS, merge_reports
from recsys.data.readers.base import Reader
from recsys.data.schema import Schema
from recsys.data.splits import SPLITS, RowSplitter, SplitConfig, SplitMode

__all__ = ["sample_raw_split"]


def sample_raw_split(
    reader: Reader,
    split: SplitConfig,
    name: str = "train",
    rows: int = 1_000_000,
    seed: int = 0,
    features: list[str] | None = None,
    drop_features: list[str] | None = None,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
) -> RawData:
    """Up to ``rows`` uniformly sampled raw rows of split ``name`` (seeded by ``seed``), in
    file order, with ``features``/``drop_features`` applied; see the module docstring.

    Raises:
        DataError: the split has no row.
        ValueError: an unknown split name or ``rows`` < 1.
    """
    if name not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {name!r}")
    if rows < 1:
        raise ValueError(f"rows must be >= 1, got {rows}")
    if split.kind is SplitMode.FILES:
        sources = split_readers(reader, split)
        if name not in sources:
            raise DataError(f"{reader.name}: data.split names no {name} files")
        source, splitter = sources[name], None
    else:
        source = reader
        total = None
        if RowSplitter.needs_count(split):  # a time split by fractions cuts at row positions
            total = sum(len(c) for c in reader.iter_chunks(chunk_rows, columns=[split.time_column or ""]))
        splitter = RowSplitter(split, total)
    rng = np.random.default_rng(seed)
    code = SPLITS.index(name)
    kept: pd.DataFrame | None = None
    keys = np.empty(0)
    schema: Schema | None = None
    reports: dict[int, ReadReport] = {}
    for chunk in source.iter_chunks(chunk_rows, columns=splitter.columns if splitter is not None else []):
        reports.setdefault(id(chunk.report), chunk.report)
        schema = chunk.schema
        frame = chunk.frame[[*schema.names, schema.label]]
        mine = np.flatnonzero(splitter.assign(chunk) == code) if splitter is not None else np.arange(len(chunk))
        if not len(mine):
            continue
        frame = frame.iloc[mine]
        k = rng.random(len(mine))
        kept = frame if kept is None else pd.concat([kept, frame])
        keys = np.concatenate([keys, k])
        if len(keys) > rows:  # keep the smallest keys, in stream order
            best = np.sort(np.argpartition(keys, rows)[:rows])
            kept, keys = kept.iloc[best], keys[best]
    if kept is None or schema is None:
        raise DataError(f"{reader.name}: the {name} split is empty")
    raw = RawData(kept, schema, merge_reports(list(reports.values())))
    return apply_options(raw, features, drop_features, None)
