"""Raw data -> encoded train/val/test splits, cached on disk (in memory; for data larger than
memory see :mod:`recsys.data.streaming.prepare`).

The one place that turns a :class:`~recsys.data.readers.base.Reader` into model-ready arrays:
read, select features, split (seeded random, predefined files or time-ordered; see
:mod:`recsys.data.splits`), fit encoders on the training split only, encode every split, and
cache the result keyed by the reader's fingerprint and the options.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from recsys.data.encoders import EncodedData, Preprocessor
from recsys.data.raw import DataError, RawData
from recsys.data.readers.base import Reader
from recsys.data.schema import Schema, SchemaError
from recsys.data.splits import (
    SPLITS,
    RowSplitter,
    SplitConfig,
    SplitMode,
    SplitName,
    rows_by_split,
    split_indices,
)
from recsys.io import atomic_write_json

__all__ = [
    "PrepareConfig", "PreparedData", "SplitConfig", "SplitMode", "SplitName", "apply_options", "check_split", "prepare_data",
    "raw_split", "split_indices", "split_readers",
]

log = logging.getLogger(__name__)


@dataclass
class PreparedData:
    """Encoded splits plus everything needed to reproduce or serve them."""

    splits: dict[str, EncodedData]
    preprocessor: Preprocessor
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def schema(self) -> Schema:
        """The fitted schema (``num_embeddings`` set)."""
        return self.preprocessor.fitted_schema

    def save(self, folder: Path) -> None:
        # a folder per process: the processes of a distributed run may all build the cache
        tmp = folder.with_name(f"{folder.name}.tmp{os.getpid()}")
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        for name, data in self.splits.items():
            data.save(tmp / f"{name}.npz")
        self.preprocessor.save(tmp / "preprocessor.json")
        atomic_write_json(tmp / "summary.json", self.summary)
        if folder.exists():
            shutil.rmtree(folder, ignore_errors=True)
        try:
            tmp.rename(folder)
        except OSError:  # another process renamed its identical copy first
            shutil.rmtree(tmp, ignore_errors=True)

    @classmethod
    def load(cls, folder: Path) -> PreparedData:
        """Load a saved folder; raises when a split the summary lists is missing or has other rows."""
        summary = json.loads((folder / "summary.json").read_text())
        counts = summary.get("split", {})
        splits: dict[str, EncodedData] = {}
        for name in SPLITS:
            path = folder / f"{name}.npz"
            expected = counts.get(f"{name}_rows")
            if expected is None and not path.exists():
                continue
            if expected == 0:
                continue
            data = EncodedData.load(path)  # FileNotFoundError when a listed split is gone
            if expected is not None and len(data) != int(expected):
                raise ValueError(f"{path}: {len(data)} rows, the summary says {expected}")
            splits[name] = data
        return cls(splits, Preprocessor.load(folder / "preprocessor.json"), summary)


def check_split(name: str, labels: np.ndarray, source: str) -> None:
    """Raise a ``DataError`` when split ``name`` is empty or holds one class only."""
    if len(labels) == 0:
        raise DataError(f"{source}: the {name} split is empty; use more data or other split fractions")
    classes = np.unique(labels)
    if len(classes) < 2:
        raise DataError(
            f"{source}: the {name} split has only one class (label={classes[0]:g}, {len(labels)} rows); "
            "AUC needs both clicks and non-clicks"
        )


def apply_options(
    raw: RawData, features: list[str] | None, drop_features: list[str] | None, embedding_dim: int | None
) -> RawData:
    """``raw`` with only ``features``, without ``drop_features``, every embedding ``embedding_dim`` wide."""
    if not features and not drop_features and embedding_dim is None:
        return raw
    schema = raw.schema.view(features, drop_features, embedding_dim)
    frame = raw.frame[[*schema.columns, schema.label]] if features or drop_features else raw.frame
    return RawData(frame, schema, raw.report)


@dataclass(frozen=True)
class PrepareConfig:
    """How a reader's rows become encoded splits: one configuration for the in-memory
    (:func:`prepare_data`), the streamed (:func:`~recsys.data.streaming.prepare.prepare_shards`)
    and the Dask (:func:`~recsys.data.streaming.dask_cluster.prepare_shards_distributed`) preparation.

    Args:
        split: how rows are split (seeded random, predefined files or time-ordered; see
            :mod:`recsys.data.splits`; None: the default seeded 8:1:1 split).
        features: keep only these features (error lists the available columns otherwise).
        drop_features: drop these features.
        embedding_dim: override every sparse feature's embedding dim.
        cache_dir: folder of the cache (in memory: None disables caching; streamed: required).
        rows_per_shard: streamed only: rows per shard file (None: sized by bytes,
            :func:`~recsys.data.streaming.chunking.shard_rows`).
        chunk_rows: streamed only: rows read and encoded at a time (memory; the result does not
            depend on it; None: sized by bytes by the reader,
            :meth:`~recsys.data.readers.base.Reader.default_chunk_rows`).
        checksum: streamed only: check every cached shard's SHA-256 before trusting the cache
            (else size only).
        progress: streamed only: show rows, rows/s and ETA of each pass (a bar on a terminal,
            log lines otherwise).

    >>> PrepareConfig(SplitConfig(seed=7), drop_features=["C3"]).columns
    (None, ['C3'], None)
    """

    split: SplitConfig | None = None
    features: list[str] | None = None
    drop_features: list[str] | None = None
    embedding_dim: int | None = None
    cache_dir: str | Path | None = None
    rows_per_shard: int | None = None
    chunk_rows: int | None = None
    checksum: bool = False
    progress: bool = True

    @property
    def splitting(self) -> SplitConfig:
        """``split``, or the default split when none is set."""
        return self.split or SplitConfig()

    @property
    def columns(self) -> tuple[list[str] | None, list[str] | None, int | None]:
        """``(features, drop_features, embedding_dim)``: the view :func:`apply_options` takes."""
        return self.features, self.drop_features, self.embedding_dim


def prepare_data(reader: Reader, config: PrepareConfig | None = None) -> PreparedData:
    """Read, split, fit encoders on train only, encode all splits; cache when ``config.cache_dir`` is set.

    Args:
        reader: the dataset reader.
        config: split, columns and cache (:class:`PrepareConfig`; its streamed-only fields are
            not used here).

    Returns:
        PreparedData with ``splits["train"|"val"|"test"]``.
    """
    config = config or PrepareConfig()
    split, (features, drop_features, embedding_dim) = config.splitting, config.columns
    key_blob = json.dumps(
        [reader.fingerprint() if split.kind is not SplitMode.FILES else _files_fingerprint(reader, split),
         split.to_dict(), features, drop_features, embedding_dim],
        sort_keys=True, default=str,
    )
    key = hashlib.sha256(key_blob.encode()).hexdigest()[:16]
    folder = Path(config.cache_dir) / f"{reader.name}-{key}" if config.cache_dir is not None else None
    if folder is not None and (folder / "summary.json").exists():
        try:
            prepared = PreparedData.load(folder)
            log.info("loaded encoded %s data from cache %s", reader.name, folder)
            return prepared
        except Exception as e:  # a damaged cache is rebuilt, never trusted (BadZipFile, EOFError, ...)
            log.warning("ignoring unreadable cache %s: %s", folder, e)

    frames, schema, source, read = _split_frames(reader, split, features, drop_features, embedding_dim)
    for name in SPLITS:
        if name == "train" or len(frames.get(name, ())):
            check_split(name, _labels(frames.get(name), schema), source)
    pre = Preprocessor(schema).fit(frames["train"])
    splits = {name: pre.transform(frame) for name, frame in frames.items() if len(frame)}
    summary = {
        "dataset": reader.name,
        "source": source,
        "read": read,
        "split": {**split.to_dict(), **{f"{k}_rows": len(frames.get(k, ())) for k in SPLITS}},
        "features": {"sparse": len(schema.sparse), "dense": len(schema.dense)},
        "encode": {name: data.stats.to_dict() for name, data in splits.items()},
        "ctr": {name: float(data.labels.mean()) for name, data in splits.items()},
    }
    prepared = PreparedData(splits, pre, summary)
    if folder is not None:
        prepared.save(folder)
    return prepared


def _labels(frame: pd.DataFrame | None, schema: Schema) -> np.ndarray:
    return np.zeros(0, np.float32) if frame is None else frame[schema.label].to_numpy(dtype=np.float32)


def _files_fingerprint(reader: Reader, split: SplitConfig) -> list[str]:
    """The fingerprints of the per-split readers of a files split."""
    assert split.files is not None
    return [reader.with_path(split.files[name]).fingerprint() for name in SPLITS if name in split.files]


def split_readers(reader: Reader, split: SplitConfig) -> dict[str, Reader]:
    """The reader of every split of a files split (``reader`` with each split's ``path``)."""
    assert split.files is not None
    return {name: reader.with_path(split.files[name]) for name in SPLITS if name in split.files}


def _split_frames(
    reader: Reader, split: SplitConfig, features: list[str] | None, drop_features: list[str] | None,
    embedding_dim: int | None,
) -> tuple[dict[str, pd.DataFrame], Schema, str, dict[str, Any]]:
    """Per split its raw frame (features selected), the schema, the source and the read report."""
    if split.kind is SplitMode.FILES:
        raws = {n: apply_options(r.read(), features, drop_features, embedding_dim) for n, r in split_readers(reader, split).items()}
        schema = raws["train"].schema
        for name, raw in raws.items():
            if raw.schema != schema:
                raise SchemaError(f"{raw.report.source}: the {name} files have another schema than the train files")
        read = {name: raw.report.to_dict() for name, raw in raws.items()}
        return {n: r.frame for n, r in raws.items()}, schema, raws["train"].report.source, read
    if split.kind is SplitMode.TIME:
        raw = reader.read_with_columns([split.time_column or ""])
        rows = rows_by_split(RowSplitter(split, total_rows=len(raw)).assign(raw))
    else:
        raw = reader.read()
        rows = split_indices(len(raw), split)
    raw = apply_options(raw, features, drop_features, embedding_dim)
    frames = {name: raw.frame.iloc[idx] for name, idx in rows.items()}
    return frames, raw.schema, raw.report.source, raw.report.to_dict()


def raw_split(
    raw: RawData,
    split: SplitConfig | None = None,
    name: SplitName = "train",
    features: list[str] | None = None,
    drop_features: list[str] | None = None,
) -> RawData:
    """The raw (unencoded) rows of one split: the same rows :func:`prepare_data` encodes.

    Model-free methods (OutRank, data-quality checks) read these, so that selection never
    looks at validation or test rows.
    """
    if name not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {name!r}")
    split = split or SplitConfig()
    if split.kind is SplitMode.FILES:
        raise ValueError("raw_split cannot cut one RawData into a files split; read the split's files instead")
    if split.kind is SplitMode.TIME:
        codes = RowSplitter(split, total_rows=len(raw)).assign(raw)
        raw = apply_options(raw, features, drop_features, None)
        rows = np.flatnonzero(codes == SPLITS.index(name))
    else:
        raw = apply_options(raw, features, drop_features, None)
        rows = split_indices(len(raw), split)[name]
    if not len(rows):
        raise DataError(f"{raw.report.source}: the {name} split is empty")
    return RawData(raw.frame.iloc[rows], raw.schema, raw.report)
