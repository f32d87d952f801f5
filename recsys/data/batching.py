"""Encoded arrays -> batches of ``KeyedJaggedTensor`` + dense tensor + labels.

A batch is TorchRec's :class:`torchrec.datasets.utils.Batch` (it has ``.to()``,
``.pin_memory()`` and ``record_stream()``). Batches are built whole in the dataset with
vectorised gathers, and the ``DataLoader`` runs with ``batch_size=None``.

KJT layout for F sparse features and a batch of B rows (feature-major)::

                 row0      row1     ...  rowB-1
    "user"     [ [12]      [7]      ...  [3]    ]
    "genres"   [ [4, 9]    []       ...  [1]    ]

    values  = [12, 7, ..., 3, 4, 9, ..., 1]   (int64, sum of lengths)
    lengths = [1, 1, ..., 1, 2, 0, ..., 1]    (int32, F * B)
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import IterableDataset
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from recsys.data.encoders import EncodedData, gather_jagged
from recsys.data.schema import Schema

__all__ = ["Batch", "BatchDataset", "make_batch", "ordered_batches", "random_batch", "rank_slice"]


def make_batch(data: EncodedData, rows: np.ndarray, offsets: dict[str, np.ndarray] | None = None) -> Batch:
    """Build one batch from the rows ``rows`` of ``data``.

    Args:
        data: encoded split.
        rows (np.ndarray): int64 row indices, B.
        offsets: precomputed ``data.offsets(name)`` per feature (saves an O(N) cumsum).

    Returns:
        Batch with ``dense_features`` B x D_dense, ``sparse_features`` KJT with the
        sparse features in schema order, ``labels`` B.
    """
    rows = np.asarray(rows, dtype=np.int64)
    values, lengths = [], []
    for name in data.sparse_names:
        off = offsets[name] if offsets is not None else data.offsets(name)
        v, ln = gather_jagged(data.values[name], off, data.lengths[name], rows)
        values.append(v)
        lengths.append(ln)
    kjt = KeyedJaggedTensor(
        keys=list(data.sparse_names),
        values=torch.from_numpy(np.concatenate(values).astype(np.int64, copy=False) if values else np.zeros(0, np.int64)),
        lengths=torch.from_numpy(np.concatenate(lengths).astype(np.int32) if lengths else np.zeros(0, np.int32)),
    )
    return Batch(
        dense_features=torch.from_numpy(np.ascontiguousarray(data.dense[rows], dtype=np.float32)),
        sparse_features=kjt,
        labels=torch.from_numpy(np.ascontiguousarray(data.labels[rows], dtype=np.float32)),
    )


def ordered_batches(data: EncodedData, batch_size: int) -> Iterator[Batch]:
    """``data``'s rows in order, ``batch_size`` at a time (the last batch may be smaller)."""
    offsets = {n: data.offsets(n) for n in data.sparse_names}
    for start in range(0, len(data), batch_size):
        yield make_batch(data, np.arange(start, min(start + batch_size, len(data))), offsets)


def rank_slice(rows: np.ndarray, rank: int, world_size: int, pad: bool) -> tuple[np.ndarray, int]:
    """Process ``rank``'s contiguous slice of one global batch's ``rows`` (B) and how many of
    its rows are padding: ``ceil(B / world_size)`` rows each with ``pad`` (a short slice is
    filled with copies of ``rows[0]``), ``B // world_size`` without (the remainder dropped)."""
    if world_size == 1:
        return rows, 0
    n, w = len(rows), world_size
    per = -(-n // w) if pad else n // w
    mine = rows[rank * per : (rank + 1) * per]
    n_pad = per - len(mine)
    if n_pad:
        mine = np.concatenate([mine, np.repeat(rows[:1], n_pad)])
    return mine, n_pad


class BatchDataset(IterableDataset[Batch]):
    """Yields whole batches of one split; use with ``DataLoader(ds, batch_size=None)``.

    Args:
        data: the encoded split.
        batch_size: rows per batch (the global batch when ``world_size`` > 1).
        shuffle: shuffle rows each epoch (seeded by ``seed + epoch``; the trainer calls
            :meth:`set_epoch`, so a resumed run sees the same order as an uninterrupted one).
        seed: base seed.
        drop_last: drop the last incomplete batch.
        rank: this process's rank in a distributed run.
        world_size: the number of processes. Every process walks the same global batches and
            keeps its contiguous slice of each (rows ``rank * b .. (rank + 1) * b`` with
            ``b = batch_size / world_size``), so the processes together see each global batch
            once and all run the same number of steps (sharded embeddings need equal slices).
        pad: for evaluation in a distributed run: a last batch that does not split evenly is
            padded to equal slices with copies of its first row labelled ``-1`` (the task
            ignores them), so no row is lost; without ``pad`` its remainder rows are dropped
            (fewer than ``world_size`` rows per epoch when ``batch_size`` is a multiple of
            ``world_size``, which the data module requires for training).
    """

    def __init__(
        self,
        data: EncodedData,
        batch_size: int,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        rank: int = 0,
        world_size: int = 1,
        pad: bool = False,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside 0..{world_size - 1}")
        self.data = data
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.rank = rank
        self.world_size = world_size
        self.pad = pad
        self.epoch = 0
        self._offsets = {name: data.offsets(name) for name in data.sparse_names}

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        n = len(self.data)
        full, rest = divmod(n, self.batch_size)
        if self.drop_last or (rest < self.world_size and not self.pad):
            return full
        return full + (rest > 0)

    def _slice(self, rows: np.ndarray) -> tuple[np.ndarray, int]:
        return rank_slice(rows, self.rank, self.world_size, self.pad)

    def __iter__(self) -> Iterator[Batch]:
        n = len(self.data)
        if self.shuffle:
            order = np.random.default_rng(self.seed + self.epoch).permutation(n)
        else:
            order = np.arange(n)
        for i in range(len(self)):
            rows, n_pad = self._slice(order[i * self.batch_size : (i + 1) * self.batch_size])
            batch = make_batch(self.data, rows, self._offsets)
            if n_pad:
                batch.labels[-n_pad:] = -1.0
            yield batch


def random_batch(
    schema: Schema, batch_size: int, seed: int = 0, max_bag: int = 5
) -> Batch:
    """A random batch for a fitted schema: ids in each table's range (OOV id 0 included),
    bag lengths 0..``max_bag`` for multi-categorical features, standard-normal dense values.
    Used for parity checks and benchmarks.
    """
    from recsys.data.schema import FeatureKind

    g = np.random.default_rng(seed)
    values, lengths = [], []
    for f in schema.sparse:
        if f.kind is FeatureKind.MULTI_CATEGORICAL:
            ln = g.integers(0, max_bag + 1, batch_size).astype(np.int32)
        else:
            ln = np.ones(batch_size, dtype=np.int32)
        values.append(g.integers(0, int(f.num_embeddings or 1), int(ln.sum())).astype(np.int64))
        lengths.append(ln)
    kjt = KeyedJaggedTensor(
        keys=schema.sparse_names,
        values=torch.from_numpy(np.concatenate(values) if values else np.zeros(0, np.int64)),
        lengths=torch.from_numpy(np.concatenate(lengths) if lengths else np.zeros(0, np.int32)),
    )
    dense = torch.from_numpy(g.standard_normal((batch_size, schema.dense_width)).astype(np.float32))
    labels = torch.from_numpy(g.integers(0, 2, batch_size).astype(np.float32))
    return Batch(dense_features=dense, sparse_features=kjt, labels=labels)
