"""One split as either encoded rows in memory or a view of its shards, read alike.

The commands beside ``salience fit`` (permutation importance, the DNIS/iHAS dimension searches,
the pipeline's evaluations) take a :data:`SplitData`: an :class:`~recsys.data.encoders.
EncodedData` when the data module prepares its splits in memory, a :class:`SplitView` when it
streams them (:meth:`recsys.train.datamodule.CTRDataModule.split_data`). The helpers here treat
both alike, with memory bounded by a few shards for a view:

* :func:`batch_dataset`: batches in evaluation order or a seeded training shuffle
  (``BatchDataset`` in memory, ``ShardBatchDataset`` for a view, :class:`SubsetBatches` for a
  view of some rows of each shard);
* :func:`iter_chunks`: the rows as consecutive pieces (the data itself, or shard by shard);
* :func:`sample_rows`: a seeded uniform sample of at most ``rows`` rows, the same rows for
  the data in memory and its shards (``rows`` >= the split's rows: every row, in order)::

      data = dm.split_data("val")                     # EncodedData or SplitView
      for batch in batch_dataset(data, 4096): ...     # evaluation order
      sample = sample_rows(data, 500_000, seed=0)     # EncodedData, <= 500k rows
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Union

import numpy as np
from torch.utils.data import IterableDataset

from recsys.data.batching import Batch, BatchDataset, make_batch
from recsys.data.encoders import EncodedData
from recsys.data.streaming.batching import ShardBatchDataset, cut_runs, select_columns
from recsys.data.streaming.shards import SplitShards, concat_encoded

__all__ = ["SplitData", "SplitView", "SubsetBatches", "batch_dataset", "iter_chunks", "sample_rows"]


@dataclass(frozen=True, eq=False)
class SplitView:
    """A split streamed from its shards: a column view (``columns``; None keeps every feature)
    and optionally only some rows of each shard (``keep[i]``: sorted row indices of shard i).

    ``len(view)`` is its number of rows; nothing is loaded until it is read.
    """

    shards: SplitShards
    columns: tuple[str, ...] | None = None
    buffer_shards: int = 4
    keep: tuple[np.ndarray, ...] | None = None

    def __post_init__(self) -> None:
        if self.keep is not None and len(self.keep) != len(self.shards.shards):
            raise ValueError(f"keep has {len(self.keep)} row lists for {len(self.shards.shards)} shards")

    def __len__(self) -> int:
        if self.keep is None:
            return self.shards.rows
        return int(sum(len(k) for k in self.keep))

    def shard_rows(self) -> list[int]:
        """Rows of the view in each shard."""
        if self.keep is None:
            return [s.rows for s in self.shards.shards]
        return [len(k) for k in self.keep]

    def load(self, index: int) -> EncodedData:
        """The view's rows of shard ``index``."""
        data = self.shards.load(index)
        if self.columns is not None:
            data = select_columns(data, self.columns)
        if self.keep is not None and len(self.keep[index]) != len(data):
            data = data.take(self.keep[index])
        return data

    def subset(self, keep: Sequence[np.ndarray]) -> SplitView:
        """The view of rows ``keep[i]`` (indices into this view's rows of shard i) of each shard."""
        if self.keep is not None:
            keep = [own[k] for own, k in zip(self.keep, keep, strict=True)]
        return SplitView(self.shards, self.columns, self.buffer_shards, tuple(np.asarray(k, dtype=np.int64) for k in keep))


#: a split in memory or streamed from its shards
SplitData = Union[EncodedData, SplitView]  # noqa: UP007 - a runtime alias (isinstance, jsonargparse)


def iter_chunks(data: SplitData) -> Iterator[EncodedData]:
    """The rows of ``data`` in order: ``data`` itself, or a view's shards one at a time."""
    if isinstance(data, EncodedData):
        yield data
        return
    for i in range(len(data.shards.shards)):
        if data.shard_rows()[i]:
            yield data.load(i)


