"""The cardinality-corrected mutual-information score of OutRank on integer codes (methods.md 2.1).

For a feature X and the label L over N rows, both integer-coded (see :func:`factorize`)::

    S(X; L) = H_null(X|L) - H(X|L)          (natural logarithms)

:func:`outrank_score` computes it with the package's per-group shift or a rotation null
(:class:`NullModel`); :func:`plain_mi`, :func:`entropy` and :func:`conditional_entropy` are the
plug-in quantities. Joint counts come from ``np.bincount`` (small key spaces) or ``np.unique``
(large ones) on combined int64 keys: no Python loop over rows. :mod:`selection.model_free.outrank` builds
the importance method on these.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from enum import Enum, unique
from typing import Any

import numpy as np
import pandas as pd

from selection.model_free import kernels

__all__ = [
    "NullModel", "conditional_entropy", "distinct_count", "entropy", "factorize", "first_appearance", "outrank_score", "pair_codes", "plain_mi",
    "rotation_significance",
]


@unique
class NullModel(str, Enum):
    """The label-unrelated arrangement the corrected score subtracts."""

    PACKAGE = "package"  # each label group reads X shifted by its own size: the package, exactly
    ROTATION = "rotation"  # the whole column rotated (mean over a few offsets): a permutation-like null



def factorize(values: pd.Series | np.ndarray | Sequence[Any]) -> np.ndarray:
    """Integer codes of ``values`` like pandas ``category`` codes, a missing value its own code.

    Codes are ``0..K-1`` in order of first appearance (int64). NaN and None share one code; an
    empty string is a value like any other (it is what missing sparse cells hold).
    """
    codes, _ = pd.factorize(pd.Series(values, copy=False) if not isinstance(values, pd.Series) else values,
                            use_na_sentinel=False)
    return np.asarray(codes, dtype=np.int64)


def first_appearance(x: np.ndarray) -> np.ndarray:
    """Non-negative integer codes relabelled ``0..K-1`` in order of first appearance (int64):
    :func:`factorize` of integer codes, by the compiled kernel where it runs."""
    x = np.asarray(x, dtype=np.int64)
    if x.size and kernels.compiled(int(x.max()) + 1, len(x)):
        return kernels.first_appearance(x)
    return factorize(x)


def _xlogx(counts: np.ndarray) -> float:
    """``sum(c * log c)`` over positive counts."""
    c = np.asarray(counts, dtype=np.float64)
    return float(np.sum(c * np.log(c))) if c.size else 0.0


def _joint_counts(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Non-zero joint counts of the pairs ``(y, x)``: ``(y value of each pair, count)``."""
    kx = int(x.max()) + 1
    keys = y * kx + x
    span = (int(y.max()) + 1) * kx
    if span <= max(4 * len(x), 1 << 16):  # small key space: one bincount
        counts = np.bincount(keys, minlength=span)
        nz = np.flatnonzero(counts)
        return nz // kx, counts[nz]
    uniq, counts = np.unique(keys, return_counts=True)
    return uniq // kx, counts


def distinct_count(x: np.ndarray) -> int:
    """Distinct values among non-negative integer codes ``x``: a bincount over a small code
    space (codes of one batch of a factorized column), ``np.unique`` over a large one."""
    if x.size == 0:
        return 0
    top = int(x.max()) + 1
    if kernels.compiled(top, len(x)):
        return kernels.distinct_count(x)
    if top <= max(4 * len(x), 1 << 16):
        return int(np.count_nonzero(np.bincount(x, minlength=top)))
    return len(np.unique(x))


def _n_cond_entropy(x: np.ndarray, y: np.ndarray, ny: np.ndarray) -> float:
    """``N * H(X|Y)`` over the groups of Y with at least 2 rows (``ny = bincount(y)``)."""
    g, cnt = _joint_counts(x, y)
    keep = ny[g] >= 2
    return _xlogx(ny[ny >= 2]) - _xlogx(cnt[keep])


