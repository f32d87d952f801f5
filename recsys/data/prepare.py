"""Raw data -> encoded train/val/test splits, cached on disk.

The one place that turns a :class:`~recsys.data.readers.base.Reader` into model-ready arrays:
read, select features, seeded split, fit encoders on the training split only, encode every
split, and cache the result keyed by the reader's fingerprint and the options.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from recsys.data.encoders import EncodedData, Preprocessor
from recsys.data.raw import DataError, RawData
from recsys.data.readers.base import Reader
from recsys.data.schema import Schema
from recsys.io import atomic_write_json

__all__ = ["PreparedData", "SplitConfig", "SplitName", "prepare_data", "raw_split", "split_indices"]

log = logging.getLogger(__name__)

#: the data splits: training rows, validation (selection, early stopping) and test rows
SplitName = Literal["train", "val", "test"]
SPLITS: tuple[SplitName, ...] = ("train", "val", "test")


@dataclass(frozen=True)
class SplitConfig:
    """Seeded random split fractions (train, val, test); they must sum to 1."""

    train: float = 0.8
    val: float = 0.1
    test: float = 0.1
    seed: int = 42

    def __post_init__(self) -> None:
        parts = (self.train, self.val, self.test)
        if any(not p >= 0 for p in parts) or not abs(sum(parts) - 1.0) <= 1e-6 or not self.train > 0:  # NaN fails
            raise ValueError(f"split fractions must be >= 0, train > 0 and sum to 1, got {parts}")


def split_indices(n: int, split: SplitConfig) -> dict[str, np.ndarray]:
    """Deterministic seeded permutation cut into train/val/test row indices (each sorted)."""
    perm = np.random.default_rng(split.seed).permutation(n)
    n_train = int(round(split.train * n))
    n_val = int(round(split.val * n))
    cuts = {"train": perm[:n_train], "val": perm[n_train : n_train + n_val], "test": perm[n_train + n_val :]}
    return {k: np.sort(v) for k, v in cuts.items()}


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


def _check_split(name: str, labels: np.ndarray, source: str) -> None:
    if len(labels) == 0:
        raise DataError(f"{source}: the {name} split is empty; use more data or other split fractions")
    classes = np.unique(labels)
    if len(classes) < 2:
        raise DataError(
            f"{source}: the {name} split has only one class (label={classes[0]:g}, {len(labels)} rows); "
            "AUC needs both clicks and non-clicks"
        )


def _apply_options(
    raw: RawData, features: list[str] | None, drop_features: list[str] | None, embedding_dim: int | None
) -> RawData:
    if features:
        raw = raw.select(features)
    if drop_features:
        raw.schema.check_columns(drop_features, what="drop_features")
        raw = raw.select([n for n in raw.schema.names if n not in set(drop_features)])
    if embedding_dim is not None:
        raw = RawData(raw.frame, raw.schema.with_uniform_dim(embedding_dim), raw.report)
    return raw


def prepare_data(
    reader: Reader,
    split: SplitConfig | None = None,
    features: list[str] | None = None,
    drop_features: list[str] | None = None,
    embedding_dim: int | None = None,
    cache_dir: str | Path | None = None,
) -> PreparedData:
    """Read, split, fit encoders on train only, encode all splits; cache when ``cache_dir`` is set.

    Args:
        reader: the dataset reader.
        split: split fractions and seed.
        features: keep only these features (error lists the available columns otherwise).
        drop_features: drop these features.
        embedding_dim: override every sparse feature's embedding dim.
        cache_dir: folder for the encoded-data cache (None disables caching).

    Returns:
        PreparedData with ``splits["train"|"val"|"test"]``.
    """
    split = split or SplitConfig()
    key_blob = json.dumps(
        [reader.fingerprint(), split.__dict__, features, drop_features, embedding_dim], sort_keys=True, default=str
    )
    key = hashlib.sha256(key_blob.encode()).hexdigest()[:16]
    folder = Path(cache_dir) / f"{reader.name}-{key}" if cache_dir is not None else None
    if folder is not None and (folder / "summary.json").exists():
        try:
            prepared = PreparedData.load(folder)
            log.info("loaded encoded %s data from cache %s", reader.name, folder)
            return prepared
        except Exception as e:  # a damaged cache is rebuilt, never trusted (BadZipFile, EOFError, ...)
            log.warning("ignoring unreadable cache %s: %s", folder, e)

    raw = _apply_options(reader.read(), features, drop_features, embedding_dim)
    source = raw.report.source
    rows = split_indices(len(raw), split)
    labels = raw.labels
    for name in SPLITS:
        if name == "train" or len(rows[name]):
            _check_split(name, labels[rows[name]], source)
    frame = raw.frame
    pre = Preprocessor(raw.schema).fit(frame.iloc[rows["train"]])
    splits = {name: pre.transform(frame.iloc[idx]) for name, idx in rows.items() if len(idx)}
    summary = {
        "dataset": reader.name,
        "source": source,
        "read": raw.report.to_dict(),
        "split": {**split.__dict__, **{f"{k}_rows": int(len(v)) for k, v in rows.items()}},
        "features": {"sparse": len(raw.schema.sparse), "dense": len(raw.schema.dense)},
        "encode": {name: data.stats.to_dict() for name, data in splits.items()},
        "ctr": {name: float(data.labels.mean()) for name, data in splits.items()},
    }
    prepared = PreparedData(splits, pre, summary)
    if folder is not None:
        prepared.save(folder)
    return prepared


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
    raw = _apply_options(raw, features, drop_features, None)
    rows = split_indices(len(raw), split or SplitConfig())[name]
    if not len(rows):
        raise DataError(f"{raw.report.source}: the {name} split is empty")
    return RawData(raw.frame.iloc[rows], raw.schema, raw.report)
