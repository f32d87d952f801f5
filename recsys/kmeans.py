"""Seeded k-means (k-means++ seeding, Lloyd's iterations) in torch, shared by every package.

One algorithm, with the switches its callers differ in:

* ``generator``: a ``torch.Generator`` draws the k-means++ centres with ``torch.randint`` /
  ``torch.multinomial``; a ``numpy.random.Generator`` with ``integers`` / ``choice`` (same
  distribution, another stream), so a caller that always seeded numpy keeps its clusters.
* ``seed_from_distinct``: draw the k-means++ centres from the distinct rows (each row value
  once) instead of every row (a repeated row more likely).
* ``reseed_empty``: move the farthest points of larger clusters into a cluster that emptied;
  off, an empty cluster keeps its centroid and stays empty (the caller drops it).
* ``tol``: also stop when the inertia improves by less than ``tol`` (relative); ``None``: stop
  only when no assignment changes (or after ``iterations``).

Callers: ``embeddings.dims.ihas.kmeans`` (numpy generator, distinct seeding, no reseeding, no
tolerance) and the semantic-ID codebook's residual k-means (torch generator, the defaults).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

__all__ = ["KMeansResult", "kmeans", "kmeans_plus_plus", "nearest_centroid", "row_norms"]

#: rows per chunk of the nearest-centroid search (bounds the N x K distance matrix)
CHUNK = 32768

Generator = torch.Generator | np.random.Generator


class KMeansResult(NamedTuple):
    """What :func:`kmeans` returns (unpacks as a 4-tuple)."""

    centroids: Tensor  #: ``[K', d]`` in ``x``'s dtype, ``K' <= k``
    assign: Tensor  #: ``[N]`` int64, the nearest centroid of each row (lowest index on ties)
    inertia: float  #: mean squared distance of a row to its centroid
    iterations: int  #: Lloyd's iterations run


def row_norms(x: Tensor) -> Tensor:
    """``|x_i|^2`` as ``[N, 1]``, computed chunk by chunk exactly as :func:`nearest_centroid` does."""
    return torch.cat([(xb * xb).sum(1, keepdim=True) for xb in x.split(CHUNK)])


def nearest_centroid(x: Tensor, c: Tensor, x_sq: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Nearest centroid of every row, in row chunks of :data:`CHUNK`, by
    ``|x|^2 - 2 x.c + |c|^2``.

    Args:
        x: ``[N, d]`` points.
        c: ``[K, d]`` centroids, same dtype and device.
        x_sq: :func:`row_norms` of ``x``, when the caller reuses it across calls.

    Returns:
        index ``[N]`` int64 (the lowest index on ties) and squared distance ``[N]`` (clamped at 0).
    """
    c_sq = (c * c).sum(1)
    c2 = 2.0 * c  # scaling by 2 is exact: x @ (2c) equals (2x) @ c bit for bit
    idx, dist = [], []
    for i in range(0, len(x), CHUNK):
        xb = x[i : i + CHUNK]
        xb_sq = (xb * xb).sum(1, keepdim=True) if x_sq is None else x_sq[i : i + CHUNK]
        d = xb_sq - xb @ c2.T + c_sq
        m, j = d.min(1)
        idx.append(j)
        dist.append(m.clamp_min(0.0))
    return torch.cat(idx), torch.cat(dist)


def _uniform_index(n: int, generator: Generator) -> int:
    if isinstance(generator, np.random.Generator):
        return int(generator.integers(n))
    return int(torch.randint(n, (1,), generator=generator, device=generator.device).item())


def _weighted_index(d2: Tensor, total: Tensor, generator: Generator) -> int:
    """An index drawn with probability ``d2 / total``."""
    if isinstance(generator, np.random.Generator):
        w = d2.detach().double().cpu().numpy()
        return int(generator.choice(len(w), p=w / w.sum()))
    return int(torch.multinomial((d2 / total).double().cpu(), 1, generator=generator).item())


def kmeans_plus_plus(x: Tensor, k: int, generator: Generator) -> Tensor:
    """k-means++ seeding: the first centre uniform over the rows, each next one drawn with
    probability proportional to its squared distance to the nearest centre so far.

    Args:
        x: ``[N, d]`` candidate centres (``N >= 1``).
        k: centres wanted; fewer come back when every row already is a centre.
        generator: the random source (see the module docstring; a torch one must be a CPU
            generator for the weighted draws).

    Returns:
        ``[k', d]`` centres, rows of ``x``.
    """
    first = _uniform_index(len(x), generator)
    centres = [x[first]]
    d2 = ((x - x[first]) ** 2).sum(1)
    for _ in range(1, k):
        total = d2.sum()
        if not bool(total > 0):
            break
        j = _weighted_index(d2, total, generator)
        centres.append(x[j])
        d2 = torch.minimum(d2, ((x - x[j]) ** 2).sum(1))
    return torch.stack(centres)


