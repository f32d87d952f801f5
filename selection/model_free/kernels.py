"""Compiled (numba) kernels of OutRank's hot loops, with the pure-NumPy path as their reference.

What they compute, on non-negative integer codes (``x`` of the scored column, ``y`` of the
grouping column, ``N`` rows):

* :func:`cond_xlogx` - ``sum c log c`` of the joint counts ``c`` of ``(y, x')`` over the groups of
  Y with at least 2 rows, for several arrangements ``x'`` of X at once: X itself, its cyclic
  rotations (the rotation null) or the package's per-group shift. OutRank's score is a
  difference of these sums (:mod:`selection.model_free.mutual_info`).
* :func:`distinct_count` - distinct values among codes.
* :func:`bin_codes` - quantile-bin numbers of floats (``np.searchsorted(edges, x, "right")``,
  NaN ``len(edges) + 1``).
* :func:`first_appearance` - codes relabelled ``0..K-1`` in order of first appearance (what
  ``pd.factorize`` gives on integers).
* :func:`majority_vote` - the Boyer-Moore majority candidate of a text column, read from its
  Arrow buffers without hashing (the survey's constant and near-constant candidates; the NumPy
  path counts every value instead, and both find the value of more than half the rows).

Each kernel visits the rows once per arrangement and keeps its counts in a zeroed scratch buffer
that it zeroes again on the way out (visiting the same keys), so a call costs O(N) whatever the
key space ``max(y) * max(x)``: no allocation and no sort per batch. The buffers are per thread,
so the kernels (compiled ``nogil``) can run on several threads at once.

Integer results (counts, bins, codes) are bit-identical to the NumPy path; the float sums add
the same terms in another order (relative difference ~1e-15, tested to 1e-12).

:func:`active` (from :mod:`recsys.jit`) says which path runs: ``numba`` when it is installed, unless the
environment variable ``SALIENCE_KERNELS=numpy`` (or :func:`use`) selects the reference path; :func:`compiled`
says whether a call of a given key space takes the kernel (the callers hold the reference).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from recsys.data.streaming.encoders import string_buffers
from recsys.jit import Kernels, active, available, jit, use

__all__ = ["KERNEL_KEYS", "Kernels", "active", "available", "bin_codes", "compiled", "cond_xlogx", "distinct_count",
           "first_appearance", "majority_vote", "use"]

#: largest joint key space (``max(y) + 1) * (max(x) + 1``) a compiled kernel counts in its buffer;
#: beyond it (pairs of two many-valued features) the NumPy path sorts instead
KERNEL_KEYS = 1 << 22


# ---- scratch buffers (zero between calls), one set per thread --------------------------------

_local = threading.local()


def _scratch(name: str, size: int) -> np.ndarray:
    """A zeroed int64 buffer of at least ``size`` entries, kept per thread and name."""
    buf = getattr(_local, name, None)
    if buf is None or len(buf) < size:
        buf = np.zeros(max(size, 1 << 16), dtype=np.int64)
        setattr(_local, name, buf)
    return buf


# ---- the compiled kernels ----------------------------------------------------------------------

@jit
def _cond_xlogx_kernel(x: np.ndarray, y: np.ndarray, ny: np.ndarray, kx: int, offsets: np.ndarray, package: bool,
                       counts: np.ndarray) -> np.ndarray:  # pragma: no cover - compiled
    n = x.shape[0]
    m = 2 if package else offsets.shape[0]
    out = np.zeros(m)
    for j in range(m):
        k = 0 if package else offsets[j] % n
        for sweep in range(2):  # count the pairs, then read and zero the counts
            acc = 0.0
            for i in range(n):
                if package:  # X itself, then the package's per-group shift
                    src = i if j == 0 else (i + ny[y[i]]) % n
                else:  # np.roll(x, k): row i reads row i - k
                    src = i - k + n if i < k else i - k
                key = y[i] * kx + x[src]
                if sweep == 0:
                    counts[key] += 1
                else:
                    c = counts[key]
                    if c > 1 and ny[y[i]] >= 2:
                        acc += c * np.log(c)
                    counts[key] = 0
        out[j] = acc
    return out


@jit
def _first_appearance_kernel(x: np.ndarray, marks: np.ndarray) -> np.ndarray:  # pragma: no cover - compiled
    out = np.empty(x.shape[0], dtype=np.int64)
    k = 0
    for i in range(x.shape[0]):
        v = x[i]
        if marks[v] == 0:
            k += 1
            marks[v] = k
        out[i] = marks[v] - 1
    for i in range(x.shape[0]):
        marks[x[i]] = 0
    return out


@jit
def _bin_kernel(x: np.ndarray, edges: np.ndarray) -> np.ndarray:  # pragma: no cover - compiled
    out = np.empty(x.shape[0], dtype=np.int64)
    e = edges.shape[0]
    for i in range(x.shape[0]):
        v = x[i]
        if np.isnan(v):
            out[i] = e + 1
        elif e <= 64:  # edges <= v, counted without branches (quantile bins: few edges)
            k = 0
            for j in range(e):
                k += edges[j] <= v
            out[i] = k
        else:  # the first edge > v (searchsorted side="right")
            lo, hi = 0, e
            while lo < hi:
                mid = (lo + hi) >> 1
                if edges[mid] <= v:
                    lo = mid + 1
                else:
                    hi = mid
            out[i] = lo
    return out


@jit
def _vote_kernel(offsets: np.ndarray, data: np.ndarray, valid: np.ndarray) -> tuple[int, int]:  # pragma: no cover
    n = offsets.shape[0] - 1
    cand, count, cs, ce = -1, 0, 0, 0
    for i in range(n):
        s = offsets[i]
        e = offsets[i + 1] if valid[i] else s  # null reads as ""
        if count == 0:
            cand, count, cs, ce = i, 1, s, e
            continue
        same = e - s == ce - cs
        if same:
            for j in range(e - s):
                if data[s + j] != data[cs + j]:
                    same = False
                    break
        count += 1 if same else -1
    return cand, count


@jit
def _number_vote_kernel(x: np.ndarray) -> tuple[int, int]:  # pragma: no cover - compiled
    cand, count = -1, 0
    for i in range(x.shape[0]):
        v = x[i]
        if count == 0:
            cand, count = i, 1
            continue
        c = x[cand]
        count += 1 if v == c or (v != v and c != c) else -1  # NaN is one value, -0.0 is 0.0
    return cand, count


# ---- the public functions (callers keep the NumPy reference for when compiled() is False) ---------

def compiled(keys: int, rows: int) -> bool:
    """Whether a compiled kernel runs on ``rows`` codes of a key space of ``keys`` values."""
    return active() == "numba" and keys <= max(KERNEL_KEYS, 4 * rows)


def cond_xlogx(x: np.ndarray, y: np.ndarray, ny: np.ndarray, offsets: list[int] | None = None) -> np.ndarray:
    """``sum c log c`` over the joint counts ``c`` of ``(y, x')`` in the groups of Y holding 2+ rows.

    Args:
        x (np.ndarray): N int64 codes of the scored column (non-negative, N >= 1).
        y (np.ndarray): N int64 codes of the grouping column (non-negative).
        ny (np.ndarray): ``np.bincount(y)``.
        offsets (list[int] | None): the arrangements ``x'``: ``np.roll(x, k)`` for each offset
            ``k``; None: ``x`` itself, then the package's shift ``x[(i + ny[y[i]]) % N]``.

    Returns:
        float64 array, one sum per arrangement (2 for the package's).
    """
    kx = int(x.max()) + 1
    return _cond_xlogx_kernel(x, y, ny, kx, np.asarray(offsets or [], dtype=np.int64), offsets is None,
                              _scratch("counts", len(ny) * kx))


def distinct_count(x: np.ndarray) -> int:
    """Distinct values among N >= 1 non-negative int64 codes ``x``."""
    return int(first_appearance(x).max()) + 1


def first_appearance(x: np.ndarray) -> np.ndarray:
    """N >= 1 non-negative int64 codes relabelled ``0..K-1`` in order of first appearance."""
    return _first_appearance_kernel(x, _scratch("marks", int(x.max()) + 1))


def bin_codes(x: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Bin numbers (int64) of float64 ``x`` by sorted float64 ``edges``: ``0..len(edges)``, NaN
    ``len(edges) + 1``."""
    return _bin_kernel(np.ascontiguousarray(x, dtype=np.float64), np.ascontiguousarray(edges, dtype=np.float64))


def majority_vote(arr: Any) -> tuple[str | None, int]:
    """Boyer-Moore majority vote over the cells of an Arrow string array (null read as ``""``),
    without hashing them: ``(candidate, net count)``. A value in more than half the cells is the
    candidate; the cells are pairs of two different values plus ``net count`` copies of the
    candidate (what :class:`~selection.model_free.sketch.MisraGries` with ``k = 1`` needs).
    ``(None, 0)`` for no cells."""
    n = len(arr)
    if n == 0:
        return None, 0
    offsets, data = string_buffers(arr)
    valid = np.ones(n, dtype=np.bool_) if arr.null_count == 0 else arr.is_valid().to_numpy(zero_copy_only=False)
    cand, count = _vote_kernel(offsets, data, valid)
    return (arr[cand].as_py() or ""), int(count)


def majority_vote_numbers(x: np.ndarray) -> tuple[float | None, int]:
    """:func:`majority_vote` over float64 ``x`` (NaN one value, as ``value_counts(dropna=False)``
    counts it; ``-0.0`` equal to ``0.0``): ``(candidate, net count)``, ``(None, 0)`` for no values."""
    if len(x) == 0:
        return None, 0
    cand, count = _number_vote_kernel(np.ascontiguousarray(x, dtype=np.float64))
    return float(x[cand]), int(count)
