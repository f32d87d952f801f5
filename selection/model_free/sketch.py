"""Bounded-memory summaries of a column streamed in chunks: distinct counts and heavy hitters.

* :class:`HyperLogLog`: the distinct-value count of a column from ``2^p`` one-byte registers
  (relative standard error ``1.04 / sqrt(2^p)``: 0.8% at the default ``p = 14``, 16 KiB),
  vectorised with numpy over a chunk's values hashed by :func:`hash_values`; two sketches of
  the same ``p`` and seed merge by a register-wise max (chunks, files, workers).
* :class:`MisraGries`: the ``k`` most frequent values with counts that undercount by at most
  ``(N - kept) / (k + 1)`` (Misra-Gries, mergeable form of Agarwal et al. 2012); any value
  holding more than ``N / (k + 1)`` rows is always kept, so ``k = 1`` finds a majority value.

Both take a chunk at a time and never hold more than their fixed state::

    hll = HyperLogLog()
    for chunk in chunks:
        hll.add(chunk["C3"])
    hll.count()                       # ~ distinct values of C3
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["HyperLogLog", "MisraGries", "hash_values"]


def _hash_key(seed: int) -> str:
    """The 16-character key of pandas' SipHash for ``seed``."""
    return f"{seed % 10**16:016d}"


def hash_values(values: pd.Series | np.ndarray | Sequence[Any], seed: int = 0) -> np.ndarray:
    """uint64 hashes of ``values`` (SipHash of pandas' ``hash_array``, keyed by ``seed``).

    Equal values hash equally in every chunk and every process (no Python ``hash``
    randomisation); strings hash by their text, numbers by their value bits.
    """
    arr = values.to_numpy() if isinstance(values, pd.Series) else np.asarray(values)
    if arr.dtype.kind in "iub":
        arr = arr.astype(np.int64)
    elif arr.dtype.kind in "US":  # numpy text: pandas hashes object arrays of str
        arr = arr.astype(object)
    return np.asarray(pd.util.hash_array(arr, hash_key=_hash_key(seed), categorize=False), dtype=np.uint64)


class HyperLogLog:
    """Distinct-count sketch with ``2^p`` registers (Flajolet et al. 2007, 64-bit hashes).

    Args:
        p: register bits, 4..18 (``2^p`` bytes of state; relative error ``1.04 / 2^(p/2)``).
        seed: hash seed; only sketches with the same ``p`` and seed merge.
    """

    def __init__(self, p: int = 14, seed: int = 0) -> None:
        if not 4 <= p <= 18:
            raise ValueError(f"HyperLogLog: p must be in 4..18, got {p}")
        self.p = p
        self.seed = seed
        self.registers = np.zeros(1 << p, dtype=np.uint8)

    @property
    def relative_error(self) -> float:
        """The standard error of :meth:`count` relative to the true count."""
        return 1.04 / math.sqrt(len(self.registers))

    def add(self, values: pd.Series | np.ndarray | Sequence[Any]) -> None:
        """Add the values of one chunk (N values hashed; no Python loop over them)."""
        self.add_hashes(hash_values(values, self.seed))

    def add_hashes(self, h: np.ndarray) -> None:
        """Add uint64 hashes (N,): the first ``p`` bits pick a register, the rest its rank."""
        h = np.asarray(h, dtype=np.uint64)
        if h.size == 0:
            return
        q = 64 - self.p
        idx = (h >> np.uint64(q)).astype(np.int64)
        w = h & np.uint64((1 << q) - 1)
        # rank = q - bit_length(w) + 1 (w = 0: q + 1); log2 of the float may round up by one bit
        nz = w > 0
        bits = np.zeros(h.shape, dtype=np.int64)
        wf = w[nz]
        b = np.floor(np.log2(wf.astype(np.float64))).astype(np.int64)
        b -= ((wf >> b.astype(np.uint64)) == 0).astype(np.int64)
        bits[nz] = b + 1
        rank = (q - bits + 1).astype(np.uint8)
        np.maximum.at(self.registers, idx, rank)

    def merge(self, other: HyperLogLog) -> HyperLogLog:
        """Fold ``other`` into this sketch (register-wise max); returns self."""
        if (other.p, other.seed) != (self.p, self.seed):
            raise ValueError(f"HyperLogLog: cannot merge p={other.p}, seed={other.seed} into p={self.p}, seed={self.seed}")
        np.maximum(self.registers, other.registers, out=self.registers)
        return self

    def count(self) -> float:
        """Estimated distinct values (linear counting while many registers are empty)."""
        m = float(len(self.registers))
        alpha = 0.7213 / (1.0 + 1.079 / m)
        est = alpha * m * m / float(np.sum(np.ldexp(1.0, -self.registers.astype(np.int64))))
        zeros = int(np.count_nonzero(self.registers == 0))
        if est <= 2.5 * m and zeros:
            est = m * math.log(m / zeros)
        return est