def _reseed_empty(assign: Tensor, dist: Tensor, k: int) -> None:
    """Give each empty cluster the farthest point of a cluster holding more than one (in place)."""
    counts = torch.bincount(assign, minlength=k)
    empty = torch.nonzero(counts == 0).flatten()
    if not len(empty):
        return
    far = torch.argsort(dist, descending=True, stable=True)
    taken = 0
    for j in empty.tolist():
        while taken < len(far) and counts[assign[far[taken]]] <= 1:
            taken += 1  # keep singleton clusters; take points from larger ones
        if taken == len(far):
            break
        p = far[taken]
        counts[assign[p]] -= 1
        counts[j] = 1
        assign[p] = j
        taken += 1


def kmeans(
    x: Tensor,
    k: int,
    generator: Generator,
    iterations: int = 50,
    tol: float | None = 1e-6,
    n_init: int = 1,
    seed_from_distinct: bool = False,
    reseed_empty: bool = True,
) -> KMeansResult:
    """Lloyd's k-means from a k-means++ start; deterministic for a generator state.

    ``k`` is capped at the number of distinct rows of ``x``. Each iteration moves every centroid
    to the mean of its rows (a centroid without rows stays) and reassigns the rows; it stops
    when no assignment changes, when the inertia improves by less than ``tol`` (relative), or
    after ``iterations``. With ``n_init > 1`` the run with the lowest inertia is kept (the first
    on ties).

    Args:
        x: ``[N, d]`` float points, ``N >= 1`` (the dtype of the arithmetic and the result).
        k: clusters wanted, ``>= 1``.
        generator: the random source: a CPU ``torch.Generator`` or a ``numpy.random.Generator``.
        iterations: Lloyd's iterations at most.
        tol: relative inertia improvement under which to stop; ``None``: no such test.
        n_init: k-means++ restarts.
        seed_from_distinct: draw the k-means++ centres from the distinct rows of ``x``.
        reseed_empty: refill an empty cluster with the farthest point of a larger cluster.

    Returns:
        :class:`KMeansResult`: centroids ``[K', d]``, assignment ``[N]`` int64, inertia and
        the Lloyd iterations of the kept run.

    Example::

        >>> x = torch.tensor([[0.0], [0.1], [5.0], [5.2]])
        >>> kmeans(x, 2, torch.Generator().manual_seed(0)).assign.tolist() in ([0, 0, 1, 1], [1, 1, 0, 0])
        True
    """
    if x.ndim != 2 or len(x) == 0:
        raise ValueError(f"kmeans needs a non-empty N x d tensor, got shape {tuple(x.shape)}")
    if k < 1:
        raise ValueError(f"kmeans: k must be >= 1, got {k}")
    distinct = torch.unique(x, dim=0)
    k_eff = min(int(k), len(distinct))
    candidates = distinct if seed_from_distinct else x
    x_sq = row_norms(x)
    best: KMeansResult | None = None
    for _ in range(max(1, n_init)):
        c = kmeans_plus_plus(candidates, k_eff, generator)
        assign, dist = nearest_centroid(x, c, x_sq)
        inertia = float(dist.mean())
        it = 0
        for it in range(1, iterations + 1):  # noqa: B007 - read after the loop (iterations run)
            if reseed_empty:
                _reseed_empty(assign, dist, len(c))
            sums = torch.zeros_like(c).index_add_(0, assign, x)
            counts = torch.bincount(assign, minlength=len(c)).to(x.dtype)
            c = torch.where((counts > 0)[:, None], sums / counts.clamp_min(1.0)[:, None], c)
            new_assign, dist = nearest_centroid(x, c, x_sq)
            new_inertia = float(dist.mean())
            changed = bool((new_assign != assign).any())
            assign = new_assign
            done = not changed or (tol is not None and (inertia - new_inertia) <= tol * max(inertia, 1e-30))
            inertia = new_inertia
            if done:
                break
        if best is None or inertia < best.inertia:
            best = KMeansResult(c, assign, inertia, it)
    assert best is not None
    return best
