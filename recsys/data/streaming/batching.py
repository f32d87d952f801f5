"""Batches streamed from an encoded shard set (:mod:`recsys.data.streaming.shards`) with bounded memory.

:class:`ShardBatchDataset` is the streaming twin of :class:`~recsys.data.batching.BatchDataset`:
the same :class:`~torchrec.datasets.utils.Batch` objects built by the same vectorised
:func:`~recsys.data.batching.make_batch`, used with ``DataLoader(ds, batch_size=None)``, but
at most ``buffer_shards`` shards of the split are in memory at once.

**Training** (``train=True``). Each epoch the shard order is permuted (seeded by ``seed`` and
the epoch). The permuted shards form one virtual row stream of N rows; process ``rank`` of
``world_size`` W owns the contiguous range ``[rank * N // W, (rank + 1) * N // W)`` of it and
reads only the shards that range covers (a shard on the boundary of two ranges is read by both,
each keeping its part). Its shards are grouped into buffers of ``buffer_shards`` shards; the rows
of a buffer are shuffled (seeded by seed, epoch, rank and buffer) and cut into consecutive batches
of ``batch_size / W`` rows (a batch may span two buffers)::

    epoch order     | s4 | s1 | s6 | s0 | s3 | s5 | s2 |      7 shards, W = 2, buffer_shards = 2
    rank 0 rows     |<------- N // 2 ------->|
    rank 1 rows                              |<------- N // 2 ------->|   (N % 2 rows rest unused)
    rank 0 buffers  [s4 s1] [s6 s0']                  rank 1 buffers [s0'' s3] [s5 s2]

*Equal steps on every rank* (sharded embeddings run collectives every step): every rank owns
exactly ``N // W`` rows, so every rank has the same number of batches of the same sizes.
At most ``W - 1`` rows per epoch are left out (the tail of the epoch's last shard, another one
each epoch); a round-robin assignment of whole shards would instead leave ranks with unequal rows
and force dropping up to a shard per rank and epoch. A multi-process run does not see the global
batches of a one-process run (unlike ``BatchDataset``), but each global batch is still the union
of W independent buffer shuffles.

**Evaluation** (``train=False``). Shards are read in order and cut into global batches of
``batch_size`` rows, each sliced by rank and padded exactly like ``BatchDataset(pad=True)``
(:func:`~recsys.data.batching.rank_slice`): the batches equal ``BatchDataset``'s on the same
rows. Every rank reads the whole split (the slices of one global batch lie in the same shard).

**Resuming mid-epoch.** :meth:`ShardBatchDataset.state_dict` is the epoch, the batches yielded
in it and the layout (rows, shards, batch size, world size, seed, buffer_shards);
:meth:`~ShardBatchDataset.load_state_dict` makes the next iteration of that epoch start at the
following batch, loading only the buffer that holds it (the row plan is a function of sizes and
seeds alone). :class:`ResumableLoader` exposes that state to Lightning, which saves the state of
every ``state_dict``/``load_state_dict`` train loader in its checkpoints (``FitLoop.
on_save_checkpoint`` -> ``CombinedLoader._state_dicts``) and restores it on a restart before it
starts iterating (``FitLoop.setup_data`` -> ``_load_combined_loader_states``). Lightning does not
prefetch from a loader with a length, so "yielded" is "consumed by the training step". All ranks
have equal positions, so a checkpoint written by rank 0 restores every rank.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch.utils.data import DataLoader, IterableDataset

from recsys.data.batching import Batch, make_batch, rank_slice
from recsys.data.encoders import EncodedData, EncodeStats
from recsys.data.streaming.shards import SplitShards, concat_encoded

__all__ = ["ResumableLoader", "ShardBatchDataset", "select_columns"]

#: the layout keys a mid-epoch state must match to be resumed exactly
LAYOUT_KEYS = ("train", "rows", "shards", "batch_size", "world_size", "seed", "buffer_shards", "drop_last")


def select_columns(data: EncodedData, columns: Sequence[str]) -> EncodedData:
    """``data`` restricted to the features ``columns`` (kept in ``data``'s order; no copy of the
    kept arrays). Raises ``ValueError`` naming a column the data does not hold."""
    keep = set(columns)
    missing = sorted(keep - set(data.sparse_names) - set(data.dense_names))
    if missing:
        raise ValueError(f"features {missing} are not in the shards; they hold {data.sparse_names + data.dense_names}")
    sparse = [n for n in data.sparse_names if n in keep]
    slices = data.dense_slices()
    dense_keep = [n for n in data.dense_names if n in keep]
    dense_idx = [i for n in dense_keep for i in range(slices[n].start, slices[n].stop)]
    stats = EncodeStats(
        rows=data.stats.rows,
        oov={k: v for k, v in data.stats.oov.items() if k in keep},
        dense_filled={k: v for k, v in data.stats.dense_filled.items() if k in keep},
    )
    return EncodedData(
        sparse,
        dense_keep,
        {n: data.values[n] for n in sparse},
        {n: data.lengths[n] for n in sparse},
        data.dense[:, dense_idx],
        data.labels,
        stats,
        [slices[n].stop - slices[n].start for n in dense_keep],
    )


@dataclass(frozen=True)
class _Segment:
    """Rows ``start:stop`` of shard ``shard``."""

    shard: int
    start: int
    stop: int

    @property
    def rows(self) -> int:
        return self.stop - self.start


_Run = tuple[EncodedData, np.ndarray, dict[str, np.ndarray] | None]


def cut_runs(pieces: Iterator[tuple[EncodedData, np.ndarray]], size: int) -> Iterator[_Run]:
    """Consecutive runs of ``size`` rows of the stream ``pieces`` (data, row order), the last one
    shorter: ``(data, rows, offsets)`` for :func:`make_batch` (offsets computed once per piece).
    A run spanning two pieces is copied out of both, so no earlier piece stays referenced."""
    tail: EncodedData | None = None
    for data, order in pieces:
        i = 0
        if tail is not None:
            i = min(size - len(tail), len(order))
            tail = concat_encoded([tail, data.take(order[:i])])
            if len(tail) == size:
                yield tail, np.arange(size), None
                tail = None
        if i + size <= len(order):
            offsets = {name: data.offsets(name) for name in data.sparse_names}
            while i + size <= len(order):
                yield data, order[i : i + size], offsets
                i += size
            del offsets
        if i < len(order):
            tail = data.take(order[i:])
        del data, order  # the next piece loads only after this one is released
    if tail is not None:
        yield tail, np.arange(len(tail)), None


class ShardBatchDataset(IterableDataset[Batch]):
    """Yields whole batches of one split streamed from its shards; use with
    ``DataLoader(ds, batch_size=None)`` (a :class:`ResumableLoader` for training).

    Args:
        shards: the split's shards.
        batch_size: rows per batch, the global batch when ``world_size`` > 1 (training needs a
            multiple of ``world_size``: each process yields ``batch_size / world_size`` rows).
        train: training order (shards permuted per epoch, rows shuffled within a buffer, each
            rank its own range of rows) instead of the sequential, padded evaluation order.
        seed: base seed of the training order (>= 0; the epoch comes from :meth:`set_epoch`).
        buffer_shards: shards loaded and shuffled together in training (memory: about this many
            shards, twice while a buffer is assembled).
        drop_last: drop the last incomplete batch.
        rank: this process's rank.
        world_size: the number of processes.
        pad: evaluation: pad a last global batch that does not split evenly (rows labelled -1),
            as ``BatchDataset(pad=True)``.
        columns: keep only these features (a column view of the shards; None keeps all).
    """

    def __init__(
        self,
        shards: SplitShards,
        batch_size: int,
        train: bool = False,
        seed: int = 0,
        buffer_shards: int = 4,
        drop_last: bool = False,
        rank: int = 0,
        world_size: int = 1,
        pad: bool = True,
        columns: Sequence[str] | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside 0..{world_size - 1}")
        if buffer_shards < 1:
            raise ValueError(f"buffer_shards must be >= 1, got {buffer_shards}")
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        if train and batch_size % world_size:
            raise ValueError(f"the global batch {batch_size} must split evenly over {world_size} processes")
        self.shards = shards
        self.batch_size = batch_size
        self.train = train
        self.seed = seed
        self.buffer_shards = buffer_shards
        self.drop_last = drop_last
        self.rank = rank
        self.world_size = world_size
        self.pad = pad
        self.columns = list(columns) if columns is not None else None
        self.epoch = 0
        self._position = 0  # batches yielded in this epoch (what a checkpoint records)
        self._resume: tuple[int, int] | None = None  # (epoch, batches) to skip on the next iteration

    # -- sizes -----------------------------------------------------------------------------
    @property
    def local_batch_size(self) -> int:
        """Rows per training batch of this process."""
        return self.batch_size // self.world_size

    @property
    def rank_rows(self) -> int:
        """Training rows of each process per epoch (``N // world_size``)."""
        return self.shards.rows // self.world_size

    def __len__(self) -> int:
        if self.train:
            full, rest = divmod(self.rank_rows, self.local_batch_size)
            return full + (rest > 0 and not self.drop_last)
        full, rest = divmod(self.shards.rows, self.batch_size)
        if self.drop_last or (rest < self.world_size and not self.pad):
            return full
        return full + (rest > 0)

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self._position = 0
        self.epoch = epoch

    # -- resuming --------------------------------------------------------------------------
    def layout(self) -> dict[str, Any]:
        """What fixes the order of the batches besides the epoch."""
        return {
            "train": self.train,
            "rows": self.shards.rows,
            "shards": len(self.shards.shards),
            "batch_size": self.batch_size,
            "world_size": self.world_size,
            "seed": self.seed,
            "buffer_shards": self.buffer_shards,
            "drop_last": self.drop_last,
        }

    def state_dict(self) -> dict[str, Any]:
        """The position: ``{"epoch", "batches"`` (yielded in that epoch), ``"length"`` (batches
        of the epoch), ``"layout"}``."""
        return {"epoch": self.epoch, "batches": self._position, "length": len(self), "layout": self.layout()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue epoch ``state["epoch"]`` after its ``state["batches"]`` batches on the next
        iteration (unless :meth:`set_epoch` moves to another epoch first).

        Raises:
            ValueError: a mid-epoch state of another layout (rows, shards, batch size, world size,
                seed, buffer_shards): the rest of that epoch cannot be reproduced.
        """
        epoch, batches = int(state["epoch"]), int(state["batches"])
        saved = state.get("layout", {})
        changed = [k for k in LAYOUT_KEYS if k in saved and saved[k] != self.layout()[k]]
        if changed and 0 < batches < int(state.get("length", batches + 1)):
            shown = ", ".join(f"{k} {saved[k]} -> {self.layout()[k]}" for k in changed)
            raise ValueError(
                f"cannot resume mid-epoch {epoch} after {batches} batches: the streamed data's layout changed "
                f"({shown}); resume from an end-of-epoch checkpoint or with the original settings"
            )
        self.epoch = epoch
        self._position = batches
        self._resume = (epoch, batches)

    # -- loading ---------------------------------------------------------------------------
    def _load(self, index: int) -> EncodedData:
        data = self.shards.load(index)
        return select_columns(data, self.columns) if self.columns is not None else data

    def _segments(self, epoch: int) -> list[_Segment]:
        """This rank's pieces of the epoch's permuted shard stream."""
        infos = self.shards.shards
        order = np.random.default_rng([self.seed, epoch]).permutation(len(infos))
        per = self.rank_rows
        lo, hi = self.rank * per, (self.rank + 1) * per
        out, start = [], 0
        for i in order:
            stop = start + infos[i].rows
            a, b = max(start, lo), min(stop, hi)
            if a < b:
                out.append(_Segment(int(i), a - start, b - start))
            start = stop
        return out

    def _buffers(self, epoch: int) -> list[list[_Segment]]:
        segments = self._segments(epoch)
        k = self.buffer_shards
        return [segments[i : i + k] for i in range(0, len(segments), k)]

    def _load_buffer(self, buffer: list[_Segment]) -> EncodedData:
        parts = []
        for seg in buffer:
            data = self._load(seg.shard)
            if seg.rows != len(data):
                data = data.take(np.arange(seg.start, seg.stop))
            parts.append(data)
            del data
        return concat_encoded(parts)

    def _train_pieces(self, epoch: int, first_row: int) -> Iterator[tuple[EncodedData, np.ndarray]]:
        """(buffer, shuffled row order) from the buffer holding this rank's row ``first_row`` on."""
        buffers = self._buffers(epoch)
        starts = np.cumsum([0] + [sum(s.rows for s in b) for b in buffers])
        j0 = max(int(np.searchsorted(starts, first_row, side="right")) - 1, 0)
        for j in range(j0, len(buffers)):
            data = self._load_buffer(buffers[j])
            order = np.random.default_rng([self.seed, epoch, self.rank, j]).permutation(len(data))
            if j == j0:
                order = order[first_row - int(starts[j]) :]
            yield data, order
            del data, order

    def _eval_pieces(self) -> Iterator[tuple[EncodedData, np.ndarray]]:
        for i in range(len(self.shards.shards)):
            data = self._load(i)
            yield data, np.arange(len(data))
            del data

    # -- iteration -------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Batch]:
        skip = 0
        if self._resume is not None:
            epoch, batches = self._resume
            self._resume = None
            if epoch == self.epoch:
                skip = min(batches, len(self))
        self._position = skip
        total = len(self)
        if skip >= total:
            return
        if self.train:
            size = self.local_batch_size
            for data, rows, offsets in cut_runs(self._train_pieces(self.epoch, skip * size), size):
                batch = make_batch(data, rows, offsets)
                del data, rows, offsets
                self._position += 1
                yield batch
                if self._position >= total:
                    return
        else:
            for data, rows, offsets in cut_runs(self._eval_pieces(), self.batch_size):
                mine, n_pad = rank_slice(rows, self.rank, self.world_size, self.pad)
                batch = make_batch(data, mine, offsets)
                if n_pad:
                    batch.labels[-n_pad:] = -1.0
                del data, rows, offsets
                self._position += 1
                yield batch
                if self._position >= total:
                    return


class ResumableLoader(DataLoader):
    """A ``DataLoader`` whose ``state_dict``/``load_state_dict`` are its dataset's (a
    :class:`ShardBatchDataset`), so Lightning saves the position in checkpoints and restores
    it on a mid-epoch resume. Needs ``num_workers=0``: the position lives in this process."""

    def __init__(self, dataset: ShardBatchDataset, **kwargs: Any) -> None:
        if kwargs.get("num_workers", 0):
            raise ValueError("a ResumableLoader keeps its position in this process: use num_workers=0")
        kwargs.setdefault("batch_size", None)
        super().__init__(dataset, **kwargs)

    def state_dict(self) -> dict[str, Any]:
        return self.dataset.state_dict()  # type: ignore[attr-defined]

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.dataset.load_state_dict(state_dict)  # type: ignore[attr-defined]
