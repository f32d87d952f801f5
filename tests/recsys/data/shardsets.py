"""Shard sets for tests, written from in-memory encoded data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from torchrec.datasets.utils import Batch

from recsys.data.encoders import EncodedData, Preprocessor
from recsys.data.prepare import PreparedData
from recsys.data.streaming.shards import ShardSet, ShardWriter
from recsys.data.synthetic import SyntheticReader


def write_shards(folder: Path, splits: dict[str, EncodedData], pre: Preprocessor, rows_per_shard: int,
                 summary: dict | None = None, chunk: int = 333) -> ShardSet:
    """``splits`` as a shard set in ``folder`` (appended in chunks of ``chunk`` rows)."""
    with ShardWriter(folder, rows_per_shard) as writer:
        for name, data in splits.items():
            for i in range(0, len(data), chunk):
                writer.append(name, data.take(np.arange(i, min(i + chunk, len(data)))))
        return writer.finish(pre, summary or {})


def write_prepared(folder: Path, prepared: PreparedData, rows_per_shard: int) -> ShardSet:
    """The splits of ``prepared`` (what ``prepare_data`` made) as a shard set."""
    return write_shards(folder, prepared.splits, prepared.preprocessor, rows_per_shard, prepared.summary)


def numbered(n_rows: int, seed: int = 0) -> tuple[EncodedData, Preprocessor]:
    """Encoded synthetic rows whose label is the row number (float32, exact), to trace rows."""
    raw = SyntheticReader(n_rows=n_rows, seed=seed, embedding_dim=8).read()
    pre = Preprocessor(raw.schema).fit(raw.frame)
    data = pre.transform(raw.frame)
    data.labels = np.arange(n_rows, dtype=np.float32)
    return data, pre


def rows_of(batch: Batch) -> list[int]:
    """The row numbers of a batch of :func:`numbered` data (padding rows, labelled -1, left out)."""
    return [int(x) for x in batch.labels.tolist() if x >= 0]


def same_batch(a: Batch, b: Batch) -> bool:
    """Equal dense features, labels and KJTs (keys, values, lengths)."""
    ka, kb = a.sparse_features, b.sparse_features
    return (
        a.labels.equal(b.labels)
        and a.dense_features.equal(b.dense_features)
        and ka.keys() == kb.keys()
        and ka.values().equal(kb.values())
        and ka.lengths().equal(kb.lengths())
    )