def sample_rows(data: SplitData, rows: int, seed: int = 0) -> EncodedData:
    """A seeded uniform sample (without replacement) of at most ``rows`` rows of ``data``, in
    row order; every row when ``rows >= len(data)``.

    The row positions are drawn over the whole split (``default_rng(seed).choice(N, rows)``),
    so a split in memory and its shards give the same rows. Memory: the sample, the drawn
    positions and one shard.
    """
    if rows < 1:
        raise ValueError(f"rows must be >= 1, got {rows}")
    n = len(data)
    if isinstance(data, EncodedData):
        if rows >= n:
            return data
        return data.take(_positions(n, rows, seed))
    positions = None if rows >= n else _positions(n, rows, seed)
    parts, start = [], 0
    for i, count in enumerate(data.shard_rows()):
        if count == 0:
            continue
        if positions is None:
            parts.append(data.load(i))
        else:
            lo, hi = np.searchsorted(positions, [start, start + count])
            if hi > lo:
                parts.append(data.load(i).take(positions[lo:hi] - start))
        start += count
    return concat_encoded(parts)


def _positions(n: int, rows: int, seed: int) -> np.ndarray:
    return np.sort(np.random.default_rng(seed).choice(n, size=rows, replace=False)).astype(np.int64)


class SubsetBatches(IterableDataset[Batch]):
    """Batches of a :class:`SplitView` with a row subset (``keep``), streamed shard by shard.

    Training order (``shuffle``): each epoch the shards are permuted (seeded by ``seed`` and the
    epoch), grouped into buffers of ``view.buffer_shards`` shards whose rows are shuffled
    (seeded by seed, epoch and buffer) and cut into consecutive batches (a batch may span two
    buffers; the last one is shorter). Evaluation order: the rows in order. One process only.
    """

    def __init__(self, view: SplitView, batch_size: int, shuffle: bool = False, seed: int = 0) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.view, self.batch_size, self.shuffle, self.seed = view, batch_size, shuffle, seed
        self.epoch = 0

    def __len__(self) -> int:
        return -(-len(self.view) // self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _pieces(self) -> Iterator[tuple[EncodedData, np.ndarray]]:
        counts = self.view.shard_rows()
        shards = [i for i, c in enumerate(counts) if c]
        if not self.shuffle:
            for i in shards:
                data = self.view.load(i)
                yield data, np.arange(len(data))
            return
        order = [shards[j] for j in np.random.default_rng([self.seed, self.epoch]).permutation(len(shards))]
        k = self.view.buffer_shards
        for b, start in enumerate(range(0, len(order), k)):
            data = concat_encoded([self.view.load(i) for i in order[start : start + k]])
            yield data, np.random.default_rng([self.seed, self.epoch, b]).permutation(len(data))
            del data

    def __iter__(self) -> Iterator[Batch]:
        for data, rows, offsets in cut_runs(self._pieces(), self.batch_size):
            yield make_batch(data, rows, offsets)


def batch_dataset(
    data: SplitData, batch_size: int, shuffle: bool = False, seed: int = 0
) -> BatchDataset | ShardBatchDataset | SubsetBatches:
    """Batches of ``data``: evaluation order (no padding), or with ``shuffle`` a seeded training
    order whose epoch :meth:`set_epoch` picks. In memory it is ``BatchDataset(data, batch_size,
    shuffle=shuffle, seed=seed)``; a view streams (``ShardBatchDataset`` or :class:`SubsetBatches`)."""
    if isinstance(data, EncodedData):
        return BatchDataset(data, batch_size, shuffle=shuffle, seed=seed)
    if data.keep is not None:
        return SubsetBatches(data, batch_size, shuffle=shuffle, seed=seed)
    columns = list(data.columns) if data.columns is not None else None
    return ShardBatchDataset(data.shards, batch_size, train=shuffle, seed=seed, buffer_shards=data.buffer_shards,
                             columns=columns)