def _check_codes(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(x, dtype=np.int64)
    y = np.asarray(y, dtype=np.int64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"expected two 1-d code arrays of equal length, got shapes {x.shape} and {y.shape}")
    if x.size and (x.min() < 0 or y.min() < 0):
        raise ValueError("codes must be non-negative integers (see factorize)")
    return x, y


def entropy(x: np.ndarray) -> float:
    """Plug-in entropy H(X) in nats of integer codes ``x``."""
    x = np.asarray(x, dtype=np.int64)
    n = len(x)
    if n == 0:
        return 0.0
    counts = np.bincount(x)
    return math.log(n) - _xlogx(counts[counts > 0]) / n


def conditional_entropy(x: np.ndarray, y: np.ndarray) -> float:
    """H(X|Y) in nats over the groups of Y that hold at least 2 rows (N counts all rows).

    Args:
        x (np.ndarray): N non-negative integer codes of the scored column.
        y (np.ndarray): N non-negative integer codes of the grouping column (the label).
    """
    x, y = _check_codes(x, y)
    if len(x) == 0:
        return 0.0
    return _n_cond_entropy(x, y, np.bincount(y)) / len(x)


def outrank_score(x: np.ndarray, y: np.ndarray, null: NullModel | str = "package", rotations: int = 4) -> float:
    """The corrected score ``S(X;Y) = H_null(X|Y) - H(X|Y)`` (methods.md 2.1), in nats.

    Rows are grouped by Y (the label's role). With ``null="package"`` the null reads X at
    positions ``(row + n_c) mod N`` for the rows of group c: the ``outrank`` package's
    ``MI-numba-randomized`` score of the pair (label Y, feature X), equal up to its float32
    rounding. With ``null="rotation"`` the null is the mean of ``H(X'|Y)`` over ``rotations``
    whole-column cyclic rotations X' of X (offsets ``j * N / (rotations + 1)``): the rotated
    column keeps X's marginal, so the groups' sampling noise cancels as in a permutation test
    (the package's per-group shifts do not partition the rows: on a Zipf column with 1,000
    values and 16k rows its null has ~5x the spread, see :class:`NullModel`).

    Args:
        x (np.ndarray): N non-negative integer codes of the feature.
        y (np.ndarray): N non-negative integer codes of the label (or of the feature playing
            its role in a redundancy score).
        null (NullModel | str): ``package`` or ``rotation``.
        rotations (int): rotations averaged by the ``rotation`` null.

    Returns:
        S in nats; ~0 for an unrelated column whatever its cardinality, can be slightly < 0.
    """
    x, y = _check_codes(x, y)
    n = len(x)
    if n == 0:
        return 0.0
    ny = np.bincount(y)
    if NullModel(null) is NullModel.ROTATION:
        together = _rotation_entropies(x, y, ny, rotations)
        return (float(together[1:].mean()) - float(together[0])) / n
    if kernels.compiled(len(ny) * (int(x.max()) + 1), n):  # N H(X|Y) = xlogx(ny) - xlogx(joint): the first cancels
        plain, shifted_sum = kernels.cond_xlogx(x, y, ny)
        return float(plain - shifted_sum) / n
    shifted = x[(np.arange(n, dtype=np.int64) + ny[y]) % n]
    return (_n_cond_entropy(shifted, y, ny) - _n_cond_entropy(x, y, ny)) / n


def _rotation_entropies(x: np.ndarray, y: np.ndarray, ny: np.ndarray, rotations: int) -> np.ndarray:
    """``N * H(X'|Y)`` of X itself, then of its ``rotations`` whole-column rotations (offsets
    ``j * N / (rotations + 1)``): one bincount over all of them when the key space allows, else
    one :func:`_n_cond_entropy` per rotation."""
    n = len(x)
    offsets = [0, *((j + 1) * n // (rotations + 1) for j in range(rotations))]
    if kernels.compiled(len(ny) * (int(x.max()) + 1), n):
        return _xlogx(ny[ny >= 2]) - kernels.cond_xlogx(x, y, ny, offsets)
    together = _rotated_n_cond_entropies(x, y, ny, offsets)
    if together is None:
        together = np.array([_n_cond_entropy(np.roll(x, k), y, ny) for k in offsets])
    return together


def _rotated_n_cond_entropies(x: np.ndarray, y: np.ndarray, ny: np.ndarray, offsets: list[int]) -> np.ndarray | None:
    """``N * H(roll(X, k) | Y)`` for each offset ``k`` (groups of Y with at least 2 rows), from
    one bincount over all of them; None when their joint key space is too large for a bincount
    (then :func:`_n_cond_entropy` per offset, which falls back to ``np.unique``)."""
    n, r = len(x), len(offsets)
    kx = int(x.max()) + 1
    span = len(ny) * kx
    if r * span > max(4 * r * n, 1 << 16):
        return None
    rolled = np.empty((r, n), dtype=np.int64)
    for j, k in enumerate(offsets):  # np.roll(x, k) without its temporaries
        k %= n
        rolled[j, :k] = x[n - k:]
        rolled[j, k:] = x[: n - k]
    rolled += y * kx
    rolled += (np.arange(r, dtype=np.int64) * span)[:, None]
    counts = np.bincount(rolled.reshape(-1), minlength=r * span).reshape(r, len(ny), kx)[:, ny >= 2, :]
    c = counts.reshape(r, -1).astype(np.float64)
    xlogx = (c * np.log(np.maximum(c, 1.0))).sum(axis=1)
    return _xlogx(ny[ny >= 2]) - xlogx


def rotation_significance(x: np.ndarray, y: np.ndarray, rotations: int = 32) -> tuple[float, float]:
    """The rotation-null score of X against Y and how far it stands out of its null: ``(S, z)``.

    ``S`` is :func:`outrank_score` with ``rotations`` rotations; ``z = S / sd`` where ``sd`` is
    the standard deviation of ``H(X'|Y)`` over the rotations X' (the spread a label-unrelated
    column of X's marginal shows). An ID-like column (a distinct value in a large share of the
    rows) can score a few thousandths of a nat by chance on a small sample; its ``z`` stays
    near 0 unless the label really depends on it.

    Args:
        x (np.ndarray): N non-negative integer codes of the feature.
        y (np.ndarray): N non-negative integer codes of the label.
        rotations (int): whole-column rotations of the null (at least 2).

    Returns:
        ``(S in nats, z)``; z is 0 when the null has no spread (a constant column).
    """
    if rotations < 2:
        raise ValueError(f"rotation_significance needs at least 2 rotations, got {rotations}")
    x, y = _check_codes(x, y)
    n = len(x)
    if n == 0:
        return 0.0, 0.0
    together = _rotation_entropies(x, y, np.bincount(y), rotations)
    null = together[1:] / n
    score = float(null.mean() - together[0] / n)
    sd = float(null.std(ddof=1))
    return score, (score / sd if sd > 1e-12 else 0.0)


def plain_mi(x: np.ndarray, y: np.ndarray) -> float:
    """Plug-in mutual information ``H(X) - H(X|Y)`` (groups of Y with one row skipped).

    This is what the package returns for the label-vs-itself pair, where the correction is
    switched off; ``plain_mi(l, l) == entropy(l)`` for a label whose classes all repeat.
    """
    x, y = _check_codes(x, y)
    return entropy(x) - conditional_entropy(x, y) if len(x) else 0.0


def pair_codes(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Codes of the pair column "a AND b": ``a * K_b + b`` (``K_b = max(b) + 1``), compacted.

    The package hashes the concatenated strings with xxh64; the exact product code has no
    collisions and gives the same partition of the rows.
    """
    a = np.asarray(a, dtype=np.int64)
    b = np.asarray(b, dtype=np.int64)
    kb = int(b.max()) + 1 if b.size else 1
    return np.unique(a * kb + b, return_inverse=True)[1].astype(np.int64).reshape(-1)