class MisraGries:
    """The ``k`` heaviest values of a stream of value counts, each undercounted by at most
    ``(rows - sum of kept counts) / (k + 1)``.

    Args:
        k: counters kept (memory: ``k`` values and counts).
    """

    def __init__(self, k: int) -> None:
        if k < 1:
            raise ValueError(f"MisraGries: k must be >= 1, got {k}")
        self.k = k
        self.rows = 0
        self.counts = pd.Series(dtype=np.int64)

    def add_counts(self, counts: pd.Series) -> None:
        """Add one chunk's exact value counts (value -> rows, as ``value_counts`` gives)."""
        self.rows += int(counts.sum())
        na = np.asarray(counts.index.isna())
        if na.sum() > 1:  # None and NaN: one value, as a grouped sum counts them
            counts = counts.groupby(level=0, sort=False, dropna=False).sum()
            na = np.asarray(counts.index.isna())
        old = self.counts
        chunk = counts.to_numpy(dtype=np.int64)
        new = np.ones(len(chunk), dtype=bool)  # the chunk's values without a counter yet
        old_counts = old.to_numpy(dtype=np.int64)
        if len(old) and len(chunk):
            pos = _positions(counts.index, old.index)  # -1: not in this chunk
            old_na = np.asarray(old.index.isna())
            if old_na.any():  # a missing value finds the chunk's, whichever NA each holds
                pos[old_na] = np.flatnonzero(na)[0] if na.any() else -1
            hit = pos >= 0
            old_counts = old_counts + np.where(hit, chunk[np.maximum(pos, 0)], 0)
            new[pos[hit]] = False
        merged = np.concatenate([old_counts, chunk[new]])
        cut = int(np.partition(merged, len(merged) - self.k - 1)[len(merged) - self.k - 1]) if len(merged) > self.k else 0
        kept_new = np.flatnonzero(new)[chunk[new] > cut]
        kept_old = old_counts > cut  # counters in the order a grouped sum of [old, chunk] lists them
        parts = [pd.Series(old_counts[kept_old] - cut, index=old.index[kept_old], dtype=np.int64),
                 pd.Series(chunk[kept_new] - cut, index=counts.index[kept_new], dtype=np.int64)]
        parts = [p for p in parts if len(p)]
        self.counts = pd.concat(parts) if len(parts) > 1 else parts[0] if parts else pd.Series(dtype=np.int64)

    def merge(self, other: MisraGries) -> MisraGries:
        """Fold another summary in (the mergeable-summary rule); returns self."""
        rows = self.rows + other.rows
        self.add_counts(other.counts)
        self.rows = rows
        return self

    def top(self) -> tuple[Any, int] | None:
        """``(value, lower bound of its count)`` of the heaviest kept value (first kept on ties)."""
        if not len(self.counts):
            return None
        ordered = self.counts.sort_values(ascending=False, kind="stable")
        return ordered.index[0], int(ordered.iloc[0])

    @property
    def error_bound(self) -> float:
        """Most rows any kept count can miss."""
        return (self.rows - float(self.counts.sum())) / (self.k + 1)


def _positions(index: pd.Index, values: pd.Index) -> np.ndarray:
    """Position in ``index`` (unique) of each of ``values``, -1 where absent. A few values (the
    kept counters) are found by comparison: ``get_indexer`` would first hash the whole index."""
    if len(values) > 32:
        return np.asarray(index.get_indexer(values), dtype=np.int64)
    keys = pd.Series(index, copy=False)
    out = np.full(len(values), -1, dtype=np.int64)
    for i, v in enumerate(values):
        if pd.isna(v):
            continue  # missing values are matched by the caller
        hit = np.flatnonzero(keys.eq(v).fillna(False).to_numpy(dtype=bool))
        if hit.size:
            out[i] = hit[0]
    return out
